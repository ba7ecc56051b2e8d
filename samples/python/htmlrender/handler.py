"""Server-side HTML rendering with Jinja2 (vHive "chameleon" analogue).

At import the template is compiled (autoescaping on) and a fixed pool of
MAX_ROWS table rows is generated deterministically; each call renders the
first event["rows"] rows into a full HTML page.

Event: {"rows": int (default 200, 1..MAX_ROWS)}.
Returns the row count, the HTML length and its sha256.
"""

import hashlib
import random

import jinja2

MAX_ROWS = 5000
COLUMNS = ["id", "name", "city", "status", "amount", "quantity", "ratio", "note"]

TEMPLATE_SRC = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{{ title }}</title>
<style>table{border-collapse:collapse}td,th{padding:2px 6px}.neg{color:#b00}</style>
</head>
<body>
<h1>{{ title }}</h1>
<p>{{ rows|length }} rows, total amount {{ "%.2f"|format(total) }}</p>
<table>
  <thead><tr>{% for c in columns %}<th>{{ c|capitalize }}</th>{% endfor %}</tr></thead>
  <tbody>
{%- for r in rows %}
    <tr class="{{ loop.cycle('odd', 'even') }}">
      <td>{{ r.id }}</td><td>{{ r.name }}</td><td>{{ r.city|upper }}</td>
      <td>{% if r.status == 'ok' %}&#10003;{% else %}<b>{{ r.status }}</b>{% endif %}</td>
      <td{% if r.amount < 0 %} class="neg"{% endif %}>{{ "%.2f"|format(r.amount) }}</td>
      <td>{{ r.quantity }}</td><td>{{ "%.4f"|format(r.ratio) }}</td><td>{{ r.note }}</td>
    </tr>
{%- endfor %}
  </tbody>
</table>
</body>
</html>
"""

ENV = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
TEMPLATE = ENV.from_string(TEMPLATE_SRC)


def _build_rows():
    rng = random.Random(1337)
    cities = ["Amsterdam", "Berlin", "Cairo", "Delhi", "Edinburgh", "Florence", "Geneva", "Helsinki"]
    statuses = ["ok", "ok", "ok", "pending", "failed"]
    notes = ["", "<fragile>", "Tom & Jerry", 'say "hi"', "n/a", "rush order", "it's late"]
    rows = []
    for i in range(MAX_ROWS):
        rows.append({
            "id": i + 1,
            "name": "customer-%05d" % rng.randrange(100000),
            "city": rng.choice(cities),
            "status": rng.choice(statuses),
            "amount": round(rng.uniform(-500, 5000), 2),
            "quantity": rng.randrange(1, 1000),
            "ratio": rng.random(),
            "note": rng.choice(notes),
        })
    return rows


ROWS = _build_rows()
# render once so every code path (filters, escaping, loop helpers) is warm
TEMPLATE.render(title="warm-up", columns=COLUMNS, rows=ROWS[:3], total=0.0)


def handler(event, context):
    event = event if isinstance(event, dict) else {}
    n = int(event.get("rows", 200))
    if not 1 <= n <= MAX_ROWS:
        raise ValueError("rows must be in 1..%d" % MAX_ROWS)
    rows = ROWS[:n]
    html = TEMPLATE.render(title="Thaw orders report", columns=COLUMNS, rows=rows,
                           total=sum(r["amount"] for r in rows))
    data = html.encode("utf-8")
    return {"rows": n, "length": len(data), "sha256": hashlib.sha256(data).hexdigest()}
