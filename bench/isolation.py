#!/usr/bin/env python3
"""Per-invocation isolation and reset latency against dirtied memory (issue #30).

1. Isolation against none (Groundhog's overhead). For each function: snapshot it once,
   then, alternating ROUNDS times, restore it and invoke it CALLS times in a row
   without resets (the baseline: a warm instance shared by every call) and with a
   reset after each call (`--reset`: per-invocation isolation). Two overheads, same
   run: the latency a caller sees, median(isolated invocation) / median(invocation
   without) - 1 (the node resets after the response is sent: a call pays for the
   write tracking and for faulting in again what the reset took back), and the
   instance's occupancy, median(invocation + the reset that follows it) /
   median(invocation without) - 1 (what back-to-back calls on one instance pay).
   Baseline of the latency, same rounds ("all WP +"): resets that write-protect every
   written page again (THAW_RESET_HOT=0), where today's leave the pages every call
   writes writable (each first write would fault).
2. Reset latency against dirtied memory (Refunction, figs. 10-12). A Python function
   holding a 64 MiB buffer from its init writes one byte in every page of the first
   MIB of it per call; each reset then writes back what it dirtied.

Prints medians, writes JSON (default bench/results/isolation-<time>.json) and a chart
beside it (.svg, when matplotlib is importable).

    .venv/bin/python bench/isolation.py [--thaw PATH] [--functions helloworld,pyaes,...]
        [--calls 20] [--rounds 3] [--dirty-mib 0,1,4,16,64] [--no-base]
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
from reset import function_spec  # noqa: E402  (same samples, same manifest)

DIRTY_HANDLER = '''
POOL = bytearray(64 << 20)


def handler(event, context):
    n = int(event["mib"]) << 20
    for i in range(0, n, 4096):
        POOL[i] = (POOL[i] + 1) & 255
    return n
'''


def restore(thaw, env, snap, payload, calls, reset):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        args = [thaw, "snapshot", "restore", snap, "--payload", payload, "--invocations", str(calls), "--quiet", "--stats", f.name]
        if reset:
            args.append("--reset")
        subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def median(v):
    return statistics.median(v) if v else None


def chart(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not importable ({e.__class__.__name__}): chart skipped"
    fns = list(results["isolation"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = range(len(fns))
    none = [results["isolation"][f]["call_ms"] for f in fns]
    inv = [results["isolation"][f]["isolated_call_ms"] for f in fns]
    # A function whose resets were refused has no reset to show (its calls ran on
    # fresh restores): its bar is the call alone, labelled below.
    rst = [results["isolation"][f]["reset_ms"] or 0 for f in fns]
    a.bar([i - 0.2 for i in x], none, 0.4, label="no isolation (warm call)")
    a.bar([i + 0.2 for i in x], inv, 0.4, label="isolated: call")
    a.bar([i + 0.2 for i in x], rst, 0.4, bottom=inv, label="isolated: reset after it")
    labels = [f + (" (refused)" if results["isolation"][f]["overhead"] is None else "") for f in fns]
    a.set_xticks(list(x), labels, rotation=30, ha="right")
    a.set_ylabel("ms per call (median)")
    a.set_yscale("log")
    a.set_title("Per-invocation isolation against none, same run")
    a.legend(fontsize=8)
    d = results["dirty"]
    mib = [r["mib"] for r in d]
    b.plot(mib, [r["reset_ms"] for r in d], marker="o", label="reset ms")
    b.set_xlabel("MiB dirtied per call")
    b.set_ylabel("reset ms (median)")
    b.set_title("Reset latency against dirtied memory (python)")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return f"wrote {path}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--thaw", default=os.environ.get("THAW", "target/release/thaw"))
    ap.add_argument("--samples", default="build/samples/python")
    ap.add_argument("--functions", default="helloworld,pyaes,lrserving,imagerotate,nodejs/helloworld,nodejs/imageresize,java/helloworld,java/matmul")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dirty-mib", default="0,1,4,16,64")
    ap.add_argument("--no-base", action="store_true", help="full images (thaw snapshot create --no-base) instead of diffs on the runtime's base")
    ap.add_argument("--out", default=f"bench/results/isolation-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    a = ap.parse_args()
    if a.calls < 3 or a.rounds < 1:
        sys.exit("--calls must be at least 3 and --rounds at least 1")
    work = tempfile.mkdtemp(prefix="thaw-bench-isolation-")
    env = dict(os.environ, THAW_DATA_DIR=os.path.join(work, "data"))
    results = {"calls": a.calls, "rounds": a.rounds, "isolation": {}, "dirty": []}
    print(f"{'function':<20}{'call ms':>10}{'isolated':>10}{'reset':>8}{'latency +':>10}{'occupancy +':>12}{'1st call':>10}{'all WP +':>12}")
    for fn in a.functions.split(","):
        snap = os.path.join(work, "snap-" + fn.replace("/", "-"))
        runtime, code, handler, sample_payload = function_spec(fn, a.samples)
        payload = sample_payload or "{}"
        subprocess.run([a.thaw, "snapshot", "create", "--runtime", runtime, "--code", code, "--handler", handler, "--out", snap]
                       + (["--no-base"] if a.no_base else []), check=True, env=env, stdout=subprocess.DEVNULL)
        restore(a.thaw, env, snap, payload, 1, False)  # records the working set
        plain, isolated, resets, refused, fresh, all_protected = [], [], [], 0, [], []
        for _ in range(a.rounds):
            # The first call of each restore is a cold one: left out of both, and kept
            # as what a call costs on a freshly restored instance (the other way to
            # isolate calls: a restore per call, from the same snapshot).
            times = restore(a.thaw, env, snap, payload, a.calls, False)["invocations_ms"]
            plain += times[1:]
            fresh.append(times[0])
            st = restore(a.thaw, env, snap, payload, a.calls, True)
            isolated += st["invocations_ms"][1:]
            fresh.append(st["invocations_ms"][0])
            resets += [r["reset_ms"] for r in st["resets"] if r.get("reset_ms") is not None]
            refused += sum(1 for r in st["resets"] if r.get("discarded"))
            # Baseline, same round: every written page write-protected again at each
            # reset (THAW_RESET_HOT=0), so each call faults on its first write to each.
            all_protected += restore(a.thaw, dict(env, THAW_RESET_HOT="0"), snap, payload, a.calls, True)["invocations_ms"][1:]
        call, iso, rst = median(plain), median(isolated), median(resets)
        # Most resets refused: the isolated calls ran on fresh restores; no overhead to state.
        valid = rst is not None and refused * 2 < len(isolated)
        overhead = (iso + rst) / call - 1 if valid else None
        latency = iso / call - 1 if valid else None
        results["isolation"][fn] = {"call_ms": call, "isolated_call_ms": iso, "reset_ms": rst, "overhead": overhead,
                                    "first_call_after_restore_ms": median(fresh),
                                    "latency_overhead": latency, "resets_refused": refused, "calls": len(plain),
                                    "isolated_all_protected_call_ms": median(all_protected),
                                    "latency_overhead_all_protected": median(all_protected) / call - 1 if valid and all_protected else None}
        wp = results["isolation"][fn]["latency_overhead_all_protected"]
        shown = (f"{latency:>10.1%}{overhead:>12.1%}" if valid else f"{'-':>10}{'-':>12}") + f"{median(fresh):>10.3f}" + (f"{wp:>12.1%}" if wp is not None else f"{'-':>12}")
        print(f"{fn:<20}{call:>10.3f}{iso:>10.3f}{(rst or 0):>8.3f}{shown}" + (f"  ({refused} resets refused)" if refused else ""))
    code = os.path.join(work, "dirty")
    os.makedirs(code)
    with open(os.path.join(code, "handler.py"), "w") as f:
        f.write(DIRTY_HANDLER)
    snap = os.path.join(work, "snap-dirty")
    subprocess.run([a.thaw, "snapshot", "create", "--code", code, "--handler", "handler.handler", "--memory", "512", "--out", snap],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"{'MiB dirtied':<20}{'reset ms':>10}{'pages':>10}")
    for mib in [int(x) for x in a.dirty_mib.split(",")]:
        payload = json.dumps({"mib": mib})
        resets, pages = [], []
        for _ in range(a.rounds):
            st = restore(a.thaw, env, snap, payload, a.calls, True)
            # The first reset also takes back the first call's faults; the rest are steady.
            resets += [r["reset_ms"] for r in st["resets"][1:] if r.get("reset_ms") is not None]
            pages += [r["pages_written_back"] for r in st["resets"][1:] if r.get("reset_ms") is not None]
        row = {"mib": mib, "reset_ms": median(resets), "pages_written_back": median(pages), "n": len(resets)}
        results["dirty"].append(row)
        print(f"{mib:<20}{row['reset_ms']:>10.3f}{row['pages_written_back']:>10.0f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {a.out}")
    print(chart(results, os.path.splitext(a.out)[0] + ".svg"))


if __name__ == "__main__":
    main()
