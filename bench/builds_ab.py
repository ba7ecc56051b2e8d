#!/usr/bin/env python3
"""Two builds of thaw, same run: repurposing by diff and resets (issue #30).

For each function, each build (its own data directory, so each builds its own base and
diff) serves `thaw base repurpose` calls that alternate a one-line filler function
(loaded) with the function's diff (installed), ROUNDS times, the builds interleaved
round by round. Reports medians of:
  - install_ms: the diff installed (code + install), and its memory phase;
  - first_response_ms: code + install + the first invocation;
  - reset_ms: the filler's instance reset to the base before each install;
and of `thaw snapshot restore --reset --invocations N` with the function's snapshot:
isolated_invoke_ms (each call after a reset), reset_ms and its memory phase (of the
resets not refused), resets_refused (in all).

    python3 bench/builds_ab.py --old /tmp/thaw-old --new target/release/thaw \\
        [--functions helloworld,pyaes,jsonserde,imagerotate] [--rounds 3] [--calls 9]

Writes JSON (default bench/results/builds-ab-<time>.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reset as reset_bench  # noqa: E402  (function_spec, run_stats)


def median(v):
    v = [x for x in v if x is not None]
    return round(statistics.median(v), 3) if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the baseline build's thaw binary")
    ap.add_argument("--new", required=True, help="the build measured against it")
    ap.add_argument("--samples", default="build/samples/python")
    ap.add_argument("--functions", default="helloworld,pyaes,jsonserde,imagerotate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--out", default=time.strftime("bench/results/builds-ab-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    a = ap.parse_args()
    bins = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    tmp = tempfile.mkdtemp(prefix="thaw-builds-ab-")
    envs = {k: dict(os.environ, THAW_DATA_DIR=os.path.join(tmp, "data-" + k)) for k in bins}
    filler = os.path.join(tmp, "filler")
    os.makedirs(filler)
    with open(os.path.join(filler, "f.py"), "w") as f:
        f.write("def handler(event, context):\n    return 1\n")
    results = {"builds": bins, "rounds": a.rounds, "calls": a.calls, "functions": {}}
    for fn in a.functions.split(","):
        runtime, code, handler, payload = reset_bench.function_spec(fn, a.samples)
        payload = payload or "{}"
        calls_files, snaps = {}, {}
        for k, b in bins.items():
            snaps[k] = os.path.join(tmp, f"{fn}-{k}.diff")
            subprocess.run([b, "snapshot", "create", "--runtime", runtime, "--code", code, "--handler", handler, "--out", snaps[k]],
                           check=True, env=envs[k], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            reset_bench.run_stats(b, ["snapshot", "restore", snaps[k], "--payload", payload], envs[k])  # the working set
            calls = []
            for _ in range(a.calls):
                calls.append({"code": filler, "handler": "f.handler", "payload": {}})
                calls.append({"snapshot": snaps[k], "payload": json.loads(payload)})
            calls_files[k] = os.path.join(tmp, f"{fn}-{k}-calls.json")
            with open(calls_files[k], "w") as f:
                json.dump(calls, f)
        got = {k: {m: [] for m in ("install_ms", "install_memory_ms", "first_response_ms", "reset_to_base_ms",
                                   "isolated_invoke_ms", "reset_ms", "reset_memory_ms", "resets_refused")} for k in bins}
        for _ in range(a.rounds):
            for k, b in bins.items():
                p = subprocess.run([b, "base", "repurpose", "--runtime", runtime, "--calls", calls_files[k]],
                                   check=True, env=envs[k], capture_output=True, text=True)
                for line in p.stdout.splitlines():
                    c = json.loads(line)
                    if c.get("how") == "repurposed-diff":
                        got[k]["install_ms"].append(c["load_ms"])
                        got[k]["install_memory_ms"].append(dict(c["phases"]).get("memory"))
                        got[k]["first_response_ms"].append(c["first_response_ms"])
                    elif c.get("reset_ms") is not None:
                        got[k]["reset_to_base_ms"].append(c["reset_ms"])
                st = reset_bench.run_stats(b, ["snapshot", "restore", snaps[k], "--payload", payload, "--reset",
                                               "--invocations", str(a.calls + 3)], envs[k])
                got[k]["isolated_invoke_ms"].extend(st["invocations_ms"][3:])
                kept = [r for r in st["resets"][3:] if "phases_ms" in r]
                got[k]["reset_ms"].extend(r["reset_ms"] for r in kept)
                got[k]["reset_memory_ms"].extend(r["phases_ms"].get("memory") for r in kept)
                got[k]["resets_refused"].append(len(st["resets"][3:]) - len(kept))
        res = {k: {m: (sum(v) if m == "resets_refused" else median(v)) for m, v in got[k].items()} for k in bins}
        results["functions"][fn] = res
        for k in bins:
            print(f"{fn:<12} {k:<4} " + "  ".join(f"{m} {v}" for m, v in res[k].items()), flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
