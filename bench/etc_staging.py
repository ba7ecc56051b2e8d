#!/usr/bin/env python3
"""Sandbox creation with the minimal /etc staged once (one read-only bind) against
the same /etc mounted entry by entry (THAW_NO_ETC_STAGING=1), in one sitting.

    bench/etc_staging.py [--pairs 4] [--runs 5] [--thaw target/release/thaw] [--out bench/results]

Alternates `thaw bench --functions helloworld` runs in the two modes (`--pairs` of
each, starting with a different mode each pair; in-process restores, as a node does
them, so the staged directory is looked up once per process) and prints/writes the
medians of sandbox_ms and restore_ms of the prefetch and lazy restores.
Needs root and build/samples (scripts/build-samples.sh).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("prefetch", "lazy")


def bench(thaw, env, runs, out):
    subprocess.run([thaw, "bench", "--functions", "helloworld", "--runs", str(runs), "--concurrency", "",
                    "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    newest = max(out.glob("reap-*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(newest.read_text())
    newest.unlink()
    return [r for r in data["runs"] if r["mode"] in MODES]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--thaw", default=str(ROOT / "target/release/thaw"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    got = {m: [] for m in ("staged", "per-entry")}
    with tempfile.TemporaryDirectory(prefix="thaw-etc-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, THAW_DATA_DIR=str(tmp / "data"))
        envs = {"staged": env, "per-entry": dict(env, THAW_NO_ETC_STAGING="1")}
        for i in range(a.pairs):
            for m in (list(envs) if i % 2 == 0 else list(envs)[::-1]):
                got[m] += bench(a.thaw, envs[m], a.runs, tmp)
    med = {m: {f"{mode}_{k}": statistics.median(r[k] for r in rs if r["mode"] == mode)
               for mode in MODES for k in ("sandbox_ms", "restore_ms")} for m, rs in got.items()}
    for m, d in med.items():
        print(f"{m:10s} " + "  ".join(f"{k} {v:.2f}" for k, v in d.items())
              + f"  ({a.pairs * a.runs} runs per mode)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / time.strftime("etc-staging-%Y%m%dT%H%M%SZ.json", time.gmtime())
    path.write_text(json.dumps({"pairs": a.pairs, "runs": a.runs, "medians": med, "samples": got}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
