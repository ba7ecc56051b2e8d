"""Protocol tests for the Java shim (dev.thaw.runtime.Bootstrap), driven through runtimes/harness.py.

Needs build/runtimes/java/thaw-java-runtime.jar (scripts/build-runtimes.sh) and a JDK 17.

    .venv/bin/python -m pytest -q runtimes/java
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shimtest  # noqa: E402

JAVAC = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac"
JAR = shimtest.harness.JAVA_JAR

SOURCES = {
    "example/Hello.java": """
        package example;
        import com.amazonaws.services.lambda.runtime.*;
        import java.util.Map;
        public class Hello implements RequestHandler<Map<String, Object>, String> {
            static { System.out.println("static init ran"); }
            public String handleRequest(Map<String, Object> event, Context ctx) {
                ctx.getLogger().log("invoke " + ctx.getAwsRequestId() + "\\n");
                System.err.println("stderr line");
                return "Hello " + event.get("name") + " " + ctx.getFunctionName() + " " + ctx.getMemoryLimitInMB()
                    + " " + (ctx.getRemainingTimeInMillis() > 0) + " " + ctx.getLogGroupName();
            }
        }
    """,
    "example/Pojo.java": """
        package example;
        import com.amazonaws.services.lambda.runtime.*;
        import java.util.List;
        public class Pojo implements RequestHandler<Pojo.In, Pojo.Out> {
            public static class In { public String name; private int count; public int getCount() { return count; } public void setCount(int c) { count = c; } }
            public static class Out { public String greeting; public List<Integer> counts; public String nonAscii = "h\\u00e9"; }
            public Out handleRequest(In in, Context ctx) {
                Out o = new Out(); o.greeting = "hi " + in.name; o.counts = List.of(in.getCount(), in.getCount() * 2); return o;
            }
        }
    """,
    "example/Stream.java": """
        package example;
        import com.amazonaws.services.lambda.runtime.*;
        import java.io.*;
        public class Stream implements RequestStreamHandler {
            public void handleRequest(InputStream in, OutputStream out, Context ctx) throws IOException {
                byte[] b = in.readAllBytes();
                out.write(("{\\"len\\":" + b.length + "}").getBytes());
            }
        }
    """,
    "example/Methods.java": """
        package example;
        import com.amazonaws.services.lambda.runtime.Context;
        import java.io.*;
        import java.util.*;
        public class Methods {
            private final long created = System.nanoTime();
            public static int square(int x) { return x * x; }
            public String str(String s, Context ctx) { return s.toUpperCase() + ":" + ctx.getAwsRequestId(); }
            public Map<String, Object> map(Map<String, Object> m) { Map<String, Object> r = new TreeMap<>(m); r.put("seen", true); return r; }
            public void nothing(Object o) { }
            public static String noargs() { return "none"; }
            public void stream(InputStream in, OutputStream out) throws IOException { out.write("not json".getBytes()); }
            public List<Double> list(List<Double> xs) { List<Double> r = new ArrayList<>(); for (Double d : xs) r.add(d * 2); return r; }
            public String fail(Map<String, Object> m) { throw new IllegalStateException("bad state " + m.get("x")); }
            public Object unmarshallable(Map<String, Object> m) { return new Object() { public Object getSelf() { return this; } }; }
            public int oom(Map<String, Object> m) { throw new OutOfMemoryError("simulated"); }
        }
    """,
    "example/Broken.java": """
        package example;
        public class Broken {
            static { if (true) throw new IllegalArgumentException("static init failed"); }
            public static String handle(String s) { return s; }
        }
    """,
    "example/Layered.java": """
        package example;
        import java.util.*;
        public class Layered {
            static final String SEEN = System.getenv("SECRET");
            public Map<String, Object> handle(Map<String, Object> e) {
                Map<String, Object> r = new TreeMap<>();
                r.put("init", SEEN);
                r.put("now", System.getenv("SECRET"));
                r.put("base", System.getenv("THAW_BASE"));
                r.put("loader", Layered.class.getClassLoader().getName());
                r.put("context", Thread.currentThread().getContextClassLoader() == Layered.class.getClassLoader());
                try {
                    Process p = new ProcessBuilder("/bin/sh", "-c", "printf %s \\"$SECRET${THAW_BASE:-}\\"").start();
                    r.put("child", new String(p.getInputStream().readAllBytes()));
                } catch (java.io.IOException x) {
                    r.put("child", x.toString());
                }
                return r;
            }
        }
    """,
    "example/NotAHandler.java": """
        package example;
        public class NotAHandler { public String run(String s) { return s; } }
    """,
    "example/Hooked.java": """
        package example;
        import com.amazonaws.services.lambda.runtime.*;
        import java.security.SecureRandom;
        import java.util.*;
        import java.util.concurrent.ThreadLocalRandom;
        import org.crac.Core;
        import org.crac.Resource;
        public class Hooked implements RequestHandler<Map<String, Object>, Map<String, Object>>, Resource {
            static final List<String> EVENTS = Collections.synchronizedList(new ArrayList<>());
            static final SecureRandom SR = dev.thaw.runtime.Hooks.registerSecureRandom(new SecureRandom());
            public Hooked() {
                Core.getGlobalContext().register(this);
                dev.thaw.runtime.Hooks.registerBeforeSnapshot(() -> EVENTS.add("hooks-before"));
                dev.thaw.runtime.Hooks.registerAfterRestore(() -> EVENTS.add("hooks-after"));
                Math.random();
            }
            public void beforeCheckpoint(org.crac.Context<? extends Resource> c) { EVENTS.add("crac-before"); }
            public void afterRestore(org.crac.Context<? extends Resource> c) { EVENTS.add("crac-after"); }
            public Map<String, Object> handleRequest(Map<String, Object> e, Context ctx) {
                Map<String, Object> r = new HashMap<>();
                r.put("events", new ArrayList<>(EVENTS));
                r.put("math", Math.random());
                r.put("tlr", ThreadLocalRandom.current().nextLong());
                r.put("sr", SR.nextLong());
                return r;
            }
        }
    """,
}


@unittest.skipUnless(os.path.exists(JAVAC) and os.path.exists(JAR), "needs JDK 17 and the runtime jar (scripts/build-runtimes.sh)")
class JavaShimTest(shimtest.ShimTestCase):
    RUNTIME = "java"
    classes = None

    @classmethod
    def setUpClass(cls):
        cls.src = tempfile.mkdtemp(prefix="thaw-java-src-")
        cls.classes = tempfile.mkdtemp(prefix="thaw-java-classes-")
        files = []
        for rel, text in SOURCES.items():
            p = os.path.join(cls.src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
            files.append(p)
        subprocess.run([JAVAC, "-nowarn", "-cp", JAR, "-d", cls.classes] + files, check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.src, ignore_errors=True)
        shutil.rmtree(cls.classes, ignore_errors=True)

    def setUp(self):
        super().setUp()
        shutil.rmtree(self.dir)
        shutil.copytree(self.classes, self.dir)

    def test_request_handler_map(self):
        rt = self.start("example.Hello")
        self.assertReady(rt)
        shimtest.wait_blocked_in_read_fd3(rt.pid, tid=self.java_main_tid(rt))
        r = rt.invoke({"name": "é"}, request_id="r1")
        self.assertTrue(r["ok"], r)
        self.assertEqual(json.loads(r["result"]), "Hello é test-fn 128 true /aws/lambda/test-fn")
        log = rt.read_log()
        self.assertIn("static init ran", log)
        self.assertIn("invoke r1", log)
        self.assertIn("stderr line", log)
        self.assertEqual(rt.shutdown(), 0)

    def java_main_tid(self, rt):
        # The java launcher's primordial thread waits for the "main" Java thread (the 2nd task).
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % rt.pid))
        return tids[1]

    def test_pojo_handler(self):
        rt = self.start("example.Pojo")
        self.assertReady(rt)
        r = rt.invoke({"name": "ann", "count": 3, "unknown": 1})
        self.assertTrue(r["ok"], r)
        self.assertEqual(json.loads(r["result"]), {"greeting": "hi ann", "counts": [3, 6], "nonAscii": "hé"})
        r = rt.invoke({"count": "x"})
        self.assertEqual(r["error"]["errorType"], "Runtime.UnmarshalError")

    def test_stream_handler(self):
        rt = self.start("example.Stream")
        self.assertReady(rt)
        self.assertEqual(json.loads(rt.invoke('{"a":1}')["result"]), {"len": 7})

    def test_method_handlers(self):
        cases = [
            ("example.Methods::square", "7", 49),
            ("example.Methods::str", '"abc"', "ABC:req-1"),
            ("example.Methods::map", '{"b":1}', {"b": 1, "seen": True}),
            ("example.Methods::nothing", "{}", None),
            ("example.Methods::noargs", "{}", "none"),
            ("example.Methods::stream", "{}", "not json"),
            ("example.Methods::list", "[1.5, 2]", [3.0, 4.0]),
        ]
        for handler, payload, want in cases:
            rt = self.start(handler)
            self.assertReady(rt)
            r = rt.invoke(payload)
            self.assertTrue(r["ok"], (handler, r))
            self.assertEqual(json.loads(r["result"]), want, handler)
            rt.close()

    def test_invocation_errors(self):
        rt = self.start("example.Methods::fail")
        self.assertReady(rt)
        r = rt.invoke({"x": 5})
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["errorType"], "java.lang.IllegalStateException")
        self.assertEqual(r["error"]["errorMessage"], "bad state 5")
        self.assertEqual(r["error"]["stackTrace"][0], "example.Methods.fail(Methods.java:15)")
        r = rt.invoke("{broken")
        self.assertEqual(r["error"]["errorType"], "Runtime.UnmarshalError")
        self.assertEqual(rt.invoke({"x": 1})["error"]["errorMessage"], "bad state 1")  # still serving
        rt2 = self.start("example.Methods::unmarshallable")
        self.assertReady(rt2)
        self.assertEqual(rt2.invoke({})["error"]["errorType"], "Runtime.MarshalError")
        rt3 = self.start("example.Methods::oom")
        self.assertReady(rt3)
        self.assertEqual(rt3.invoke({})["error"]["errorType"], "java.lang.OutOfMemoryError")
        self.assertEqual(rt3.close(), 1)  # the JVM is not trusted after a VirtualMachineError

    def test_init_errors(self):
        rt = self.start("example.Missing::handle")
        self.assertEqual(rt.init["type"], "init_error")
        self.assertEqual(rt.init["errorType"], "java.lang.ClassNotFoundException")
        self.assertEqual(rt.init["errorMessage"], "Class not found: example.Missing")
        self.assertEqual(rt.close(), 1)
        rt = self.start("example.Methods::nosuch")
        self.assertEqual(rt.init["errorType"], "Runtime.HandlerNotFound")
        rt = self.start("example.NotAHandler")
        self.assertEqual(rt.init["errorType"], "Runtime.HandlerNotFound")
        rt = self.start("example.Methods::")
        self.assertEqual(rt.init["errorType"], "Runtime.MalformedHandlerName")
        rt = self.start("example.Broken::handle")
        self.assertEqual(rt.init["errorType"], "java.lang.IllegalArgumentException")
        self.assertEqual(rt.init["errorMessage"], "static init failed")
        self.assertTrue(rt.init["stackTrace"][0].startswith("example.Broken.<clinit>(Broken.java:"), rt.init)

    def test_hooks_crac_and_restored(self):
        rt = self.start("example.Hooked")
        self.assertReady(rt)
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v["events"], ["hooks-before", "crac-before"])
        self.assertEqual(rt.restored(), {"type": "ok"})
        v2 = json.loads(rt.invoke({})["result"])
        self.assertEqual(v2["events"], ["hooks-before", "crac-before", "crac-after", "hooks-after"])
        self.assertTrue(0 <= v2["math"] < 1)

    def test_eof_and_unknown_frame(self):
        rt = self.start("example.Hello")
        self.assertReady(rt)
        self.assertEqual(rt.close(), 0)
        rt = self.start("example.Hello")
        self.assertReady(rt)
        rt.send({"type": "bogus"})
        self.assertEqual(rt.close(), 2)
        self.assertIn("protocol error", rt.read_log())


    # ---- base ------------------------------------------------------------
    def test_base_waits_for_its_function_then_takes_its_environment(self):
        # The function's classes: on the system class loader's path (as in a full image's
        # JVM), or, asked for by THAW_JAVA_FUNCTION_LOADER=own, a loader of their own.
        for own, loader in ((None, "app"), ("own", "function")):
            rt = self.start("", env={"THAW_BASE": "1", "SECRET": "from-the-boot"})
            self.assertEqual(rt.init, {"type": "ready", "base": True, "restore_notice": True}, rt.read_log())
            rt.send({"type": "restored", "nonce": "n1"})
            self.assertEqual(rt.recv(), {"type": "ok", "nonce": "n1"})
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
            env.update(_HANDLER="example.Layered::handle", LAMBDA_TASK_ROOT=self.dir, SECRET="s3", AWS_LAMBDA_FUNCTION_NAME="layered")
            if own:
                env["THAW_JAVA_FUNCTION_LOADER"] = own
            rt.send({"type": "load", "env": env})
            self.assertEqual(rt.recv()["type"], "ready", rt.read_log())
            v = json.loads(rt.invoke({})["result"])
            # The function sees the environment `load` carried, nothing of the base's, and
            # its loader is also the context one. A child process inherits that
            # environment too (the C library's, set natively).
            self.assertEqual(v, {"init": "s3", "now": "s3", "base": None, "loader": loader, "context": True, "child": "s3"}, rt.read_log())
            self.assertEqual(rt.shutdown(), 0)

    def test_base_rejects_anything_but_load(self):
        self.assertBaseTakesOnlyLoad("is not a string")


if __name__ == "__main__":
    unittest.main()
