package example;

import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.RequestHandler;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * JVM features across a snapshot: a thread pool created in a static initializer (its threads are
 * part of the snapshot), allocation + System.gc(), a resource read from the function's jar.
 * Handler "example.Features".
 */
public class Features implements RequestHandler<Map<String, Object>, Map<String, Object>> {
    static final ExecutorService POOL = Executors.newFixedThreadPool(2, r -> {
        Thread t = new Thread(r, "features-worker");
        t.setDaemon(true);
        return t;
    });
    static final String GREETING = resource("/greeting.txt");

    static String resource(String name) {
        try (InputStream in = Features.class.getResourceAsStream(name)) {
            return in == null ? null : new String(in.readAllBytes(), StandardCharsets.UTF_8).trim();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    static long sumRange(long from, long to) {
        long s = 0;
        for (long i = from; i < to; i++) {
            s += i * i % 7;
        }
        return s;
    }

    @Override
    public Map<String, Object> handleRequest(Map<String, Object> event, Context ctx) {
        List<byte[]> garbage = new ArrayList<>();
        for (int i = 0; i < 64; i++) {
            garbage.add(new byte[64 * 1024]);
        }
        int allocated = garbage.size();
        garbage = null;
        System.gc();
        long total = 0;
        try {
            List<Future<Long>> parts = new ArrayList<>();
            for (int p = 0; p < 4; p++) {
                final long from = p * 250_000L, to = (p + 1) * 250_000L;
                parts.add(POOL.submit(() -> sumRange(from, to)));
            }
            for (Future<Long> f : parts) {
                total += f.get();
            }
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("greeting", GREETING);
        r.put("resourceFromJar", String.valueOf(Features.class.getResource("/greeting.txt")).startsWith("jar:"));
        r.put("allocatedChunks", allocated);
        r.put("parallelSum", total);
        // Heap in use varies from run to run: logged, not part of the (deterministic) result.
        ctx.getLogger().log("heap used: " + ((Runtime.getRuntime().totalMemory() - Runtime.getRuntime().freeMemory()) >> 20) + " MB\n");
        return r;
    }
}
