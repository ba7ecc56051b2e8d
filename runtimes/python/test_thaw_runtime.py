"""The `restored` frame and thaw_runtime hooks of the Python shim.

    /usr/bin/python3 -m unittest runtimes/python/test_thaw_runtime.py
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # shimtest
sys.path.insert(0, HERE)  # harness: the Python binding, ahead of runtimes/harness.py
import harness  # noqa: E402
import shimtest  # noqa: E402


class RestoredFrameTest(shimtest.ShimTestCase):
    RUNTIME = "python"
    MEMORY_MB = 128

    def start(self, code):
        self.write("handler.py", code)
        return super().start("handler.handler")

    def restored(self, rt):
        harness.send_frame(rt.parent, {"type": "restored"})
        return harness.recv_frame(rt.parent)

    def test_hooks_and_reseed(self):
        rt = self.start("""
            import random, tempfile
            import thaw_runtime
            events = []
            thaw_runtime.register_before_snapshot(lambda: events.append("before"))
            @thaw_runtime.register_after_restore
            def again():
                events.append("after")
            random.seed(1234)
            state = random.getstate()
            def handler(event, context):
                return {"events": events, "same_state": random.getstate() == state}
        """)
        self.assertEqual(rt.init, {"type": "ready", "restore_notice": True})
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v, {"events": ["before"], "same_state": True})
        self.assertEqual(self.restored(rt), {"type": "ok"})
        v = json.loads(rt.invoke({})["result"])
        self.assertEqual(v, {"events": ["before", "after"], "same_state": False})
        self.assertEqual(rt.shutdown(), 0)

    def test_restore_notice_only_when_there_is_something_to_do(self):
        plain = self.start("""
            def handler(event, context):
                return 1
        """)
        self.assertEqual(plain.init, {"type": "ready", "restore_notice": False})
        self.assertEqual(self.restored(plain), {"type": "ok"})  # still answered if sent
        uses_random = self.start("""
            import random
            def handler(event, context):
                return random.random()
        """)
        self.assertEqual(uses_random.init, {"type": "ready", "restore_notice": True})

    def test_failing_hooks(self):
        rt = self.start("""
            import thaw_runtime
            def boom():
                raise RuntimeError("cannot reconnect")
            thaw_runtime.register_after_restore(boom)
            def handler(event, context):
                return 1
        """)
        self.assertEqual(rt.init, {"type": "ready", "restore_notice": True})
        r = self.restored(rt)
        self.assertEqual(r["type"], "error")
        self.assertEqual(r["errorType"], "RuntimeError")
        self.assertIn("cannot reconnect", r["errorMessage"])
        self.assertEqual(rt.invoke({})["result"], "1")
        rt2 = self.start("""
            import thaw_runtime
            def no():
                raise ValueError("no snapshot now")
            thaw_runtime.register_before_snapshot(no)
            def handler(event, context):
                return 1
        """)
        self.assertEqual(rt2.init["type"], "init_error")
        self.assertEqual(rt2.init["errorType"], "ValueError")


if __name__ == "__main__":
    unittest.main()
