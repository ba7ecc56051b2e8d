"""Shared helpers for the runtime shim tests (loaded by path: every test dir has its own harness)."""

import importlib.util
import os
import shutil
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def load_harness():
    spec = importlib.util.spec_from_file_location("thaw_runtimes_harness", os.path.join(HERE, "harness.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


harness = load_harness()


def main_thread_syscall(pid):
    """(syscall number, first argument) of the process's main thread, or None."""
    with open("/proc/%d/syscall" % pid) as f:
        parts = f.read().split()
    if parts[0] == "running":
        return None
    return int(parts[0]), int(parts[1], 16)


def wait_blocked_in_read_fd3(pid, tid=None, timeout=5.0):
    path = "/proc/%d/task/%d/syscall" % (pid, tid or pid)
    end = time.time() + timeout
    last = None
    while time.time() < end:
        with open(path) as f:
            parts = f.read().split()
        last = parts
        if parts[0] != "running" and int(parts[0]) == 0 and int(parts[1], 16) == 3:
            return True
        time.sleep(0.02)
    raise AssertionError("not blocked in read(3, ...): %r" % (last,))


class ShimTestCase(unittest.TestCase):
    RUNTIME = None
    # Memory size the shim is told (Lambda's default is 128 MiB).
    MEMORY_MB = 256

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="thaw-shim-")
        self.rts = []

    def tearDown(self):
        for rt in self.rts:
            try:
                rt.close(5)
            except Exception:
                pass
            rt.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def write(self, rel, text):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def start(self, handler="handler.handler", **kw):
        kw.setdefault("memory_mb", self.MEMORY_MB)
        rt = harness.Runtime(self.RUNTIME, self.dir, handler, **kw)
        self.rts.append(rt)
        return rt

    def assertBaseTakesOnlyLoad(self, bad_env=None):
        """A base (THAW_BASE=1) says ready as one and ends with a protocol error (exit 2) on
        any frame but `load`; with `bad_env` (the shim's message), also on a `load` whose
        environment holds a value that is not a string."""
        rt = self.start("", env={"THAW_BASE": "1"})
        self.assertTrue(rt.init["base"], rt.read_log())
        rt.send({"type": "invoke", "request_id": "1", "payload": "{}"})
        self.assertEqual(rt.close(), 2)
        self.assertIn("a base expects load", rt.read_log())
        if bad_env:
            rt2 = self.start("", env={"THAW_BASE": "1"})
            rt2.send({"type": "load", "env": {"A": 1}})
            self.assertEqual(rt2.close(), 2)
            self.assertIn(bad_env, rt2.read_log())

    def assertReady(self, rt):
        self.assertEqual(rt.init, {"type": "ready"}, rt.read_log())
