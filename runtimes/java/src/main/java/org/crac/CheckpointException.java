package org.crac;

/** Thrown when one or more resources failed in beforeCheckpoint (they are suppressed exceptions). */
public class CheckpointException extends Exception {
    private static final long serialVersionUID = 1L;

    public CheckpointException() {
        super();
    }
}
