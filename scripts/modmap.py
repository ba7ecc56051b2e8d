#!/usr/bin/env python3
"""The module map of a crate, and the import circles in it (issue #34).

    scripts/modmap.py [--print] [CRATE_DIR ...]        (default: crates/engine crates/node)

A crate's modules are the files directly in src/ (a directory beside a file is part of
that file's module: src/node/update.rs belongs to `node`). Module A uses module B when
A's code (outside `#[cfg(test)]`, which by convention closes a file) names `crate::B`.
Modules that use each other, directly or through others, form a circle: one cannot
be read, changed or tested without the rest. Circles known today are listed in
scripts/modmap-known.txt (to be broken up, issue #34); the check fails on any other
circle, on a known one that grew, and names a known one that is gone (take it off the
list). --print shows each crate's modules in layers (a module uses only what is in the
layers below it, or its own circle), for ARCHITECTURE.md.

A script over `crate::` paths rather than cargo-modules: no toolchain to install, and
what it reads is what a reviewer reads.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KNOWN = ROOT / "scripts" / "modmap-known.txt"


def modules(src: Path):
    """{module: text of its files, test code cut off}."""
    mods = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        top = rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]
        if top in ("lib", "main") or (len(rel.parts) > 1 and rel.parts[0] == "bin"):
            continue
        text = f.read_text()
        cut = text.find("#[cfg(test)]")
        mods.setdefault(top, []).append(text if cut < 0 else text[:cut])
    return {m: "\n".join(t) for m, t in mods.items()}


def uses(mods):
    """{module: set of the crate's other modules it names}."""
    out = {}
    for m, text in mods.items():
        names = set(re.findall(r"\bcrate::(\w+)", text))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            names |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        out[m] = {n for n in names if n in mods and n != m}
    return out


def circles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c for c in comps if len(c) > 1]


def layers(graph, comps):
    """Modules in layers: each uses only lower layers (a circle counts as one node)."""
    of = {m: frozenset(c) for c in comps for m in c}
    node = lambda m: of.get(m, frozenset([m]))
    nodes = {node(m) for m in graph}
    deps = {x: {node(w) for m in x for w in graph[m]} - {x} for x in nodes}
    level = {}
    while len(level) < len(nodes):
        for x in nodes:
            if x not in level and all(d in level for d in deps[x]):
                level[x] = 1 + max((level[d] for d in deps[x]), default=-1)
    out = {}
    for x, l in level.items():
        out.setdefault(l, []).append("(" + " ".join(sorted(x)) + ")" if len(x) > 1 else next(iter(x)))
    return [sorted(out[l]) for l in sorted(out)]


def known():
    """{crate: [set of modules]} from scripts/modmap-known.txt (`crate: a b c` lines)."""
    out = {}
    for line in KNOWN.read_text().splitlines() if KNOWN.exists() else []:
        line = line.split("#", 1)[0].strip()
        if line:
            crate, mods = line.split(":", 1)
            out.setdefault(crate.strip(), []).append(set(mods.split()))
    return out


def main(argv):
    show = "--print" in argv
    crates = [a for a in argv if a != "--print"] or ["crates/engine", "crates/node"]
    allowed = known()
    failed = False
    for c in crates:
        name = Path(c).name
        graph = uses(modules(ROOT / c / "src"))
        found = circles(graph)
        if show:
            print(f"{name}: {len(graph)} modules, bottom layer first")
            for i, l in enumerate(layers(graph, found)):
                print(f"  {i}: {' '.join(l)}")
        for comp in found:
            if not any(comp <= k for k in allowed.get(name, [])):
                failed = True
                print(f"modmap: {name}: a new import circle: {' '.join(sorted(comp))}", file=sys.stderr)
        for k in allowed.get(name, []):
            if not any(k & comp for comp in found):
                print(f"modmap: {name}: the known circle {' '.join(sorted(k))} is gone: take it off {KNOWN.relative_to(ROOT)}", file=sys.stderr)
        if not show:
            print(f"modmap: {name}: {len(graph)} modules, {len(found)} circle(s)" + "".join(f"; {' '.join(sorted(x))}" for x in found))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
