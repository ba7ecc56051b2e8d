package org.crac;

import java.util.ArrayList;
import java.util.List;

/**
 * org.crac entry point as provided by the Thaw Java runtime. The runtime jar comes first on the
 * class path, so a function bundling org.crac:crac gets these classes: resources registered in
 * the global context are notified by the runtime around the snapshot (before READY: in reverse
 * registration order; after a restore: in registration order). Resources are held strongly.
 */
public final class Core {
    private static final GlobalContext GLOBAL = new GlobalContext();

    private Core() {
    }

    public static Context<Resource> getGlobalContext() {
        return GLOBAL;
    }

    /** The snapshot is taken by the platform, not on request. */
    public static void checkpointRestore() throws CheckpointException, RestoreException {
        throw new UnsupportedOperationException("Thaw takes the snapshot itself after init; checkpointRestore() is not supported");
    }

    static final class GlobalContext extends Context<Resource> {
        private final List<Resource> resources = new ArrayList<>();

        @Override
        public synchronized void register(Resource resource) {
            if (resource == null) {
                throw new NullPointerException("resource");
            }
            resources.add(resource);
        }

        private synchronized List<Resource> snapshot() {
            return new ArrayList<>(resources);
        }

        @Override
        public void beforeCheckpoint(Context<? extends Resource> context) throws CheckpointException {
            List<Resource> rs = snapshot();
            CheckpointException failed = null;
            for (int i = rs.size() - 1; i >= 0; i--) {
                try {
                    rs.get(i).beforeCheckpoint(this);
                } catch (Exception e) {
                    if (failed == null) {
                        failed = new CheckpointException();
                    }
                    failed.addSuppressed(e);
                }
            }
            if (failed != null) {
                throw failed;
            }
        }

        @Override
        public void afterRestore(Context<? extends Resource> context) throws RestoreException {
            RestoreException failed = null;
            for (Resource r : snapshot()) {
                try {
                    r.afterRestore(this);
                } catch (Exception e) {
                    if (failed == null) {
                        failed = new RestoreException();
                    }
                    failed.addSuppressed(e);
                }
            }
            if (failed != null) {
                throw failed;
            }
        }
    }
}
