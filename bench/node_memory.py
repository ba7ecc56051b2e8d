#!/usr/bin/env python3
"""Host memory of a node's instances, by shared-memory policy (issue #31), same run.

For each policy a `thaw serve` node (temporary data directory) serves the same
functions of one runtime; their instances are brought up to 1, then 4, then 8 alive
per function (M concurrent calls to each function, each call held open for a moment
after the function answered, so that M instances must exist), and after each step
the node's memory is measured:

    host memory of the instances = the anonymous memory of every process in the
    sandboxes that run an instance, its init included (/proc/PID/smaps_rollup
    "Anonymous": the copies each holds privately) + the node's shared memory files
    (/run/thaw/shared-mem/<node pid>-*, their allocated blocks), counted once

per live instance, and per instance added from one step to the next (what the issue
asks: (memory at the step - memory at the step before) / instances added), each
against the same figure with full images (`--no-bases`). The sandboxes the node keeps
prepared (`--sandbox-pool`, the same under every policy) are reported apart. Policies (`thaw serve --shared-memory-file`):

    full      full images, no bases (the baseline)
    snapshot  a file per snapshot: a function's instances share its whole image,
              the base's pages once per function
    base      the base's file: every function's instances share the base's pages,
              each holds its diff's pages privately
    auto      (the default) a function's first instances map the base's file, later
              ones the snapshot's

With `--give-back` each step also waits until every idle instance gave back its
unchanged copies (`--give-back-after 1`) and measures again. The anonymous memory is
also broken down by mapping (the shared memory file's copied pages, the stack, the
heap, other anonymous memory, each library's written data; the init's apart) and
printed per instance for the last step.

Each function is deployed as its sample (build/samples/python/NAME) plus a
one-file wrapper (thaw_hold.py) that calls the sample's handler and then sleeps
`hold_ms` before answering; the snapshot holds the sample's imports as without it.

    .venv/bin/python bench/node_memory.py [--functions helloworld,pyaes,jsonserde]
        [--instances 1,4,8] [--policies full,snapshot,base,auto] [--give-back] [--out FILE]

Prints a table, writes JSON (default bench/results/node-memory-<time>.json) and an
SVG chart beside it when matplotlib is importable.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "api"))
from thaw_node_harness import NodeProcess, create, zip_bytes  # noqa: E402

SHARED_MEM = Path("/run/thaw/shared-mem")
POLICIES = ("full", "snapshot", "base", "auto")

WRAPPER = '''\
import time
import handler as _sample


def handler(event, context):
    hold = event.pop("hold_ms", 0) if isinstance(event, dict) else 0
    out = _sample.handler(event, context)
    if hold:
        time.sleep(hold / 1000)
    return out
'''


def function_zip(name):
    src = ROOT / "build" / "samples" / "python" / name
    if not (src / "handler.py").exists():
        raise SystemExit(f"no sample {src} (scripts/setup.sh builds the samples)")
    files = {str(p.relative_to(src)): p for p in sorted(src.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    files["thaw_hold.py"] = WRAPPER
    return zip_bytes(files)


def payload(name):
    manifest = json.loads((ROOT / "samples" / "manifest.json").read_text())
    return dict(manifest["functions"].get(name, {}).get("payload", {}))


def process_tree():
    """{pid: [children]} and {pid: comm} of every process."""
    children, comm = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        comm[int(d)] = name
        children.setdefault(int(rest.split()[1]), []).append(int(d))
    return children, comm


def descendants(pid, children=None):
    children = children if children is not None else process_tree()[0]
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


SANDBOX_INIT = "thaw-sandbox-in"  # comm of thaw-sandbox-init (15 characters)


def split_instances(node_pid):
    """The node's sandboxes: (processes of sandboxes running an instance, processes
    of sandboxes prepared ahead, `--sandbox-pool`). A sandbox is its init, a child of
    the node; it runs an instance once a process under it is no longer the init
    binary (a prepared sandbox's waiting stub is a fork of the init)."""
    children, comm = process_tree()
    live, prepared = [], []
    for init in children.get(node_pid, []):
        if comm.get(init) != SANDBOX_INIT:
            continue
        tree = [init, *descendants(init, children)]
        (live if any(comm.get(p) != SANDBOX_INIT for p in tree) else prepared).extend(tree)
    return live, prepared


def anon_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def mapping_class(path, comm):
    """What an area of /proc/PID/smaps is, for the breakdown: the shared memory file
    (pages copied from it on write), the stack, the heap, other anonymous memory, or a
    file's private mapping (a library's written data: not shareable, see the engine's
    sharedmem.rs), by the process kind (the sandbox init or the instance)."""
    who = "init" if comm == SANDBOX_INIT else "instance"
    if path.startswith(str(SHARED_MEM)):
        what = "shared-memory file, copied"
    elif path in ("[stack]", "[heap]"):
        what = path
    elif not path or path.startswith("["):
        what = "anonymous" if not path else path
    else:
        what = "file " + os.path.basename(path.split(" (deleted)")[0])
    return f"{who}: {what}"


def anon_by_mapping(pids):
    """Anonymous bytes of `pids` by [`mapping_class`]."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().rstrip("\n")
            with open(f"/proc/{pid}/smaps") as f:
                text = f.read()
        except OSError:
            continue
        cls = None
        for line in text.splitlines():
            head = line.split(None, 5)
            if head and "-" in head[0] and not head[0].endswith(":"):
                cls = mapping_class(head[5] if len(head) > 5 else "", comm)
            elif line.startswith("Anonymous:") and cls:
                out[cls] = out.get(cls, 0) + int(head[1]) * 1024
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def measure(node):
    """Anonymous memory of the sandboxes running instances (init and instance), its
    shared files (allocated), live instances; the prepared sandboxes' apart."""
    live_procs, prepared = split_instances(node.pid)
    anon = sum(anon_kb(p) for p in live_procs) * 1024
    files = [SHARED_MEM / f for f in (os.listdir(SHARED_MEM) if SHARED_MEM.is_dir() else []) if f.startswith(f"{node.pid}-")]
    shared = sum(os.stat(f).st_blocks * 512 for f in files if f.exists())
    st = node.status()
    live = {f["name"]: f["instances"]["live"] for f in st["functions"]}
    return {"anon_bytes": anon, "anon_by_mapping": anon_by_mapping(live_procs), "shared_bytes": shared, "shared_files": sum(1 for f in files if f.exists() and os.stat(f).st_blocks),
            "live": live, "instances": sum(live.values()), "node_anon_bytes": anon_kb(node.pid) * 1024,
            "prepared_sandboxes_anon_bytes": sum(anon_kb(p) for p in prepared) * 1024}


def bring_up(client, functions, m, hold_ms):
    """M calls at once to each function, each held `hold_ms` after it answered."""
    def call(name):
        resp = client.invoke(FunctionName=name, Payload=json.dumps({**payload(name), "hold_ms": hold_ms}))
        body = resp["Payload"].read()
        if resp.get("FunctionError"):
            raise SystemExit(f"{name} failed: {body[:400]!r}")
    with concurrent.futures.ThreadPoolExecutor(len(functions) * m) as ex:
        list(ex.map(call, [f for f in functions for _ in range(m)]))


def run_policy(policy, functions, steps, hold_ms, give_back):
    extra = ["--no-bases"] if policy == "full" else ["--shared-memory-file", policy]
    extra += ["--give-back-after", "1" if give_back else "0", "--max-instances", str(len(functions) * max(steps) + 4),
              "--max-instances-per-function", str(max(steps) + 2)]
    node = NodeProcess(tempfile.mkdtemp(prefix=f"thaw-node-memory-{policy}-"), *extra, keep_alive="600")
    rows = []
    try:
        c = node.client(timeout=120)
        for f in functions:
            create(c, f, function_zip(f), handler="thaw_hold.handler", MemorySize=128)
        for m in steps:
            bring_up(c, functions, m, hold_ms)
            time.sleep(0.3)
            row = {"policy": policy, "per_function": m, "given_back": False, **measure(node)}
            rows.append(row)
            print_row(row)
            if give_back:
                time.sleep(3.0)  # idle > --give-back-after: each instance gives back once
                row = {"policy": policy, "per_function": m, "given_back": True, **measure(node)}
                row["pages_given_back"] = sum(f["counters"].get("pages_given_back", 0) for f in node.status()["functions"])
                rows.append(row)
                print_row(row)
    finally:
        code = node.stop()
        if code != 0:
            print(f"warning: the {policy} node exited with {code}; see {node.log_path}", file=sys.stderr)
    return rows


def print_row(r):
    per = (r["anon_bytes"] + r["shared_bytes"]) / max(r["instances"], 1)
    print("%-9s %2d each%s  instances %3d  anon %7.2f MB  shared files %d: %7.2f MB  per instance %6.2f MB" % (
        r["policy"], r["per_function"], " (given back)" if r["given_back"] else "             ", r["instances"],
        r["anon_bytes"] / 1e6, r["shared_files"], r["shared_bytes"] / 1e6, per / 1e6), flush=True)


def chart(rows, steps, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in sorted({(r["policy"], r["given_back"]) for r in rows}, key=lambda k: (POLICIES.index(k[0]), k[1])):
        pts = [r for r in rows if (r["policy"], r["given_back"]) == key]
        ax.plot([r["per_function"] for r in pts], [r["per_instance_vs_full"] * 100 for r in pts], marker="o",
                label=key[0] + (" (given back)" if key[1] else ""))
    ax.set_xticks(steps)
    ax.set_xlabel("live instances per function")
    ax.set_ylabel("host memory per instance, % of full images")
    ax.set_title("Instances of several functions on one runtime, by shared-memory policy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", default="helloworld,pyaes,jsonserde")
    ap.add_argument("--instances", default="1,4,8", help="live instances per function, increasing")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--hold-ms", type=int, default=1500, help="how long each call is held open after the function answered")
    ap.add_argument("--give-back", action="store_true", help="also measure after every idle instance gave back its unchanged copies")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / f"node-memory-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"))
    a = ap.parse_args(argv)
    functions = a.functions.split(",")
    steps = [int(x) for x in a.instances.split(",")]
    policies = a.policies.split(",")
    if "full" not in policies:
        policies.insert(0, "full")
    rows = []
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"unknown policy {p} (one of {', '.join(POLICIES)})")
        rows += run_policy(p, functions, steps, a.hold_ms, a.give_back and p != "full")
    total = lambda r: r["anon_bytes"] + r["shared_bytes"]  # noqa: E731
    series = {}
    for r in rows:
        series.setdefault((r["policy"], r["given_back"]), []).append(r)
    for pts in series.values():
        prev = None
        for r in pts:
            r["per_instance_bytes"] = total(r) / max(r["instances"], 1)
            if prev is not None and r["instances"] > prev["instances"]:
                r["per_added_instance_bytes"] = (total(r) - total(prev)) / (r["instances"] - prev["instances"])
            prev = r
    full = {r["per_function"]: r for r in series[("full", False)]}
    for r in rows:
        f = full[r["per_function"]]
        r["per_instance_vs_full"] = r["per_instance_bytes"] / f["per_instance_bytes"]
        if "per_added_instance_bytes" in r and "per_added_instance_bytes" in f:
            r["per_added_instance_vs_full"] = r["per_added_instance_bytes"] / f["per_added_instance_bytes"]
    order = sorted(series, key=lambda k: (POLICIES.index(k[0]), k[1]))
    print()
    print("host memory of the instances against full images (%s; same run)" % ", ".join(functions))
    print("%-22s" % "per instance" + "".join("%10s" % f"{m} each" for m in steps) + "   | per added instance" +
          "".join("%10s" % f"->{m}" for m in steps[1:]))
    for key in order:
        pts = series[key]
        line = "%-22s" % (key[0] + (" (given back)" if key[1] else ""))
        line += "".join("%9.0f%%" % (r["per_instance_vs_full"] * 100) for r in pts) + "   | " + " " * 18
        line += "".join("%9.0f%%" % (r["per_added_instance_vs_full"] * 100) if "per_added_instance_vs_full" in r else "%10s" % "-" for r in pts[1:])
        print(line)
    print()
    print("anonymous memory per instance at %d each, by mapping (kB; `init: ` the sandbox init's)" % steps[-1])
    last = [series[k][-1] for k in order]
    per = lambda r, c: r["anon_by_mapping"].get(c, 0) / 1024 / max(r["instances"], 1)  # noqa: E731
    classes = sorted({c for r in last for c in r["anon_by_mapping"] if per(r, c) >= 1}, key=lambda c: -max(per(r, c) for r in last))[:12]
    print("%-44s" % "" + "".join("%12s" % (r["policy"] + (" gb" if r["given_back"] else "")) for r in last))
    for c in classes:
        print("%-44s" % c[:44] + "".join("%12.0f" % per(r, c) for r in last))
    f = series[("full", False)][-1]
    print("full images: %.2f MB per instance; prepared sandboxes (apart, every policy): %.2f MB" % (
        f["per_instance_bytes"] / 1e6, f["prepared_sandboxes_anon_bytes"] / 1e6))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"functions": functions, "steps": steps, "hold_ms": a.hold_ms, "rows": rows}, indent=1))
    svg = chart(rows, steps, out.with_suffix(".svg"))
    print("wrote", out, *( [svg] if svg else []))


if __name__ == "__main__":
    main()
