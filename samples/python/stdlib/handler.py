"""Exercises a spread of the standard library; deterministic output.

At import: an in-memory sqlite3 database with a few rows.
Per call: json, decimal, re, sqlite3, hashlib, zlib and datetime applied to
the event.  The same event gives the same result in any process (no clock,
no randomness, no hash() of str).
"""

import datetime
import decimal
import hashlib
import json
import re
import sqlite3
import zlib

_DB = sqlite3.connect(":memory:", check_same_thread=False)
_DB.executescript(
    """
    CREATE TABLE product (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                          price TEXT NOT NULL, category TEXT NOT NULL);
    INSERT INTO product (id, name, price, category) VALUES
        (1, 'apple',  '0.35', 'fruit'),
        (2, 'banana', '0.25', 'fruit'),
        (3, 'carrot', '0.10', 'vegetable'),
        (4, 'bread',  '2.49', 'bakery'),
        (5, 'cheese', '7.95', 'dairy'),
        (6, 'milk',   '1.19', 'dairy');
    """
)
_DB.commit()

_WORD = re.compile(r"[A-Za-z]+")
_EPOCH = datetime.date(2024, 1, 1)
_CENT = decimal.Decimal("0.01")


def handler(event, context):
    if not isinstance(event, dict):
        event = {"value": event}
    text = str(event.get("text", "The quick brown fox jumps over the lazy dog"))
    qty = int(event.get("qty", 3))
    category = str(event.get("category", "fruit"))
    days = int(event.get("days", 45))

    # json: canonical form of the event
    canonical = json.dumps(event, sort_keys=True, separators=(",", ":"))

    # re
    words = _WORD.findall(text)
    longest = max(words, key=lambda w: (len(w), w)) if words else ""

    # sqlite3 + decimal (exact money arithmetic)
    rows = _DB.execute(
        "SELECT name, price FROM product WHERE category = ? ORDER BY id", (category,)
    ).fetchall()
    with decimal.localcontext() as ctx:
        ctx.prec = 28
        subtotal = sum((decimal.Decimal(p) * qty for _, p in rows), decimal.Decimal(0))
        tax = (subtotal * decimal.Decimal("0.0825")).quantize(_CENT, decimal.ROUND_HALF_EVEN)
        total = subtotal + tax

    # hashlib + zlib
    blob = canonical.encode("utf-8")
    digest = hashlib.sha256(blob).hexdigest()
    compressed = zlib.compress(blob * 8, 6)

    # datetime on fixed dates
    due = _EPOCH + datetime.timedelta(days=days)
    stamp = datetime.datetime(2024, 2, 29, 12, 30, tzinfo=datetime.timezone.utc) + \
        datetime.timedelta(hours=days)

    return {
        "canonical": canonical,
        "word_count": len(words),
        "longest_word": longest,
        "items": [name for name, _ in rows],
        "subtotal": str(subtotal),
        "tax": str(tax),
        "total": str(total),
        "sha256": digest,
        "crc32": zlib.crc32(blob),
        "compressed_len": len(compressed),
        "due": due.isoformat(),
        "due_weekday": due.strftime("%A"),
        "stamp": stamp.isoformat(),
    }
