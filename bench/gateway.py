#!/usr/bin/env python3
"""The gateway's overhead on a warm invoke (issue #29, target: <= 1 ms median).

    bench/gateway.py [--runs 300] [--out bench/results]

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


def chart(data, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("direct_ms", "straight to the agent"), ("gateway_ms", "through the gateway")):
        v = sorted(data[key])
        ax.plot(v, [i / len(v) for i in range(len(v))], label=label)
    ax.set_xlabel("warm invoke, ms (new connection, SigV4)")
    ax.set_ylabel("fraction of invokes")
    ax.set_title(f"gateway overhead: {data['overhead_median_ms']:.2f} ms at the median")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "gateway.json"
        env = dict(os.environ, THAW_BENCH_OUT=str(raw), THAW_BENCH_RUNS=str(a.runs))
        r = subprocess.run(["cargo", "test", "--release", "-q", "-p", "thaw", "--test", "gateway", "--", "--ignored", "--nocapture",
                            "gateway_overhead_on_a_warm_invoke"], cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0 or not raw.exists():
            raise SystemExit(f"the benchmark failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        data = json.loads(raw.read_text())
    print(f"warm invoke, {data['runs']} each, interleaved: straight to the agent {data['median_direct_ms']:.3f} ms "
          f"(p99 {data['p99_direct_ms']:.3f}), through the gateway {data['median_gateway_ms']:.3f} ms "
          f"(p99 {data['p99_gateway_ms']:.3f}): overhead {data['overhead_median_ms']:.3f} ms at the median")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"gateway-{stamp}.json"
    path.write_text(json.dumps(data, indent=1))
    svg = chart(data, out / f"gateway-{stamp}.svg")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


if __name__ == "__main__":
    sys.exit(main())
