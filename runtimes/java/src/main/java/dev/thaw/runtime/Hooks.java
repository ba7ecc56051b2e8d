package dev.thaw.runtime;

import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;

/**
 * Snapshot hooks for functions that compile against the Thaw runtime jar (org.crac's
 * {@code Core.getGlobalContext().register(resource)} is the portable alternative).
 *
 * <ul>
 *   <li>{@link #registerBeforeSnapshot}: runs once after init, before the snapshot (before READY).</li>
 *   <li>{@link #registerAfterRestore}: runs in every restored instance before its first invocation.</li>
 *   <li>{@link #registerSecureRandom}: the runtime reseeds it from /dev/urandom after every restore.</li>
 * </ul>
 */
public final class Hooks {
    private static final List<Runnable> BEFORE = new ArrayList<>();
    private static final List<Runnable> AFTER = new ArrayList<>();
    private static final List<SecureRandom> RANDOMS = new ArrayList<>();

    private Hooks() {
    }

    public static synchronized void registerBeforeSnapshot(Runnable hook) {
        BEFORE.add(java.util.Objects.requireNonNull(hook));
    }

    public static synchronized void registerAfterRestore(Runnable hook) {
        AFTER.add(java.util.Objects.requireNonNull(hook));
    }

    /** Reseed {@code random} (setSeed with 32 fresh bytes) in every restored instance. */
    public static synchronized <T extends SecureRandom> T registerSecureRandom(T random) {
        RANDOMS.add(java.util.Objects.requireNonNull(random));
        return random;
    }

    static synchronized List<Runnable> beforeSnapshot() {
        return new ArrayList<>(BEFORE);
    }

    static synchronized List<Runnable> afterRestore() {
        return new ArrayList<>(AFTER);
    }

    static synchronized List<SecureRandom> secureRandoms() {
        return new ArrayList<>(RANDOMS);
    }
}
