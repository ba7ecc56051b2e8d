package example;

import java.util.LinkedHashMap;
import java.util.Map;

/** Dense matrix multiply, handler "example.MatMul::multiply" (a static method, no Context). */
public class MatMul {
    static double[][] matrix(int n, long seed) {
        double[][] m = new double[n][n];
        long s = seed;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) {
                s = s * 6364136223846793005L + 1442695040888963407L;
                m[i][j] = ((s >>> 33) % 1000) / 1000.0;
            }
        }
        return m;
    }

    public static Map<String, Object> multiply(Map<String, Object> event) {
        int n = event != null && event.get("n") instanceof Number num ? Math.max(1, Math.min(1024, num.intValue())) : 128;
        double[][] a = matrix(n, 1), b = matrix(n, 2), c = new double[n][n];
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < n; k++) {
                double aik = a[i][k];
                double[] bk = b[k], ci = c[i];
                for (int j = 0; j < n; j++) {
                    ci[j] += aik * bk[j];
                }
            }
        }
        double trace = 0, sum = 0;
        for (int i = 0; i < n; i++) {
            trace += c[i][i];
            for (int j = 0; j < n; j++) {
                sum += c[i][j];
            }
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("n", n);
        r.put("trace", Math.round(trace * 1e6) / 1e6);
        r.put("sum", Math.round(sum * 1e3) / 1e3);
        // Timing goes to the log: the result stays the same for the same input.
        System.out.printf("multiply n=%d took %.3f ms%n", n, (System.nanoTime() - t0) / 1e6);
        return r;
    }
}
