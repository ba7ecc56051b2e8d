"""bench/store.py end to end, once, on loopback (a real MinIO and the real thaw binary):
every mode runs and the remote ones fetch what they should."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_store_bench_runs_every_mode(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "store.py"), "--functions", "helloworld", "--runs", "1",
                        "--links", "loopback", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(next(tmp_path.glob("store-*.json")).read_text())
    rows = {s["mode"]: s for s in data["samples"]}
    assert set(rows) == {"boot", "local", "remote-cold", "remote-warm", "remote-cold-whole", "remote-cold-head-wait", "remote-cold-copy-wait", "remote-cold-chunk-check", "remote-cold-early-sandbox", "remote-cold-head-whole", "remote-cold-ws-lz4", "remote-cold-ws-derived", "remote-cold-no-head-copy", "remote-cold-manifest-apart", "remote-cold-copy-whole", "remote-cold-window", "remote-cold-v2", "remote-cold-v1",
                         "layered-local", "layered-remote-cold", "layered-remote-cold-base-apart", "layered-remote-cold-whole-base", "layered-remote-diff"}
    # Compressed packs: less over the wire than the raw ones, still more than a MiB for helloworld.
    assert rows["remote-cold"]["bytes_fetched"] > 1 << 20, rows["remote-cold"]
    assert rows["remote-cold"]["bytes_fetched"] < rows["remote-cold-v2"]["bytes_fetched"], rows
    # A diff whose base is cached fetches less than one that brings its base along.
    assert rows["layered-remote-diff"]["bytes_fetched"] < rows["layered-remote-cold"]["bytes_fetched"], rows
    # A base the cache lacks arrives lazily beside the diff: a fraction of it before the
    # first response, where the baseline fetched it whole first.
    lazy, whole = rows["layered-remote-cold"], rows["layered-remote-cold-whole-base"]
    # (The base's manifest and head come in one read of its copy, as the diff's do: two
    # in all; fetching the base whole reads its manifest and every pack after.)
    assert lazy["requests"] <= 4 and lazy["requests"] < whole["requests"], (lazy, whole)
    # The diff's copy carries the base's start: three requests at once (the diff's copy
    # in two objects, the rest of the base's); read apart, the base's copy follows the
    # diff's manifest (four).
    assert (lazy["requests"], rows["layered-remote-cold-base-apart"]["requests"]) == (3, 4), rows
    assert lazy["bytes_before_first_response"] * 2 < whole["bytes_before_first_response"], (lazy, whole)
    # Packs and a head: a handful of requests before the first response where the
    # format before them made hundreds, and less than the image.
    assert rows["remote-cold"]["requests"] <= 4, rows["remote-cold"]
    # The head's copy brings the manifest: two requests at once before the first
    # response (its two parts), one for a copy in one object; a copy without the
    # manifest is read beside the manifest (and the second part a split copy would
    # have: three); without a copy the head follows the manifest (one or two more).
    assert rows["remote-cold"]["requests"] == 2, rows["remote-cold"]
    assert rows["remote-cold-copy-whole"]["requests"] == 1, rows["remote-cold-copy-whole"]
    assert rows["remote-cold-copy-whole"]["bytes_before_first_response"] == rows["remote-cold"]["bytes_before_first_response"], rows
    assert rows["remote-cold-manifest-apart"]["requests"] == 3, rows["remote-cold-manifest-apart"]
    assert rows["remote-cold-manifest-apart"]["bytes_before_first_response"] == rows["remote-cold"]["bytes_before_first_response"], rows
    assert 2 < rows["remote-cold-no-head-copy"]["requests"] <= 4, rows["remote-cold-no-head-copy"]
    assert rows["remote-cold-early-sandbox"]["requests"] <= 4, rows["remote-cold-early-sandbox"]
    # Streaming the head's copy or waiting for all of it fetches the same, in as many requests.
    wait = rows["remote-cold-copy-wait"]
    assert (wait["requests"], wait["bytes_before_first_response"]) == (2, rows["remote-cold"]["bytes_before_first_response"]), (wait, rows["remote-cold"])
    # Checking the head whole or chunk by chunk fetches the same.
    assert rows["remote-cold-chunk-check"]["bytes_before_first_response"] == rows["remote-cold"]["bytes_before_first_response"], rows
    assert rows["remote-cold"]["bytes_before_first_response"] < rows["remote-cold-whole"]["bytes_before_first_response"], rows
    assert rows["remote-cold-whole"]["requests"] <= 4, rows["remote-cold-whole"]
    assert rows["remote-cold-v1"]["requests"] > 100, rows["remote-cold-v1"]
    # ws.pages in the head (format 4): pages.img's chunks of the working set are built
    # from it, not fetched, so the whole miss reads less than when ws.pages is derived.
    assert rows["remote-cold-ws-derived"]["requests"] <= 4, rows["remote-cold-ws-derived"]
    assert rows["remote-cold"]["bytes_fetched"] < rows["remote-cold-ws-derived"]["bytes_fetched"] * 1.05, rows
    # ws.lz4 in the head (format 5) or ws.pages, streamed or checked whole: the copy's
    # two parts before the first response each; checked whole, the same bytes.
    assert rows["remote-cold-ws-lz4"]["requests"] == 2 and rows["remote-cold-head-whole"]["requests"] == 2, rows
    assert rows["remote-cold-head-whole"]["bytes_before_first_response"] == rows["remote-cold"]["bytes_before_first_response"], rows
    assert rows["remote-warm"]["bytes_fetched"] == 0, "a warm cache fetches nothing"
    assert all(r["cpu_ms"] > 0 for r in rows.values() if r["mode"] != "boot"), rows
    assert rows["local"]["paging"] == "prefetch" and rows["remote-cold"]["paging"] == "prefetch", rows
    assert "remote-cold" in r.stdout
