"""bench/cores.py: the model from made-up points, and one real run (1 and 2 cores, tiny)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import cores  # noqa: E402


def test_model_ratios_agreement_and_prediction():
    per = {1: {1: 4.0, 2: 8.0, 4: 16.0}, 2: {1: 2.0, 2: 3.0, 4: 6.0}}
    m = cores.model(per)
    assert m["ratio_to_single"][1] == {1: 1.0, 2: 2.0, 4: 4.0}
    assert m["ratio_to_single"][2] == {1: 1.0, 2: 1.5, 4: 3.0}
    # 2 cores at 2N against 1 core at N.
    assert m["agreement"] == {1: 3.0 / 4.0, 2: 6.0 / 8.0}
    # One instance per core on the most cores measured: 2 cores, N = 2.
    assert m["predicted_16_on_16"] == 1.5


def test_cores_runs_on_one_and_two_cores(tmp_path):
    if (os.cpu_count() or 1) < 2:
        return
    out = tmp_path / "cores.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "cores.py"), "--bursts", "1,2", "--runs", "1", "--rounds", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    per = data["per_instance_median_ms"]
    assert set(per) == {"1", "2"} and all(set(v) == {"1", "2"} for v in per.values()), per
    assert all(ms > 0 for v in per.values() for ms in v.values()), per
    assert data["model"]["predicted_16_on_16"] > 0
