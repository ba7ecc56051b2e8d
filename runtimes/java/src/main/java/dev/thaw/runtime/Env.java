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
