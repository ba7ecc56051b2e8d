package dev.thaw.runtime;

import com.amazonaws.services.lambda.runtime.ClientContext;
import com.amazonaws.services.lambda.runtime.CognitoIdentity;
import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.LambdaLogger;
import com.fasterxml.jackson.databind.JsonNode;

import java.nio.charset.StandardCharsets;

/** The Lambda {@link Context} of one invocation (defaults from the environment, read per call). */
final class LambdaContext implements Context {
    static final LambdaLogger LOGGER = new LambdaLogger() {
        @Override
        public void log(String message) {
            System.out.print(message);
            System.out.flush();
        }

        @Override
        public void log(byte[] message) {
            System.out.print(new String(message, StandardCharsets.UTF_8));
            System.out.flush();
        }
    };

    private final String requestId;
    private final String functionName;
    private final String functionVersion;
    private final String arn;
    private final String logStream;
    private final int memory;
    private final long deadlineMs;

    LambdaContext(JsonNode msg) {
        requestId = msg.path("request_id").asText("");
        functionName = text(msg, "function_name", env("AWS_LAMBDA_FUNCTION_NAME", ""));
        functionVersion = text(msg, "function_version", env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"));
        arn = msg.path("invoked_function_arn").asText("");
        logStream = text(msg, "log_stream_name", env("AWS_LAMBDA_LOG_STREAM_NAME", ""));
        JsonNode mem = msg.get("memory_limit_mb");
        int m;
        if (mem != null && mem.canConvertToInt()) {
            m = mem.asInt();
        } else {
            try {
                m = Integer.parseInt(env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "0"));
            } catch (NumberFormatException e) {
                m = 0;
            }
        }
        memory = m;
        JsonNode d = msg.get("deadline_ms");
        deadlineMs = d == null || d.isNull() ? -1 : d.asLong();
    }

    private static String env(String k, String dflt) {
        String v = System.getenv(k);
        return v == null ? dflt : v;
    }

    private static String text(JsonNode msg, String k, String dflt) {
        String v = msg.path(k).asText("");
        return v.isEmpty() ? dflt : v;
    }

    @Override
    public String getAwsRequestId() {
        return requestId;
    }

    @Override
    public String getLogGroupName() {
        return env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/" + functionName);
    }

    @Override
    public String getLogStreamName() {
        return logStream;
    }

    @Override
    public String getFunctionName() {
        return functionName;
    }

    @Override
    public String getFunctionVersion() {
        return functionVersion;
    }

    @Override
    public String getInvokedFunctionArn() {
        return arn;
    }

    @Override
    public CognitoIdentity getIdentity() {
        return null;
    }

    @Override
    public ClientContext getClientContext() {
        return null;
    }

    @Override
    public int getRemainingTimeInMillis() {
        if (deadlineMs < 0) {
            return 0;
        }
        return (int) Math.max(0, Math.min(Integer.MAX_VALUE, deadlineMs - System.currentTimeMillis()));
    }

    @Override
    public int getMemoryLimitInMB() {
        return memory;
    }

    @Override
    public LambdaLogger getLogger() {
        return LOGGER;
    }

    @Override
    public String toString() {
        return "LambdaContext[awsRequestId=" + requestId + ",functionName=" + functionName + ",functionVersion="
                + functionVersion + ",invokedFunctionArn=" + arn + ",memoryLimitInMB=" + memory + "]";
    }
}
