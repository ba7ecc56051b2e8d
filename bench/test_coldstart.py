"""Tests for bench/coldstart.py against bench/fake_thaw.py (no real thaw needed).

    /usr/bin/python3 -m unittest bench/test_coldstart.py
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import coldstart  # noqa: E402

FAKE = os.path.join(HERE, "fake_thaw.py")


class StatsTest(unittest.TestCase):
    def test_percentile(self):
        self.assertIsNone(coldstart.percentile([], 50))
        self.assertEqual(coldstart.percentile([7], 90), 7.0)
        self.assertEqual(coldstart.percentile([3, 1, 2], 50), 2.0)
        self.assertEqual(coldstart.percentile([1, 2, 3, 4], 50), 2.5)
        self.assertAlmostEqual(coldstart.percentile(list(range(1, 11)), 90), 9.1)

    def test_sample_totals(self):
        s = coldstart.sample_from_stats("boot", {"total_ms": 250, "sandbox_ms": 40,
                                                 "init_ms": 200, "first_invoke_ms": 10}, 300.0)
        self.assertEqual(s["total_ms"], 250.0)
        self.assertEqual(s["wall_ms"], 300.0)
        self.assertIsNone(s["restore_ms"])
        s = coldstart.sample_from_stats("lazy", {"restore_ms": 8, "first_invoke_ms": 4,
                                                 "page_faults": 100,
                                                 "bytes_read_from_image": 4096}, 20.0)
        self.assertEqual(s["total_ms"], 12.0)
        self.assertEqual(s["page_faults"], 100.0)
        s = coldstart.sample_from_stats("warm", {"restore_ms": 8, "first_invoke_ms": 4,
                                                 "invocations_ms": [4, 0.75]}, 20.0)
        self.assertEqual(s["total_ms"], 0.75)
        with self.assertRaises(coldstart.BenchError):
            coldstart.sample_from_stats("warm", {"invocations_ms": [4]}, 1.0)

    def test_aggregate_and_speedup(self):
        boot = [{"total_ms": v, "wall_ms": v + 10} for v in (100, 200, 300)]
        lazy = [{"total_ms": v, "wall_ms": v + 10} for v in (10, 20, 30)]
        agg = coldstart.aggregate({"boot": boot, "lazy": lazy, "eager": [], "warm": []})
        self.assertEqual(agg["boot"]["total_ms"], {"median": 200.0, "p90": 280.0, "n": 3})
        self.assertEqual(agg["lazy"]["total_ms"]["median"], 20.0)
        self.assertEqual(agg["speedup"]["lazy"], 10.0)
        self.assertEqual(agg["speedup"]["lazy_wall"], 7.0)
        self.assertIsNone(agg["speedup"]["eager"])
        self.assertEqual(agg["eager"]["runs_ok"], 0)

    def test_evict_page_cache(self):
        d = tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(d, "sub"))
            for p, n in (("a", 10), ("sub/b", 5000)):
                with open(os.path.join(d, p), "wb") as f:
                    f.write(b"x" * n)
            os.symlink("a", os.path.join(d, "link"))
            self.assertEqual(coldstart.evict_page_cache(d), 5010)
            self.assertEqual(coldstart.evict_page_cache(os.path.join(d, "nope")), 0)
        finally:
            shutil.rmtree(d)

    def test_balanced_orders(self):
        from collections import Counter
        for n in range(1, 9):
            orders = coldstart.balanced_orders("m%d" % i for i in range(n))
            self.assertEqual(len(orders), n * (2 if n % 2 and n > 1 else 1))
            for o in orders:
                self.assertEqual(sorted(o), sorted("m%d" % i for i in range(n)))
            # Each mode first equally often, each ordered pair of neighbours equally often.
            self.assertEqual(len(set(Counter(o[0] for o in orders).values())), 1)
            pairs = Counter((o[k - 1], o[k]) for o in orders for k in range(1, n))
            self.assertEqual(len(pairs), n * (n - 1))
            self.assertLessEqual(len(set(pairs.values())), 1)


class EndToEndTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="thaw-bench-test-")
        self.samples = os.path.join(self.tmp, "samples")
        for name in ("helloworld", "bigheap", "error", "initerror"):
            os.makedirs(os.path.join(self.samples, name))
            with open(os.path.join(self.samples, name, "handler.py"), "w") as f:
                f.write("def handler(e, c):\n    return 1\n")
        self.log = os.path.join(self.tmp, "calls.log")
        self.out = os.path.join(self.tmp, "res", "out.json")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_bench(self, *extra, env=None):
        argv = ["--thaw", FAKE, "--samples", self.samples, "--runs", "3", "--out", self.out]
        argv += list(extra)
        e = {"FAKE_THAW_LOG": self.log}
        e.update(env or {})
        stdout, stderr = io.StringIO(), io.StringIO()
        with mock.patch.dict(os.environ, e), contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr):
            code = coldstart.main(argv)
        return code, stdout.getvalue(), stderr.getvalue()

    def test_full_run(self):
        code, out, err = self.run_bench()
        self.assertEqual(code, 0, err)
        with open(self.out) as f:
            doc = json.load(f)
        meta = doc["meta"]
        for key in ("date", "kernel", "cpu", "git_commit", "runs"):
            self.assertIn(key, meta)
        self.assertEqual(meta["runs"], 3)
        res = doc["results"]
        # error / initerror are excluded by default
        self.assertEqual(sorted(res), ["bigheap", "helloworld"])
        for fn in res:
            r = res[fn]
            self.assertEqual(r["errors"], [])
            self.assertTrue(r["outputs_consistent"])
            for mode in coldstart.MODES:
                self.assertEqual(r[mode]["runs_ok"], 3)
                self.assertEqual(r[mode]["total_ms"]["n"], 3)
                self.assertEqual(r[mode]["wall_ms"]["n"], 3)
            # fake numbers: boot ~245 ms, lazy ~14, eager ~21, warm ~0.5
            self.assertTrue(200 < r["boot"]["total_ms"]["median"] < 300)
            self.assertTrue(10 < r["lazy"]["total_ms"]["median"] < 18)
            self.assertTrue(r["warm"]["total_ms"]["median"] < 1)
            self.assertTrue(r["speedup"]["lazy"] > 10)
            self.assertTrue(r["speedup"]["eager"] > 8)
            self.assertIn("page_faults", r["lazy"])
            self.assertIn("bytes_read_from_image", r["eager"])
            self.assertIn("init_ms", r["boot"])
            self.assertNotIn("restore_ms", r["boot"])
            lz = r["lazy"]["total_ms"]
            self.assertLessEqual(lz["median"], lz["p90"])
        # interleaving: create once per function, then boot,lazy,eager,warm x runs
        with open(self.log) as f:
            calls = [line.split()[0] for line in f]
        per_fn = ["create"] + ["boot", "lazy", "eager", "warm"] * 3
        self.assertEqual(calls, per_fn * 2)
        # table printed
        self.assertIn("function", out)
        self.assertIn("helloworld", out)
        self.assertIn("x", out.split("speedup")[1])
        self.assertTrue(("plot:" in out) or ("plot skipped" in out))

    def test_selected_functions_and_failing_mode(self):
        code, out, err = self.run_bench("--functions", "helloworld",
                                        env={"FAKE_THAW_FAIL": "eager"})
        self.assertEqual(code, 1)
        with open(self.out) as f:
            res = json.load(f)["results"]
        self.assertEqual(list(res), ["helloworld"])
        r = res["helloworld"]
        self.assertEqual(len(r["errors"]), 3)
        self.assertEqual(r["eager"]["runs_ok"], 0)
        self.assertIsNone(r["speedup"]["eager"])
        self.assertEqual(r["lazy"]["runs_ok"], 3)

    def test_snapshot_create_failure(self):
        code, out, err = self.run_bench("--functions", "helloworld",
                                        env={"FAKE_THAW_FAIL": "create"})
        self.assertEqual(code, 1)
        with open(self.out) as f:
            res = json.load(f)["results"]
        self.assertIn("error", res["helloworld"])

    def test_missing_thaw(self):
        code, out, err = self.run_bench("--thaw", os.path.join(self.tmp, "nope"))
        self.assertEqual(code, 2)
        self.assertIn("not found", err)


if __name__ == "__main__":
    unittest.main()
