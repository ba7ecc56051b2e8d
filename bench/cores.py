#!/usr/bin/env python3
"""Bursts on more cores, modelled (issue #33): the same burst of cold starts with the
node held to 1 core and to 2 cores (`taskset`), to see how a start's time scales with
the cores per instance when no larger host is at hand.

Each round runs, per core count (balanced orders), `thaw bench --functions ""
--concurrency BURSTS --concurrency-modes burst-pooled` under `taskset -c 0..C-1`
(the node, its page servers, the sandboxes and the instances all inherit the mask):
N concurrent cold starts of one function from prepared sandboxes, one working-set
read per burst. Reported per core count C and burst size N: the per-instance median
time to first response (median over rounds), its ratio to the single start on the
same cores, and the CPU per start (node + instance).

The model: if a start's time depends on the instances per core (N / C) and not on N
and C apart, the 1-core and 2-core curves drawn against N / C fall on one line (the
`agreement` rows compare 1 core with N against 2 cores with 2N; below 1.00, more cores
help more than in proportion: a single start runs in parallel itself, its working
set's loader and page server beside the restore). A burst of 16 on a 16-core host is
then the point N / C = 1 (one instance per core), read on the most cores measured: its
ratio to a single start there is `predicted_16_on_16`. What the model leaves out: a larger host's
memory bandwidth and its cross-core costs (IPIs for TLB shootdowns, lock contention in
the kernel's mm and cgroup code), which only grow with cores.

    .venv/bin/python bench/cores.py [--thaw target/release/thaw] [--function helloworld]
        [--bursts 1,2,4,8,16] [--cores 1,2] [--runs 5] [--rounds 2] [--out FILE]

Writes JSON (default bench/results/cores-<time>.json) and an SVG chart beside it, and
prints a table.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coldstart  # noqa: E402  (balanced_orders)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def burst_run(thaw, fn, cores, bursts, runs, samples, work):
    """One `thaw bench` burst experiment under taskset: {N: summary entry}."""
    out = os.path.join(work, "out-%d" % cores)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, THAW_DATA_DIR=os.path.join(work, "data"))
    env.pop("THAW_LOG", None)
    cpus = ",".join(str(c) for c in range(cores))
    subprocess.run(["taskset", "-c", cpus, thaw, "bench", "--functions", "", "--concurrency-functions", fn,
                    "--concurrency", ",".join(map(str, bursts)), "--concurrency-modes", "burst-pooled",
                    "--runs", str(runs), "--samples", samples, "--out", out],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    newest = max(glob.glob(os.path.join(out, "reap-*.json")), key=os.path.getmtime)
    with open(newest) as f:
        data = json.load(f)
    for p in glob.glob(os.path.join(out, "reap-*")):
        os.remove(p)
    return {e["n"]: e for e in data["summary"]["concurrency"][fn]["burst-pooled"]}


def model(per):
    """From {cores: {N: per-instance median ms}}: each point's ratio to the single start
    on its cores, the agreement of 1 core at N with 2 cores at 2N, and the predicted
    ratio of a burst of 16 on 16 cores (one instance per core: the point N = C on the
    most cores measured)."""
    out = {"ratio_to_single": {}, "agreement": {}}
    for c, pts in per.items():
        out["ratio_to_single"][c] = {n: ms / pts[1] for n, ms in pts.items() if 1 in pts}
    if 1 in per and 2 in per:
        for n, ms in per[1].items():
            if 2 * n in per[2]:
                out["agreement"][n] = per[2][2 * n] / ms
    # One instance per core, on the most cores measured (a 1-core "burst" of 1 is the
    # single start itself; the most cores' single start is the most like a large host's).
    c = max(per)
    out["predicted_16_on_16"] = out["ratio_to_single"].get(c, {}).get(c)
    return out


def chart(per, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c, pts in sorted(per.items()):
        ns = sorted(pts)
        axes[0].plot(ns, [pts[n] for n in ns], marker="o", label="%d core%s" % (c, "s" if c > 1 else ""))
        axes[1].plot([n / c for n in ns], [pts[n] / pts[ns[0]] for n in ns], marker="o", label="%d core%s" % (c, "s" if c > 1 else ""))
    axes[0].set_xlabel("burst size N")
    axes[0].set_ylabel("per-instance median, ms")
    axes[1].set_xlabel("instances per core (N / C)")
    axes[1].set_ylabel("x a single start on the same cores")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle("Burst of cold starts (burst-pooled) by cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thaw", default=os.path.join(ROOT, "target", "release", "thaw"))
    ap.add_argument("--function", default="helloworld")
    ap.add_argument("--samples", default=os.path.join(ROOT, "build", "samples", "python"))
    ap.add_argument("--bursts", default="1,2,4,8,16")
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--runs", type=int, default=5, help="trials of each burst size per thaw bench run")
    ap.add_argument("--rounds", type=int, default=2, help="thaw bench runs per core count, alternated")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cores-%s.json" % time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    a = ap.parse_args(argv)
    bursts = [int(x) for x in a.bursts.split(",")]
    cores = [int(x) for x in a.cores.split(",")]
    if 1 not in bursts:
        raise SystemExit("--bursts must include 1 (the single start every ratio is to)")
    if max(cores) > (os.cpu_count() or 1):
        raise SystemExit("this host has %d cores" % (os.cpu_count() or 1))
    got = {c: [] for c in cores}
    with tempfile.TemporaryDirectory(prefix="thaw-cores-") as work:
        orders = coldstart.balanced_orders(cores)
        for r in range(a.rounds):
            for c in orders[r % len(orders)]:
                got[c].append(burst_run(os.path.abspath(a.thaw), a.function, c, bursts, a.runs, os.path.abspath(a.samples), work))
                print("round %d, %d core(s): %s" % (r + 1, c, "  ".join("N=%d %.1f ms" % (n, e["median_ms"]) for n, e in sorted(got[c][-1].items()))), flush=True)
    med = lambda c, n, k: statistics.median(g[n][k] for g in got[c] if n in g)  # noqa: E731
    per = {c: {n: med(c, n, "median_ms") for n in bursts} for c in cores}
    cpu = {c: {n: med(c, n, "cpu_ms") for n in bursts} for c in cores}
    m = model(per)
    print()
    print("%s, burst-pooled, per-instance median ms (x a single start on the same cores); CPU per start ms" % a.function)
    print("%6s" % "N" + "".join("%28s" % ("%d core%s" % (c, "s" if c > 1 else "")) for c in cores))
    for n in bursts:
        print("%6d" % n + "".join("%12.1f (%5.2fx) %7.2f" % (per[c][n], m["ratio_to_single"][c][n], cpu[c][n]) for c in cores))
    for n, x in sorted(m["agreement"].items()):
        print("agreement: 2 cores at N=%d / 1 core at N=%d = %.2f (1.00: time depends on instances per core alone)" % (2 * n, n, x))
    off = [x for x in m["agreement"].values() if abs(x - 1) > 0.1]
    m["holds"] = not off
    if m["predicted_16_on_16"] is not None:
        print("model: a burst of 16 on 16 cores (one instance per core) ~ %.2fx a single start%s" % (
            m["predicted_16_on_16"], "" if m["holds"] else
            " -- but the model does not hold here: more cores did not help in proportion (agreement %.2f-%.2f), so "
            "something in a burst does not scale with cores and this is a lower bound" % (min(off), max(off))))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"function": a.function, "bursts": bursts, "cores": cores, "runs": a.runs, "rounds": a.rounds,
                   "per_instance_median_ms": per, "cpu_per_start_ms": cpu, "model": m, "raw": got}, f, indent=1)
    svg = chart(per, os.path.splitext(a.out)[0] + ".svg")
    print("wrote", a.out, *([svg] if svg else []))


if __name__ == "__main__":
    main()
