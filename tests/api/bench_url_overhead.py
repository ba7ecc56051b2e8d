#!/usr/bin/env python3
"""What a function URL adds over a direct Invoke, warm, in one run (issue #16's target:
at most 1 ms median).

    .venv/bin/python tests/api/bench_url_overhead.py [--n 300] [--out FILE]

Starts its own `thaw serve`, deploys helloworld with a function URL (AuthType NONE),
warms it up, then alternates a direct Invoke (SigV4-signed before the clock starts,
one keep-alive connection) and a GET of the URL (another keep-alive connection),
N times each. Prints the medians and their difference and writes JSON.
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
from bench_api_overhead import signed  # noqa: E402
from thaw_node_harness import NodeProcess, create, sample_zip  # noqa: E402


def rtt(conn, method, path, headers=None, body=None):
    t = time.perf_counter()
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t) * 1e3
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {data[:200]!r}")
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="thaw-url-bench-") as tmp:
        node = NodeProcess(Path(tmp) / "node", keep_alive="600")
        try:
            client = node.client()
            create(client, "hello", sample_zip("helloworld"))
            client.create_function_url_config(FunctionName="hello", AuthType="NONE")
            host, port = node.endpoint.removeprefix("http://").split(":")
            direct, url = http.client.HTTPConnection(host, int(port)), http.client.HTTPConnection(host, int(port))
            payload = b"{}"
            for _ in range(20):  # warm: the instance exists, connections are open
                path, headers = signed(node, "hello", payload)
                rtt(direct, "POST", path, headers, payload)
                rtt(url, "GET", "/url/hello/")
            d, u = [], []
            for i in range(a.n):
                path, headers = signed(node, "hello", payload)
                pair = [("d", lambda: rtt(direct, "POST", path, headers, payload)), ("u", lambda: rtt(url, "GET", "/url/hello/"))]
                for k, f in (pair if i % 2 == 0 else pair[::-1]):
                    (d if k == "d" else u).append(f())
        finally:
            node.stop()
    res = {"n": a.n, "invoke_median_ms": statistics.median(d), "url_median_ms": statistics.median(u),
           "overhead_median_ms": statistics.median(u) - statistics.median(d),
           "invoke_p90_ms": statistics.quantiles(d, n=10)[-1], "url_p90_ms": statistics.quantiles(u, n=10)[-1]}
    print(f"warm Invoke median {res['invoke_median_ms']:.3f} ms, function URL median {res['url_median_ms']:.3f} ms: "
          f"URL overhead {res['overhead_median_ms']:+.3f} ms (target <= 1 ms; {a.n} alternating calls each)")
    out = Path(a.out or time.strftime("bench/results/url-overhead-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
