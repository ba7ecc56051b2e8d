#!/usr/bin/env python3
"""The gateway's overhead on a warm invoke (issue #29, target: <= 1 ms median), and with
--fresh a cold start on an agent that never had the function's snapshot (target <= 2x).

    bench/gateway.py [--runs 300] [--out bench/results]
    bench/gateway.py --fresh [--runs 7]

Runs the ignored benchmark test of crates/thaw/tests/gateway.rs (a real kube-apiserver,
one `thaw serve --cluster` agent, one `thaw gateway`, a warm Python function): warm
invokes straight to the agent and through the gateway, interleaved in the same run,
each over a new connection, signed (SigV4). Prints the medians and p99s, writes JSON and
an SVG chart (the two latency distributions) to --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cdf_chart(data, path, series, xlabel, ylabel, title):
    """An SVG of the distributions of `series` ((key in data, label)), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in series:
        v = sorted(data[key])
        ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], marker="o" if len(v) < 50 else None, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def run_ignored(test, runs):
    """Run the ignored benchmark test `test` of crates/thaw/tests/gateway.rs; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "bench.json"
        env = dict(os.environ, THAW_BENCH_OUT=str(raw), THAW_BENCH_RUNS=str(runs))
        r = subprocess.run(["cargo", "test", "--release", "-q", "-p", "thaw", "--test", "gateway", "--", "--ignored", "--nocapture", test],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0 or not raw.exists():
            raise SystemExit(f"the benchmark failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        return json.loads(raw.read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--fresh", action="store_true",
                   help="instead: a cold start on an agent that never had the function's snapshot (fetched from the "
                        "store) against one from the builder's local cache (target <= 2x); --runs defaults to 7")
    a = p.parse_args()
    if a.fresh:
        return fresh(a)
    data = run_ignored("gateway_overhead_on_a_warm_invoke", a.runs)
    print(f"warm invoke, {data['runs']} each, interleaved: straight to the agent {data['median_direct_ms']:.3f} ms "
          f"(p99 {data['p99_direct_ms']:.3f}), through the gateway {data['median_gateway_ms']:.3f} ms "
          f"(p99 {data['p99_gateway_ms']:.3f}): overhead {data['overhead_median_ms']:.3f} ms at the median")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"gateway-{stamp}.json"
    path.write_text(json.dumps(data, indent=1))
    svg = cdf_chart(data, out / f"gateway-{stamp}.svg", (("direct_ms", "straight to the agent"), ("gateway_ms", "through the gateway")),
                    "warm invoke, ms (new connection, SigV4)", "fraction of invokes",
                    f"gateway overhead: {data['overhead_median_ms']:.2f} ms at the median")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


def fresh(a):
    data = run_ignored("fresh_agent_cold_start", a.runs if a.runs != 300 else 7)
    print(f"cold start, {data['runs']} each, interleaved: on a fresh agent (snapshot fetched from the store) "
          f"{data['median_fresh_ms']:.2f} ms, on the builder from its cache {data['median_local_ms']:.2f} ms: "
          f"{data['ratio']:.2f}x (target <= 2x)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cluster-cold-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(data, indent=1))
    svg = cdf_chart(data, path.with_suffix(".svg"), (("local_ms", "the builder, from its cache"), ("fresh_ms", "a fresh agent, from the store")),
                    "cold start in the node, ms (x-thaw-timing-ms start)", "fraction of starts",
                    f"fresh agent vs local: {data['ratio']:.2f}x at the median (target <= 2x)")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


if __name__ == "__main__":
    sys.exit(main())
