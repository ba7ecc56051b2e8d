package dev.thaw.runtime;

import com.fasterxml.jackson.databind.JsonNode;

import java.lang.reflect.Field;
import java.util.Map;

/**
 * Changes this JVM's view of its environment ({@link System#getenv()}). The JDK has no
 * API for it, so the map behind the unmodifiable view is reached by reflection (needs
 * bootstrap.sh's {@code --add-opens java.base/java.util=ALL-UNNAMED}); without it the
 * environment stays as it was and only the context reports the value.
 */
final class Env {
    private static final Map<String, String> WRITABLE = writable();

    private Env() {}

    @SuppressWarnings("unchecked")
    private static Map<String, String> writable() {
        try {
            Map<String, String> view = System.getenv();
            Field m = view.getClass().getDeclaredField("m");
            m.setAccessible(true);
            return (Map<String, String>) m.get(view);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    /** Set one variable; false if this JVM's environment cannot be changed. */
    static boolean set(String key, String value) {
        if (WRITABLE == null) {
            return false;
        }
        try {
            WRITABLE.put(key, value);
            return true;
        } catch (RuntimeException e) {
            return false;
        }
    }

    /**
     * Make the process's environment exactly {@code env} (a base given its function's
     * environment by the load frame): this JVM's view of it, and the C library's, which
     * child processes inherit (libthawenv.so beside the jar, {@code -Dthaw.native}). False if
     * either cannot be changed: the base then exits without loading the function, which
     * gets a full image instead.
     */
    static boolean replaceAll(Map<String, String> env) {
        if (WRITABLE == null || !loadNative()) {
            return false;
        }
        try {
            for (String k : new java.util.ArrayList<>(WRITABLE.keySet())) {
                if (!env.containsKey(k) && setenv0(utf8(k), null) != 0) {
                    return false;
                }
            }
            for (Map.Entry<String, String> e : env.entrySet()) {
                if (setenv0(utf8(e.getKey()), utf8(e.getValue())) != 0) {
                    return false;
                }
            }
            WRITABLE.keySet().retainAll(env.keySet());
            WRITABLE.putAll(env);
            return true;
        } catch (RuntimeException | UnsatisfiedLinkError e) {
            return false;
        }
    }

    private static byte[] utf8(String s) {
        return s.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }

    private static boolean loadNative() {
        String lib = System.getProperty("thaw.native");
        try {
            if (lib != null) {
                System.load(lib);
                return true;
            }
        } catch (UnsatisfiedLinkError | SecurityException e) {
            System.err.println("thaw runtime: " + lib + ": " + e.getMessage());
        }
        return false;
    }

    /**
     * Make {@code dir} the process's working directory (chdir(2)): a base instance given a
     * function keeps the one it had, on the /var/task the function's code replaced, and
     * relative paths would name the previous code's files. Java's own {@code user.dir}
     * stays the same string. False if the native library is missing or chdir fails.
     */
    static boolean chdir(String dir) {
        if (!loadNative()) {
            return false;
        }
        try {
            return chdir0(utf8(dir)) == 0;
        } catch (UnsatisfiedLinkError e) {
            return false;
        }
    }

    /** setenv(3), or unsetenv(3) when {@code value} is null (runtimes/java/native/thaw_env.c). */
    private static native int setenv0(byte[] key, byte[] value);

    /** chdir(2) (runtimes/java/native/thaw_env.c). */
    private static native int chdir0(byte[] path);

    /**
     * The version this call runs, and the log stream named after it, come with the call:
     * one snapshot (and one warm process) may serve $LATEST and several published
     * versions, so the environment captured in the image must not decide what
     * AWS_LAMBDA_FUNCTION_VERSION and AWS_LAMBDA_LOG_STREAM_NAME say.
     */
    static void takeIdentity(JsonNode msg) {
        take(msg, "function_version", "AWS_LAMBDA_FUNCTION_VERSION");
        take(msg, "log_stream_name", "AWS_LAMBDA_LOG_STREAM_NAME");
    }

    private static void take(JsonNode msg, String field, String key) {
        String v = msg.path(field).asText("");
        if (!v.isEmpty() && !v.equals(System.getenv(key))) {
            set(key, v);
        }
    }
}
