package example;

import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.RequestHandler;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Randomness after a restore: clones of one snapshot must differ. Generators created at init
 * (RANDOM, SECURE) hold snapshot state; see runtimes/java/README.md for what the runtime reseeds.
 * Handler "example.Randoms".
 */
public class Randoms implements RequestHandler<Map<String, Object>, Map<String, Object>> {
    static final SecureRandom SECURE = new SecureRandom();
    static final Random RANDOM = new Random();
    static final double AT_INIT = Math.random();

    static {
        SECURE.nextInt(); // force seeding at init
        ThreadLocalRandom.current().nextInt();
    }

    @Override
    public Map<String, Object> handleRequest(Map<String, Object> event, Context ctx) {
        byte[] b = new byte[16];
        SECURE.nextBytes(b);
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("math", Math.random());
        r.put("threadLocal", ThreadLocalRandom.current().nextLong());
        r.put("secureHex", HexFormat.of().formatHex(b));
        r.put("uuid", UUID.randomUUID().toString());
        r.put("newRandom", new Random().nextLong());
        r.put("initRandom", RANDOM.nextLong());
        r.put("mathAtInit", AT_INIT);
        return r;
    }
}
