"""bench/chunking.py end to end, once (two real captures of helloworld): every way of
cutting is reported, and the head kept apart holds less than address windows bring."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_chunking_bench_reports_every_way(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "chunking.py"), "--functions", "helloworld", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {x["chunking"]: x for x in json.loads(next(tmp_path.glob("chunking-*.json")).read_text())["rows"]}
    assert {"window-8k", "cdc-16k", "cdc-64k-mixed"} <= set(rows), rows.keys()
    # Apart, the head is only its pages: less than the windows around them, far less
    # than content-defined chunks that mix them with others.
    assert rows["cdc-16k"]["head_pages_bytes"] < rows["window-8k"]["head_pages_bytes"], rows
    assert rows["cdc-16k"]["head_pages_bytes"] < rows["cdc-64k-mixed"]["head_pages_bytes"], rows
    # Larger chunks: fewer of them and a smaller manifest.
    assert rows["cdc-64k-mixed"]["page_chunks"] < rows["cdc-16k"]["page_chunks"] < rows["window-8k"]["page_chunks"], rows
    # Two versions share most of their chunks.
    assert 1.0 < rows["cdc-16k"]["both_vs_one"] < 2.0, rows
    assert "cdc-16k" in r.stdout
