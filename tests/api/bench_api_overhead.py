#!/usr/bin/env python3
"""What the API path adds on top of the engine, for warm and cold invocations.

    .venv/bin/python tests/api/bench_api_overhead.py [--warm 500] [--cold 40] [--out FILE]

Starts its own `thaw serve` (temporary data dir), deploys the helloworld sample,
then measures:

- warm: N invocations over one keep-alive HTTP connection (requests signed with
  botocore's SigV4 *before* the clock starts, so client-side signing is not
  counted), against the engine's warm invoke times from
  `thaw snapshot restore --invocations N` on the same snapshot;
- cold: invocations that find no idle instance (a second node runs with
  --keep-alive 0, the bench waits for the instance to be reaped), against
  `thaw snapshot restore`'s restore_ms + first_invoke_ms.

Both client round-trip and the node's own `x-thaw-timing-ms` header
(start/invoke/node) are recorded, so the overhead can be split into HTTP
client+loopback and in-node parts. Prints medians and writes JSON.
Not collected by pytest (file name does not start with test_).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

sys.path.insert(0, str(Path(__file__).resolve().parent))
from thaw_node_harness import ACCESS_KEY, SECRET_KEY, THAW, NodeProcess, create, sample_zip  # noqa: E402


def signed(node, name, payload):
    url = f"{node.endpoint}/2015-03-31/functions/{name}/invocations"
    req = AWSRequest(method="POST", url=url, data=payload, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "lambda", "us-east-1").add_auth(req)
    return f"/2015-03-31/functions/{name}/invocations", dict(req.headers.items())


def timed_invoke(conn, path, headers, payload):
    t = time.perf_counter()
    conn.request("POST", path, body=payload, headers=headers)
    r = conn.getresponse()
    body = r.read()
    rtt = (time.perf_counter() - t) * 1e3
    if r.status != 200 or r.getheader("x-amz-function-error"):
        raise RuntimeError(f"invoke failed: {r.status} {body[:200]!r}")
    timing = dict(kv.split("=") for kv in r.getheader("x-thaw-timing-ms").split(";"))
    return rtt, {k: float(v) for k, v in timing.items()}, r.getheader("x-thaw-start")


def stop(node):
    code = node.stop()
    if code != 0:
        print(f"warning: node exited with {code}", file=sys.stderr)


# The node restores with lazy paging (its default); compare the engine in the same mode.
PAGING = "lazy"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def engine_restore(snapdir, payload, invocations, data_dir):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([str(THAW), "--data-dir", str(data_dir), "snapshot", "restore", str(snapdir), "--payload", payload,
                        "--invocations", str(invocations), "--stats", f.name, "--quiet", "--paging", PAGING],
                       check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=int, default=500, help="warm invocations (default 500)")
    ap.add_argument("--cold", type=int, default=40, help="cold invocations (default 40)")
    ap.add_argument("--out", default="bench_api_overhead.json", help="JSON results file")
    args = ap.parse_args()
    payload = json.dumps({"name": "bench"})

    with tempfile.TemporaryDirectory(prefix="thaw-bench-") as tmp:
        # Warm: a node with the default keep-alive; one keep-alive HTTP connection.
        node = NodeProcess(Path(tmp) / "warm", keep_alive="60")
        try:
            create(node.client(), "bench", sample_zip("helloworld"))
            snapdir = node.function_status("bench")["snapshot"]["dir"]
            host, port = node.endpoint.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port))
            warm_rtt, warm_node, warm_engine_in_node, warm_node_overhead = [], [], [], []
            reqs = [signed(node, "bench", payload) for _ in range(args.warm + 1)]
            for path, headers in reqs:
                rtt, t, kind = timed_invoke(conn, path, headers, payload)
                if kind != "warm":
                    continue
                warm_rtt.append(rtt)
                warm_node.append(t["node"])
                warm_engine_in_node.append(t["invoke"])
                warm_node_overhead.append(t["node"] - t["invoke"])
            conn.close()
            eng = engine_restore(snapdir, payload, min(args.warm, 200) + 1, tmp)
            engine_warm = eng["invocations_ms"][1:]
        finally:
            stop(node)

        # Cold: a node that keeps no idle instance; wait for the reaper before each call.
        node = NodeProcess(Path(tmp) / "cold", keep_alive="0")
        try:
            create(node.client(), "bench", sample_zip("helloworld"))
            snapdir = node.function_status("bench")["snapshot"]["dir"]
            host, port = node.endpoint.removeprefix("http://").split(":")
            cold_rtt, cold_start, cold_invoke, cold_node, cold_kinds = [], [], [], [], []
            for _ in range(args.cold):
                deadline = time.time() + 5
                while node.status()["node"]["instances_alive"] != 0 and time.time() < deadline:
                    time.sleep(0.02)
                path, headers = signed(node, "bench", payload)
                conn = http.client.HTTPConnection(host, int(port))
                conn.connect()
                rtt, t, kind = timed_invoke(conn, path, headers, payload)
                conn.close()
                cold_kinds.append(kind)
                if not kind.startswith("restore"):
                    continue
                cold_rtt.append(rtt)
                cold_start.append(t["start"])
                cold_invoke.append(t["invoke"])
                cold_node.append(t["node"])
            engine_cold = [engine_restore(snapdir, payload, 1, tmp) for _ in range(min(args.cold, 20))]
        finally:
            stop(node)

    e_restore = [e["restore_ms"] for e in engine_cold]
    e_open = [e["open_ms"] for e in engine_cold]
    e_first = [e["first_invoke_ms"] for e in engine_cold]
    e_total = [e["total_ms"] for e in engine_cold]
    res = {
        "warm": {
            "samples": len(warm_rtt),
            "api_client_rtt_ms": med(warm_rtt),
            "api_node_ms": med(warm_node),
            "api_node_engine_invoke_ms": med(warm_engine_in_node),
            "api_node_overhead_ms": med(warm_node_overhead),
            "engine_invoke_ms": med(engine_warm),
            "overhead_vs_engine_ms": med(warm_rtt) - med(engine_warm),
        },
        "cold": {
            "samples": len(cold_rtt),
            "kinds": {k: cold_kinds.count(k) for k in set(cold_kinds)},
            "api_client_rtt_ms": med(cold_rtt),
            "api_node_start_ms": med(cold_start),
            "api_node_first_invoke_ms": med(cold_invoke),
            "api_node_ms": med(cold_node),
            "engine_open_ms": med(e_open),
            "engine_restore_ms": med(e_restore),
            "engine_restore_without_open_ms": med([r - o for r, o in zip(e_restore, e_open)]),
            "engine_first_invoke_ms": med(e_first),
            "engine_total_ms": med(e_total),
            "overhead_vs_engine_total_ms": med(cold_rtt) - med(e_total),
        },
        "raw": {"warm_rtt_ms": warm_rtt, "cold_rtt_ms": cold_rtt, "engine_warm_ms": engine_warm,
                "engine_cold_total_ms": e_total},
    }
    w, c = res["warm"], res["cold"]
    print(f"warm ({w['samples']} calls): API round trip {w['api_client_rtt_ms']:.3f} ms median, engine invoke "
          f"{w['engine_invoke_ms']:.3f} ms -> overhead {w['overhead_vs_engine_ms']:.3f} ms "
          f"(inside the node: {w['api_node_overhead_ms']:.3f} ms)")
    print(f"cold ({c['samples']} calls): API round trip {c['api_client_rtt_ms']:.3f} ms median "
          f"(node: start {c['api_node_start_ms']:.3f} + invoke {c['api_node_first_invoke_ms']:.3f}); engine restore "
          f"{c['engine_restore_ms']:.3f} (open {c['engine_open_ms']:.3f}) + first invoke {c['engine_first_invoke_ms']:.3f} "
          f"= {c['engine_total_ms']:.3f} ms -> overhead {c['overhead_vs_engine_total_ms']:.3f} ms")
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
