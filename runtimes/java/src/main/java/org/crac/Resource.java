package org.crac;

/**
 * org.crac API (https://github.com/CRaC/org.crac), implemented by the Thaw Java runtime:
 * {@link #beforeCheckpoint} runs once before the snapshot is taken (before READY),
 * {@link #afterRestore} runs in every instance restored from it, before its first invocation.
 */
public interface Resource {
    void beforeCheckpoint(Context<? extends Resource> context) throws Exception;

    void afterRestore(Context<? extends Resource> context) throws Exception;
}
