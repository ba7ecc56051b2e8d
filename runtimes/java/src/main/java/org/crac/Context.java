package org.crac;

/** A group of {@link Resource}s notified together; itself a Resource. */
public abstract class Context<R extends Resource> implements Resource {
    protected Context() {
    }

    @Override
    public abstract void beforeCheckpoint(Context<? extends Resource> context) throws CheckpointException;

    @Override
    public abstract void afterRestore(Context<? extends Resource> context) throws RestoreException;

    public abstract void register(R resource);
}
