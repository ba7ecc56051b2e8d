#!/usr/bin/env python3
"""How the store cuts pages.img into chunks (issue #28): address windows against content-defined chunks.

    bench/chunking.py [--functions helloworld,pyaes,lrserving] [--out bench/results]

For each function, two versions that differ in a few lines (an added constant and an
added helper) are captured with the same address layout and hash seed (`setarch
-R`, PYTHONHASHSEED=0: without them nearly every heap page differs), and their
working sets recorded. The store crate's `chunking` example then cuts both with
each way (`publish::Chunking`: 8 and 64 KiB address windows, FastCDC at 16 to 256
KiB average with the head's pages apart, and 64 KiB with them mixed in) and
reports:
  page_chunks        stored chunks of pages.img (one version)
  manifest_*         the manifest's size, compressed size and parse time (median of 15)
  both_vs_one        bytes stored for the two versions / for one (compressed chunks; dedup)
  head_pages_*       pages.img bytes in the head (raw, stored), what a miss reads before the start
Sizes are deterministic for one pair of captures; only the parse time is a median.
Prints a table, writes JSON and an SVG chart to --out. Needs root and build/samples.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def capture(thaw, code, out, data):
    env = {"THAW_DATA_DIR": str(data), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    r = subprocess.run(["setarch", "-R", thaw, "snapshot", "create", "--code", str(code), "--handler", "handler.handler",
                        "--env", "PYTHONHASHSEED=0", "--no-base", "--out", str(out)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"capturing {code} failed: {r.stderr}")
    # Records the working set (the head is cut around it).
    subprocess.run([thaw, "snapshot", "restore", str(out), "--quiet"], env=env, check=True, capture_output=True)


def versions(fn, tmp):
    src = ROOT / "build" / "samples" / "python" / fn
    v1, v2 = tmp / f"{fn}-v1", tmp / f"{fn}-v2"
    shutil.copytree(src, v1)
    shutil.copytree(src, v2)
    h = v2 / "handler.py"
    text = h.read_text()
    h.write_text(text + "\n\nVERSION = \"v2\"\n\n\ndef helper(x):\n    return x * 2\n")
    return v1, v2


def chart(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fns = sorted({r["function"] for r in rows})
    ways = list(dict.fromkeys(r["chunking"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label in zip(axes, ("both_vs_one", "manifest_parse_ms", "head_pages_stored"),
                              ("two versions / one (stored bytes)", "manifest parse, ms", "head pages stored, MB")):
        w = 0.8 / len(ways)
        for j, way in enumerate(ways):
            ys = [next((r[key] for r in rows if r["function"] == fn and r["chunking"] == way), 0) for fn in fns]
            if key == "head_pages_stored":
                ys = [y / 1e6 for y in ys]
            ax.bar([i + j * w for i in range(len(fns))], ys, w, label=way)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(fns))])
        ax.set_xticklabels(fns)
        ax.set_title(label, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", default="helloworld,pyaes,lrserving")
    ap.add_argument("--thaw", default=str(ROOT / "target/release/thaw"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "thaw-store", "--example", "chunking"], cwd=ROOT, check=True)
    tool = ROOT / "target" / "release" / "examples" / "chunking"
    rows = []
    with tempfile.TemporaryDirectory(prefix="thaw-chunking-") as tmp:
        tmp = Path(tmp)
        for fn in a.functions.split(","):
            v1, v2 = versions(fn, tmp)
            snaps = [tmp / f"{fn}-v1.snap", tmp / f"{fn}-v2.snap"]
            for code, snap in zip((v1, v2), snaps):
                capture(a.thaw, code, snap, tmp / "data")
            r = subprocess.run([str(tool), *map(str, snaps)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"chunking {fn} failed: {r.stderr}")
            out = r.stdout
            rows += [dict(json.loads(line), function=fn) for line in out.splitlines() if line.startswith("{")]
    print(f"{'function':11s} {'chunking':14s} {'chunks':>7s} {'manifest KB':>11s} {'zstd KB':>8s} {'parse ms':>9s} "
          f"{'2 vs 1':>7s} {'head MB':>8s} {'head stored MB':>15s}")
    for r in rows:
        print(f"{r['function']:11s} {r['chunking']:14s} {r['page_chunks']:7d} {r['manifest_bytes'] / 1e3:11.1f} "
              f"{r['manifest_zstd_bytes'] / 1e3:8.1f} {r['manifest_parse_ms']:9.2f} {r['both_vs_one']:7.3f} "
              f"{r['head_pages_bytes'] / 1e6:8.2f} {r['head_pages_stored'] / 1e6:15.2f}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out / f"chunking-{stamp}.json"
    path.write_text(json.dumps({"rows": rows}, indent=1))
    svg = chart(rows, out / f"chunking-{stamp}.svg")
    print(f"wrote {path}" + (f" and {svg}" if svg else ""))


if __name__ == "__main__":
    sys.exit(main())
