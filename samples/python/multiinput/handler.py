"""Input-dependent working set (REAP paper, Figure 5).

At import TABLES independent tables are built one after another, each a few
MiB: ROWS distinct Python tuples (int, float, str) plus a BLOB_SIZE bytes
blob with a per-table pattern.  Each table is built in one go, so its
objects sit in their own arenas/pages.  A call reads and aggregates only
table event["table"], so the set of pages touched after a restore depends
on the input: a working set recorded with table 0 misses table 3's pages.

Event: {"table": int in 0..TABLES-1 (default 0)}.
Returns a deterministic aggregate of that table.
"""

import hashlib
import math

TABLES = 8
ROWS = 20000
BLOB_SIZE = 1 << 20


def _build_table(t):
    rows = []
    x = 1 + t * 7919  # LCG state; distinct sequence per table
    for j in range(ROWS):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        rows.append((j * TABLES + t, (x >> 11) / float(1 << 53) * 1000.0,
                     "t%d-r%05d-%016x" % (t, j, x)))
    pattern = bytes(((t * 53 + k * 13) % 251) + 1 for k in range(256))
    blob = pattern * (BLOB_SIZE // len(pattern))
    return {"id": t, "rows": rows, "blob": blob}


DATA = [_build_table(t) for t in range(TABLES)]


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    t = int(event.get("table", 0))
    if not 0 <= t < TABLES:
        raise ValueError("table must be in 0..%d" % (TABLES - 1))
    table = DATA[t]
    rows = table["rows"]
    h = hashlib.sha256()
    key_sum = 0
    big = 0
    for key, value, label in rows:
        key_sum += key
        if value > 500.0:
            big += 1
        h.update(label.encode("ascii"))
    return {
        "table": t,
        "rows": len(rows),
        "key_sum": key_sum,
        "value_sum": round(math.fsum(r[1] for r in rows), 6),
        "values_over_500": big,
        "labels_sha256": h.hexdigest(),
        "blob_bytes": len(table["blob"]),
        "blob_sha256": hashlib.sha256(table["blob"]).hexdigest(),
    }
