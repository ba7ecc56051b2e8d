#!/usr/bin/env python3
"""One change switched by an environment variable, A against B, in one sitting:
`thaw bench --functions helloworld` runs alternated between the two environments, and
the medians of sandbox_ms, restore_ms and ttfr_ms per function and restore mode.

    bench/env_ab.py small-init THAW_SANDBOX_INIT=self   # the small init binary vs re-exec of thaw
    bench/env_ab.py etc-staging THAW_NO_ETC_STAGING=1   # staged /etc vs per-entry mounts
    # the bundle check beside the restore vs none and vs before it, dentries cold (issue #35)
    bench/env_ab.py code-check THAW_CODE_CHECK=unchecked THAW_CODE_CHECK=before --functions lrserving --evict-dentries

    bench/env_ab.py NAME VAR=VALUE [VAR=VALUE ...] [--pairs 4] [--runs 5] [--functions helloworld] [--modes boot,prefetch,...]
                    [--evict-dentries] [--thaw target/release/thaw] [--out bench/results]

    # network namespaces used again vs one made per sandbox (issue #33)
    bench/env_ab.py netns-reuse THAW_NETNS_REUSE=0

A is the current environment, B (C, ...) the same plus each VAR=VALUE. `--pairs` rounds
of each, in balanced orders (each follows each other equally often); restores run in-process, as a node does them.
Writes bench/results/NAME-<time>.json. Needs root and build/samples (scripts/build-samples.sh).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coldstart  # noqa: E402  (balanced_orders)

ROOT = Path(__file__).resolve().parents[1]
MODES = ("boot", "prefetch", "prefetch-pooled", "lazy")
FIELDS = ("sandbox_ms", "restore_ms", "ttfr_ms", "node_cpu_ms", "sandbox_init_cpu_ms")


def busy_ms():
    """The machine's CPU time outside idle and iowait so far (/proc/stat, all cores),
    ms: what a start costs the host, kernel workers included (a network namespace is
    torn down by one), which no per-process account sees."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) * 1000.0 / os.sysconf("SC_CLK_TCK")


def bench(thaw, env, runs, out, functions, extra, modes):
    """thaw bench's runs of `modes`, each with `machine_cpu_ms`: the machine's CPU over
    the whole bench process divided by the runs it made (every mode's; setup included,
    which is the same in every environment)."""
    b0 = busy_ms()
    subprocess.run([thaw, "bench", "--functions", functions, "--runs", str(runs), "--concurrency", "",
                    "--out", str(out), *extra], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    busy = busy_ms() - b0
    newest = max(out.glob("reap-*.json"), key=lambda p: p.stat().st_mtime)
    data = json.loads(newest.read_text())
    newest.unlink()
    per_run = busy / max(1, len(data["runs"]))
    return [dict(r, machine_cpu_ms=per_run) for r in data["runs"] if r["mode"] in modes]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("settings", nargs="+", metavar="setting", help="VAR=VALUE added to the environment for B (C, ...)")
    ap.add_argument("--pairs", type=int, default=4, help="rounds (each runs every environment once)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--functions", default="helloworld", help="thaw bench --functions")
    ap.add_argument("--evict-dentries", action="store_true", help="thaw bench --evict-dentries")
    ap.add_argument("--modes", default=",".join(MODES), help="restore modes reported (thaw bench runs them all), e.g. prefetch-sealed")
    ap.add_argument("--thaw", default=str(ROOT / "target/release/thaw"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    modes = tuple(m for m in a.modes.split(",") if m)
    labels = ["A"] + [f"{chr(ord('B') + i)} {st}" for i, st in enumerate(a.settings)]
    got = {m: [] for m in labels}
    extra = ["--evict-dentries"] if a.evict_dentries else []
    with tempfile.TemporaryDirectory(prefix="thaw-ab-") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, THAW_DATA_DIR=str(tmp / "data"))
        for st in a.settings:
            env.pop(st.partition("=")[0], None)
        envs = {labels[0]: env}
        for label, st in zip(labels[1:], a.settings):
            var, _, value = st.partition("=")
            envs[label] = dict(env, **{var: value})
        orders = coldstart.balanced_orders(envs)
        for i in range(a.pairs):
            for m in orders[i % len(orders)]:
                got[m] += bench(a.thaw, envs[m], a.runs, tmp, a.functions, extra, modes)
    # Medians per function and mode (several functions' runs are never pooled: their
    # times differ by more than any change measured here).
    functions = list(dict.fromkeys(r["function"] for rs in got.values() for r in rs))
    def median(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else float("nan")

    med = {m: {f"{fn}/{mode}_{k}": median(r.get(k) for r in rs if r["mode"] == mode and r["function"] == fn)
               for fn in functions for mode in modes if any(r["mode"] == mode and r["function"] == fn for r in rs) for k in FIELDS}
           | {"machine_cpu_ms_per_run": median(r["machine_cpu_ms"] for r in rs)}
           for m, rs in got.items()}
    for m, d in med.items():
        print(f"{m}:  ({a.pairs * a.runs} runs per function and mode; the machine's CPU per run of thaw bench, "
              f"setup included: {d['machine_cpu_ms_per_run']:.2f} ms)")
        for fn in functions:
            for mode in modes:
                if f"{fn}/{mode}_ttfr_ms" in d:
                    print(f"  {fn:14s} {mode:16s} " + "  ".join(f"{k} {d[f'{fn}/{mode}_{k}']:.2f}" for k in FIELDS))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / time.strftime(f"{a.name}-%Y%m%dT%H%M%SZ.json", time.gmtime())
    path.write_text(json.dumps({"name": a.name, "settings": a.settings, "functions": a.functions,
                                "evict_dentries": a.evict_dentries, "pairs": a.pairs, "runs": a.runs,
                                "medians": med, "samples": got}, indent=1))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
