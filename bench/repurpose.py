#!/usr/bin/env python3
"""Repurposing (issue #30): a cold start served by an idle instance of the runtime's
base, against a restore and a cold boot, same run.

For each function (Python samples; Node.js as nodejs/NAME): a cold boot (`thaw boot`), a restore of the
function's diff on the base with its working set (`thaw snapshot restore`, page cache
evicted: today's cold start), and a repurposed cold start: one instance of the base,
restored once with write tracking, serves the function after a call to another
function (`thaw base repurpose`, the calls alternating with a one-line filler function), so each
of its calls is reset to the base (reported apart: a node does that when the instance
goes idle, off the cold start's path), gets the function's code at /var/task, and
loads it (its init runs: the import happens at the cold start, as with "base only" in
SnapFaaS). Time to first response of a repurposed start = code + load + invoke.
A repurposed start by diff (`repurposed-diff`): the same base instance gets the
function's diff (its snapshot on the base) installed instead, its pages, working set and
state (`{"snapshot": DIR}` calls): no init runs. Its time = code + install + invoke.
Baseline of the load, same run: THAW_LOAD_SERVE=0, the runtime loads as it does before
a capture (Node.js compacts its heap with a full GC).

    python3 bench/repurpose.py [--thaw PATH] [--functions helloworld,pyaes,jsonserde,nodejs/helloworld] [--runs 9]

Prints medians and writes JSON (default bench/results/repurpose.json) and an SVG chart.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coldstart  # noqa: E402  (evict_page_cache)
import reset as reset_bench  # noqa: E402  (function_spec, run_stats)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def chart(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fns = list(results["functions"])
    modes = [m for m in ("boot", "restore", "repurposed", "repurposed_diff") if all(m in results["functions"][f] for f in fns)]
    fig, ax = plt.subplots(figsize=(2 + 2 * len(fns), 4))
    w = 0.8 / len(modes)
    for i, m in enumerate(modes):
        ax.bar([k + i * w for k in range(len(fns))], [results["functions"][f][m]["median"] for f in fns], w, label=m)
    ax.set_xticks([k + w for k in range(len(fns))])
    ax.set_xticklabels(fns)
    ax.set_ylabel("time to first response, ms (median)")
    ax.set_title("Repurposed base instance vs restore vs boot (same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thaw", default=os.path.join(ROOT, "target/release/thaw"))
    ap.add_argument("--functions", default="helloworld,pyaes,jsonserde,nodejs/helloworld,nodejs/jsontransform,java/helloworld,java/jsonhandler")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/repurpose.json"))
    a = ap.parse_args(argv)
    samples = os.path.join(ROOT, "build/samples/python")
    tmp = tempfile.mkdtemp(prefix="thaw-repurpose-")
    env = dict(os.environ, THAW_DATA_DIR=os.path.join(tmp, "data"))
    results = {"runs": a.runs, "functions": {}}
    # The function called between two calls of the measured one, per runtime.
    fillers = {}
    for runtime, name, text, handler in (("python3", "filler.py", "def handler(event, context):\n    return {}\n", "filler.handler"),
                                         ("nodejs20.x", "filler.js", "exports.handler = async () => ({});\n", "filler.handler")):
        d = os.path.join(tmp, "filler-" + runtime)
        os.makedirs(d)
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
        fillers[runtime] = (d, handler)
    # Java: another sample (its classes are built by scripts/build-samples.sh).
    java = reset_bench.function_spec("java/random", samples)
    fillers["java17"] = (os.path.abspath(java[1]), java[2])
    for fn in a.functions.split(","):
        runtime, code, handler, payload = reset_bench.function_spec(fn, samples)
        payload = payload or "{}"
        snap = os.path.join(tmp, fn + ".diff")
        subprocess.run([a.thaw, "snapshot", "create", "--runtime", runtime, "--code", code, "--handler", handler, "--out", snap],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reset_bench.run_stats(a.thaw, ["snapshot", "restore", snap, "--payload", payload], env)  # records the working set
        calls = []
        for _ in range(a.runs):
            calls.append({"code": fillers[runtime][0], "handler": fillers[runtime][1], "payload": {}})
            calls.append({"code": os.path.abspath(code), "handler": handler, "payload": json.loads(payload)})
        calls_file = os.path.join(tmp, fn + "-calls.json")
        with open(calls_file, "w") as f:
            json.dump(calls, f)
        diff_calls = [c if c["code"] == fillers[runtime][0] else {"snapshot": snap, "payload": c["payload"]} for c in calls]
        diff_calls_file = os.path.join(tmp, fn + "-diff-calls.json")
        with open(diff_calls_file, "w") as f:
            json.dump(diff_calls, f)
        boot, restore = [], []
        for _ in range(a.runs):
            boot.append(reset_bench.run_stats(a.thaw, ["boot", "--runtime", runtime, "--code", code, "--handler", handler, "--payload", payload], env)["total_ms"])
            coldstart.evict_page_cache(snap)
            coldstart.evict_page_cache(os.path.join(tmp, "data", "bases"))
            restore.append(reset_bench.run_stats(a.thaw, ["snapshot", "restore", snap, "--payload", payload], env)["total_ms"])
        def repurposed(extra_env, file=calls_file):
            p = subprocess.run([a.thaw, "base", "repurpose", "--runtime", runtime, "--calls", file], check=True,
                               env=dict(env, **extra_env), capture_output=True, text=True)
            lines = [json.loads(l) for l in p.stdout.splitlines()]
            return [l for l in lines if l["code"] == os.path.realpath(code)]
        # The baseline first: the runtime loads as for a capture (compacting its heap).
        mine_gc = repurposed({"THAW_LOAD_SERVE": "0"})
        mine = repurposed({})
        by_diff = repurposed({}, diff_calls_file)
        installed = [l for l in by_diff if l.get("how") == "repurposed-diff"]
        rep = [l["first_response_ms"] for l in mine if "first_response_ms" in l]
        res = {
            "boot": reset_bench.summary(boot),
            "restore": reset_bench.summary(restore),
            "repurposed": reset_bench.summary(rep),
            "repurposed_load_as_capture": reset_bench.summary([l["first_response_ms"] for l in mine_gc if "first_response_ms" in l]),
            "repurposed_parts_ms": {k: statistics.median(l[k] for l in mine if k in l) for k in ("code_ms", "load_ms", "invoke_ms", "reset_ms")},
            "installs_refused": sorted({l["install_refused"] for l in by_diff if "install_refused" in l}),
        }
        if installed:
            res["repurposed_diff"] = reset_bench.summary([l["first_response_ms"] for l in installed])
            res["repurposed_diff_parts_ms"] = {k: statistics.median(l[k] for l in installed if k in l) for k in ("code_ms", "load_ms", "invoke_ms", "reset_ms")}
            phases = {}
            for l in installed:
                for name, ms in l.get("phases", []):
                    phases.setdefault(name, []).append(ms)
            res["repurposed_diff_phases_ms"] = {k: statistics.median(v) for k, v in phases.items()}
        results["functions"][fn] = res
        print("%-12s first response ms (median of %d): boot %7.1f  restore %7.1f  repurposed %6.2f (loaded as for a capture %6.2f)  (code %.2f + load %.2f + invoke %.2f; reset before it %.2f)" % (
            fn, a.runs, res["boot"]["median"], res["restore"]["median"], res["repurposed"]["median"], res["repurposed_load_as_capture"]["median"],
            *(res["repurposed_parts_ms"][k] for k in ("code_ms", "load_ms", "invoke_ms", "reset_ms"))), flush=True)
        if installed:
            d = res["repurposed_diff_parts_ms"]
            print("%-12s repurposed by diff %6.2f (code %.2f + install %.2f + invoke %.2f; reset before it %.2f)" % (
                fn, res["repurposed_diff"]["median"], d["code_ms"], d["load_ms"], d["invoke_ms"], d.get("reset_ms", 0)), flush=True)
        else:
            print("%-12s repurposed by diff: refused (%s)" % (fn, "; ".join(res["installs_refused"])), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    svg = chart(results, os.path.splitext(a.out)[0] + ".svg")
    print("wrote %s%s" % (a.out, " and " + svg if svg else ""))


if __name__ == "__main__":
    main()
