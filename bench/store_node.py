#!/usr/bin/env python3
"""Remote cold starts as a node serves them (issue #28): `thaw serve --snapshot-store`.

    bench/store_node.py [--functions helloworld,pyaes,jsonserde,lrserving] [--runs 15] [--link loopback]

bench/store.py measures the CLI: every `thaw snapshot restore s3://...` builds its own
I/O runtime and S3 client and opens a new connection before its first request. A node
keeps all three, which is where users meet a miss. Here a real node on a real MinIO:

  node-local        the node restarted with its cache entry in place (page cache of
                    the entry evicted): the first call restores from the local cache
  node-remote-cold  the node restarted with its cache emptied: the first call fetches
                    the snapshot from the store (its head first, the rest after the
                    first response) and restores

Each run starts a node on the same data directory, waits `--settle` seconds (the node's
start-up work: its store connection, its sandbox pool), makes one Invoke call and stops
the node; the modes alternate in balanced orders (bench/coldstart.balanced_orders). Per
call: the node's own time for the Invoke call (`thaw_request_seconds`, one request per
node, so its sum), the time to a ready instance (`thaw_start_seconds`) and the client's
wall time (boto3: signing and HTTP added to both modes alike). The remote runs also
report what the store served before the first response. Functions are deployed as full
images (`--no-bases`), as bench/store.py's `local` and `remote-cold` are; their working
set is recorded and republished before the runs. `--encryption on,off,on-ws-pages`: each
function on a node that seals its snapshots (the default: the store keeps a sealed
working set as ws.lz4, compressed then sealed), on one with `--no-encryption`, and
sealed with `THAW_STORE_SEALED_WS=pages` (the working set as ws.pages, ciphertext that
does not compress: the baseline). A clear image's working set of 4 MiB or more is stored
as ws.lz4 too (`off+ws-pages`: as ws.pages, the baseline).

A sample over 40 MB (lrserving: 214 MB of numpy, scipy and scikit-learn, whose zip is
past the API's 80 MB request) is deployed as its top-level files plus layers of its
package directories under /opt/python.

Prints medians, writes store-node-<stamp>.json and .svg to --out (bench/results).
Needs root, build/samples (scripts/build-samples.sh) and MinIO (scripts/build-minio.sh).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "api"))
sys.path.insert(0, str(ROOT / "bench"))
from coldstart import balanced_orders, evict_page_cache  # noqa: E402
from store import Store  # noqa: E402  (MinIO on loopback or behind a shaped veth pair)
from thaw_node_harness import SAMPLES, NodeProcess, create, zip_bytes  # noqa: E402

MODES = ("node-local", "node-remote-cold")
BUCKET = "thaw-bench"


# A request body is at most 80 MB (base64 of the zip): larger samples (lrserving's
# 214 MB of numpy, scipy and scikit-learn) go as layers under /opt/python, a zip each
# of at most this much unzipped.
LAYER_MAX = 120 << 20
BUNDLE_MAX = 40 << 20


def files_of(d):
    """Files below `d` without bytecode caches, by path relative to `d`."""
    return {str(p.relative_to(d)): p for p in sorted(d.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def sample_zip(fn):
    """The whole sample directory (a function's own modules too), without bytecode caches."""
    return zip_bytes(files_of(SAMPLES / fn))


def sample_parts(d, bundle_max=BUNDLE_MAX, layer_max=LAYER_MAX):
    """The function's zip and its layers' zips for the sample in `d`: the whole sample
    in one zip when it is small, else its top-level files in the function's zip and its
    directories (the packages it ships) in layers under python/, greedily grouped."""
    every = files_of(d)
    if sum(p.stat().st_size for p in every.values()) <= bundle_max:
        return zip_bytes(every), []
    top = {k: p for k, p in every.items() if "/" not in k}
    groups, size = [[]], 0
    for sub in sorted(p for p in d.iterdir() if p.is_dir() and p.name != "__pycache__"):
        n = sum(p.stat().st_size for p in files_of(sub).values())
        if size + n > layer_max and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(sub)
        size += n
    layers = [zip_bytes({f"python/{sub.name}/{k}": p for sub in g for k, p in files_of(sub).items()}) for g in groups if g]
    return zip_bytes(top), layers


def histogram_sum(metrics, name):
    """Sum over labels of `name`_sum (seconds) in a Prometheus text page."""
    return sum(float(v) for v in re.findall(rf"^{name}_sum(?:{{[^}}]*}})? (\S+)$", metrics, re.M))


def counter(metrics, name, labels):
    m = re.search(rf"^{name}{{{re.escape(labels)}}} (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


class Node:
    """`thaw serve` on the store, on one data directory, started and stopped per run."""

    def __init__(self, data, store, prefix, encryption):
        self.data, self.store, self.prefix, self.encryption = data, store, prefix, encryption
        self.sealed, self.env = variant_env(encryption)

    def start(self):
        clear = () if self.sealed else ("--no-encryption",)
        env = dict(self.store.env, **self.env)
        return NodeProcess(self.data, "--snapshot-store", f"s3://{BUCKET}/{self.prefix}", "--store-endpoint-url", self.store.endpoint,
                           "--create-bucket", "--no-bases", *clear, env=env)

    @property
    def entries(self):
        return self.data / "node" / "snapshot-cache" / "entries"


def wait_for(cond, what, timeout=60):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def deploy(node, fn):
    """Deploy `fn`, call it once (its working set is recorded) and wait for the node to
    publish the snapshot again with it, as a node does after a first restore."""
    n = node.start()
    try:
        client = n.client(timeout=300)
        code, layers = sample_parts(SAMPLES / fn)
        arns = [client.publish_layer_version(LayerName=f"{fn}-deps-{i}", Content={"ZipFile": z})["LayerVersionArn"]
                for i, z in enumerate(layers)]
        create(client, fn, code, Layers=arns) if arns else create(client, fn, code)
        first = n.function_status(fn)["snapshot"]["stored"]
        r = client.invoke(FunctionName=fn, Payload=b"{}")
        if "FunctionError" in r:
            raise SystemExit(f"{fn} failed on the node: {r['Payload'].read()!r}")
        wait_for(lambda: n.function_status(fn)["snapshot"]["stored"] not in (None, first), f"{fn}'s snapshot to be republished with its working set")
        return n.function_status(fn)["snapshot"]["stored"]
    finally:
        if n.stop() != 0:
            raise SystemExit(f"the node did not stop cleanly: {n.log_path}")


# thaw_engine::ws::LZ4_READ_FROM: a smaller working set is read from ws.pages, and the
# node leaves a store's frames of it as they are (LoadedSnapshot::compress_working_set_if_read).
LZ4_READ_FROM = 4 << 20


def rewritten_by_the_node(entry):
    """Whether the node rewrites cache entry `entry`'s stored ws.lz4 frames as LZ4 ones:
    only where its restores read ws.lz4 (THAW_WS_LZ4=1: always, =0: never)."""
    forced = os.environ.get("THAW_WS_LZ4")
    if forced in ("0", "1"):
        return forced == "1"
    pages = entry / "ws.pages"
    return pages.exists() and pages.stat().st_size >= LZ4_READ_FROM


def lz4_frames_here(entries):
    """Whether every cache entry's ws.lz4 the node rewrites holds LZ4 frames (header
    version 1 or 2, not a store's zstd frames, 3 or 4) and none is being written."""
    for e in Path(entries).glob("*"):
        if any(f.name.startswith("ws.lz4.tmp") for f in e.iterdir()):
            return False
        z = e / "ws.lz4"
        if z.exists() and rewritten_by_the_node(e) and int.from_bytes(z.read_bytes()[8:12], "little") not in (1, 2):
            return False
    return True


def one_call(node, fn, mode, settle):
    if mode == "node-local":
        evict_page_cache(str(node.entries))
    else:
        shutil.rmtree(node.entries, ignore_errors=True)
    n = node.start()
    try:
        client = n.client()
        time.sleep(settle)
        before = n.status()["snapshot_store"]
        t0 = time.perf_counter()
        r = client.invoke(FunctionName=fn, Payload=b"{}")
        client_ms = (time.perf_counter() - t0) * 1e3
        body = r["Payload"].read()
        if "FunctionError" in r:
            raise SystemExit(f"{fn} failed ({mode}): {body!r}")
        m = n.metrics()
        after = n.status()["snapshot_store"]
        fetches = after["fetches"] - before["fetches"]
        restores = sum(float(v) for v in re.findall(r'^thaw_starts_total{kind="restore-[^"]*"} (\S+)$', m, re.M))
        if restores != 1 or counter(m, "thaw_starts_total", 'kind="boot"') != 0:
            raise SystemExit(f"{fn} ({mode}): not one restore: {m}")
        if fetches != (1 if mode == "node-remote-cold" else 0):
            raise SystemExit(f"{fn} ({mode}): {fetches} fetches from the store")
        fetch = n.function_status(fn)["snapshot"].get("fetch") or {}
        if fetches:
            # The rest of the image arrives after the first response; the next run's
            # node-local needs it in the cache.
            wait_for(lambda: n.status()["snapshot_store"]["lazy_settled"] >= 1, f"{fn}'s snapshot to settle in the cache", timeout=300)
            # Once settled, the node rewrites a store's zstd frames as LZ4 frames where it
            # reads them (a working set of 4 MiB or more; they decode faster from its own
            # disk): let it finish, so the next node-local run measures the entry, not
            # that rewrite.
            wait_for(lambda: lz4_frames_here(node.entries), f"{fn}'s cache entry to get LZ4 frames", timeout=20)
        return {"function": fn, "sealed": node.sealed, "encryption": node.encryption, "mode": mode, "client_ms": client_ms,
                "request_ms": histogram_sum(m, "thaw_request_seconds") * 1e3,
                "start_ms": histogram_sum(m, "thaw_start_seconds") * 1e3,
                "lazy": bool(fetch.get("lazy")) if fetches else None,
                "requests_before_first_response": fetch.get("requests_before_first_response", 0) if fetches else 0,
                "bytes_before_first_response": fetch.get("bytes_fetched_before_first_response", 0) if fetches else 0}
    finally:
        if n.stop() != 0:
            raise SystemExit(f"the node did not stop cleanly: {n.log_path}")


# A variant: `on` or `off` (sealed or clear), then options each with `+`, each the
# environment of a baseline kept to measure against.
OPTIONS = {
    "ws-pages": ("ws.pages", {"THAW_STORE_SEALED_WS": "pages", "THAW_STORE_CLEAR_WS": "pages"}),
    "ws-lz4": ("ws.lz4", {"THAW_STORE_CLEAR_WS": "lz4"}),
    "head-whole": ("head checked whole", {"THAW_STORE_HEAD_STREAM": "pack"}),
    "lz4-frames": ("LZ4 frames", {"THAW_STORE_WS_CODEC": "lz4"}),
    "json-manifest": ("JSON manifest", {"THAW_STORE_MANIFEST": "json"}),
    "manifest-6": ("format 6 manifest", {"THAW_STORE_MANIFEST": "6"}),
    "hash-early": ("head hashed early", {"THAW_STORE_HEAD_HASH": "early"}),
    "copy-whole": ("head copy in one object", {"THAW_STORE_HEAD_SPLIT": "0"}),
}


def variant_env(variant):
    """(sealed, environment) of a variant such as `on`, `off+ws-pages` or `on+head-whole`
    (`on-ws-pages`: `on+ws-pages`, as before)."""
    base, *opts = variant.replace("on-ws-pages", "on+ws-pages").split("+")
    if base not in ("on", "off") or any(o not in OPTIONS for o in opts):
        raise ValueError(f"unknown variant {variant!r}: on or off, then +{' +'.join(OPTIONS)}")
    env = {}
    for o in opts:
        env.update(OPTIONS[o][1])
    return base == "on", env


def label(fn, encryption):
    base, *opts = encryption.replace("on-ws-pages", "on+ws-pages").split("+")
    return f"{fn} ({', '.join([{'on': 'sealed', 'off': 'clear'}[base]] + [OPTIONS[o][0] for o in opts])})"


def summarize(rows):
    out = {}
    for r in rows:
        out.setdefault(label(r["function"], r.get("encryption", "on" if r["sealed"] else "off")), {}).setdefault(r["mode"], []).append(r)
    med = {}
    for fn, by in out.items():
        med[fn] = {mode: {k: statistics.median(x[k] for x in v) for k in ("client_ms", "request_ms", "start_ms",
                                                                        "requests_before_first_response", "bytes_before_first_response")}
                   | {"n": len(v)} for mode, v in by.items()}
        local = med[fn]["node-local"]
        for mode, m in med[fn].items():
            m["request_x_local"] = m["request_ms"] / local["request_ms"]
            m["client_x_local"] = m["client_ms"] / local["client_ms"]
        # Same-run pairs (run i's remote over run i's local).
        pairs = [rc["request_ms"] / lo["request_ms"] for lo, rc in zip(by["node-local"], by["node-remote-cold"])]
        med[fn]["paired_request_ratio"] = statistics.median(pairs) if pairs else None
    return med


def chart(med, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fns = sorted(med)
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(fns)), 4))
    w = 0.38
    for j, mode in enumerate(MODES):
        ys = [med[f][mode]["request_ms"] for f in fns]
        bars = ax.bar([i + j * w for i in range(len(fns))], ys, w, label=mode)
        if mode == "node-remote-cold":
            for b, f in zip(bars, fns):
                ax.annotate(f"{med[f][mode]['request_x_local']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + w / 2 for i in range(len(fns))])
    ax.set_xticklabels(fns, fontsize=8)
    ax.set_ylabel("Invoke call in the node, ms (median)")
    ax.set_title("A node's first call: snapshot in its cache vs fetched from MinIO")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", default="helloworld,pyaes,jsonserde,lrserving",
                    help="Python samples, deployed through the Lambda API (a large one's packages as layers)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--link", default="loopback", help="loopback, or a tc rate (1gbit, 100mbit) of a veth pair to the store")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds between a node's start and its call")
    ap.add_argument("--encryption", default="on,off,on+ws-pages",
                    help="variants, each a node of its own: on: the node's default, snapshots sealed at rest with its key; "
                         "off: --no-encryption; then options: +ws-pages: the working set published as ws.pages instead of "
                         "ws.lz4 (a sealed image's, a clear one's of 4 MiB or more; THAW_STORE_SEALED_WS=pages, "
                         "THAW_STORE_CLEAR_WS=pages, the baseline); +ws-lz4: a clear image published with its "
                         "ws.lz4 whatever its size (THAW_STORE_CLEAR_WS=lz4); +head-whole: a miss checks the head whole before "
                         "handing any of it over (THAW_STORE_HEAD_STREAM=pack, the baseline); +lz4-frames: the stored "
                         "ws.lz4 keeps the node's LZ4 frames instead of zstd ones (THAW_STORE_WS_CODEC=lz4, the baseline); "
                         "+json-manifest: the manifest stored as JSON (format 5 or earlier) instead of binary (format 7; "
                         "THAW_STORE_MANIFEST=json, the baseline); +manifest-6: the binary manifest with fixed chunk "
                         "records (format 6, THAW_STORE_MANIFEST=6, the baseline) instead of compact tables (format 7); "
                         "+hash-early: a miss hashes the head's copy from its first byte until it knows the head is "
                         "checked chunk by chunk (THAW_STORE_HEAD_HASH=early, the baseline); +copy-whole: the head's copy "
                         "published and read as one object (THAW_STORE_HEAD_SPLIT=0, the baseline) instead of split "
                         "(state.bin and ws.trace first, the head's pages in a second object requested at once)")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    ap.add_argument("--logs", help="copy every node's log into this directory before the scratch directory goes "
                         "(their detail: THAW_TEST_LOG, e.g. info,thaw_store=debug)")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="thaw-store-node-bench-") as tmp:
        tmp = Path(tmp)
        store = Store(tmp, a.link)
        try:
            for fn in a.functions.split(","):
                for enc in a.encryption.split(","):
                    try:
                        variant_env(enc)
                    except ValueError as e:
                        ap.error(f"--encryption: {e}")
                    node = Node(tmp / f"node-{fn}-{enc}", store, prefix=f"node-{fn}-{enc}", encryption=enc)
                    sid = deploy(node, fn)
                    print(f"{label(fn, enc)}: stored snapshot {sid[:12]}", flush=True)
                    orders = balanced_orders(MODES)
                    for i in range(a.runs):
                        for mode in orders[i % len(orders)]:
                            rows.append(dict(one_call(node, fn, mode, a.settle), run=i, link=a.link))
        finally:
            store.stop()
            if a.logs:
                Path(a.logs).mkdir(parents=True, exist_ok=True)
                for log in tmp.glob("node-*/node-*.log"):
                    shutil.copy(log, Path(a.logs) / f"{log.parent.name}-{log.name}")
    med = summarize(rows)
    print(f"{'function':20s} {'mode':17s} {'Invoke in node ms':>17s} {'x local':>8s} {'start ms':>9s} {'client ms':>10s} "
          f"{'x local':>8s} {'requests':>9s} {'KB first':>9s}")
    for fn in sorted(med):
        for mode in MODES:
            m = med[fn][mode]
            print(f"{fn:20s} {mode:17s} {m['request_ms']:17.2f} {m['request_x_local']:8.2f} {m['start_ms']:9.2f} {m['client_ms']:10.2f} "
                  f"{m['client_x_local']:8.2f} {m['requests_before_first_response']:9.0f} {m['bytes_before_first_response'] / 1e3:9.0f}")
        print(f"{fn:20s} remote / local in the same round (median of {med[fn]['node-local']['n']}): {med[fn]['paired_request_ratio']:.2f}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"store-node-{stamp}.json"
    path.write_text(json.dumps({"runs": a.runs, "link": a.link, "settle_s": a.settle, "encryption": a.encryption, "medians": med, "samples": rows}, indent=1))
    svg = chart(med, out / f"store-node-{stamp}.svg")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


if __name__ == "__main__":
    main()
