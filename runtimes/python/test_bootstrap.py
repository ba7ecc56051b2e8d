"""Protocol tests for bootstrap.py (stdlib only).

    /usr/bin/python3 -m unittest runtimes/python/test_bootstrap.py
"""

import json
import os
import socket
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # shimtest
sys.path.insert(0, HERE)  # harness: the Python binding, ahead of runtimes/harness.py
import harness  # noqa: E402
import shimtest  # noqa: E402


class BootstrapTest(shimtest.ShimTestCase):
    RUNTIME = "python"
    MEMORY_MB = 128

    # ---- init ----------------------------------------------------------
    def test_ready_and_invoke(self):
        self.write("handler.py", """
            print("init log line")
            def handler(event, context):
                print("invoke log", context.aws_request_id)
                return {"echo": event, "rid": context.aws_request_id,
                        "fn": context.function_name, "mem": context.memory_limit_in_mb,
                        "arn": context.invoked_function_arn,
                        "group": context.log_group_name,
                        "remaining_ok": 0 < context.get_remaining_time_in_millis() <= 30000}
        """)
        rt = self.start()
        self.assertEqual(rt.init["type"], "ready")
        r = rt.invoke({"a": [1, 2, "é"]}, request_id="abc")
        self.assertEqual(r["type"], "result")
        self.assertTrue(r["ok"], r)
        self.assertIsInstance(r["result"], str)
        v = json.loads(r["result"])
        self.assertEqual(v["echo"], {"a": [1, 2, "é"]})
        self.assertEqual(v["rid"], "abc")
        self.assertEqual(v["fn"], "test-fn")
        self.assertEqual(v["mem"], "128")
        self.assertEqual(v["arn"], "arn:thaw:function:test-fn")
        self.assertEqual(v["group"], "/aws/lambda/test-fn")
        self.assertTrue(v["remaining_ok"])
        self.assertEqual(rt.shutdown(), 0)
        log = rt.read_log()
        self.assertIn("init log line", log)
        self.assertIn("invoke log abc", log)

    def test_logs_flushed_before_result(self):
        self.write("handler.py", """
            import sys
            def handler(event, context):
                sys.stdout.write("partial-no-newline")
                sys.stderr.write("err-no-newline")
                return 1
        """)
        rt = self.start()
        r = rt.invoke({})
        self.assertEqual(r["result"], "1")
        log = rt.read_log()  # read before shutdown: must already be there
        self.assertIn("partial-no-newline", log)
        self.assertIn("err-no-newline", log)

    def test_dotted_module(self):
        self.write("pkg/__init__.py", "")
        self.write("pkg/mod.py", """
            def fn(event, context):
                return "dotted"
        """)
        rt = self.start("pkg.mod.fn")
        self.assertEqual(rt.init["type"], "ready")
        self.assertEqual(rt.invoke(None)["result"], '"dotted"')

    def test_task_root_first_on_path(self):
        # a user module named like a runtime file or a stdlib module wins
        self.write("bootstrap.py", "def handler(e, c):\n    return 'user bootstrap'\n")
        rt = self.start("bootstrap.handler")
        self.assertEqual(rt.init["type"], "ready")
        self.assertEqual(rt.invoke({})["result"], '"user bootstrap"')

    def test_import_module_error(self):
        rt = self.start("nosuch.handler")
        self.assertEqual(rt.init["type"], "init_error")
        self.assertEqual(rt.init["errorType"], "Runtime.ImportModuleError")
        self.assertEqual(rt.init["errorMessage"],
                         "Unable to import module 'nosuch': No module named 'nosuch'")
        self.assertEqual(rt.close(), 1)

    def test_handler_not_found(self):
        self.write("handler.py", "x = 1\n")
        rt = self.start("handler.missing")
        self.assertEqual(rt.init["errorType"], "Runtime.HandlerNotFound")
        self.assertEqual(rt.init["errorMessage"], "Handler 'missing' missing on module 'handler'")
        self.assertEqual(rt.close(), 1)
        rt = self.start("handler.x")  # exists but not callable
        self.assertEqual(rt.init["errorType"], "Runtime.HandlerNotFound")

    def test_malformed_handler(self):
        rt = self.start("nodot")
        self.assertEqual(rt.init["errorType"], "Runtime.MalformedHandlerName")
        self.assertIn("Bad handler 'nodot'", rt.init["errorMessage"])
        self.assertEqual(rt.close(), 1)

    def test_module_raises_at_import(self):
        self.write("handler.py", """
            def helper():
                raise KeyError("boom")
            helper()
        """)
        rt = self.start()
        self.assertEqual(rt.init["type"], "init_error")
        self.assertEqual(rt.init["errorType"], "KeyError")
        self.assertEqual(rt.init["errorMessage"], "'boom'")
        st = rt.init["stackTrace"]
        self.assertTrue(st and all("bootstrap.py" not in line for line in st), st)
        self.assertIn("handler.py", st[0])
        self.assertIn("in helper", st[-1])
        self.assertEqual(rt.close(), 1)

    def test_syntax_error(self):
        self.write("handler.py", "def handler(:\n")
        rt = self.start()
        self.assertEqual(rt.init["errorType"], "Runtime.UserCodeSyntaxError")

    # ---- invoke --------------------------------------------------------
    def test_handler_exception(self):
        self.write("handler.py", """
            def handler(event, context):
                raise ValueError("bad input: " + event["x"])
        """)
        rt = self.start()
        r = rt.invoke({"x": "q"})
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["errorType"], "ValueError")
        self.assertEqual(r["error"]["errorMessage"], "bad input: q")
        st = r["error"]["stackTrace"]
        self.assertEqual(len(st), 1, st)
        self.assertTrue(st[0].startswith('  File "%s/handler.py", line 3, in handler\n'
                                         % os.path.realpath(self.dir))
                        or st[0].startswith('  File "%s/handler.py", line 3, in handler\n'
                                            % self.dir), st)
        # the process survives a failed invocation
        self.assertFalse(rt.invoke({"x": "z"})["ok"])
        self.assertEqual(rt.shutdown(), 0)

    def test_marshal_error(self):
        self.write("handler.py", """
            def handler(event, context):
                return {1, 2} if event == "set" else float("nan")
        """)
        rt = self.start()
        for ev in ("set", "nan"):
            r = rt.invoke(json.dumps(ev))
            self.assertFalse(r["ok"])
            self.assertEqual(r["error"]["errorType"], "Runtime.MarshalError")

    def test_bad_payload(self):
        self.write("handler.py", "def handler(e, c):\n    return e\n")
        rt = self.start()
        r = rt.invoke("{not json")
        self.assertEqual(r["error"]["errorType"], "Runtime.UnmarshalError")

    def test_state_persists_and_eof_exits_zero(self):
        self.write("handler.py", """
            n = 0
            def handler(event, context):
                global n
                n += 1
                return {"count": n}
        """)
        rt = self.start()
        self.assertEqual([json.loads(rt.invoke({})["result"])["count"] for _ in range(3)],
                         [1, 2, 3])
        self.assertEqual(rt.close(), 0)  # EOF on fd 3

    def test_large_payload(self):
        self.write("handler.py", "def handler(e, c):\n    return len(e)\n")
        rt = self.start()
        big = "x" * (5 * 1024 * 1024)
        r = rt.invoke(json.dumps(big))
        self.assertEqual(r["result"], str(len(big)))

    def test_no_extra_fds_or_threads_after_init(self):
        self.write("handler.py", """
            import os, threading
            def handler(event, context):
                return {"fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
                        "threads": threading.active_count()}
        """)
        rt = self.start()
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v["threads"], 1)
        # 0,1,2,3 plus the fd listdir itself uses
        self.assertLessEqual(len([fd for fd in v["fds"] if fd > 3]), 1, v)

    def test_new_socket_at_fd3_between_invocations(self):
        """Simulates a restore: the peer behind fd 3 changes while blocked.

        We cannot swap the child's fd 3 from outside without a checkpointer,
        so the handler itself replaces fd 3 with a fresh socket (dup2) that
        the test passed it, the way a restored process finds a new socket.
        """
        self.write("handler.py", """
            import os, socket
            def handler(event, context):
                if event.get("swap"):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(event["swap"])
                    os.dup2(s.fileno(), 3)
                    s.close()
                    return "swapped"
                return "hello"
        """)
        path = os.path.join(self.dir, "ctl.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        rt = self.start()
        # the reply to the swapping invocation goes out on the NEW fd 3
        harness.send_frame(rt.parent, {"type": "invoke", "request_id": "1",
                                       "payload": json.dumps({"swap": path}),
                                       "deadline_ms": int(time.time() * 1000) + 5000})
        conn, _ = srv.accept()
        self.assertEqual(harness.recv_frame(conn)["result"], '"swapped"')
        harness.send_frame(conn, {"type": "invoke", "request_id": "2", "payload": "{}",
                                  "deadline_ms": int(time.time() * 1000) + 5000})
        self.assertEqual(harness.recv_frame(conn)["result"], '"hello"')
        harness.send_frame(conn, {"type": "shutdown"})
        conn.close()
        srv.close()
        self.assertEqual(rt.close(), 0)

    # ---- as a base (layered snapshots) --------------------------------
    def test_base_waits_for_its_function_then_takes_its_environment(self):
        # The function's code is at the task root `load` names, not where the base
        # started (repurposing replaces /var/task under a running base): the base moves there.
        self.write("task/app.py", """
            import os
            SEEN = os.environ.get("SECRET")
            def handler(event, context):
                return {"init": SEEN, "now": os.environ.get("SECRET"),
                        "base": os.environ.get("THAW_BASE"), "fn": os.environ.get("AWS_LAMBDA_FUNCTION_NAME"),
                        "cwd": os.getcwd()}
        """)
        task = os.path.join(self.dir, "task")
        rt = self.start("", env={"THAW_BASE": "1", "SECRET": "from-the-boot"})
        self.assertEqual(rt.init, {"type": "ready", "base": True, "restore_notice": True}, rt.read_log())
        rt.send({"type": "restored", "nonce": "n1"})
        self.assertEqual(rt.recv(), {"type": "ok", "nonce": "n1"})
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
        env.update(_HANDLER="app.handler", LAMBDA_TASK_ROOT=task, SECRET="s3", AWS_LAMBDA_FUNCTION_NAME="layered")
        rt.send({"type": "load", "env": env})
        self.assertEqual(rt.recv()["type"], "ready")
        v = json.loads(rt.invoke({})["result"])
        # The function sees the environment `load` carried, nothing of the base's.
        self.assertEqual(v, {"init": "s3", "now": "s3", "base": None, "fn": "layered", "cwd": task})
        self.assertEqual(rt.shutdown(), 0)

    def test_base_rejects_anything_but_load(self):
        self.assertBaseTakesOnlyLoad("no environment object of strings")


class SamplesTest(unittest.TestCase):
    """Runs the built samples (scripts/build-samples.sh) if present."""

    ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    BUILD = os.path.join(ROOT, "build", "samples", "python")

    def run_sample(self, name, payloads):
        code = os.path.join(self.BUILD, name)
        if not os.path.isdir(code):
            self.skipTest("sample %s not built" % name)
        rt = harness.Runtime(code, "handler.handler")
        try:
            out = [rt.invoke(p) for p in payloads] if rt.init.get("type") == "ready" else []
            return rt.init, out
        finally:
            rt.shutdown()
            rt.log.close()

    def test_stdlib_deterministic(self):
        ev = {"text": "Snapshots restore quickly", "qty": 7, "category": "dairy", "days": 400}
        _, a = self.run_sample("stdlib", [ev, ev])
        _, b = self.run_sample("stdlib", [ev])
        self.assertEqual(a[0]["result"], a[1]["result"])
        self.assertEqual(a[0]["result"], b[0]["result"])
        v = json.loads(a[0]["result"])
        self.assertEqual(v["subtotal"], "63.98")  # 7 * (7.95 + 1.19)

    def test_counter(self):
        _, r = self.run_sample("counter", [{}, {}, {}])
        self.assertEqual([json.loads(x["result"])["count"] for x in r], [1, 2, 3])

    def test_initerror(self):
        init, _ = self.run_sample("initerror", [])
        self.assertEqual(init["errorType"], "RuntimeError")


if __name__ == "__main__":
    unittest.main()
