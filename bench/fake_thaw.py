#!/usr/bin/python3
"""A fake `thaw` CLI for bench/test_coldstart.py: same arguments, plausible stats.

It runs no function: `boot` and `snapshot restore` print a canned result and
write stats drawn from fixed per-mode numbers plus a small jitter.  Knobs
(environment):
    FAKE_THAW_LOG=FILE     append one line "<mode> <code-or-snap>" per command
    FAKE_THAW_FAIL=MODE    exit 1 for that mode (boot|lazy|eager|warm|create)
"""

import argparse
import json
import os
import random
import sys

BASE = {  # ms
    "boot": {"sandbox_ms": 40.0, "init_ms": 200.0, "first_invoke_ms": 5.0},
    "lazy": {"restore_ms": 8.0, "first_invoke_ms": 6.0, "page_faults": 900, "bytes": 3 << 20},
    "eager": {"restore_ms": 20.0, "first_invoke_ms": 1.0, "page_faults": 10, "bytes": 40 << 20},
}


def log(mode, what):
    path = os.environ.get("FAKE_THAW_LOG")
    if path:
        with open(path, "a") as f:
            f.write("%s %s\n" % (mode, what))
    if os.environ.get("FAKE_THAW_FAIL") == mode:
        print("fake thaw: failing %s on request" % mode, file=sys.stderr)
        sys.exit(1)


def jitter(rng, v):
    return round(v * rng.uniform(0.9, 1.1), 3)


def write_stats(path, stats):
    if path:
        with open(path, "w") as f:
            json.dump(stats, f)


def main(argv):
    ap = argparse.ArgumentParser(prog="thaw")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("boot")
    b.add_argument("--code", required=True)
    b.add_argument("--handler", required=True)
    b.add_argument("--payload", required=True)
    b.add_argument("--stats")
    s = sub.add_parser("snapshot")
    ssub = s.add_subparsers(dest="sub", required=True)
    c = ssub.add_parser("create")
    c.add_argument("--code", required=True)
    c.add_argument("--handler", required=True)
    c.add_argument("--out", required=True)
    r = ssub.add_parser("restore")
    r.add_argument("snapdir")
    r.add_argument("--payload", required=True)
    r.add_argument("--paging", choices=("lazy", "eager"), default="lazy")
    r.add_argument("--invocations", type=int, default=1)
    r.add_argument("--stats")
    a = ap.parse_args(argv)
    rng = random.Random()

    if a.cmd == "boot":
        log("boot", a.code)
        json.loads(a.payload)
        st = {k: jitter(rng, v) for k, v in BASE["boot"].items()}
        st["total_ms"] = round(sum(st.values()), 3)
        st["mode"] = "boot"
        write_stats(a.stats, st)
        print(json.dumps({"fake": True, "payload": json.loads(a.payload)}))
        return 0
    if a.sub == "create":
        log("create", a.code)
        os.makedirs(a.out)
        with open(os.path.join(a.out, "meta.json"), "w") as f:
            json.dump({"code": a.code, "handler": a.handler}, f)
        os.makedirs(os.path.join(a.out, "mem"))
        with open(os.path.join(a.out, "mem", "pages.img"), "wb") as f:
            f.write(b"\x5a" * (256 * 1024))
        return 0
    # restore
    with open(os.path.join(a.snapdir, "meta.json")) as f:
        json.load(f)
    mode = "warm" if a.invocations >= 2 else a.paging
    log(mode, a.snapdir)
    base = BASE[a.paging]
    first = jitter(rng, base["first_invoke_ms"])
    invs = [first] + [jitter(rng, 0.5) for _ in range(a.invocations - 1)]
    st = {"mode": a.paging, "restore_ms": jitter(rng, base["restore_ms"]),
          "first_invoke_ms": first, "page_faults": int(jitter(rng, base["page_faults"])),
          "bytes_read_from_image": int(jitter(rng, base["bytes"])), "invocations_ms": invs}
    st["total_ms"] = round(st["restore_ms"] + sum(invs), 3)
    write_stats(a.stats, st)
    print(json.dumps({"fake": True, "payload": json.loads(a.payload)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
