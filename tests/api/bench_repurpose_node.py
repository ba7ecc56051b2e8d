#!/usr/bin/env python3
"""Repurposing in the node (issue #30): cold starts served by a pooled base instance
against restores (with the node's prepared sandboxes), same node, same run.

    .venv/bin/python tests/api/bench_repurpose_node.py [--functions 9] [--out FILE]

Starts `thaw serve --base-pool 1 --keep-alive 1` (temporary data dir), deploys N copies
of the helloworld sample, and calls each twice, letting its instance expire in
between: the first cold starts of each are served by the pooled base instance (which
returns to the pool, reset, when it expires), the last is a restore of its snapshot
(the node measures each way once before it picks the cheapest). The pool serves a
function by installing its diff (`repurposed-diff`); a second node, same run, with
THAW_REPURPOSE=load loads it instead (`repurposed`, its init run). Reports the node's
own start time (`x-thaw-timing-ms` start=) and the client's round trip, medians, and
writes JSON. Not collected by pytest (file name does not start with test_).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thaw_node_harness import NodeProcess, create, sample_zip  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "results", "repurpose-node.json"))
    a = ap.parse_args(argv)
    samples, pools = {}, {}
    for mode in ("diff", "load"):
        pools[mode] = run_node(a.functions, samples, {} if mode == "diff" else {"THAW_REPURPOSE": "load"}, mode)
    med = {w: {"n": len(v), "start_ms": statistics.median(s["start_ms"] for s in v), "rtt_ms": statistics.median(s["rtt_ms"] for s in v)}
           for w, v in samples.items() if v}
    for w, m in med.items():
        print("%-24s n=%2d  node start %6.2f ms  client round trip %6.2f ms (medians)" % (w, m["n"], m["start_ms"], m["rtt_ms"]))
    print("pools:", json.dumps(pools))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"medians": med, "samples": samples, "pools": pools}, f, indent=1)
    print("wrote", a.out)


def run_node(functions, samples, env, mode):
    """One node: N helloworld copies, each called twice (pool, then restore)."""
    node = NodeProcess(tempfile.mkdtemp(prefix="thaw-repurpose-node-"), "--base-pool", "1", keep_alive="1", env=env)
    try:
        c = node.client()
        names = ["h%d" % i for i in range(functions)]
        for n in ["warmup", *names]:
            create(c, n, sample_zip("helloworld"))

        def wait(cond, what):
            deadline = time.time() + 60
            while not cond():
                assert time.time() < deadline, what
                time.sleep(0.05)

        def call(name):
            wait(lambda: node.function_status(name)["instances"]["live"] == 0, "expiry")
            t = time.perf_counter()
            r = c.invoke(FunctionName=name, Payload=json.dumps({"name": name}))
            rtt = (time.perf_counter() - t) * 1e3
            body = json.loads(r["Payload"].read())
            assert body == {"message": "hello, %s" % name}, body
            h = r["ResponseMetadata"]["HTTPHeaders"]
            timing = dict(kv.split("=") for kv in h["x-thaw-timing-ms"].split(";"))
            return h.get("x-thaw-start"), float(timing["start"]), rtt

        call("warmup")  # a restore; the pool fills behind it
        wait(lambda: node.status()["base_pool"]["idle"] == 1, "the pool to fill")
        # The node measures each way once: from the pool (installing, and in the diff
        # node then loading), then restoring.
        rounds = 3 if not env else 2
        for rnd in range(rounds):
            for n in names:
                wait(lambda: rnd == rounds - 1 or node.status()["base_pool"]["idle"] == 1, "the instance back in the pool")
                kind, start_ms, rtt = call(n)
                way = "restore" if (kind or "").startswith("restore") else kind
                samples.setdefault("%s (%s node)" % (way, mode), []).append({"function": n, "start_ms": start_ms, "rtt_ms": rtt})
        return node.status()["base_pool"]
    finally:
        assert node.stop() == 0


if __name__ == "__main__":
    main()
