#!/usr/bin/python3
"""Cold-start benchmark: cold boot vs snapshot restore (lazy / eager) vs warm.

Runs the `thaw` CLI (stdlib only; run with /usr/bin/python3):

    thaw boot --code DIR --handler mod.fn --payload JSON [--stats FILE]
    thaw snapshot create --code DIR --handler mod.fn --out SNAPDIR
    thaw snapshot restore SNAPDIR --payload JSON [--paging lazy|eager]
                          [--invocations N] [--stats FILE]

For every function the snapshot is created once (in a temp dir); then each of
the N runs executes, interleaved so drift hits every mode alike:

    boot   cold boot + one invocation              total = total_ms
    lazy   restore --paging lazy                   total = restore_ms + first_invoke_ms
    eager  restore --paging eager                  total = restore_ms + first_invoke_ms
    warm   restore --invocations 2                 total = invocations_ms[1]

Before every command the snapshot image is evicted from the page cache
(fsync + posix_fadvise(DONTNEED) on every regular file of SNAPDIR).  Each
command is also timed end to end (wall_ms).  Reported per function and mode:
median and p90 of total, restore_ms, first_invoke_ms, page_faults,
bytes_read_from_image, wall_ms (+ sandbox_ms/init_ms for boot), and the
speedup of lazy/eager/warm over boot (ratio of median totals).

Output: a fixed-width table on stdout and JSON
{"meta": {...}, "results": {function: {mode: {metric: {median, p90, n}}, ...}}}
at --out (default bench/results/coldstart-<UTC timestamp>.json), plus a PNG
bar chart next to it when matplotlib is importable.

    /usr/bin/python3 bench/coldstart.py --runs 10
    /usr/bin/python3 bench/coldstart.py --thaw target/release/thaw --functions helloworld,bigheap
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MODES = ("boot", "lazy", "eager", "warm")
EXCLUDED = ("error", "initerror")
DEFAULT_HANDLER = "handler.handler"
DEFAULT_PAYLOADS = {
    "helloworld": '{"name": "bench"}',
    "bigheap": '{"i": 7}',
    "stdlib": '{"text": "Snapshots make cold starts warm", "qty": 4, "category": "dairy", "days": 90}',
    "heavyimports": '{"n": 256, "seed": 3}',
}
# metrics summarised per mode (None values are skipped)
METRICS = ("total_ms", "restore_ms", "first_invoke_ms", "page_faults",
           "bytes_read_from_image", "wall_ms", "sandbox_ms", "init_ms")


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------

def percentile(values, p):
    """Linear-interpolated percentile (numpy's default), p in [0, 100]."""
    vals = sorted(values)
    if not vals:
        return None
    if len(vals) == 1:
        return float(vals[0])
    k = (len(vals) - 1) * (p / 100.0)
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return float(vals[lo] + (vals[hi] - vals[lo]) * (k - lo))


def summarize(values):
    vals = [v for v in values if v is not None]
    return {"median": percentile(vals, 50), "p90": percentile(vals, 90), "n": len(vals)}


def _num(d, key):
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def sample_from_stats(mode, stats, wall_ms):
    """One measurement (dict of metric -> float|None) from a stats file."""
    s = {m: None for m in METRICS}
    s["wall_ms"] = wall_ms
    for key in ("restore_ms", "first_invoke_ms", "page_faults", "bytes_read_from_image",
                "sandbox_ms", "init_ms"):
        s[key] = _num(stats, key)
    if mode == "boot":
        s["total_ms"] = _num(stats, "total_ms")
    elif mode in ("lazy", "eager"):
        r, f = s["restore_ms"], s["first_invoke_ms"]
        s["total_ms"] = r + f if r is not None and f is not None else None
    elif mode == "warm":
        inv = stats.get("invocations_ms") if isinstance(stats, dict) else None
        if not isinstance(inv, list) or len(inv) < 2:
            raise BenchError("warm run: stats has no 2nd entry in invocations_ms: %r" % (inv,))
        s["total_ms"] = float(inv[1])
    else:
        raise ValueError(mode)
    return s


def aggregate(samples_by_mode):
    """{mode: [sample, ...]} -> {mode: {metric: summary}, "speedup": {...}}."""
    out = {}
    for mode in MODES:
        samples = samples_by_mode.get(mode, [])
        summ = {}
        for metric in METRICS:
            vals = [s.get(metric) for s in samples]
            if any(v is not None for v in vals):
                summ[metric] = summarize(vals)
        summ["runs_ok"] = len(samples)
        out[mode] = summ
    speed = {}
    boot = out.get("boot", {}).get("total_ms", {}).get("median")
    boot_wall = out.get("boot", {}).get("wall_ms", {}).get("median")
    for mode in ("lazy", "eager", "warm"):
        med = out.get(mode, {}).get("total_ms", {}).get("median")
        wall = out.get(mode, {}).get("wall_ms", {}).get("median")
        speed[mode] = round(boot / med, 3) if boot and med else None
        if mode != "warm":
            speed[mode + "_wall"] = round(boot_wall / wall, 3) if boot_wall and wall else None
    out["speedup"] = speed
    return out


# --------------------------------------------------------------------------
# running thaw
# --------------------------------------------------------------------------

def balanced_orders(items):
    """Orders to run `items` in, one per round (round i takes orders[i % len(orders)]),
    balanced for what ran just before: over all the orders every item runs first
    equally often and follows every other item equally often (a Williams design, as
    in crossover trials; 2n orders for an odd n). A rotation of one order, as the
    benchmarks did before, makes each mode always follow the same one: a restore
    measured right after an eager restore ran 5-8% slower (jsonserde, 2026-11-29),
    which charged that slowdown to one mode every round."""
    items = list(items)
    n = len(items)
    if n < 2:
        return [items]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(j + i) % n for j in first] for i in range(n)]
    if n % 2:
        rows += [r[::-1] for r in rows]
    return [[items[j] for j in r] for r in rows]


def evict_page_cache(path):
    """Drop every regular file under path from the page cache. Returns bytes."""
    total = 0
    if not os.path.exists(path):
        return 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            fp = os.path.join(dirpath, name)
            try:
                if not os.path.isfile(fp) or os.path.islink(fp):
                    continue
                fd = os.open(fp, os.O_RDONLY)
            except OSError:
                continue
            try:
                try:
                    os.fsync(fd)  # dirty pages cannot be dropped
                except OSError:
                    pass
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def thaw_argv(thaw):
    if thaw.endswith(".py"):
        return [sys.executable, thaw]
    return [thaw]


def run_cmd(argv, timeout):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError("timed out after %ss: %s" % (timeout, " ".join(argv)))
    except OSError as e:
        raise BenchError("cannot run %s: %s" % (argv[0], e))
    wall = (time.perf_counter() - t0) * 1000.0
    if p.returncode != 0:
        raise BenchError("exit %d: %s\n%s" % (p.returncode, " ".join(argv),
                                              p.stderr.decode("utf-8", "replace")[-2000:]))
    return wall, p.stdout.decode("utf-8", "replace")


def read_stats(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise BenchError("cannot read stats file %s: %s" % (path, e))


def mode_argv(thaw, mode, code, handler, snap, payload, stats):
    base = thaw_argv(thaw)
    if mode == "boot":
        return base + ["boot", "--code", code, "--handler", handler,
                       "--payload", payload, "--stats", stats]
    argv = base + ["snapshot", "restore", snap, "--payload", payload, "--stats", stats]
    if mode in ("lazy", "eager"):
        return argv + ["--paging", mode]
    return argv + ["--invocations", "2"]


def bench_function(name, code, args, tmp, log=print):
    handler = args.handler
    payload = args.payloads.get(name, "{}")
    snap = os.path.join(tmp, name + ".snap")
    stats = os.path.join(tmp, name + ".stats.json")
    shutil.rmtree(snap, ignore_errors=True)
    t0 = time.perf_counter()
    run_cmd(thaw_argv(args.thaw) + ["snapshot", "create", "--code", code, "--handler", handler,
                                   "--out", snap], args.timeout)
    create_ms = (time.perf_counter() - t0) * 1000.0
    image_bytes = evict_page_cache(snap)
    log("  %s: snapshot created in %.0f ms (%.1f MiB)" % (name, create_ms, image_bytes / 2.0 ** 20))

    samples = {m: [] for m in MODES}
    errors = []
    outputs = {}
    for run in range(args.runs):
        for mode in MODES:
            if not args.no_evict:
                evict_page_cache(snap)
            if os.path.exists(stats):
                os.unlink(stats)
            argv = mode_argv(args.thaw, mode, code, handler, snap, payload, stats)
            try:
                wall, out = run_cmd(argv, args.timeout)
                s = sample_from_stats(mode, read_stats(stats), wall)
            except BenchError as e:
                errors.append({"run": run, "mode": mode, "error": str(e)})
                log("  %s run %d %s: FAILED: %s" % (name, run + 1, mode, str(e).splitlines()[0]))
                continue
            s["run"] = run
            samples[mode].append(s)
            # Compare the first invocation's result only: warm runs two
            # invocations and prints one result line per invocation.
            lines = out.strip().splitlines()
            if lines:
                outputs.setdefault(mode, lines[0].strip())
    res = aggregate(samples)
    res["snapshot"] = {"create_ms": round(create_ms, 3), "image_bytes": image_bytes,
                       "handler": handler, "payload": payload}
    res["errors"] = errors
    res["outputs"] = outputs
    distinct = sorted(set(outputs.values()))
    res["outputs_consistent"] = len(distinct) <= 1
    if len(distinct) > 1:
        log("  %s: WARNING: modes printed different results: %s" % (name, outputs))
    res["raw"] = samples
    return res


# --------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------

def _fmt(v, scale=1.0, digits=1):
    if v is None:
        return "-"
    return "%.*f" % (digits, v / scale)


def format_table(results):
    hdr = ("%-14s %-6s %4s %9s %9s %9s %9s %9s %9s %9s %8s"
           % ("function", "mode", "n", "total", "p90", "restore", "1st-inv", "wall",
              "faults", "MiB-read", "speedup"))
    lines = [hdr, "-" * len(hdr)]
    for fn in sorted(results):
        r = results[fn]
        for mode in MODES:
            m = r.get(mode, {})
            g = lambda k, q="median": m.get(k, {}).get(q)  # noqa: E731
            sp = r.get("speedup", {}).get(mode) if mode != "boot" else None
            lines.append("%-14s %-6s %4d %9s %9s %9s %9s %9s %9s %9s %8s" % (
                fn, mode, m.get("runs_ok", 0),
                _fmt(g("total_ms")), _fmt(g("total_ms", "p90")), _fmt(g("restore_ms")),
                _fmt(g("first_invoke_ms")), _fmt(g("wall_ms")),
                _fmt(g("page_faults"), digits=0), _fmt(g("bytes_read_from_image"), 2.0 ** 20),
                ("%.2fx" % sp) if sp else "-"))
    lines.append("times in ms (median; p90 of total); speedup = boot total / mode total (medians)")
    return "\n".join(lines)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def collect_meta(args):
    cpu = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = None
    dirty = None
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        st = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10)
        dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernel": platform.release(),
        "cpu": cpu or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "mem_total_kb": next((int(l.split()[1]) for l in _read("/proc/meminfo").splitlines()
                              if l.startswith("MemTotal:")), None),
        "git_commit": commit,
        "git_dirty": dirty,
        "runs": args.runs,
        "thaw": args.thaw,
        "functions": args.functions,
        "evict_page_cache": not args.no_evict,
        "python": sys.version.split()[0],
    }


def write_plot(results, png):
    """Grouped bar chart of median total latency. Returns a note string."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # ImportError or a broken install
        return "matplotlib not importable (%s): plot skipped" % e.__class__.__name__
    fns = sorted(results)
    width = 0.8 / len(MODES)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(fns) + 2), 4.5))
    for i, mode in enumerate(MODES):
        vals = [results[f].get(mode, {}).get("total_ms", {}).get("median") or 0 for f in fns]
        xs = [j + (i - (len(MODES) - 1) / 2.0) * width for j in range(len(fns))]
        ax.bar(xs, vals, width, label=mode)
    ax.set_xticks(range(len(fns)))
    ax.set_xticklabels(fns)
    ax.set_ylabel("median latency (ms)")
    ax.set_yscale("log")
    ax.set_title("Thaw cold start: boot vs restore")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return "plot: %s" % png


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def discover_functions(samples_dir):
    if not os.path.isdir(samples_dir):
        return []
    return sorted(d for d in os.listdir(samples_dir)
                  if d not in EXCLUDED and not d.startswith(".")
                  and os.path.isfile(os.path.join(samples_dir, d, "handler.py")))


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Thaw cold-start benchmark",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--thaw", default=os.path.join(ROOT, "target", "release", "thaw"),
                    help="thaw binary (default: target/release/thaw)")
    ap.add_argument("--runs", type=int, default=10, help="runs per function and mode (10)")
    ap.add_argument("--functions", default=None,
                    help="comma-separated sample names (default: all built except error/initerror)")
    ap.add_argument("--samples", default=os.path.join(ROOT, "build", "samples", "python"),
                    help="built samples dir (scripts/build-samples.sh)")
    ap.add_argument("--handler", default=DEFAULT_HANDLER)
    ap.add_argument("--payload", action="append", default=[], metavar="NAME=JSON",
                    help="override a function's event payload")
    ap.add_argument("--out", default=None, help="result JSON path")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-command timeout, s")
    ap.add_argument("--no-evict", action="store_true", help="do not evict the image page cache")
    ap.add_argument("--keep-tmp", action="store_true", help="keep snapshots and stats files")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    args.thaw = os.path.abspath(args.thaw) if os.sep in args.thaw else (
        shutil.which(args.thaw) or args.thaw)
    args.payloads = dict(DEFAULT_PAYLOADS)
    for p in args.payload:
        if "=" not in p:
            ap.error("--payload wants NAME=JSON")
        k, v = p.split("=", 1)
        try:
            json.loads(v)
        except ValueError as e:
            ap.error("--payload %s: not JSON: %s" % (k, e))
        args.payloads[k] = v
    if args.functions:
        args.functions = [f.strip() for f in args.functions.split(",") if f.strip()]
    else:
        args.functions = discover_functions(args.samples)
    if args.out is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        args.out = os.path.join(ROOT, "bench", "results", "coldstart-%s.json" % stamp)
    return args


def main(argv=None):
    args = parse_args(argv)
    if not os.path.exists(args.thaw):
        print("coldstart: thaw CLI not found at %s (cargo build --release, or --thaw PATH)"
              % args.thaw, file=sys.stderr)
        return 2
    if not args.functions:
        print("coldstart: no functions in %s (run scripts/build-samples.sh)" % args.samples,
              file=sys.stderr)
        return 2
    for fn in args.functions:
        if not os.path.isdir(os.path.join(args.samples, fn)):
            print("coldstart: function %s not built in %s" % (fn, args.samples), file=sys.stderr)
            return 2

    meta = collect_meta(args)
    print("coldstart: %d function(s) x %d run(s) x %d modes, thaw=%s"
          % (len(args.functions), args.runs, len(MODES), args.thaw), file=sys.stderr)
    results = {}
    failed = []
    tmp = tempfile.mkdtemp(prefix="thaw-coldstart-")
    try:
        for fn in args.functions:
            code = os.path.join(args.samples, fn)
            try:
                results[fn] = bench_function(fn, code, args, tmp,
                                             log=lambda m: print(m, file=sys.stderr))
            except BenchError as e:
                print("coldstart: %s: %s" % (fn, e), file=sys.stderr)
                failed.append(fn)
                results[fn] = {"error": str(e)}
    finally:
        if args.keep_tmp:
            print("coldstart: kept %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    ok = {k: v for k, v in results.items() if "error" not in v}
    print(format_table(ok))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2, sort_keys=True)
        f.write("\n")
    print("results: %s" % args.out)
    if ok:
        print(write_plot(ok, os.path.splitext(args.out)[0] + ".png"))
    n_err = sum(len(v.get("errors", [])) for v in ok.values())
    if failed or n_err:
        print("coldstart: %d function(s) failed, %d command(s) failed"
              % (len(failed), n_err), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
