#!/usr/bin/env python3
"""One change switched by an environment variable, A against B, in one sitting:
`thaw bench --functions helloworld` runs alternated between the two environments, and
the medians of sandbox_ms, restore_ms and ttfr_ms per restore mode.

    bench/env_ab.py small-init THAW_SANDBOX_INIT=self   # the small init binary vs re-exec of thaw
    bench/env_ab.py etc-staging THAW_NO_ETC_STAGING=1   # staged /etc vs per-entry mounts

    bench/env_ab.py NAME VAR=VALUE [--pairs 4] [--runs 5] [--thaw target/release/thaw] [--out bench/results]

A is the current environment, B the same plus VAR=VALUE. `--pairs` of each, starting
with a different one each pair; restores run in-process, as a node does them. Writes
bench/results/NAME-<time>.json. Needs root and build/samples (scripts/build-samples.sh).
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
MODES = ("boot", "prefetch", "prefetch-pooled", "lazy")
FIELDS = ("sandbox_ms", "restore_ms", "ttfr_ms")


def bench(thaw, env, runs, out):
    subprocess.run([thaw, "bench", "--functions", "helloworld", "--runs", str(runs), "--concurrency", "",
                    "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    newest = max(out.glob("reap-*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(newest.read_text())
    newest.unlink()
    return [r for r in data["runs"] if r["mode"] in MODES]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("setting", help="VAR=VALUE added to the environment for B")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--thaw", default=str(ROOT / "target/release/thaw"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    var, _, value = a.setting.partition("=")
    labels = ("A", f"B {a.setting}")
    got = {m: [] for m in labels}
    with tempfile.TemporaryDirectory(prefix="thaw-ab-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, THAW_DATA_DIR=str(tmp / "data"))
        env.pop(var, None)
        envs = {labels[0]: env, labels[1]: dict(env, **{var: value})}
        for i in range(a.pairs):
            for m in (list(envs) if i % 2 == 0 else list(envs)[::-1]):
                got[m] += bench(a.thaw, envs[m], a.runs, tmp)
    med = {m: {f"{mode}_{k}": statistics.median(r[k] for r in rs if r["mode"] == mode)
               for mode in MODES if any(r["mode"] == mode for r in rs) for k in FIELDS} for m, rs in got.items()}
    for m, d in med.items():
        print(f"{m}:  ({a.pairs * a.runs} runs per mode)")
        for mode in MODES:
            if f"{mode}_ttfr_ms" in d:
                print(f"  {mode:16s} " + "  ".join(f"{k} {d[f'{mode}_{k}']:.2f}" for k in FIELDS))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / time.strftime(f"{a.name}-%Y%m%dT%H%M%SZ.json", time.gmtime())
    path.write_text(json.dumps({"name": a.name, "setting": a.setting, "pairs": a.pairs, "runs": a.runs,
                                "medians": med, "samples": got}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
