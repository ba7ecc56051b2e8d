#!/usr/bin/env python3
"""Cold starts of custom-runtime functions (cold boots: they are not snapshotted) next
to a Python function restored from its snapshot, in one run (issue #16).

    .venv/bin/python tests/api/bench_custom_runtime.py [--cold 15] [--out FILE]

Starts two `thaw serve --keep-alive 0` nodes, one with the native runtime bridge and
one with the Python bridge (THAW_RUNTIME_BRIDGE=python); on each deploys helloworld
(Python, restored), go-hello (aws-lambda-go) and rust-hello (lambda_runtime) from
build/samples/provided (scripts/build-provided.sh), then calls them in turn, each call
after the reaper has removed every instance, so each is a cold start; the nodes take
turns. Records the client round trip and the node's `x-thaw-timing-ms` start time;
prints medians and writes JSON.
Not collected by pytest (file name does not start with test_).
"""

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_api_overhead import signed, stop, timed_invoke  # noqa: E402
from thaw_node_harness import NodeProcess, create, sample_zip, zip_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROVIDED = ROOT / "build" / "samples" / "provided"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / f"custom-runtime-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"))
    args = ap.parse_args()
    code = {
        "python-restore": dict(code=sample_zip("helloworld")),
        "go-boot": dict(code=zip_bytes({"bootstrap": PROVIDED / "go-hello" / "bootstrap"}), handler="bootstrap", Runtime="provided.al2023"),
        "rust-boot": dict(code=zip_bytes({"bootstrap": PROVIDED / "rust-hello" / "bootstrap"}), handler="bootstrap", Runtime="provided.al2023"),
    }
    # (node, function) pairs: the Python function once, the custom ones under both bridges.
    bridges = {"native": {}, "python-bridge": {"THAW_RUNTIME_BRIDGE": "python"}}
    runs = [("native", "python-restore")] + [(b, f) for b in bridges for f in ("go-boot", "rust-boot")]
    samples = {f"{b}/{f}": {"rtt_ms": [], "start_ms": [], "kinds": []} for b, f in runs}
    payload = json.dumps({"name": "bench"}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {}
        try:
            for b, env in bridges.items():
                nodes[b] = NodeProcess(Path(tmp) / b, keep_alive="0", env=env)
            for b, f in runs:
                kw = dict(code[f])
                create(nodes[b].client(), f, kw.pop("code"), **kw)
            for _ in range(args.cold):
                for b, f in runs:
                    node = nodes[b]
                    deadline = time.time() + 5
                    while any(n.status()["node"]["instances_alive"] for n in nodes.values()) and time.time() < deadline:
                        time.sleep(0.02)
                    host, port = node.endpoint.removeprefix("http://").split(":")
                    path, headers = signed(node, f, payload)
                    conn = http.client.HTTPConnection(host, int(port))
                    conn.connect()
                    rtt, t, kind = timed_invoke(conn, path, headers, payload)
                    conn.close()
                    s = samples[f"{b}/{f}"]
                    s["rtt_ms"].append(rtt)
                    s["start_ms"].append(t["start"])
                    s["kinds"].append(kind)
        finally:
            for n in nodes.values():
                stop(n)
    summary = {}
    for name, s in samples.items():
        summary[name] = {"median_rtt_ms": statistics.median(s["rtt_ms"]), "median_start_ms": statistics.median(s["start_ms"]),
                         "kinds": sorted(set(s["kinds"]))}
        print(f"{name:28s} cold start median {summary[name]['median_start_ms']:7.2f} ms in the node, "
              f"{summary[name]['median_rtt_ms']:7.2f} ms round trip ({args.cold} calls; {', '.join(summary[name]['kinds'])})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cold": args.cold, "summary": summary, "samples": samples}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
