package dev.thaw.runtime;

import java.io.FileInputStream;
import java.io.IOException;
import java.lang.reflect.Field;
import java.security.SecureRandom;
import java.util.Random;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Re-randomizes the JDK's process-wide generators in a restored instance (every clone of a
 * snapshot starts with the same generator states). Needs the --add-opens of bootstrap.sh; each
 * step is best effort. See README.md for what is and is not covered.
 */
final class Reseed {
    private Reseed() {
    }

    static long[] fresh(int n) throws IOException {
        byte[] b = new byte[8 * n];
        try (FileInputStream f = new FileInputStream("/dev/urandom")) {
            int got = 0;
            while (got < b.length) {
                int r = f.read(b, got, b.length - got);
                if (r < 0) {
                    throw new IOException("EOF on /dev/urandom");
                }
                got += r;
            }
        }
        long[] out = new long[n];
        for (int i = 0; i < n; i++) {
            long v = 0;
            for (int j = 0; j < 8; j++) {
                v = (v << 8) | (b[8 * i + j] & 0xff);
            }
            out[i] = v;
        }
        return out;
    }

    static Field field(String cls, String name) throws ReflectiveOperationException {
        Field f = Class.forName(cls, false, null).getDeclaredField(name);
        f.setAccessible(true);
        return f;
    }

    /** Every live thread (without Thread.getAllStackTraces(), which walks every stack at a safepoint). */
    static Thread[] allThreads() {
        ThreadGroup root = Thread.currentThread().getThreadGroup();
        while (root.getParent() != null) {
            root = root.getParent();
        }
        Thread[] ts = new Thread[root.activeCount() + 16];
        int n;
        while ((n = root.enumerate(ts, true)) == ts.length) {
            ts = new Thread[ts.length * 2];
        }
        return java.util.Arrays.copyOf(ts, n);
    }

    static void all() throws IOException {
        long[] s = fresh(8);
        // Math.random(): a static java.util.Random (initialised lazily; reseed it if it exists).
        try {
            Field f = field("java.lang.Math$RandomNumberGeneratorHolder", "randomNumberGenerator");
            ((Random) f.get(null)).setSeed(s[0]);
        } catch (ReflectiveOperationException | RuntimeException ignored) {
            // not accessible
        }
        // new Random(): seedUniquifier ^ nanoTime
        try {
            ((AtomicLong) field("java.util.Random", "seedUniquifier").get(null)).set(s[1]);
        } catch (ReflectiveOperationException | RuntimeException ignored) {
            // not accessible
        }
        // ThreadLocalRandom: new seed source, and every thread re-initialises its seed on next use.
        try {
            ((AtomicLong) field("java.util.concurrent.ThreadLocalRandom", "seeder").get(null)).set(s[2]);
            Field probe = field("java.lang.Thread", "threadLocalRandomProbe");
            for (Thread t : allThreads()) {
                probe.setInt(t, 0);
            }
        } catch (ReflectiveOperationException | RuntimeException ignored) {
            // not accessible
        }
        // SplittableRandom's default generator
        try {
            ((AtomicLong) field("java.util.SplittableRandom", "defaultGen").get(null)).set(s[3]);
        } catch (ReflectiveOperationException | RuntimeException ignored) {
            // not accessible
        }
        // The SUN provider first: it decides, as it loads, whether new SecureRandom() is
        // NativePRNG, and asks NativePRNG whether it is available. Reaching NativePRNG's
        // INSTANCE below before that (a base's warm-up runs before anything used security)
        // would initialise NativePRNG first, which loads the provider midway, which then finds
        // NativePRNG unavailable and makes DRBG the default: seeded once, in the snapshot, and
        // shared by every clone of a generator the function makes at init.
        java.security.Security.getProvider("SUN");
        // NativePRNG (new SecureRandom() on Linux) mixes /dev/urandom into every output, but keeps
        // up to 32 bytes read ahead for 100 ms: drop them.
        for (String c : new String[] {"sun.security.provider.NativePRNG", "sun.security.provider.NativePRNG$Blocking",
            "sun.security.provider.NativePRNG$NonBlocking"}) {
            try {
                Object io = field(c, "INSTANCE").get(null);
                if (io != null) {
                    Field buffered = io.getClass().getDeclaredField("buffered");
                    buffered.setAccessible(true);
                    synchronized (io) {
                        buffered.setInt(io, 0);
                    }
                }
            } catch (ReflectiveOperationException | RuntimeException ignored) {
                // not loaded / not accessible
            }
        }
        // SecureRandoms registered through Hooks.registerSecureRandom
        for (SecureRandom r : Hooks.secureRandoms()) {
            byte[] seed = new byte[32];
            for (int i = 0; i < 4; i++) {
                long v = s[4 + i];
                for (int j = 0; j < 8; j++) {
                    seed[8 * i + j] = (byte) (v >>> (8 * j));
                }
            }
            r.setSeed(seed);
        }
    }
}
