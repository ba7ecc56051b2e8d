#!/usr/bin/env python3
"""Layered snapshots (issue #11): base + diff against today's full image, same run.

For each function: a full image (`--no-base`, today) and a diff on its runtime's
base (`thaw base build`; Python and Node.js: `--functions nodejs/helloworld`) are created, each records its working set once (REAP), then
RUNS rounds, interleaved, each from a cold page cache (every snapshot file and the
base evicted): cold boot, full image + REAP prefetch (today), base + diff eager
(the whole diff and its base pages installed before resuming: SnapFaaS- on our
engine), base + diff + working set (prefetch), and SnapFaaS's "base only": the runtime's
base restored (its own working set prefetched) with the function's import at the cold
start (base-import, `thaw base repurpose` with one call). Reported per mode: medians of
restore_ms, first_invoke_ms, total_ms, and SnapFaaS's Table 2 breakdown: A restoring
the process state, B memory from disk (the memory phase), C work after the restore
(after-restore hooks; base-import: also the code and the import), D the first
invocation's slowdown against a warm call of the full image; for a Java function also base + diff + working
set whose classes come from a class loader of its own (THAW_JAVA_FUNCTION_LOADER=own),
the baseline of appending its class path to the system loader's; for a function its
base could provide little of (under 5% of its memory), which `thaw snapshot create`
therefore captures as a full image, its diff made anyway (THAW_DIFF_MIN_BASE_SHARE=0,
mode diff-kept-prefetch: the baseline); per function: bytes of base, diff, full image,
working set, and the create time of each kind.

    python3 bench/layers.py [--thaw PATH] [--functions helloworld,pyaes] [--runs 7]

Memory: for N instances (--instances, default 1,8,16,32) of one function alive
together, each invoked once (`thaw snapshot memory`): mean per-instance USS, PSS and
RSS, the base/diff pages mapped from the shared memory file, and MemAvailable's drop
per instance (noisy: page cache), for the full image, the diff, and the diff whose
instances gave back their unchanged copies (`--give-back`); and the warm calls of one
shared instance with a give-back before each against none. Across the functions
of one runtime (--cross-instances, default 1,4 instances each, all alive in one
process): host memory per instance (its anonymous pages plus the shared memory
files counted once) for full images, diffs with a file per snapshot and diffs
with their base's file (THAW_SHARE_MEMORY=base), each also given back.

Writes JSON (default bench/results/layers.json) and an SVG chart beside it, and prints a table.
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
import coldstart  # noqa: E402  (evict_page_cache)
import reset as reset_bench  # noqa: E402  (function_spec, run_stats)


def thaw_json(thaw, args, env):
    p = subprocess.run([thaw, *args], check=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def thaw_json_all(thaw, args, env):
    p = subprocess.run([thaw, *args], check=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return json.loads(p.stdout.decode())


def dir_bytes(path, names=("pages.img",)):
    return sum(os.path.getsize(os.path.join(path, n)) for n in names if os.path.exists(os.path.join(path, n)))


def base_import(thaw, runtime, code, handler, payload, env, work, pool):
    """SnapFaaS's "base only": the runtime's base restored (its working set prefetched:
    the first such start records it) and the function imported at the cold start
    (`thaw base repurpose` with one call, which tracks no writes). A stats dict shaped
    as `thaw snapshot restore --stats` gives, plus load_ms (code + import) and
    invoke_ms; first_invoke_ms is load + invoke."""
    calls = os.path.join(work, "base-import-calls.json")
    with open(calls, "w") as f:
        json.dump([{"code": os.path.abspath(code), "handler": handler, "payload": json.loads(payload)}], f)
    p = subprocess.run([thaw, "base", "repurpose", "--runtime", runtime, "--calls", calls, *pool], check=True, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = json.loads(p.stdout.decode().splitlines()[0])
    if "error" in (line.get("response") or {}):
        raise SystemExit("base-import of %s failed: %s" % (code, line["response"]))
    return {"restore_ms": line["base_restore_ms"], "first_invoke_ms": line["first_response_ms"],
            "total_ms": line["base_restore_ms"] + line["first_response_ms"], "phases_ms": dict(line["base_phases"]),
            "load_ms": line["code_ms"] + line["load_ms"], "invoke_ms": line["invoke_ms"], "memory_peak_bytes": 0}


def phase_medians(samples):
    """The median of each restore phase over `samples` (thaw --stats: the engine's phases,
    the sandbox's and the snapshot's open), ms."""
    names = sorted({p for s in samples for p in (s.get("phases_ms") or {})} | {"sandbox", "open"})
    get = {"sandbox": lambda s: s.get("sandbox_ms") or 0.0, "open": lambda s: s.get("open_ms") or 0.0}
    return {p: statistics.median(get[p](s) if p in get else (s.get("phases_ms") or {}).get(p, 0.0) for s in samples) for p in names}


def breakdown(s, warm_ms):
    """SnapFaaS's Table 2 columns for one cold start: A restoring the process state
    (the restore but its memory phase and the runtime's after-restore hooks), B memory
    from disk (the memory phase: the working set or the eager image read and
    installed before the process resumes), C work after the restore (the after-restore
    hooks; for base-import also the function's code and import), D the first
    invocation's slowdown against a warm call (its lazy faults, cold caches)."""
    ph = s.get("phases_ms") or {}
    memory, after = ph.get("memory", 0.0), ph.get("after_restore", 0.0)
    return {"A_state_ms": s["restore_ms"] - memory - after, "B_memory_ms": memory,
            "C_after_restore_ms": after + s.get("load_ms", 0.0),
            "D_slowdown_ms": s.get("invoke_ms", s["first_invoke_ms"]) - warm_ms}


def median_ci(xs, resamples=2000, seed=31):
    """95% interval of the median of `xs` (percentile bootstrap, seeded)."""
    import random
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return [meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]]


def chart(results, path):
    """Bytes (base, diff, full) and total ms per mode, per function, as an SVG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fns = list(results["functions"])
    if not fns:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    sizes = ("diff", "full")
    w = 0.8 / len(sizes)
    for j, k in enumerate(sizes):
        axes[0].bar([i + j * w for i in range(len(fns))], [results["functions"][f]["bytes"][k] / 1e6 for f in fns], w, label=k)
    axes[0].set_title("stored MB (the diff's base stored once per runtime)", fontsize=10)
    modes = ("full-prefetch", "base-import", "diff-eager", "diff-prefetch", "diff-prefetch-shared")
    w = 0.8 / len(modes)
    for j, m in enumerate(modes):
        axes[1].bar([i + j * w for i in range(len(fns))], [results["functions"][f]["modes"].get(m, {}).get("total_ms", 0) for f in fns], w, label=m)
    axes[1].set_title("restore + first response, ms (median, cold page cache)", fontsize=10)
    for ax, n in zip(axes, (len(sizes), len(modes))):
        ax.set_xticks([i + 0.4 - 0.4 / n for i in range(len(fns))])
        ax.set_xticklabels(fns, fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thaw", default=os.environ.get("THAW", "target/release/thaw"))
    ap.add_argument("--samples", default="build/samples/python")
    ap.add_argument("--functions", default="helloworld,pyaes,jsonserde,lrserving")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--instances", default="1,8,16,32", help="instance counts of the memory measurement")
    ap.add_argument("--cross-instances", default="1,4",
                    help="instances of each function in the memory measurement across the functions of one runtime ('' to skip)")
    ap.add_argument("--prepared-sandbox", action="store_true",
                    help="restore in sandboxes prepared beforehand, as a node does (thaw serve --sandbox-pool, its default): "
                         "the sandbox's creation (~5 ms here, and the largest source of run-to-run spread) is not in the times")
    ap.add_argument("--out", default="bench/results/layers.json")
    args = ap.parse_args(argv)
    thaw = os.path.abspath(args.thaw)
    work = tempfile.mkdtemp(prefix="thaw-layers-")
    env = dict(os.environ, THAW_DATA_DIR=os.path.join(work, "data"))
    env.pop("THAW_LOG", None)
    bases = {}
    results = {"bases": {}, "runs": args.runs, "prepared_sandbox": args.prepared_sandbox, "functions": {}, "across_functions": {}}
    by_runtime = {}
    for fn in [f for f in args.functions.split(",") if f]:
        runtime, code, handler, payload = reset_bench.function_spec(fn, args.samples)
        payload = payload or "{}"
        if runtime not in bases:
            # A runtime that cannot have a base (Java) says so: its "diff" is a full image.
            try:
                bases[runtime] = thaw_json(thaw, ["base", "build", "--runtime", runtime], env)
                results["bases"][runtime] = {"id": bases[runtime]["id"], "bytes": bases[runtime]["bytes"]}
            except subprocess.CalledProcessError as e:
                print("%s: no base (%s)" % (runtime, e.stderr.decode().strip()), flush=True)
                bases[runtime] = None
        base = bases[runtime] or {"bytes": 0, "dir": None}
        common = ["--code", code, "--handler", handler, "--runtime", runtime]
        snaps = {k: os.path.join(work, "%s.%s" % (fn.replace("/", "_"), k)) for k in ("full", "diff")}
        t = time.perf_counter()
        full = thaw_json(thaw, ["snapshot", "create", "--no-base", *common, "--out", snaps["full"]], env)
        full_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        diff = thaw_json(thaw, ["snapshot", "create", *common, "--out", snaps["diff"]], env)
        diff_ms = (time.perf_counter() - t) * 1e3
        layered = diff.get("base") is not None
        # Java: the baseline of the function's classes on the system class loader's path
        # (what a diff does), a loader of the function's own (THAW_JAVA_FUNCTION_LOADER=own).
        own_loader = None
        if layered and runtime.startswith("java"):
            own_loader = os.path.join(work, "%s.diff-own-loader" % fn.replace("/", "_"))
            thaw_json(thaw, ["snapshot", "create", *common, "--env", "THAW_JAVA_FUNCTION_LOADER=own", "--out", own_loader], env)
        # A function its base could provide little of is captured as a full image
        # (layered.rs MIN_BASE_SHARE_PERCENT); the baseline keeps its diff anyway.
        kept_diff = None
        if diff.get("full_image_because"):
            kept_diff = os.path.join(work, "%s.diff-kept" % fn.replace("/", "_"))
            thaw_json(thaw, ["snapshot", "create", *common, "--out", kept_diff], dict(env, THAW_DIFF_MIN_BASE_SHARE="0"))
        for k in (*snaps.values(), own_loader, kept_diff):
            if k:
                reset_bench.run_stats(thaw, ["snapshot", "restore", k, "--paging", "record", "--payload", payload], env)
        pool = ["--prepared-sandbox"] if args.prepared_sandbox else []
        modes = {
            "boot": ["boot", *common, "--payload", payload],
            "full-prefetch": ["snapshot", "restore", snaps["full"], "--paging", "prefetch", "--payload", payload, *pool],
            "diff-eager": ["snapshot", "restore", snaps["diff"], "--paging", "eager", "--payload", payload, *pool],
            "diff-prefetch": ["snapshot", "restore", snaps["diff"], "--paging", "prefetch", "--payload", payload, *pool],
            # With a shared memory file: each CLI restore is a new process whose file is
            # empty, so this is the cost of filling it (later restores of a process map it).
            "diff-prefetch-shared": ["snapshot", "restore", snaps["diff"], "--paging", "prefetch", "--share-memory", "--payload", payload, *pool],
        }
        if bases[runtime]:
            modes["base-import"] = None  # base_import()
            base_import(thaw, runtime, code, handler, payload, env, work, pool)  # records the base's working set
        if kept_diff:
            modes["diff-kept-prefetch"] = ["snapshot", "restore", kept_diff, "--paging", "prefetch", "--payload", payload, *pool]
        if own_loader:
            modes["diff-prefetch-own-loader"] = ["snapshot", "restore", own_loader, "--paging", "prefetch", "--payload", payload, *pool]
        samples = {m: [] for m in modes}
        # Every mode follows every other equally often (a restore right after an eager
        # one runs slower: a rotation charged that to diff-prefetch every round).
        orders = coldstart.balanced_orders(modes.items())
        for run in range(args.runs):
            for m, a in orders[run % len(orders)]:
                for d in (*snaps.values(), base["dir"], own_loader, kept_diff):
                    if d:
                        coldstart.evict_page_cache(d)
                samples[m].append(base_import(thaw, runtime, code, handler, payload, env, work, pool) if m == "base-import"
                                  else reset_bench.run_stats(thaw, a, env))
        # A warm call of the full image (calls 2..4 of one instance), for D.
        warm = []
        for _ in range(3):
            warm += reset_bench.run_stats(thaw, ["snapshot", "restore", snaps["full"], "--paging", "prefetch", "--invocations", "4", "--payload", payload], env)["invocations_ms"][1:]
        warm_ms = statistics.median(warm)
        med = lambda m, k: statistics.median(s.get(k) or 0.0 for s in samples[m])  # noqa: E731
        res = {
            "layered": layered,
            "full_image_because": diff.get("full_image_because"),
            "bytes": {
                "base": base["bytes"],
                "full": dir_bytes(snaps["full"]),
                "diff": dir_bytes(snaps["diff"]),
                "ws_full": dir_bytes(snaps["full"], ("ws.pages",)),
                "ws_diff": dir_bytes(snaps["diff"], ("ws.pages",)),
            },
            "create_ms": {"full": full_ms, "diff": diff_ms},
            "pages_from_base": diff["capture"].get("pages_from_base"),
            "modes": {m: {k: med(m, k) for k in ("restore_ms", "first_invoke_ms", "total_ms", "memory_peak_bytes")} for m in modes},
            "warm_ms": warm_ms,
            "breakdown": {m: {k: statistics.median(breakdown(s, warm_ms)[k] for s in samples[m])
                              for k in ("A_state_ms", "B_memory_ms", "C_after_restore_ms", "D_slowdown_ms")} for m in modes if m != "boot"},
            # Each restore phase's median (the sandbox's, the open's, the engine's own).
            "phases_ms": {m: phase_medians(samples[m]) for m in modes if m not in ("boot", "base-import")},
        }
        # Memory: N instances alive together, each invoked once (prefetch restores).
        res["memory"] = {}
        variants = {k: (snaps[k], [], "snapshot") for k in snaps}
        if layered:
            # Each instance, once idle, gives back the pages it copied and holds unchanged
            # (what `thaw serve --give-back-after` does); and the same with the base's
            # memory file (`--shared-memory-file base`: the diff's own pages private).
            variants["diff-given-back"] = (snaps["diff"], ["--give-back"], "snapshot")
            variants["diff-base-file"] = (snaps["diff"], [], "base")
            variants["diff-base-file-given-back"] = (snaps["diff"], ["--give-back"], "base")
        for n in [int(x) for x in args.instances.split(",") if x]:
            for k, (snap, extra, files) in variants.items():
                m = thaw_json_all(thaw, ["snapshot", "memory", snap, "--instances", str(n), "--paging", "prefetch", "--payload", payload, *extra],
                                  dict(env, THAW_SHARE_MEMORY=files))
                later = sorted(m["restore_ms"][1:]) or [0.0]
                res["memory"]["%s-%d" % (k, n)] = {"instances": n, "shared": m["shared_memory"] is not None,
                                                   "host_added_per_instance_bytes": m["host_mem_added_per_instance_bytes"],
                                                   "first_restore_ms": m["restore_ms"][0], "later_restore_ms_median": later[len(later) // 2],
                                                   "shared_memory_bytes": m["shared_memory_bytes"],
                                                   "host_per_instance": m["mean"]["anon"] + m["shared_memory_bytes"] / n,
                                                   **m["mean"]}
                if m.get("give_back"):
                    res["memory"]["%s-%d" % (k, n)]["give_back_ms_median"] = statistics.median(g["ms"] for g in m["give_back"])
                    res["memory"]["%s-%d" % (k, n)]["pages_given_back_mean"] = statistics.mean(g["given_back"] for g in m["give_back"])
        if layered:
            # What a give-back costs the calls after it: warm calls 2..CALLS of one
            # shared instance, with a give-back before each against none, same rounds.
            calls = {"warm": [], "after-give-back": []}
            for _ in range(args.runs):
                for k, extra in (("warm", []), ("after-give-back", ["--give-back"])):
                    s = reset_bench.run_stats(thaw, ["snapshot", "restore", snaps["diff"], "--paging", "prefetch", "--share-memory", *extra,
                                                     "--invocations", "5", "--payload", payload], env)
                    calls[k].extend(s["invocations_ms"][1:])
            res["calls_ms"] = {k: statistics.median(v) for k, v in calls.items()}
        res["bytes"]["diff_over_full"] = res["bytes"]["diff"] / res["bytes"]["full"]
        res["diff_prefetch_over_full_prefetch"] = res["modes"]["diff-prefetch"]["total_ms"] / res["modes"]["full-prefetch"]["total_ms"]
        # Paired: diff+WS / full+REAP of the same round (drift between rounds cancels),
        # the median over rounds and its 95% interval (bootstrap of the median).
        res["samples_total_ms"] = {m: [s["total_ms"] for s in samples[m]] for m in modes}
        pairs = [d / f for d, f in zip(res["samples_total_ms"]["diff-prefetch"], res["samples_total_ms"]["full-prefetch"])]
        res["paired_ratio"] = {"median": statistics.median(pairs), "ci95": median_ci(pairs)}
        results["functions"][fn] = res
        if layered:
            by_runtime.setdefault(runtime, []).append((fn, snaps, payload))
        print("%-12s diff %6.2f MB / full %6.2f MB (%3.0f%%)  ws %5.2f / %5.2f MB  total ms: boot %6.1f  full+REAP %6.1f  diff eager %6.1f  diff+WS %6.1f (%.2fx)  diff+WS, shared file filled %6.1f" % (
            fn, res["bytes"]["diff"] / 1e6, res["bytes"]["full"] / 1e6, 100 * res["bytes"]["diff_over_full"],
            res["bytes"]["ws_diff"] / 1e6, res["bytes"]["ws_full"] / 1e6,
            res["modes"]["boot"]["total_ms"], res["modes"]["full-prefetch"]["total_ms"],
            res["modes"]["diff-eager"]["total_ms"], res["modes"]["diff-prefetch"]["total_ms"],
            res["diff_prefetch_over_full_prefetch"], res["modes"]["diff-prefetch-shared"]["total_ms"]), flush=True)
        print("    diff+WS / full+REAP in the same round: median %.3f (95%% interval %.3f-%.3f over %d rounds)" % (
            res["paired_ratio"]["median"], *res["paired_ratio"]["ci95"], len(pairs)), flush=True)
        if "base-import" in res["modes"]:
            print("    base only, the import at the cold start (SnapFaaS): %6.1f ms (base restore %.1f + code and import %.1f + invoke %.1f)" % (
                res["modes"]["base-import"]["total_ms"], res["modes"]["base-import"]["restore_ms"],
                med("base-import", "load_ms"), med("base-import", "invoke_ms")), flush=True)
        print("    A state / B memory / C after the restore / D slowdown vs warm (%.2f ms), ms:  %s" % (warm_ms, "  ".join(
            "%s %.1f/%.1f/%.1f/%.1f" % (m, *(res["breakdown"][m][k] for k in ("A_state_ms", "B_memory_ms", "C_after_restore_ms", "D_slowdown_ms")))
            for m in ("full-prefetch", "base-import", "diff-eager", "diff-prefetch") if m in res["breakdown"])), flush=True)
        full_p, diff_p = res["phases_ms"]["full-prefetch"], res["phases_ms"]["diff-prefetch"]
        print("    phases, diff+WS against full+REAP (ms, + is slower): %s" % ", ".join(
            "%s %+.2f" % (p, diff_p.get(p, 0.0) - full_p.get(p, 0.0)) for p in sorted(set(full_p) | set(diff_p))
            if abs(diff_p.get(p, 0.0) - full_p.get(p, 0.0)) >= 0.05), flush=True)
        if own_loader:
            print("    diff+WS with a class loader of the function's own (the baseline) %6.1f ms (%.2fx full+REAP); first invocation %.1f vs %.1f ms on the system loader" % (
                res["modes"]["diff-prefetch-own-loader"]["total_ms"], res["modes"]["diff-prefetch-own-loader"]["total_ms"] / res["modes"]["full-prefetch"]["total_ms"],
                res["modes"]["diff-prefetch-own-loader"]["first_invoke_ms"], res["modes"]["diff-prefetch"]["first_invoke_ms"]), flush=True)
        if "calls_ms" in res:
            print("    warm call %.3f ms, after a give-back %.3f ms" % (res["calls_ms"]["warm"], res["calls_ms"]["after-give-back"]), flush=True)
        for key in sorted(res["memory"], key=lambda k: (res["memory"][k]["instances"], k)):
            m = res["memory"][key]
            print("    %-26s host %6.2f MB  anon %6.2f MB  USS %6.2f MB  PSS %6.2f MB  RSS %6.2f MB  shared pages %5d  restore first %6.1f ms, later %6.1f ms" % (
                key, m["host_per_instance"] / 1e6, m["anon"] / 1e6, m["uss"] / 1e6, m["pss"] / 1e6, m["rss"] / 1e6, m["pages_shared"], m["first_restore_ms"], m["later_restore_ms_median"]), flush=True)
    # Memory across the functions of one runtime: instances of every function alive
    # together in one process (`thaw snapshot memory A B ...`). Host memory per instance
    # = each instance's anonymous pages (its own, copies included) plus the shared memory
    # files' bytes counted once: full images; diffs with a file per snapshot; diffs with
    # their base's file (the base counted once); each also with the unchanged copies
    # given back.
    for runtime, fns in by_runtime.items():
        if len(fns) < 2:
            continue
        for n in [int(x) for x in args.cross_instances.split(",") if x]:
            row = {}
            variants = (("full", "full", "snapshot", []), ("diff, file per snapshot", "diff", "snapshot", []),
                        ("diff, file per snapshot, given back", "diff", "snapshot", ["--give-back"]),
                        ("diff, base's file", "diff", "base", []), ("diff, base's file, given back", "diff", "base", ["--give-back"]))
            for label, kind, files, extra in variants:
                m = thaw_json_all(thaw, ["snapshot", "memory", *[s[kind] for _, s, _ in fns], "--instances", str(n), "--paging", "prefetch", *extra],
                                  dict(env, THAW_SHARE_MEMORY=files))
                k = n * len(fns)
                row[label] = {"anon_per_instance": m["mean"]["anon"], "uss_per_instance": m["mean"]["uss"], "shared_memory_files": m["shared_memory_files"],
                              "shared_memory_bytes": m["shared_memory_bytes"], "host_per_instance": (m["mean"]["anon"] * k + m["shared_memory_bytes"]) / k}
            results["across_functions"]["%s x%d" % (runtime, n)] = {"functions": [f for f, _, _ in fns], "instances_each": n, "memory": row}
            print("%s, %d functions x %d instances: host memory per instance (anon + shared files once)" % (runtime, len(fns), n), flush=True)
            full = row["full"]["host_per_instance"]
            for label, r in row.items():
                print("    %-38s %7.0f KB (%3.0f%% of full)  anon %6.0f KB  shared files %d: %7.0f KB" % (
                    label, r["host_per_instance"] / 1024, 100 * r["host_per_instance"] / full, r["anon_per_instance"] / 1024,
                    r["shared_memory_files"], r["shared_memory_bytes"] / 1024), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    svg = chart(results, os.path.splitext(args.out)[0] + ".svg")
    if svg:
        print("chart %s" % svg)
    for runtime, b in results["bases"].items():
        print("%s base %s: %.2f MB" % (runtime, b["id"][:12], b["bytes"] / 1e6))
    print("written %s" % args.out)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
