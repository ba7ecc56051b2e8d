"""bench/node_memory.py end to end, small (real `thaw serve` nodes): the instances
asked for are alive, a file per snapshot shows up as shared memory files and full
images as none, and give-back leaves the instances holding less of their own."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_node_memory_bench_measures_every_policy_asked(tmp_path):
    out = tmp_path / "node-memory.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "node_memory.py"), "--functions", "helloworld", "--instances", "1,2",
                        "--policies", "full,snapshot", "--hold-ms", "600", "--give-back", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    by = {(x["policy"], x["per_function"], x["given_back"]): x for x in rows}
    assert set(by) == {("full", 1, False), ("full", 2, False), ("snapshot", 1, False), ("snapshot", 1, True),
                       ("snapshot", 2, False), ("snapshot", 2, True)}, sorted(by)
    for x in rows:
        assert x["live"] == {"helloworld": x["per_function"]}, x
        assert x["anon_bytes"] > 0 and x["per_instance_bytes"] > 0, x
    assert by[("full", 2, False)]["shared_bytes"] == 0
    assert by[("snapshot", 2, False)]["shared_files"] == 1 and by[("snapshot", 2, False)]["shared_bytes"] > 0
    # Unchanged copies given back: less anonymous memory, the shared file as it was.
    assert by[("snapshot", 2, True)]["anon_bytes"] < by[("snapshot", 2, False)]["anon_bytes"]
    assert "per_added_instance_vs_full" in by[("snapshot", 2, False)]
