"""Idle instances are frozen between invocations (issue #9: an idle instance's
background thread used 10 CPU-seconds in 10 s). A function starts a thread that
spins and records its own CPU time; between two invocations 1.5 s apart the thread
must not run, unless the node was started with --no-freeze-idle (the control)."""

import time

import pytest

from thaw_node_harness import NodeProcess, create, invoke_json, zip_bytes

SPINNER = '''
import threading, time
state = {"cpu": 0.0, "started": False}

def spin():
    while True:
        state["cpu"] = time.thread_time()
        for _ in range(20000):
            pass

def handler(event, context):
    if not state["started"]:
        state["started"] = True
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.05)
    return {"cpu": state["cpu"]}
'''


def idle_cpu(client, name):
    create(client, name, zip_bytes({"handler.py": SPINNER}), MemorySize=1769)
    _, first = invoke_json(client, name, {})
    time.sleep(1.5)
    _, second = invoke_json(client, name, {})
    return second["cpu"] - first["cpu"]


def test_idle_instances_are_frozen(node, client):
    used = idle_cpu(client, "spinner")
    assert used < 0.1, f"the idle instance's thread ran {used:.3f} CPU-s while idle"


@pytest.fixture
def unfrozen_node(tmp_path):
    n = NodeProcess(tmp_path, "--no-freeze-idle")
    yield n
    assert n.stop() == 0


def test_without_freezing_the_thread_runs(unfrozen_node):
    used = idle_cpu(unfrozen_node.client(), "spinner")
    assert used > 0.3, f"control: the thread ran only {used:.3f} CPU-s in 1.5 s idle"
