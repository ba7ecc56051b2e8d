#!/usr/bin/env python3
"""No-op in-place reset vs restore from disk, same run (issue #12).

For each function: snapshot it once, then
  - restore it from disk RUNS times per paging mode (`thaw snapshot restore --stats`,
    page cache warm: the snapshot was just written/read), taking restore_ms;
  - restore it once, invoke once, and reset it RUNS+1 times in a row
    (`--reset --noop-resets`), taking each reset's reset_ms except the first (which
    takes back the invocation's writes; reported separately as `first_reset_ms`).
Prints a table of medians and writes JSON (default bench/results/reset.json).

    python3 bench/reset.py [--thaw PATH] [--functions helloworld,pyaes,java/helloworld] [--runs 20]

Node.js and Java samples are named nodejs/NAME and java/NAME (runtime, handler and
payload from samples/manifest.json, as `thaw bench` names them).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_stats(thaw, args, env):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([thaw, *args, "--quiet", "--stats", f.name], check=True, env=env, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def function_spec(fn, samples):
    """(runtime, code dir, handler, payload or None) of a sample, as samples/manifest.json says."""
    manifest = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "samples", "manifest.json")))
    kind, _, name = fn.rpartition("/")
    runtime = {"nodejs": "nodejs20.x", "java": "java17"}.get(kind, "python3")
    code = os.path.join(samples, "..", kind, name) if kind in ("nodejs", "java") else os.path.join(samples, fn)
    entry = manifest["functions"].get(fn, {})
    handler = entry.get("handler") or manifest["default_handler"][kind or "python"]
    payload = json.dumps(entry["payload"]) if "payload" in entry else None
    return runtime, code, handler, payload


def summary(values):
    values = sorted(values)
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
        "min": values[0],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thaw", default=os.environ.get("THAW", "target/release/thaw"))
    ap.add_argument("--samples", default="build/samples/python")
    ap.add_argument("--functions", default="helloworld,pyaes")
    ap.add_argument("--modes", default="prefetch,eager,lazy")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--payload", default="{}")
    ap.add_argument("--out", default="bench/results/reset.json")
    a = ap.parse_args()
    if a.runs < 2:
        sys.exit("--runs must be at least 2")
    work = tempfile.mkdtemp(prefix="thaw-bench-reset-")
    env = dict(os.environ, THAW_DATA_DIR=os.path.join(work, "data"))
    results = {"runs": a.runs, "functions": {}}
    print(f"{'function':<18}{'what':<24}{'median ms':>10}{'p90 ms':>10}")
    for fn in a.functions.split(","):
        snap = os.path.join(work, "snap-" + fn.replace("/", "-"))
        runtime, code, handler, sample_payload = function_spec(fn, a.samples)
        payload = sample_payload or a.payload
        subprocess.run(
            [a.thaw, "snapshot", "create", "--runtime", runtime, "--code", code, "--handler", handler,
             "--out", snap], check=True, env=env, stdout=subprocess.DEVNULL)
        res = {}
        for mode in a.modes.split(","):
            # The first prefetch restore records the working set; measure after it.
            run_stats(a.thaw, ["snapshot", "restore", snap, "--payload", payload, "--paging", "auto"], env)
            times = [run_stats(a.thaw, ["snapshot", "restore", snap, "--payload", payload, "--paging", mode], env)["restore_ms"]
                     for _ in range(a.runs)]
            res[f"restore_{mode}_ms"] = summary(times)
        st = run_stats(a.thaw, ["snapshot", "restore", snap, "--payload", payload, "--reset",
                                "--noop-resets", str(a.runs + 1)], env)
        resets = st["noop_resets"]
        res["first_reset_ms"] = resets[0]["reset_ms"]
        res["first_reset_pages_written_back"] = resets[0]["pages_written_back"]
        res["noop_reset_ms"] = summary([r["reset_ms"] for r in resets[1:]])
        # Without the runtime's answer to the restore notice (its reseed hook).
        res["noop_reset_engine_ms"] = summary([r["reset_ms"] - (r.get("after_restore_ms") or 0) for r in resets[1:]])
        res["noop_reset_pages_written_back"] = summary([r["pages_written_back"] for r in resets[1:]])
        for k, v in res.items():
            if isinstance(v, dict) and k.endswith("_ms"):
                print(f"{fn:<18}{k[:-3]:<24}{v['median']:>10.3f}{v['p90']:>10.3f}")
        results["functions"][fn] = res
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
