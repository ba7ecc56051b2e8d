"""A node serves every restored instance's page faults from a fixed set of threads
(issue #33): before, each idle instance kept a page-server thread of its own, so 500
idle instances were 500 threads. Eight functions, each restored and left idle, and
invoked again afterwards (their memory still served correctly by the shared threads);
the control with THAW_PAGESERVER=thread has one thread per instance."""

import concurrent.futures
from pathlib import Path

import pytest

from thaw_node_harness import NodeProcess, create, invoke_json, zip_bytes

FUNCTIONS = 8

# Memory the invocation reads back: faults served lazily after the restore.
HANDLER = '''
import os
NAME = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
BIG = bytes(range(256)) * 4096

def handler(event, context):
    return {"name": NAME, "sum": sum(BIG[::4096]), "n": event.get("n")}
'''


def server_threads(pid):
    """(shared-or-instance page-server threads, forked-child page-server threads) of `pid`."""
    names = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((t / "comm").read_text().strip())
        except FileNotFoundError:
            pass  # a short-lived thread (the working set's compression, say) ended meanwhile
    return names.count("thaw-pageserver"), names.count("thaw-ps-child")


def idle_instances(node):
    client = node.client()
    names = [f"ps{i}" for i in range(FUNCTIONS)]
    for n in names:
        create(client, n, zip_bytes({"handler.py": HANDLER}))
    expected = sum((bytes(range(256)) * 4096)[::4096])

    def call(n, k):
        _, out = invoke_json(client, n, {"n": k})
        assert out == {"name": n, "sum": expected, "n": k}, out
        return out

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda n: call(n, 1), names))
    threads = server_threads(node.pid)
    # The idle instances answer again (their pages served after the restore).
    for n in names:
        call(n, 2)
    return threads


@pytest.fixture
def shared_node(tmp_path):
    n = NodeProcess(tmp_path, "--no-bases", keep_alive="120", env={"THAW_PAGESERVER_THREADS": "2"})
    yield n
    assert n.stop() == 0


@pytest.fixture
def per_instance_node(tmp_path):
    n = NodeProcess(tmp_path, "--no-bases", keep_alive="120", env={"THAW_PAGESERVER": "thread"})
    yield n
    assert n.stop() == 0


def test_idle_instances_share_a_fixed_set_of_page_server_threads(shared_node):
    ps, children = idle_instances(shared_node)
    assert ps == 2 and children == 0, f"{ps} page-server threads (+{children} for children) for {FUNCTIONS} instances"
    assert "thaw_pageserver_threads 2" in shared_node.metrics().splitlines()


def test_control_a_thread_per_instance(per_instance_node):
    ps, _ = idle_instances(per_instance_node)
    assert ps >= FUNCTIONS, f"control: only {ps} page-server threads for {FUNCTIONS} idle instances"
    assert "thaw_pageserver_threads 0" in per_instance_node.metrics().splitlines()
