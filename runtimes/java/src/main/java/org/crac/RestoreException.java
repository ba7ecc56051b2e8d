package org.crac;

/** Thrown when one or more resources failed in afterRestore (they are suppressed exceptions). */
public class RestoreException extends Exception {
    private static final long serialVersionUID = 1L;

    public RestoreException() {
        super();
    }
}
