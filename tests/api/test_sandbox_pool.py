"""Prepared sandboxes in the node (issue #15): once a function is deployed the node keeps
sandboxes of its shape prepared, and cold starts of any function of that shape take
one (only the function's code is attached), answer correctly from a fresh
state, and show up in /metrics and /thaw/status. Stopping the node removes them."""

import os
import re
import subprocess
import time
from pathlib import Path

from thaw_node_harness import THAW, NodeProcess, create, invoke_json, sample_zip


def metric(node, name):
    for line in node.metrics().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            yield line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1])


def init_exes(parent):
    """The executable names of `parent`'s child processes (the sandboxes' inits)."""
    names = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                names.append(os.path.basename(os.readlink(d / "exe")))
        except OSError:
            continue
    return names


def test_cold_starts_take_prepared_sandboxes(tmp_path):
    node = NodeProcess(tmp_path, "--sandbox-pool", "2", keep_alive="1")
    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        # A deploy has the new snapshot's sandboxes prepared: two, before any call.
        deadline = time.time() + 30
        while node.status()["sandbox_pool"]["ready"] < 2 and time.time() < deadline:
            time.sleep(0.1)
        st = node.status()["sandbox_pool"]
        assert st["ready"] == 2 and st["shapes"] == 1, st
        # Their inits run the small init of the same build, not a re-exec of the node's
        # 165 MB binary: the one linked statically against musl when scripts/build-init.sh
        # put it beside thaw (faster to start), else the glibc-linked one.
        small = "thaw-sandbox-init-static" if (THAW.parent / "thaw-sandbox-init-static").exists() else "thaw-sandbox-init"
        assert sorted(init_exes(node.pid)) == [small, small]
        # So the very first cold start after the deploy takes one.
        _, body = invoke_json(c, "hello", {"name": "pool"})
        assert body == {"message": "hello, pool"}
        assert dict(metric(node, "thaw_restore_sandboxes_total")) == {'thaw_restore_sandboxes_total{outcome="prepared"}': 1.0}
        create(c, "counter", sample_zip("counter"))
        while node.status()["sandbox_pool"]["ready"] < 2 and time.time() < deadline:
            time.sleep(0.1)
        # Another function of the same shape: its cold start takes a prepared sandbox,
        # and every instance starts from the snapshot's state.
        for _ in range(3):
            _, body = invoke_json(c, "counter", {})
            assert body["count"] >= 1
        time.sleep(1.5)  # keep-alive over: the next call is a cold start again
        _, body = invoke_json(c, "counter", {})
        assert body["count"] == 1, body
        m = dict(metric(node, "thaw_restore_sandboxes_total"))
        assert m.get('thaw_restore_sandboxes_total{outcome="prepared"}', 0) >= 2, m
        assert node.status()["sandbox_pool"]["hits"] >= 2
        assert dict(metric(node, "thaw_sandbox_pool_ready"))["thaw_sandbox_pool_ready"] >= 0
    finally:
        assert node.stop() == 0, node.log_path.read_text()
    assert node.leftover_sandboxes() == [], "the prepared sandboxes are removed at shutdown"


def test_pool_off(tmp_path):
    node = NodeProcess(tmp_path, "--sandbox-pool", "0")
    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        _, body = invoke_json(c, "hello", {"name": "nopool"})
        assert body == {"message": "hello, nopool"}
        assert node.status()["sandbox_pool"] is None
        assert not list(metric(node, "thaw_restore_sandboxes_total"))
    finally:
        assert node.stop() == 0, node.log_path.read_text()
    assert node.leftover_sandboxes() == []


# Reads what a new tenant can see of its network namespace, then (when asked) makes a
# loopback connection: that use must keep the namespace from being handed out again.
NETNS_PROBE = '''import os, socket

def counters():
    lo = [l.split() for l in open("/proc/net/dev") if l.strip().startswith("lo:")][0]
    used = [l for l in open("/proc/net/sockstat") if l.startswith("sockets:")][0].split()[2]
    return {"lo_rx_packets": int(lo[2]), "lo_tx_packets": int(lo[10]), "sockets_used": int(used),
            "netns": os.readlink("/proc/self/ns/net")}

def handler(event, context):
    seen = counters()
    if event.get("talk"):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
        c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b"x"); a.recv(1)
        for x in (a, c, s):
            x.close()
    return seen
'''


def hold_netns(name):
    """A descriptor of the network namespace `name` (net:[inode]), from a process in it."""
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "ns/net") == name:
                return os.open(d / "ns/net", os.O_RDONLY)
        except OSError:
            continue
    raise AssertionError(f"no process in {name}")


def test_network_namespaces_are_used_again_only_unused(tmp_path):
    """Issue #33: an ended instance's network namespace serves a later sandbox when
    nothing shows it was used; one with loopback traffic is dropped, so no instance
    ever sees another's sockets or counters."""
    from thaw_node_harness import zip_bytes

    node = NodeProcess(tmp_path, "--sandbox-pool", "1", keep_alive="1")
    try:
        c = node.client()
        create(c, "probe", zip_bytes({"handler.py": NETNS_PROBE}))
        talked, own_sockets, held = set(), None, []
        for i in range(6):
            talk = i % 2 == 1
            _, seen = invoke_json(c, "probe", {"talk": talk})
            # Whatever namespace it got, nothing of an earlier tenant shows: loopback
            # never carried a packet, and the namespace holds only the instance's own
            # sockets, as many as the first instance's (the talking instances'
            # namespaces were dropped).
            assert seen["lo_rx_packets"] == 0 and seen["lo_tx_packets"] == 0, (i, seen)
            own_sockets = seen["sockets_used"] if own_sockets is None else own_sockets
            assert seen["sockets_used"] == own_sockets, (i, seen)
            assert seen["netns"] not in talked, (i, seen)
            if talk:
                talked.add(seen["netns"])
                # Hold the namespace, so its number is not given to a new one once
                # the node drops it (the kernel reuses the numbers of freed ones).
                held.append(hold_netns(seen["netns"]))
            time.sleep(1.6)  # keep-alive over: the instance ends, the next call is cold
        m = dict(metric(node, "thaw_network_namespaces_checked_total"))
        assert m.get('thaw_network_namespaces_checked_total{outcome="dropped"}', 0) >= 3, m
        assert m.get('thaw_network_namespaces_checked_total{outcome="kept"}', 0) >= 2, m
        m = dict(metric(node, "thaw_network_namespaces_total"))
        assert m.get('thaw_network_namespaces_total{outcome="reused"}', 0) >= 1, m
        st = node.status()["network_namespaces"]
        assert st["kept"] >= 2 and st["dropped"] >= 3, st
        # And `thaw status` says so in words.
        out = subprocess.run([str(THAW), "status", "--endpoint", f"127.0.0.1:{node.port}"],
                             capture_output=True, text=True, check=True).stdout
        line = next(l for l in out.splitlines() if l.startswith("network namespaces:"))
        kept, dropped = map(int, re.search(r"(\d+) kept, (\d+) dropped", line).groups())
        assert kept >= st["kept"] and dropped >= st["dropped"], line
        assert any(l.startswith("sandbox pool:") for l in out.splitlines()), out
        for fd in held:
            os.close(fd)
    finally:
        assert node.stop() == 0, node.log_path.read_text()
    assert node.leftover_sandboxes() == []
