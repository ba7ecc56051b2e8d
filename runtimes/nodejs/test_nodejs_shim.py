"""Protocol tests for the Node.js shim (bootstrap.js), driven through runtimes/harness.py.

    .venv/bin/python -m pytest -q runtimes/nodejs
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shimtest  # noqa: E402

HAVE_NODE = os.path.exists("/usr/bin/node")


@unittest.skipUnless(HAVE_NODE, "needs /usr/bin/node")
class NodeShimTest(shimtest.ShimTestCase):
    RUNTIME = "nodejs"

    # ---- init ----------------------------------------------------------
    def test_ready_invoke_context_and_logs(self):
        self.write("index.js", """
            console.log("init log line");
            exports.handler = async (event, context) => {
              console.log("invoke log", context.awsRequestId);
              console.error("to stderr");
              return {echo: event, rid: context.awsRequestId, fn: context.functionName,
                      ver: context.functionVersion, mem: context.memoryLimitInMB,
                      arn: context.invokedFunctionArn, group: context.logGroupName,
                      waits: context.callbackWaitsForEmptyEventLoop,
                      remaining: context.getRemainingTimeInMillis()};
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.invoke({"a": [1, 2, "é"]}, request_id="abc")
        self.assertTrue(r["ok"], r)
        v = json.loads(r["result"])
        self.assertEqual(v["echo"], {"a": [1, 2, "é"]})
        self.assertEqual((v["rid"], v["fn"], v["ver"], v["mem"]), ("abc", "test-fn", "$LATEST", "128"))
        self.assertEqual(v["arn"], "arn:thaw:function:test-fn")
        self.assertEqual(v["group"], "/aws/lambda/test-fn")
        self.assertIs(v["waits"], True)
        self.assertTrue(0 < v["remaining"] <= 30000)
        log = rt.read_log()  # logs precede the reply
        self.assertIn("init log line", log)
        self.assertIn("invoke log abc", log)
        self.assertIn("to stderr", log)
        self.assertEqual(rt.shutdown(), 0)

    def test_frames_are_ascii(self):
        self.write("index.js", "exports.handler = async () => 'h\\u00e9\\u{1F600}';\n")
        rt = self.start("index.handler")
        self.assertReady(rt)
        harness = shimtest.harness
        harness.send_frame(rt.parent, {"type": "invoke", "request_id": "1", "payload": "{}",
                                       "deadline_ms": int(time.time() * 1000) + 10000})
        n = int.from_bytes(harness._recv_exact(rt.parent, 4), "big")
        raw = harness._recv_exact(rt.parent, n)
        raw.decode("ascii")
        self.assertEqual(json.loads(json.loads(raw)["result"]), "hé\U0001F600")

    def test_idle_in_blocking_read_on_main_thread(self):
        self.write("index.js", "exports.handler = async () => 1;\n")
        rt = self.start("index.handler")
        self.assertReady(rt)
        shimtest.wait_blocked_in_read_fd3(rt.pid)
        self.assertEqual(rt.invoke({})["result"], "1")
        shimtest.wait_blocked_in_read_fd3(rt.pid)
        flags = [l for l in open("/proc/%d/fdinfo/3" % rt.pid) if l.startswith("flags:")][0]
        self.assertEqual(int(flags.split()[1], 8) & os.O_NONBLOCK, 0)

    def test_esm_with_top_level_await(self):
        self.write("index.mjs", """
            import { readFile } from 'node:fs/promises';
            const text = await readFile(new URL('./data.txt', import.meta.url), 'utf8');
            export const handler = async (event) => ({ text: text.trim(), n: event.n + 1 });
        """)
        self.write("data.txt", "loaded at init\n")
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.invoke({"n": 1})
        self.assertEqual(json.loads(r["result"]), {"text": "loaded at init", "n": 2})

    def test_nested_dir_and_nested_property(self):
        self.write("src/lib/app.js", "exports.handlers = { main: async (e) => 'nested ' + e.x };\n")
        rt = self.start("src/lib/app.handlers.main")
        self.assertReady(rt)
        self.assertEqual(json.loads(rt.invoke({"x": 7})["result"]), "nested 7")

    def test_package_type_module_js(self):
        self.write("package.json", '{"type": "module"}')
        self.write("app.js", "export async function handler() { return 'esm js'; }\n")
        rt = self.start("app.handler")
        self.assertReady(rt)
        self.assertEqual(json.loads(rt.invoke({})["result"]), "esm js")

    def test_import_module_error(self):
        rt = self.start("missing.handler")
        self.assertEqual(rt.init["type"], "init_error")
        self.assertEqual(rt.init["errorType"], "Runtime.ImportModuleError")
        self.assertIn("Cannot find module 'missing'", rt.init["errorMessage"])
        self.assertEqual(rt.close(), 1)

    def test_missing_dependency_is_import_module_error(self):
        self.write("index.js", "require('not-installed-pkg'); exports.handler = async () => 1;\n")
        rt = self.start("index.handler")
        self.assertEqual(rt.init["errorType"], "Runtime.ImportModuleError")
        self.assertIn("not-installed-pkg", rt.init["errorMessage"])

    def test_handler_not_found(self):
        self.write("index.js", "exports.other = () => 1; exports.notfn = 5;\n")
        rt = self.start("index.handler")
        self.assertEqual(rt.init["errorType"], "Runtime.HandlerNotFound")
        self.assertEqual(rt.init["errorMessage"], "index.handler is undefined or not exported")
        rt2 = self.start("index.notfn")
        self.assertEqual(rt2.init["errorType"], "Runtime.HandlerNotFound")
        self.assertEqual(rt2.init["errorMessage"], "index.notfn is not a function")

    def test_malformed_handler(self):
        self.write("index.js", "exports.handler = () => 1;\n")
        rt = self.start("index")
        self.assertEqual(rt.init["errorType"], "Runtime.MalformedHandlerName")

    def test_syntax_error(self):
        self.write("index.js", "exports.handler = () => {;\n")
        rt = self.start("index.handler")
        self.assertEqual(rt.init["errorType"], "Runtime.UserCodeSyntaxError")
        self.assertIn("SyntaxError", rt.init["errorMessage"])

    def test_error_thrown_at_init(self):
        self.write("index.js", "console.log('before'); throw new TypeError('bad config');\n")
        rt = self.start("index.handler")
        self.assertEqual(rt.init["type"], "init_error")
        self.assertEqual(rt.init["errorType"], "TypeError")
        self.assertEqual(rt.init["errorMessage"], "bad config")
        self.assertTrue(any("index.js" in l for l in rt.init["stackTrace"]), rt.init)
        self.assertEqual(rt.close(), 1)
        self.assertIn("before", rt.read_log())

    # ---- handler styles ------------------------------------------------
    def test_callback_style(self):
        self.write("index.js", """
            exports.handler = (event, context, callback) => {
              setTimeout(() => callback(null, {got: event.v}), 10);
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        self.assertEqual(json.loads(rt.invoke({"v": 3})["result"]), {"got": 3})
        self.assertEqual(json.loads(rt.invoke({"v": 4})["result"]), {"got": 4})

    def test_callback_waits_for_empty_event_loop(self):
        self.write("index.js", """
            exports.handler = (event, context, callback) => {
              context.callbackWaitsForEmptyEventLoop = event.wait;
              setTimeout(() => console.log('late timer ' + event.wait), 150);
              callback(null, 'done');
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.invoke({"wait": True})
        self.assertEqual(json.loads(r["result"]), "done")
        self.assertIn("late timer true", rt.read_log())  # ran before the reply
        t0 = time.time()
        r = rt.invoke({"wait": False})
        self.assertEqual(json.loads(r["result"]), "done")
        self.assertLess(time.time() - t0, 0.14)
        self.assertNotIn("late timer false", rt.read_log())
        # the pending timer fires during the next invocation (as on Lambda)
        rt.invoke({"wait": True})
        self.assertIn("late timer false", rt.read_log())

    def test_callback_error_and_context_succeed(self):
        self.write("index.js", """
            exports.cb = (event, context, callback) => callback(new RangeError('cb failed'));
            exports.str = (event, context, callback) => callback('plain string');
            exports.legacy = (event, context) => { context.succeed({legacy: true}); };
        """)
        rt = self.start("index.cb")
        self.assertReady(rt)
        r = rt.invoke({})
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["errorType"], "RangeError")
        self.assertEqual(r["error"]["errorMessage"], "cb failed")
        rt2 = self.start("index.str")
        r = rt2.invoke({})
        self.assertEqual((r["error"]["errorType"], r["error"]["errorMessage"]), ("string", "plain string"))
        rt3 = self.start("index.legacy")
        self.assertEqual(json.loads(rt3.invoke({})["result"]), {"legacy": True})

    def test_sync_handler_without_callback_returns_null(self):
        self.write("index.js", "exports.handler = (event) => 42;\n")
        rt = self.start("index.handler")
        self.assertReady(rt)
        self.assertEqual(rt.invoke({})["result"], "null")  # as Lambda: only promises/callbacks answer

    def test_async_errors(self):
        self.write("index.js", """
            class MyError extends Error { constructor(m) { super(m); this.name = 'MyError'; } }
            exports.handler = async (event) => {
              if (event.kind === 'throw') throw new MyError('boom');
              if (event.kind === 'reject') return Promise.reject(new Error('rejected'));
              if (event.kind === 'circular') { const a = {}; a.a = a; return a; }
              return 'fine';
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.invoke({"kind": "throw"})
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["errorType"], "MyError")
        self.assertEqual(r["error"]["errorMessage"], "boom")
        self.assertTrue(r["error"]["stackTrace"][0].startswith("MyError: boom"))
        self.assertTrue(any("index.js" in l for l in r["error"]["stackTrace"]))
        r = rt.invoke({"kind": "reject"})
        self.assertEqual((r["error"]["errorType"], r["error"]["errorMessage"]), ("Error", "rejected"))
        r = rt.invoke({"kind": "circular"})
        self.assertEqual(r["error"]["errorType"], "Runtime.MarshalError")
        r = rt.invoke("{not json")
        self.assertEqual(r["error"]["errorType"], "Runtime.UnmarshalError")
        self.assertEqual(json.loads(rt.invoke({})["result"]), "fine")  # still serving

    def test_unhandled_rejection_fails_invocation_and_exits(self):
        self.write("index.js", """
            exports.handler = async () => {
              Promise.reject(new Error('nobody handles me'));
              await new Promise((r) => setTimeout(r, 50));
              return 'unreachable';
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.invoke({})
        self.assertFalse(r["ok"])
        self.assertEqual(r["error"]["errorType"], "Runtime.UnhandledPromiseRejection")
        self.assertIn("nobody handles me", r["error"]["errorMessage"])
        self.assertEqual(rt.close(), 129)

    def test_timers_fs_crypto_in_invocations(self):
        self.write("data.txt", "bundled file\n")
        self.write("index.js", """
            const fs = require('fs');
            const crypto = require('crypto');
            exports.handler = async () => {
              await new Promise((r) => setTimeout(r, 5));
              await new Promise((r) => setImmediate(r));
              const text = await fs.promises.readFile(__dirname + '/data.txt', 'utf8');
              const rnd = await new Promise((res, rej) => crypto.randomBytes(8, (e, b) => e ? rej(e) : res(b)));
              const hash = crypto.createHash('sha256').update(text).digest('hex');
              const key = await new Promise((res, rej) => crypto.pbkdf2('pw', 'salt', 10, 16, 'sha256', (e, k) => e ? rej(e) : res(k)));
              return {text: text.trim(), hash, rnd: rnd.length, key: key.toString('hex')};
            };
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        for _ in range(3):
            v = json.loads(rt.invoke({})["result"])
            self.assertEqual(v["text"], "bundled file")
            self.assertEqual(v["rnd"], 8)
            self.assertEqual(len(v["key"]), 32)
            shimtest.wait_blocked_in_read_fd3(rt.pid)

    # ---- snapshot hooks and the restored frame --------------------------
    def test_hooks_and_restored_frame(self):
        self.write("index.js", """
            const crypto = require('crypto');
            const events = [];
            globalThis.thaw.registerBeforeSnapshot(() => events.push('before'));
            globalThis.thaw.registerAfterRestore(async () => {
              await new Promise((r) => setTimeout(r, 1));
              events.push('after');
            });
            const original = Math.random;
            exports.handler = async () => ({
              events, replaced: Math.random !== original, r: Math.random(),
              bytes: crypto.randomBytes(16).toString('hex'), uuid: crypto.randomUUID(),
              int: crypto.randomInt(10), gv: Array.from(crypto.getRandomValues(new Uint8Array(4))).length,
              fill: crypto.randomFillSync(Buffer.alloc(8)).length,
            });
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v["events"], ["before"])
        self.assertFalse(v["replaced"])
        self.assertEqual(rt.restored(), {"type": "ok"})
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v["events"], ["before", "after"])
        self.assertTrue(v["replaced"])
        self.assertTrue(0 <= v["r"] < 1)
        self.assertEqual(len(v["bytes"]), 32)
        self.assertRegex(v["uuid"], r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
        self.assertTrue(0 <= v["int"] < 10)
        self.assertEqual((v["gv"], v["fill"]), (4, 8))
        # a second restored frame (restore of a restored clone) is fine too
        self.assertEqual(rt.restored(), {"type": "ok"})

    def test_failing_hooks(self):
        self.write("index.js", """
            globalThis.thaw.registerAfterRestore(() => { throw new Error('cannot reconnect'); });
            exports.handler = async () => 1;
        """)
        rt = self.start("index.handler")
        self.assertReady(rt)
        r = rt.restored()
        self.assertEqual(r["type"], "error")
        self.assertIn("cannot reconnect", r["errorMessage"])
        self.write("b.js", """
            globalThis.thaw.registerBeforeSnapshot(async () => { throw new Error('no snapshot'); });
            exports.handler = async () => 1;
        """)
        rt2 = self.start("b.handler")
        self.assertEqual(rt2.init["type"], "init_error")
        self.assertIn("no snapshot", rt2.init["errorMessage"])

    # ---- channel ---------------------------------------------------------
    def test_eof_and_unknown_frame(self):
        self.write("index.js", "exports.handler = async () => 1;\n")
        rt = self.start("index.handler")
        self.assertReady(rt)
        self.assertEqual(rt.close(), 0)
        rt2 = self.start("index.handler")
        self.assertReady(rt2)
        rt2.send({"type": "bogus"})
        self.assertEqual(rt2.close(), 2)
        self.assertIn("protocol error", rt2.read_log())

    # ---- base ------------------------------------------------------------
    def test_base_waits_for_its_function_then_takes_its_environment(self):
        os.makedirs(os.path.join(self.dir, "lib"), exist_ok=True)
        self.write("lib/dep.js", "module.exports = 'from NODE_PATH';\n")
        # The function's code is at the task root `load` names, not where the base
        # started (repurposing replaces /var/task under a running base): the base moves there.
        self.write("task/index.js", """
            const SEEN = process.env.SECRET;
            const dep = require('dep');
            exports.handler = async () => ({init: SEEN, now: process.env.SECRET, dep,
                base: process.env.THAW_BASE === undefined ? null : process.env.THAW_BASE,
                fn: process.env.AWS_LAMBDA_FUNCTION_NAME, cwd: process.cwd()});
        """)
        task = os.path.join(self.dir, "task")
        rt = self.start("", env={"THAW_BASE": "1", "SECRET": "from-the-boot"})
        self.assertEqual(rt.init, {"type": "ready", "base": True, "restore_notice": True}, rt.read_log())
        rt.send({"type": "restored", "nonce": "n1"})
        self.assertEqual(rt.recv(), {"type": "ok", "nonce": "n1"})
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
        env.update(_HANDLER="index.handler", LAMBDA_TASK_ROOT=task, SECRET="s3", AWS_LAMBDA_FUNCTION_NAME="layered",
                   NODE_PATH=os.path.join(self.dir, "lib"))
        rt.send({"type": "load", "env": env})
        self.assertEqual(rt.recv()["type"], "ready", rt.read_log())
        v = json.loads(rt.invoke({})["result"])
        # The function sees the environment `load` carried (NODE_PATH included),
        # nothing of the base's.
        self.assertEqual(v, {"init": "s3", "now": "s3", "dep": "from NODE_PATH", "base": None, "fn": "layered", "cwd": task})
        self.assertEqual(rt.shutdown(), 0)

    def test_base_rejects_anything_but_load(self):
        self.assertBaseTakesOnlyLoad("no environment object of strings")


if __name__ == "__main__":
    unittest.main()
