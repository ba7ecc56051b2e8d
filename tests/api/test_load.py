"""Bounded load on loopback: >= 1,000 invocations from 16 concurrent clients at two functions."""

import json
import threading
import time
from collections import Counter

from thaw_node_harness import create, sample_zip, zip_bytes

CLIENTS = 16
PER_CLIENT = 64
SQUARE = "def handler(event, context):\n    return {'square': event['n'] * event['n'], 'id': event['id']}\n"


def test_load_scales_up_and_back_to_zero(node):
    admin = node.client()
    create(admin, "load-hello", sample_zip("helloworld"))
    create(admin, "load-square", zip_bytes({"handler.py": SQUARE}))
    # Half the clients per function: at most 8 at once each, the default per-function limit.
    clients = [node.client(retries=1) for _ in range(CLIENTS)]
    answers, failures = Counter(), []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS)

    def run(i):
        c = clients[i]
        fn = "load-hello" if i % 2 == 0 else "load-square"
        start.wait()
        for k in range(PER_CLIENT):
            ident = f"{i}-{k}"
            try:
                if fn == "load-hello":
                    r = c.invoke(FunctionName=fn, Payload=json.dumps({"name": ident}))
                    ok = json.loads(r["Payload"].read()) == {"message": f"hello, {ident}"}
                else:
                    r = c.invoke(FunctionName=fn, Payload=json.dumps({"n": k, "id": ident}))
                    ok = json.loads(r["Payload"].read()) == {"square": k * k, "id": ident}
                ok = ok and "FunctionError" not in r
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                ok = False
                with lock:
                    failures.append(f"{fn} {ident}: {e!r}")
            with lock:
                answers[ok] += 1

    t0 = time.time()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    elapsed = time.time() - t0
    total = CLIENTS * PER_CLIENT
    assert failures == []
    assert answers[True] == total and answers[False] == 0 and sum(answers.values()) == total
    print(f"\n{total} invocations from {CLIENTS} clients in {elapsed:.2f}s ({total / elapsed:.0f}/s)")

    peaks = {f: node.function_status(f)["counters"]["peak_instances"] for f in ("load-hello", "load-square")}
    assert max(peaks.values()) > 1, peaks
    assert all(p <= 8 for p in peaks.values()), peaks
    m = node.metrics()
    assert 'thaw_starts_total{kind="warm"}' in m

    # Scale to zero after the 2 s keep-alive.
    deadline = time.time() + 10
    while node.status()["node"]["instances_alive"] != 0:
        assert time.time() < deadline, node.status()
        time.sleep(0.2)
    for f in ("load-hello", "load-square"):
        assert node.function_status(f)["instances"] == {"live": 0, "busy": 0, "idle": 0}
    assert "thaw_instances_alive 0" in node.metrics()
