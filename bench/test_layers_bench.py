"""bench/layers.py end to end, once (the real thaw binary): a base is built, the
function is layered on it, and every mode runs from base + diff or the full image."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_layers_bench_runs_every_mode(tmp_path):
    out = tmp_path / "layers.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "layers.py"), "--thaw", str(ROOT / "target" / "release" / "thaw"),
                        "--samples", str(ROOT / "build" / "samples" / "python"), "--functions", "helloworld", "--runs", "1", "--instances", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    fn = data["functions"]["helloworld"]
    assert fn["layered"], "a base exists, so the snapshot is a diff"
    assert set(fn["modes"]) == {"boot", "full-prefetch", "diff-eager", "diff-prefetch", "diff-prefetch-shared", "base-import"}
    # SnapFaaS's Table 2: every cold start broken down; "base only" imports at the cold
    # start (C holds the import) and reads its base's memory (B).
    assert set(fn["breakdown"]) == set(fn["modes"]) - {"boot"}, fn["breakdown"]
    bi = fn["breakdown"]["base-import"]
    assert bi["C_after_restore_ms"] > fn["breakdown"]["diff-prefetch"]["C_after_restore_ms"], fn["breakdown"]
    assert bi["A_state_ms"] > 0 and bi["B_memory_ms"] > 0 and fn["warm_ms"] > 0, fn
    assert fn["breakdown"]["diff-eager"]["B_memory_ms"] > fn["breakdown"]["diff-prefetch"]["B_memory_ms"], fn["breakdown"]
    # Each restore's phases, per mode: the engine's, the sandbox's and the open's.
    ph = fn["phases_ms"]["diff-prefetch"]
    assert {"open", "sandbox", "stub", "memory", "resume"} <= set(ph) and ph["open"] > 0 and ph["memory"] > 0, ph
    assert "boot" not in fn["phases_ms"] and "phases, diff+WS against full+REAP" in r.stdout, r.stdout
    b = fn["bytes"]
    assert 0 < b["diff"] < b["full"] and b["base"] > 0 and b["ws_diff"] > 0, b
    assert fn["pages_from_base"] > 0
    assert all(m["total_ms"] > 0 for m in fn["modes"].values())
    lo, hi = fn["paired_ratio"]["ci95"]
    assert lo <= fn["paired_ratio"]["median"] <= hi and len(fn["samples_total_ms"]["diff-prefetch"]) == 1, fn["paired_ratio"]
    mem = fn["memory"]
    assert mem["diff-2"]["shared"] and not mem["full-2"]["shared"], mem
    assert mem["diff-2"]["pages_shared"] > 0 and mem["full-2"]["pages_shared"] == 0, mem
    assert mem["diff-2"]["first_restore_ms"] > 0 and mem["diff-2"]["later_restore_ms_median"] > 0, mem
    # Instances that gave back their unchanged copies hold fewer pages of their own.
    assert mem["diff-given-back-2"]["pages_given_back_mean"] > 0, mem
    assert mem["diff-given-back-2"]["uss"] < mem["diff-2"]["uss"], mem
    assert fn["calls_ms"]["warm"] > 0 and fn["calls_ms"]["after-give-back"] > 0, fn["calls_ms"]
