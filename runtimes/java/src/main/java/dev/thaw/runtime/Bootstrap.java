package dev.thaw.runtime;

import com.amazonaws.services.lambda.runtime.Context;
import com.amazonaws.services.lambda.runtime.RequestHandler;
import com.amazonaws.services.lambda.runtime.RequestStreamHandler;
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JavaType;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.ParameterizedType;
import java.lang.reflect.Type;
import java.lang.reflect.TypeVariable;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Thaw Java runtime shim (AWS Lambda java17 conventions).
 *
 * <p>Started by /var/runtime/java/bootstrap.sh (JVM flags: see README.md) with cwd = /var/task and
 * {@code _HANDLER = package.Class::method} or {@code package.Class}. fd 0 = /dev/null, fd 1/2 = the
 * function's log pipe, fd 3 = the control channel (connected AF_UNIX SOCK_STREAM). The wire
 * protocol is the Python shim's (runtimes/python/README.md).
 *
 * <p>Snapshot rules: fd 3 is wrapped in a {@link FileDescriptor} (by reflection; needs
 * {@code --add-opens java.base/java.io=ALL-UNNAMED}) and used only through
 * {@link FileInputStream#read(byte[], int, int)} / {@link FileOutputStream#write(byte[])}, i.e.
 * plain blocking read(2)/write(2) (the JDK retries EINTR). While idle the Java main thread blocks
 * in read(2) on fd 3; the runtime starts no threads of its own.
 */
public final class Bootstrap {
    static final int CONTROL_FD = 3;
    static final int MAX_FRAME = 64 * 1024 * 1024;

    /** Frames: compact, ASCII-only JSON. */
    static final ObjectMapper FRAMES = JsonMapper.builder().enable(JsonWriteFeature.ESCAPE_NON_ASCII).build();
    /** Events and results (POJO mapping), configured like Lambda's serializer. */
    static final ObjectMapper MAPPER = JsonMapper.builder()
            .disable(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES)
            .enable(DeserializationFeature.ACCEPT_SINGLE_VALUE_AS_ARRAY)
            .disable(SerializationFeature.FAIL_ON_EMPTY_BEANS)
            .build();

    private static FileInputStream in;
    private static FileOutputStream out;
    private static volatile boolean exitAfterReply;

    private Bootstrap() {
    }

    // ------------------------------------------------------------------
    // fd 3 and framing
    // ------------------------------------------------------------------

    static final class ChannelClosed extends Exception {
        private static final long serialVersionUID = 1L;
    }

    static final class ProtocolError extends Exception {
        private static final long serialVersionUID = 1L;

        ProtocolError(String m) {
            super(m);
        }
    }

    static FileDescriptor fdOf(int n) throws ReflectiveOperationException {
        FileDescriptor fd = new FileDescriptor();
        Field f = FileDescriptor.class.getDeclaredField("fd");
        f.setAccessible(true);
        f.setInt(fd, n);
        return fd;
    }

    static void readExact(byte[] buf, int n) throws IOException, ChannelClosed {
        int got = 0;
        while (got < n) {
            int r;
            try {
                // <- the engine snapshots the process blocked in this read(2)
                r = in.read(buf, got, n - got);
            } catch (IOException e) {
                String m = String.valueOf(e.getMessage());
                if (m.contains("reset") || m.contains("Bad file")) {
                    throw new ChannelClosed();
                }
                throw e;
            }
            if (r < 0) {
                throw new ChannelClosed();
            }
            got += r;
        }
    }

    static JsonNode recv() throws IOException, ChannelClosed, ProtocolError {
        byte[] head = new byte[4];
        readExact(head, 4);
        long n = ((head[0] & 0xffL) << 24) | ((head[1] & 0xff) << 16) | ((head[2] & 0xff) << 8) | (head[3] & 0xff);
        if (n > MAX_FRAME) {
            throw new ProtocolError("frame of " + n + " bytes exceeds the 64 MiB limit");
        }
        byte[] body = new byte[(int) n];
        readExact(body, (int) n);
        JsonNode msg;
        try {
            msg = FRAMES.readTree(body);
        } catch (IOException e) {
            throw new ProtocolError("frame is not valid JSON: " + e.getMessage());
        }
        if (msg == null || !msg.isObject()) {
            throw new ProtocolError("frame is not a JSON object");
        }
        return msg;
    }

    /** The node takes a reply only with its request's nonce (anything else on the
     *  channel is stale or was written by the function itself). */
    static ObjectNode echoNonce(JsonNode msg, ObjectNode reply) {
        if (msg.has("nonce")) {
            reply.set("nonce", msg.get("nonce"));
        }
        return reply;
    }

    static void send(ObjectNode msg) throws ChannelClosed, IOException {
        byte[] body = FRAMES.writeValueAsBytes(msg);
        if (body.length > MAX_FRAME) {
            boolean isResult = "result".equals(msg.path("type").asText());
            body = FRAMES.writeValueAsBytes(isResult
                    ? resultError("Runtime.ResponseSizeTooLarge", "Response of " + body.length + " bytes exceeds the 64 MiB frame limit", List.of())
                    : initError("Runtime.ResponseSizeTooLarge", "init_error frame too large", List.of()));
        }
        byte[] frame = new byte[4 + body.length];
        frame[0] = (byte) (body.length >>> 24);
        frame[1] = (byte) (body.length >>> 16);
        frame[2] = (byte) (body.length >>> 8);
        frame[3] = (byte) body.length;
        System.arraycopy(body, 0, frame, 4, body.length);
        try {
            out.write(frame);
        } catch (IOException e) {
            // EPIPE / ECONNRESET: the node is gone
            throw new ChannelClosed();
        }
    }

    // ------------------------------------------------------------------
    // errors, formatted as Lambda does
    // ------------------------------------------------------------------

    static List<String> stackTrace(Throwable t) {
        List<String> lines = new ArrayList<>();
        for (StackTraceElement e : t.getStackTrace()) {
            String c = e.getClassName();
            if (c.startsWith("dev.thaw.runtime.") || c.startsWith("jdk.internal.reflect.") || c.startsWith("java.lang.reflect.")) {
                continue;
            }
            String where = e.isNativeMethod() ? "Native Method"
                    : e.getFileName() == null ? "Unknown Source"
                    : e.getLineNumber() >= 0 ? e.getFileName() + ":" + e.getLineNumber() : e.getFileName();
            lines.add(c + "." + e.getMethodName() + "(" + where + ")");
        }
        return lines;
    }

    static ObjectNode errorBody(String type, String message, List<String> stack) {
        ObjectNode e = FRAMES.createObjectNode();
        e.put("errorType", type);
        e.put("errorMessage", message == null ? "" : message);
        e.putArray("stackTrace").addAll(stack.stream().map(s -> FRAMES.getNodeFactory().textNode(s)).toList());
        return e;
    }

    static ObjectNode resultError(String type, String message, List<String> stack) {
        ObjectNode r = FRAMES.createObjectNode();
        r.put("type", "result");
        r.put("ok", false);
        r.set("error", errorBody(type, message, stack));
        return r;
    }

    static ObjectNode initError(String type, String message, List<String> stack) {
        ObjectNode r = errorBody(type, message, stack);
        ObjectNode f = FRAMES.createObjectNode();
        f.put("type", "init_error");
        f.setAll(r);
        return f;
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof InvocationTargetException || t instanceof ExceptionInInitializerError) && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    static final class InitFault extends Exception {
        private static final long serialVersionUID = 1L;
        final String type;

        InitFault(String type, String message) {
            super(message);
            this.type = type;
        }
    }

    // ------------------------------------------------------------------
    // handler loading
    // ------------------------------------------------------------------

    /** One way of calling the function. */
    interface Invoker {
        /** Returns the JSON text of the result. */
        String invoke(String payload, Context ctx) throws Throwable;

        /** Types the mapper should know before the snapshot (warm-up). */
        default List<Type> types() {
            return List.of();
        }
    }

    static final class UnmarshalFault extends Exception {
        private static final long serialVersionUID = 1L;

        UnmarshalFault(String m) {
            super(m);
        }
    }

    static final class MarshalFault extends Exception {
        private static final long serialVersionUID = 1L;

        MarshalFault(String m) {
            super(m);
        }
    }

    static Object toInput(Type type, String payload) throws UnmarshalFault {
        if (type == InputStream.class) {
            return new ByteArrayInputStream(payload == null ? new byte[0] : payload.getBytes(StandardCharsets.UTF_8));
        }
        if (payload == null || payload.isEmpty()) {
            return null;
        }
        try {
            if (type == String.class) {
                // A JSON string is unwrapped; any other JSON is passed as its text.
                JsonNode n = MAPPER.readTree(payload);
                return n != null && n.isTextual() ? n.textValue() : payload;
            }
            JavaType jt = MAPPER.getTypeFactory().constructType(type);
            return MAPPER.readValue(payload, jt);
        } catch (IOException e) {
            throw new UnmarshalFault("Unable to unmarshal input: " + (e instanceof com.fasterxml.jackson.core.JsonProcessingException jp ? jp.getOriginalMessage() : e.getMessage()));
        }
    }

    static String fromOutput(Object value) throws MarshalFault {
        try {
            return MAPPER.writeValueAsString(value);
        } catch (IOException | RuntimeException e) {
            throw new MarshalFault("Unable to marshal response: " + e.getMessage());
        }
    }

    static String streamResult(ByteArrayOutputStream bytes) {
        String text = bytes.toString(StandardCharsets.UTF_8);
        if (text.isEmpty()) {
            return "null";
        }
        try {
            MAPPER.readTree(text);
            return text;
        } catch (IOException e) {
            // The protocol carries JSON text: non-JSON output becomes a JSON string.
            try {
                return MAPPER.writeValueAsString(text);
            } catch (IOException e2) {
                return "null";
            }
        }
    }

    /** The I of RequestHandler&lt;I, O&gt; as implemented by cls (Object if raw). */
    static Type requestHandlerInput(Class<?> cls) {
        for (Class<?> c = cls; c != null && c != Object.class; c = c.getSuperclass()) {
            for (Type t : c.getGenericInterfaces()) {
                if (t instanceof ParameterizedType p && p.getRawType() == RequestHandler.class) {
                    Type in = p.getActualTypeArguments()[0];
                    return in instanceof TypeVariable ? Object.class : in;
                }
            }
            Type sup = c.getGenericSuperclass();
            if (sup instanceof ParameterizedType p && RequestHandler.class.isAssignableFrom((Class<?>) p.getRawType())) {
                // generic base class: look for a concrete argument in the subclass declaration
                for (Type a : p.getActualTypeArguments()) {
                    if (!(a instanceof TypeVariable)) {
                        return a;
                    }
                }
            }
        }
        return Object.class;
    }

    static Object instantiate(Class<?> cls) throws Throwable {
        Constructor<?> k;
        try {
            k = cls.getDeclaredConstructor();
        } catch (NoSuchMethodException e) {
            throw new InitFault("Runtime.HandlerNotFound", "Class " + cls.getName() + " has no public no-argument constructor");
        }
        k.setAccessible(true);
        try {
            return k.newInstance();
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
    }

    static boolean isStreamSig(Class<?>[] p) {
        return p.length >= 2 && p[0] == InputStream.class && p[1] == OutputStream.class
                && (p.length == 2 || (p.length == 3 && p[2] == Context.class));
    }

    static int score(Method m) {
        Class<?>[] p = m.getParameterTypes();
        if (isStreamSig(p)) {
            return 10 + p.length;
        }
        if (p.length == 2 && p[1] == Context.class) {
            return 5;
        }
        if (p.length <= 1) {
            return p.length + 1;
        }
        return -1;
    }

    static Invoker load(String handler) throws Throwable {
        if (handler == null || handler.isEmpty()) {
            throw new InitFault("Runtime.MalformedHandlerName", "Bad handler '': expected package.Class::method or package.Class");
        }
        String className = handler;
        String methodName = null;
        int sep = handler.indexOf("::");
        if (sep >= 0) {
            className = handler.substring(0, sep);
            methodName = handler.substring(sep + 2);
            if (className.isEmpty() || methodName.isEmpty() || methodName.contains(":")) {
                throw new InitFault("Runtime.MalformedHandlerName", "Bad handler '" + handler + "': expected package.Class::method or package.Class");
            }
        }
        Class<?> cls;
        try {
            // initialize = true: static initializers are part of the function's init
            cls = Class.forName(className, true, functionLoader);
        } catch (ClassNotFoundException | NoClassDefFoundError e) {
            if (e instanceof ClassNotFoundException || className.replace('.', '/').equals(e.getMessage())) {
                throw new InitFault("java.lang.ClassNotFoundException", "Class not found: " + className);
            }
            throw e;
        }
        if (methodName == null) {
            if (RequestStreamHandler.class.isAssignableFrom(cls)) {
                RequestStreamHandler h = (RequestStreamHandler) instantiate(cls);
                return (payload, ctx) -> {
                    ByteArrayOutputStream os = new ByteArrayOutputStream();
                    h.handleRequest((InputStream) toInput(InputStream.class, payload), os, ctx);
                    return streamResult(os);
                };
            }
            if (RequestHandler.class.isAssignableFrom(cls)) {
                @SuppressWarnings("unchecked")
                RequestHandler<Object, Object> h = (RequestHandler<Object, Object>) instantiate(cls);
                Type in = requestHandlerInput(cls);
                return new Invoker() {
                    @Override
                    public String invoke(String payload, Context ctx) throws Throwable {
                        Object input = toInput(in, payload);
                        Object r;
                        try {
                            r = h.handleRequest(input, ctx);
                        } catch (ClassCastException e) {
                            throw e;
                        }
                        return fromOutput(r);
                    }

                    @Override
                    public List<Type> types() {
                        return List.of(in);
                    }
                };
            }
            throw new InitFault("Runtime.HandlerNotFound", "Class " + className
                    + " does not implement RequestHandler or RequestStreamHandler; use " + className + "::method");
        }
        Method best = null;
        int bestScore = -1;
        for (Method m : cls.getMethods()) {
            if (!m.getName().equals(methodName) || m.isBridge() || m.isSynthetic()) {
                continue;
            }
            int s = score(m);
            if (s > bestScore) {
                best = m;
                bestScore = s;
            }
        }
        if (best == null) {
            throw new InitFault("Runtime.HandlerNotFound", "No public method named " + methodName
                    + " with appropriate method signature found on class " + className);
        }
        final Method method = best;
        method.setAccessible(true);
        final Object target = Modifier.isStatic(method.getModifiers()) ? null : instantiate(cls);
        final Class<?>[] ptypes = method.getParameterTypes();
        final Type[] gtypes = method.getGenericParameterTypes();
        final boolean stream = isStreamSig(ptypes);
        final boolean isVoid = method.getReturnType() == void.class;
        return new Invoker() {
            @Override
            public String invoke(String payload, Context ctx) throws Throwable {
                Object[] args = new Object[ptypes.length];
                ByteArrayOutputStream os = null;
                if (stream) {
                    os = new ByteArrayOutputStream();
                    args[0] = toInput(InputStream.class, payload);
                    args[1] = os;
                    if (args.length == 3) {
                        args[2] = ctx;
                    }
                } else if (ptypes.length >= 1) {
                    args[0] = ptypes[0] == Context.class ? ctx : toInput(gtypes[0], payload);
                    if (ptypes.length == 2) {
                        args[1] = ctx;
                    }
                }
                Object r;
                try {
                    r = method.invoke(target, args);
                } catch (InvocationTargetException e) {
                    throw e.getCause();
                }
                if (stream) {
                    return streamResult(os);
                }
                return isVoid ? "null" : fromOutput(r);
            }

            @Override
            public List<Type> types() {
                return stream || ptypes.length == 0 ? List.of() : List.of(gtypes[0]);
            }
        };
    }

    // ------------------------------------------------------------------
    // invocation
    // ------------------------------------------------------------------

    static void flushLogs() {
        System.out.flush();
        System.err.flush();
    }

    static ObjectNode invoke(Invoker inv, JsonNode msg) {
        JsonNode p = msg.get("payload");
        String payload = p == null || p.isNull() ? null : p.asText();
        Env.takeIdentity(msg);
        LambdaContext ctx = new LambdaContext(msg);
        try {
            String text = inv.invoke(payload, ctx);
            ObjectNode r = FRAMES.createObjectNode();
            r.put("type", "result");
            r.put("ok", true);
            r.put("result", text);
            return r;
        } catch (UnmarshalFault e) {
            return resultError("Runtime.UnmarshalError", e.getMessage(), List.of());
        } catch (MarshalFault e) {
            return resultError("Runtime.MarshalError", e.getMessage(), List.of());
        } catch (Throwable t) {
            t = unwrap(t);
            if (t instanceof VirtualMachineError) {
                // As Lambda: the JVM is not trusted after OutOfMemoryError & co.
                exitAfterReply = true;
            }
            return resultError(t.getClass().getName(), t.getMessage(), stackTrace(t));
        }
    }

    // ------------------------------------------------------------------
    // snapshot hooks and reseeding
    // ------------------------------------------------------------------

    static void beforeSnapshot() throws Exception {
        List<Runnable> hooks = Hooks.beforeSnapshot();
        for (int i = hooks.size() - 1; i >= 0; i--) {
            hooks.get(i).run();
        }
        org.crac.Core.getGlobalContext().beforeCheckpoint(null);
    }

    static void afterRestore() throws Exception {
        Reseed.all();
        org.crac.Core.getGlobalContext().afterRestore(null);
        for (Runnable r : Hooks.afterRestore()) {
            r.run();
        }
    }

    // ------------------------------------------------------------------
    // main
    // ------------------------------------------------------------------

    static void warmUp(Invoker inv) {
        // Run, once, every runtime path a restored instance takes before and around the first
        // call of the function, so that the classes are loaded and linked and the method handles
        // spun in the snapshot, not on each restored instance's first invocation. The function
        // itself is not called.
        try {
            for (Type t : inv == null ? List.<Type>of() : inv.types()) {
                JavaType jt = MAPPER.getTypeFactory().constructType(t);
                MAPPER.readerFor(jt);
                if (jt.getRawClass() != Object.class && !jt.isPrimitive()) {
                    MAPPER.writerFor(jt);
                }
                // Decode a sample event only into JDK types: decoding into the function's own
                // classes would run its constructors. (An Integer input rejects an object: fine.)
                if (jt.getRawClass().getName().startsWith("java.")) {
                    try {
                        toInput(t, "{\"name\":\"warm-up\",\"n\":1,\"x\":[1.5,true,null]}");
                    } catch (Exception ignored) {
                        // the type does not take a JSON object: the rest of the warm-up still runs
                    }
                }
            }
            MAPPER.readValue("{\"a\":[1,2.5,\"x\",true,null]}", Map.class);
            fromOutput(Map.of("a", List.of(1, 2.5, "x", true)));
            fromOutput("warm-up");
            // The control channel's receive path (the first frame arrives after the snapshot),
            // the context, and the reply frames.
            byte[] frame = ("{\"type\":\"invoke\",\"request_id\":\"warm-up\",\"payload\":\"{}\",\"function_name\":\"f\","
                    + "\"function_version\":\"1\",\"invoked_function_arn\":\"arn\",\"memory_limit_mb\":128,"
                    + "\"deadline_ms\":" + System.currentTimeMillis() + "}").getBytes(StandardCharsets.UTF_8);
            JsonNode msg = FRAMES.readTree(frame);
            msg.path("type").asText("");
            LambdaContext ctx = new LambdaContext(msg);
            ctx.getRemainingTimeInMillis();
            // The per-call environment update's reflection, resolved ahead (sets what is there).
            String version = System.getenv("AWS_LAMBDA_FUNCTION_VERSION");
            if (version != null) {
                Env.set("AWS_LAMBDA_FUNCTION_VERSION", version);
            }
            ctx.getLogger();
            ObjectNode r = FRAMES.createObjectNode();
            r.put("type", "result");
            r.put("ok", true);
            r.put("result", "\"warm-up\"");
            FRAMES.writeValueAsBytes(r);
            ObjectNode ok = FRAMES.createObjectNode();
            ok.put("type", "ok");
            FRAMES.writeValueAsBytes(ok);
            FRAMES.writeValueAsBytes(resultError("x", "y", List.of("z")));
            // What runs after every restore (generators are reseeded again then).
            Reseed.all();
            primeStringConcat(ctx.getAwsRequestId(), 7, 7L, 1.5, true, 'c', ctx);
        } catch (Throwable ignored) {
            // best effort
        }
    }

    /**
     * Link string concatenations of common shapes (javac compiles {@code "a" + x} to an
     * invokedynamic call whose first execution spins method handles for its argument types, a
     * few milliseconds each): the pieces are cached by the JDK and shared by the function's own
     * concatenations of the same kinds.
     */
    static void primeStringConcat(String s, int i, long l, double d, boolean b, char c, Object o) {
        String[] out = {
            "a" + s, "a" + o, "a" + i, "a" + l,
            "a" + s + "b", "a" + o + "b", "a" + i + "b", s + "b" + s,
            "a" + s + "b" + s, "a" + o + "b" + s, "a" + s + "b" + o + "c", "a" + o + "b" + o + "c",
            "a" + i + "b" + s + "c", "a" + s + "b" + i + "c", "a" + l + "b" + s, "a" + d + "b" + b + "c" + c,
            "a" + s + "b" + s + "c" + s + "d", "a" + o + "b" + o + "c" + o + "d", "a" + s + "b" + i + "c" + s + "d" + o,
        };
        if (out.length == 0) {
            throw new AssertionError();
        }
    }

    /**
     * The reply to {@code restored} (a restored clone, a base or a function's): reseed, run
     * the after-restore hooks; {@code ok}, or the error a hook threw.
     */
    static ObjectNode restoredReply(JsonNode msg) {
        ObjectNode reply = FRAMES.createObjectNode();
        try {
            afterRestore();
            reply.put("type", "ok");
        } catch (Throwable t) {
            t = unwrap(t);
            Throwable shown = t.getSuppressed().length > 0 ? t.getSuppressed()[0] : t;
            reply.put("type", "error");
            reply.setAll(errorBody(shown.getClass().getName(), "afterRestore failed: " + shown.getMessage(), stackTrace(shown)));
        }
        flushLogs();
        return echoNonce(msg, reply);
    }

    /**
     * Where the function's classes come from: the system class loader, with the function's
     * bundle on its class path from the start (bootstrap.sh) or, in a base, which started
     * before any function was known, appended by {@link #waitAsBase} ({@link #bundleLoader}).
     */
    static ClassLoader functionLoader = ClassLoader.getSystemClassLoader();

    /**
     * A base (THAW_BASE=1): the JVM and the runtime are started and warmed up with no
     * function, report ready as a base and wait (the engine captures them blocked in this
     * read). The {@code load} frame brings the function's environment; its classes then
     * come from the bundle, on the system class loader's path ({@link #bundleLoader}).
     * False on shutdown.
     */
    static boolean waitAsBase() throws IOException, ChannelClosed, ProtocolError {
        warmUp(null);
        System.gc();
        flushLogs();
        ObjectNode ready = FRAMES.createObjectNode();
        ready.put("type", "ready");
        ready.put("base", true);
        ready.put("restore_notice", true);
        send(ready);
        JsonNode msg;
        for (;;) {
            msg = recv(); // <- the engine snapshots a base blocked in this read
            String type = msg.path("type").asText("");
            if (type.equals("load")) {
                break;
            } else if (type.equals("restored")) {
                send(restoredReply(msg));
            } else if (type.equals("shutdown")) {
                return false;
            } else {
                throw new ProtocolError("a base expects load, got \"" + type + "\"");
            }
        }
        JsonNode env = msg.path("env");
        if (!env.isObject()) {
            throw new ProtocolError("load carries no environment object");
        }
        Map<String, String> wanted = new java.util.HashMap<>();
        for (Map.Entry<String, JsonNode> e : (Iterable<Map.Entry<String, JsonNode>>) env::fields) {
            if (!e.getValue().isTextual()) {
                throw new ProtocolError("load's environment value of " + e.getKey() + " is not a string");
            }
            wanted.put(e.getKey(), e.getValue().asText());
        }
        if (!Env.replaceAll(wanted)) {
            throw new ProtocolError("this JVM's environment cannot be changed (needs bootstrap.sh's --add-opens java.base/java.util and -Dthaw.native, libthawenv.so: scripts/build-runtimes.sh)");
        }
        String task = wanted.getOrDefault("LAMBDA_TASK_ROOT", "/var/task");
        // A base instance repurposed for this function (the engine's Instance::load_into)
        // still has its cwd on the /var/task this function's code replaced.
        if (!Env.chdir(task)) {
            throw new ProtocolError("cannot change the working directory to " + task + " (libthawenv.so: scripts/build-runtimes.sh)");
        }
        // THAW_JAVA_FUNCTION_LOADER=own: a loader of the bundle's own (the baseline of
        // bench/layers.py's java samples), else the system one.
        functionLoader = "own".equals(wanted.get("THAW_JAVA_FUNCTION_LOADER")) ? ownLoader(bundlePath(task)) : bundleLoader(task);
        Thread.currentThread().setContextClassLoader(functionLoader);
        return true;
    }

    /**
     * The class path bootstrap.sh gives a function's JVM: the bundle's directory, its
     * lib/*.jar, its *.jar, then its layers' /opt/java/lib/*.jar.
     */
    static List<Path> bundlePath(String task) throws IOException {
        List<Path> path = new ArrayList<>();
        path.add(Path.of(task));
        for (Path dir : List.of(Path.of(task, "lib"), Path.of(task), Path.of("/opt/java/lib"))) {
            if (!Files.isDirectory(dir)) {
                continue;
            }
            List<Path> jars = new ArrayList<>();
            try (DirectoryStream<Path> ds = Files.newDirectoryStream(dir, "*.jar")) {
                for (Path j : ds) {
                    jars.add(j);
                }
            }
            jars.sort(null);
            path.addAll(jars);
        }
        return path;
    }

    /**
     * The loader of a function loaded into a base: the system class loader with the
     * bundle's class path appended (what the JDK does for an agent's
     * appendToSystemClassLoaderSearch; bootstrap.sh opens jdk.internal.loader to this
     * shim for it), and {@code java.class.path} naming it, so the function sees the
     * JVM a full image's does. A loader of its own would resolve, on the first
     * invocation, every class the function names through Java code the full image's
     * JVM never runs then (issue #31: java/jsonhandler's first call 2.9 ms slower).
     * Where the JVM refuses that, a loader of the bundle's own over the system one.
     */
    static ClassLoader bundleLoader(String task) throws IOException {
        List<Path> path = bundlePath(task);
        ClassLoader app = ClassLoader.getSystemClassLoader();
        try {
            Method append = app.getClass().getDeclaredMethod("appendToClassPathForInstrumentation", String.class);
            append.setAccessible(true);
            StringBuilder cp = new StringBuilder(System.getProperty("java.class.path", ""));
            for (Path p : path) {
                append.invoke(app, p.toString());
                cp.append(cp.length() == 0 ? "" : java.io.File.pathSeparator).append(p);
            }
            System.setProperty("java.class.path", cp.toString());
            return app;
        } catch (ReflectiveOperationException | RuntimeException e) {
            System.err.println("thaw runtime: the system class loader cannot take the function's class path (" + e
                + "; bootstrap.sh opens java.base/jdk.internal.loader); its classes come from a loader of their own");
            return ownLoader(path);
        }
    }

    /** A loader named {@code function} of the class path {@code path}, over the system one. */
    static ClassLoader ownLoader(List<Path> path) throws IOException {
        List<URL> urls = new ArrayList<>();
        for (Path p : path) {
            urls.add(p.toUri().toURL());
        }
        return new URLClassLoader("function", urls.toArray(new URL[0]), ClassLoader.getSystemClassLoader());
    }

    public static void main(String[] args) {
        int code;
        try {
            code = run();
        } catch (Throwable t) {
            System.err.println("thaw runtime: internal error: " + t);
            t.printStackTrace();
            code = 3;
        }
        flushLogs();
        System.exit(code);
    }

    static int run() throws Exception {
        in = new FileInputStream(fdOf(CONTROL_FD));
        out = new FileOutputStream(fdOf(CONTROL_FD));

        boolean base = "1".equals(System.getenv("THAW_BASE"));
        if (base) {
            try {
                if (!waitAsBase()) {
                    return 0;
                }
            } catch (ChannelClosed e) {
                return 0;
            } catch (ProtocolError e) {
                System.err.println("thaw runtime: protocol error: " + e.getMessage());
                return 2;
            }
        }
        Invoker inv;
        try {
            inv = load(System.getenv("_HANDLER"));
            beforeSnapshot();
        } catch (InitFault f) {
            return initFailed(initError(f.type, f.getMessage(), List.of()));
        } catch (Throwable t) {
            t = unwrap(t);
            return initFailed(initError(t.getClass().getName(), t.getMessage(), stackTrace(t)));
        }
        if ("1".equals(System.getenv("THAW_SNAPSHOT"))) {
            // This instance is about to be captured (a plain cold boot skips the warm-up).
            warmUp(inv);
        }
        // Collect init garbage so the snapshot holds live objects only.
        System.gc();
        flushLogs();
        try {
            ObjectNode ready = FRAMES.createObjectNode();
            ready.put("type", "ready");
            send(ready);
            for (;;) {
                JsonNode msg = recv(); // blocking read(2) on fd 3, main thread
                String type = msg.path("type").asText("");
                switch (type) {
                    case "invoke": {
                        ObjectNode reply = invoke(inv, msg);
                        flushLogs();
                        send(echoNonce(msg, reply));
                        if (exitAfterReply) {
                            return 1;
                        }
                        break;
                    }
                    case "restored":
                        send(restoredReply(msg));
                        break;
                    case "shutdown":
                        return 0;
                    default:
                        throw new ProtocolError("unknown message type \"" + type + "\"");
                }
            }
        } catch (ChannelClosed e) {
            return 0;
        } catch (ProtocolError e) {
            System.err.println("thaw runtime: protocol error: " + e.getMessage());
            return 2;
        }
    }

    static int initFailed(ObjectNode frame) {
        flushLogs();
        try {
            send(frame);
        } catch (Exception ignored) {
            // node gone
        }
        return 1;
    }
}
