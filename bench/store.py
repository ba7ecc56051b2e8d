#!/usr/bin/env python3
"""Remote snapshots against local ones (issue #13, the thesis's Table 6.2 on our engine).

    bench/store.py [--functions helloworld,pyaes,lrserving] [--runs 5] [--links loopback,1gbit,100mbit]

For each function, in one sitting and interleaved run by run (the order rotates):
  boot          `thaw boot` (sandbox + runtime start + init + first response)
  local         `thaw snapshot restore DIR` (REAP prefetch; page cache of the image evicted)
  remote-cold   `thaw snapshot restore s3://...` with an empty node cache (fetch, verify, restore)
  remote-warm   the same with the snapshot in the node cache (page cache of the entry evicted)
  remote-cold-head-wait  remote-cold starting the restore only once the whole head is here
                (THAW_STORE_HEAD=wait), the baseline of restoring the state beside the head's pages
  remote-cold-copy-wait  remote-cold starting the restore only once the head's copy is here
                whole (THAW_STORE_HEAD_STREAM=0), the baseline of taking state.bin and
                ws.trace out of the copy's first bytes as they arrive
  remote-cold-chunk-check  remote-cold checking the head's pages chunk by chunk after decompression
                (THAW_STORE_HEAD_CHECK=chunks), the baseline of checking the head whole by its
                pack's name (the hash of its compressed bytes: less CPU)
  remote-cold-early-sandbox  remote-cold with the sandbox prepared while the head arrives
                (THAW_STORE_EARLY_SANDBOX=1; off by default, it measured slower)
  remote-cold-head-whole  remote-cold checking the head whole by its pack's name before handing
                any of it over (THAW_STORE_HEAD_STREAM=pack), the baseline of handing each
                piece over as it arrives, checked chunk by chunk
  remote-cold-ws-lz4  remote-cold of the same snapshot pushed with ws.lz4 in the head instead
                of ws.pages (format 5, THAW_STORE_CLEAR_WS=lz4, as a sealed image's), its
                frames installed as they arrive
  remote-cold-ws-derived  remote-cold of the same snapshot pushed without ws.pages (format 3,
                THAW_STORE_WS=derived: the miss assembles the working set out of pages.img's
                chunks), the baseline of storing ws.pages in the head (format 4)
  remote-cold-no-head-copy  remote-cold of the same snapshot pushed without the head's copy
                under its id (THAW_STORE_HEAD_COPY=0: the miss reads the head from its
                pack once the manifest is here), the baseline of reading the head's
                copy beside the manifest
  remote-cold-manifest-apart  remote-cold of the same snapshot pushed with a head copy that
                does not start with the manifest (THAW_STORE_HEAD_MANIFEST=0: the miss reads
                the manifest and the copy in two parallel requests), the baseline of one request
  remote-cold-copy-whole  remote-cold of the same snapshot pushed with its head copy in one
                object (THAW_STORE_HEAD_SPLIT=0, and the miss asks for no second part), the
                baseline of a split copy (state.bin and ws.trace in a small first object, the
                head's pages in a second, both requested at once)
  remote-cold-window  remote-cold of the same snapshot pushed with pages.img cut by 8 KiB
                address windows (THAW_STORE_CHUNKS=window), the baseline of content-defined chunks
  remote-cold-v2  remote-cold of the same snapshot pushed with its chunks raw (format 2,
                THAW_STORE_FORMAT=2: packs, no compression), the baseline of compression
  remote-cold-v1  remote-cold of the same snapshot pushed in the format before packs
                (THAW_STORE_FORMAT=1: one object per 8 KiB chunk), the baseline of issue #28
  layered-local   the function as a diff on the Python base (`thaw base build`), restored
                from its directory (page cache of the diff and the base evicted)
  layered-remote-cold  the diff from the store with an empty cache: the base arrives lazily
                beside the diff (its head first, the pages the diff's working set lacks on demand)
  layered-remote-cold-base-apart  the same with a diff pushed whose copy does not carry its
                base's start (THAW_STORE_HEAD_BASE=0, push and restore): the base's copy is read
                once the diff's manifest has named it (a second round trip before the start),
                the baseline of the diff's copy carrying it
  layered-remote-cold-whole-base  the same with the base fetched whole into the cache
                before the diff's head (THAW_STORE_BASE=whole), the baseline of the lazy base
  layered-remote-diff  the diff from the store with its base already cached (what a node
                that runs other functions of the runtime sees)
Time to first response is the restore's `total_ms` (it includes the fetch); `cpu ms` is
the CPU time the thaw process used until then (fetch, restore, page server; not the
instance's, not the store's); the
remote modes also report bytes fetched (in all, and before the first response),
requests before the first response and time spent fetching. A cold restore of a
snapshot with a head pack fetches the head, starts, and fetches the rest on demand
(issue #28); `remote-cold-whole` fetches everything first (THAW_STORE_FETCH=whole).

The store is a real MinIO (scripts/build-minio.sh builds it). `loopback` runs it on
127.0.0.1; `1gbit` / `100mbit` run it in a network namespace behind a veth pair whose
both directions are shaped with `tc tbf`, since loopback flatters a remote store.
Prints a table of medians and writes JSON and an SVG chart to --out (bench/results).
Needs root and build/samples (scripts/build-samples.sh).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "api"))
from minio_harness import ACCESS_KEY, SECRET_KEY, minio_bin  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from coldstart import balanced_orders, evict_page_cache  # noqa: E402  (shared with the other benchmarks)

MODES = ("boot", "local", "remote-cold", "remote-warm", "remote-cold-whole", "remote-cold-head-wait", "remote-cold-copy-wait", "remote-cold-chunk-check", "remote-cold-early-sandbox", "remote-cold-head-whole", "remote-cold-ws-lz4", "remote-cold-ws-derived", "remote-cold-no-head-copy", "remote-cold-manifest-apart", "remote-cold-copy-whole", "remote-cold-window", "remote-cold-v2",
         "remote-cold-v1", "layered-local", "layered-remote-cold", "layered-remote-cold-base-apart", "layered-remote-cold-whole-base", "layered-remote-diff")
NS = "thaw-bench-s3"
HOST_IP, NS_IP = "10.213.0.1", "10.213.0.2"


def sh(*args, check=True):
    return subprocess.run(args, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


class Store:
    """MinIO on loopback, or in a network namespace behind a shaped veth pair."""

    def __init__(self, tmp, link):
        self.link, self.tmp = link, tmp
        data = tmp / f"minio-{link}"
        data.mkdir()
        env = dict(os.environ, MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        cmd = [str(minio_bin()), "server", "--quiet"]
        if link == "loopback":
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            self.endpoint = f"http://127.0.0.1:{port}"
            cmd += ["--address", f"127.0.0.1:{port}", str(data)]
        else:
            self._netns(link)
            self.endpoint = f"http://{NS_IP}:9000"
            cmd = ["ip", "netns", "exec", NS] + cmd + ["--address", f"{NS_IP}:9000", str(data)]
        self.log = open(data / "minio.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log)
        self.env = dict(os.environ, AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                        AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
        deadline = time.time() + 30
        while subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", self.endpoint + "/"],
                             capture_output=True, text=True).stdout != "403":
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"MinIO did not start ({link}): {(data / 'minio.log').read_text()}")
            time.sleep(0.1)

    def _netns(self, rate):
        sh("ip", "netns", "del", NS, check=False)
        sh("ip", "link", "del", "thawb-h", check=False)
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", "thawb-h", "type", "veth", "peer", "name", "thawb-m")
        sh("ip", "link", "set", "thawb-m", "netns", NS)
        sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", "thawb-h")
        sh("ip", "link", "set", "thawb-h", "up")
        sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/30", "dev", "thawb-m")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "thawb-m", "up")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        # Both directions: requests leave through thawb-h, responses through thawb-m.
        tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
        sh("tc", "qdisc", "add", "dev", "thawb-h", *tbf)
        sh("ip", "netns", "exec", NS, "tc", "qdisc", "add", "dev", "thawb-m", *tbf)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        if self.link != "loopback":
            sh("ip", "link", "del", "thawb-h", check=False)
            sh("ip", "netns", "del", NS, check=False)


def run_thaw(thaw, env, args, stats):
    r = subprocess.run([thaw, *args, "--quiet", "--stats", str(stats)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"thaw {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return json.loads(stats.read_text())


def bench_function(thaw, fn, store, runs, tmp, modes=MODES):
    code = ROOT / "build" / "samples" / "python" / fn
    data = tmp / f"data-{store.link}-{fn}"
    env = dict(store.env, THAW_DATA_DIR=str(data))
    snap = tmp / f"{store.link}-{fn}.snap"
    stats = tmp / "stats.json"
    subprocess.run([thaw, "snapshot", "create", "--code", str(code), "--handler", "handler.handler", "--out", str(snap), "--no-base"],
                   env=env, check=True, capture_output=True)
    run_thaw(thaw, env, ["snapshot", "restore", str(snap)], stats)  # records the working set
    # The same function as a diff on the runtime's base.
    subprocess.run([thaw, "base", "build", "--runtime", "python3"], env=env, check=True, capture_output=True)
    snap_d = tmp / f"{store.link}-{fn}.diff"
    # A diff even where the base provides little (THAW_DIFF_MIN_BASE_SHARE=0): these modes
    # measure diffs in the store.
    subprocess.run([thaw, "snapshot", "create", "--code", str(code), "--handler", "handler.handler", "--out", str(snap_d)],
                   env=dict(env, THAW_DIFF_MIN_BASE_SHARE="0"), check=True, capture_output=True)
    run_thaw(thaw, env, ["snapshot", "restore", str(snap_d)], stats)
    push_d = subprocess.run([thaw, "snapshot", "push", str(snap_d), f"s3://thaw-bench/{fn}-layered", "--create-bucket"],
                            env=env, check=True, capture_output=True, text=True)
    url_d = push_d.stdout.strip().splitlines()[-1]
    push_da = subprocess.run([thaw, "snapshot", "push", str(snap_d), f"s3://thaw-bench/{fn}-layered-base-apart", "--create-bucket"],
                             env=dict(env, THAW_STORE_HEAD_BASE="0"), check=True, capture_output=True, text=True)
    url_da = push_da.stdout.strip().splitlines()[-1]
    push = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}", "--create-bucket"],
                          env=env, check=True, capture_output=True, text=True)
    url = push.stdout.strip().splitlines()[-1]
    push_v1 = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-v1"],
                             env=dict(env, THAW_STORE_FORMAT="1"), check=True, capture_output=True, text=True)
    url_v1 = push_v1.stdout.strip().splitlines()[-1]
    push_v2 = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-v2"],
                             env=dict(env, THAW_STORE_FORMAT="2"), check=True, capture_output=True, text=True)
    url_v2 = push_v2.stdout.strip().splitlines()[-1]
    push_w = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-window"],
                            env=dict(env, THAW_STORE_CHUNKS="window"), check=True, capture_output=True, text=True)
    url_w = push_w.stdout.strip().splitlines()[-1]
    push_wd = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-ws-derived"],
                             env=dict(env, THAW_STORE_WS="derived"), check=True, capture_output=True, text=True)
    url_wd = push_wd.stdout.strip().splitlines()[-1]
    # ws.lz4 in the head instead of ws.pages (format 5, as a sealed image's is).
    push_wp = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-ws-lz4"],
                             env=dict(env, THAW_STORE_CLEAR_WS="lz4"), check=True, capture_output=True, text=True)
    url_wp = push_wp.stdout.strip().splitlines()[-1]
    push_nc = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-no-head-copy"],
                             env=dict(env, THAW_STORE_HEAD_COPY="0"), check=True, capture_output=True, text=True)
    url_nc = push_nc.stdout.strip().splitlines()[-1]
    push_ma = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-manifest-apart"],
                             env=dict(env, THAW_STORE_HEAD_MANIFEST="0"), check=True, capture_output=True, text=True)
    url_ma = push_ma.stdout.strip().splitlines()[-1]
    push_cw = subprocess.run([thaw, "snapshot", "push", str(snap), f"s3://thaw-bench/{fn}-copy-whole"],
                             env=dict(env, THAW_STORE_HEAD_SPLIT="0"), check=True, capture_output=True, text=True)
    url_cw = push_cw.stdout.strip().splitlines()[-1]
    pushes = {"packs": json.loads(push.stdout.strip().splitlines()[-2]), "v1": json.loads(push_v1.stdout.strip().splitlines()[-2]),
              "ws-derived": json.loads(push_wd.stdout.strip().splitlines()[-2]),
              "ws-lz4": json.loads(push_wp.stdout.strip().splitlines()[-2]),
              "no-head-copy": json.loads(push_nc.stdout.strip().splitlines()[-2]),
              "v2": json.loads(push_v2.stdout.strip().splitlines()[-2]), "layered": json.loads(push_d.stdout.strip().splitlines()[-2]),
              "window": json.loads(push_w.stdout.strip().splitlines()[-2])}
    urls = {"remote-cold-v1": url_v1, "remote-cold-v2": url_v2, "remote-cold-window": url_w, "remote-cold-ws-derived": url_wd, "remote-cold-ws-lz4": url_wp, "remote-cold-no-head-copy": url_nc, "remote-cold-manifest-apart": url_ma, "remote-cold-copy-whole": url_cw}
    base_entry = pushes["layered"]["base"]
    cache = data / "snapshot-cache" / "entries"
    rows = []
    orders = balanced_orders(m for m in MODES if m in modes)
    for i in range(runs):
        for mode in orders[i % len(orders)]:
            if mode == "boot":
                st = run_thaw(thaw, env, ["boot", "--code", str(code), "--handler", "handler.handler"], stats)
            elif mode == "local":
                evict_page_cache(str(snap))
                st = run_thaw(thaw, env, ["snapshot", "restore", str(snap)], stats)
            elif mode in ("remote-cold", "remote-cold-whole", "remote-cold-head-wait", "remote-cold-copy-wait", "remote-cold-chunk-check", "remote-cold-early-sandbox", "remote-cold-head-whole", "remote-cold-ws-lz4", "remote-cold-ws-derived", "remote-cold-no-head-copy", "remote-cold-manifest-apart", "remote-cold-copy-whole", "remote-cold-window", "remote-cold-v2", "remote-cold-v1"):
                shutil.rmtree(cache, ignore_errors=True)
                menv = {"remote-cold-whole": dict(env, THAW_STORE_FETCH="whole"),
                        "remote-cold-head-wait": dict(env, THAW_STORE_HEAD="wait"),
                        "remote-cold-copy-wait": dict(env, THAW_STORE_HEAD_STREAM="0"),
                        "remote-cold-chunk-check": dict(env, THAW_STORE_HEAD_CHECK="chunks"),
                        "remote-cold-early-sandbox": dict(env, THAW_STORE_EARLY_SANDBOX="1"),
                        "remote-cold-head-whole": dict(env, THAW_STORE_HEAD_STREAM="pack"),
                        "remote-cold-copy-whole": dict(env, THAW_STORE_HEAD_SPLIT="0")}.get(mode, env)
                st = run_thaw(thaw, menv, ["snapshot", "restore", urls.get(mode, url)], stats)
                assert st["store"]["cache_hit"] is False, st["store"]
            elif mode == "layered-local":
                evict_page_cache(str(snap_d))
                evict_page_cache(str(data / "bases"))
                st = run_thaw(thaw, env, ["snapshot", "restore", str(snap_d)], stats)
            elif mode in ("layered-remote-cold", "layered-remote-cold-base-apart", "layered-remote-cold-whole-base"):
                shutil.rmtree(cache, ignore_errors=True)
                menv = {"layered-remote-cold-whole-base": dict(env, THAW_STORE_BASE="whole"),
                        "layered-remote-cold-base-apart": dict(env, THAW_STORE_HEAD_BASE="0")}.get(mode, env)
                st = run_thaw(thaw, menv, ["snapshot", "restore", url_da if mode.endswith("base-apart") else url_d], stats)
                assert st["store"]["cache_hit"] is False, st["store"]
            elif mode == "layered-remote-diff":
                if not (cache / base_entry).is_dir():
                    run_thaw(thaw, env, ["snapshot", "restore", url_d], stats)
                shutil.rmtree(cache / url_d.rsplit("/", 1)[1], ignore_errors=True)
                evict_page_cache(str(cache))
                st = run_thaw(thaw, env, ["snapshot", "restore", url_d], stats)
                assert st["store"]["cache_hit"] is False, st["store"]
            else:
                if not (cache / url.rsplit("/", 1)[1]).is_dir():
                    run_thaw(thaw, env, ["snapshot", "restore", url], stats)
                evict_page_cache(str(cache))
                st = run_thaw(thaw, env, ["snapshot", "restore", url], stats)
                assert st["store"]["cache_hit"] is True, st["store"]
            s = st.get("store") or {}
            rows.append({"function": fn, "link": store.link, "mode": mode, "run": i, "total_ms": st["total_ms"],
                         "paging": st["mode"], "bytes_fetched": s.get("bytes_fetched", 0),
                         "requests": s.get("requests_before_first_response", s.get("requests", 0)),
                         "bytes_before_first_response": s.get("bytes_fetched_before_first_response", s.get("bytes_fetched", 0)),
                         "fetch_ms": s.get("fetch_ms", 0.0) if "remote" in mode else 0.0,
                         "cpu_ms": st.get("cpu_ms_before_first_response", 0.0),
                         # Where the time goes, to compare modes step by step.
                         "phases_ms": dict(st.get("phases_ms") or {}, sandbox=st.get("sandbox_ms", 0.0), open=st.get("open_ms", 0.0),
                                           first_invoke=st.get("first_invoke_ms", 0.0)),
                         "push": pushes[{"remote-cold-v1": "v1", "remote-cold-v2": "v2", "layered-remote-cold": "layered",
                                         "remote-cold-window": "window", "remote-cold-ws-derived": "ws-derived", "remote-cold-ws-lz4": "ws-lz4",
                                         "remote-cold-no-head-copy": "no-head-copy"}.get(mode, "packs")]
                         if "remote" in mode else None})
    return rows


def medians(rows):
    out = {}
    for r in rows:
        out.setdefault((r["link"], r["function"], r["mode"]), []).append(r)
    return {k: {"total_ms": statistics.median(x["total_ms"] for x in v),
                "fetch_ms": statistics.median(x["fetch_ms"] for x in v),
                "cpu_ms": statistics.median(x.get("cpu_ms", 0.0) for x in v),
                "bytes_fetched": statistics.median(x["bytes_fetched"] for x in v),
                "requests": statistics.median(x.get("requests", 0) for x in v),
                "bytes_before_first_response": statistics.median(x.get("bytes_before_first_response", 0) for x in v),
                "push": v[0].get("push"),
                "phases_ms": {p: statistics.median(x.get("phases_ms", {}).get(p, 0.0) for x in v)
                              for p in sorted({p for x in v for p in x.get("phases_ms", {})})},
                "paging": v[0]["paging"], "n": len(v)} for k, v in out.items()}


def chart(med, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = sorted({(link, fn) for link, fn, _ in med})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    run = [m for m in MODES if any(k[2] == m for k in med)]
    w = 0.8 / len(run)
    for j, mode in enumerate(run):
        ys = [med.get((link, fn, mode), {}).get("total_ms", 0) for link, fn in groups]
        ax.bar([i + j * w for i in range(len(groups))], ys, w, label=mode)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{fn}\n{link}" for link, fn in groups], fontsize=8)
    ax.set_ylabel("time to first response, ms (median)")
    ax.set_yscale("log")
    ax.set_title("Remote snapshots vs local (MinIO)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", default="helloworld,pyaes,lrserving")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--links", default="loopback,1gbit,100mbit",
                    help="loopback and/or tc rates (e.g. 1gbit, 100mbit) of a veth pair to the store")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="the modes to run, comma-separated (local is always run: every ratio is against it)")
    ap.add_argument("--thaw", default=str(ROOT / "target/release/thaw"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    modes = set(a.modes.split(",")) | {"local"}
    unknown = modes - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="thaw-store-bench-") as tmp:
        tmp = Path(tmp)
        for link in a.links.split(","):
            store = Store(tmp, link)
            try:
                for fn in a.functions.split(","):
                    rows += bench_function(a.thaw, fn, store, a.runs, tmp, modes)
            finally:
                store.stop()
    med = medians(rows)
    print(f"{'link':9s} {'function':11s} {'mode':24s} {'first response ms':>17s} {'x local':>8s} {'fetch ms':>9s} "
          f"{'fetch %':>8s} {'MB fetched':>10s} {'MB first':>9s} {'requests':>9s} {'cpu ms':>7s}")
    for (link, fn, mode), m in sorted(med.items(), key=lambda kv: (kv[0][0], kv[0][1], MODES.index(kv[0][2]))):
        local = med[(link, fn, "local")]["total_ms"]
        share = 100 * m["fetch_ms"] / m["total_ms"] if m["fetch_ms"] else 0
        print(f"{link:9s} {fn:11s} {mode:24s} {m['total_ms']:17.1f} {m['total_ms'] / local:8.2f} {m['fetch_ms']:9.1f} "
              f"{share:8.0f} {m['bytes_fetched'] / 1e6:10.2f} {m['bytes_before_first_response'] / 1e6:9.2f} {m['requests']:9.0f} {m['cpu_ms']:7.1f}")
    # Each mode's phases against the local restore's (median ms; + is slower).
    for (link, fn, mode), m in sorted(med.items(), key=lambda kv: (kv[0][0], kv[0][1], MODES.index(kv[0][2]))):
        base = med[(link, fn, "local")].get("phases_ms", {})
        if mode == "local" or not base:
            continue
        diffs = {p: m["phases_ms"].get(p, 0.0) - base.get(p, 0.0) for p in sorted(set(base) | set(m["phases_ms"]))}
        print(f"phases {link} {fn} {mode} vs local: " + ", ".join(f"{p} {d:+.2f}" for p, d in diffs.items() if abs(d) >= 0.05))
    for (link, fn, mode), m in sorted(med.items()):
        label = {"remote-cold": "format 7 (compact binary manifest), compressed packs, ws.pages in the head, head copy split", "remote-cold-ws-lz4": "format 7, ws.lz4 (zstd frames) in the head, streamed", "remote-cold-ws-derived": "format 3, ws.pages derived",
                 "remote-cold-no-head-copy": "format 4, no head copy",
                 "remote-cold-window": "format 3, 8 KiB address windows",
                 "remote-cold-v2": "format 2, raw packs", "remote-cold-v1": "format 1",
                 "layered-remote-cold": "format 3, diff + base"}
        if mode in label and m.get("push"):
            p = m["push"]
            # Throughput of the snapshot pushed (its bytes per second), and what went over the wire.
            mbps = p["snapshot_bytes"] / p["seconds"] / 1e6 if p["seconds"] else 0
            print(f"push {link} {fn} ({label[mode]}): {p['snapshot_bytes'] / 1e6:.2f} MB in {p['seconds'] * 1e3:.0f} ms "
                  f"({mbps:.1f} MB/s), {p['bytes_uploaded'] / 1e6:.2f} MB sent, {p['requests']} requests")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"store-{stamp}.json"
    path.write_text(json.dumps({"runs": a.runs, "links": a.links, "medians": {"/".join(k): v for k, v in med.items()},
                                "samples": rows}, indent=1))
    svg = chart(med, out / f"store-{stamp}.svg")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


if __name__ == "__main__":
    main()
