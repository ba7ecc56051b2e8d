"""Issue #9: the node admits instances by memory (the sum of their MemorySize may not
exceed --memory-budget-mb), evicting idle instances of other functions first."""

import threading
import time

import pytest
from botocore.exceptions import ClientError

from thaw_node_harness import NodeProcess, create, invoke_json, zip_bytes

SLEEPER = "import time\n\ndef handler(event, context):\n    time.sleep(event.get('sleep', 0))\n    return {'ok': True}\n"


@pytest.fixture
def small_node(tmp_path):
    n = NodeProcess(tmp_path, "--memory-budget-mb", "700", "--no-freeze-idle", keep_alive="60")
    yield n
    assert n.stop() == 0


def test_instances_are_admitted_by_memory(small_node):
    node, client = small_node, small_node.client()
    code = zip_bytes({"handler.py": SLEEPER})
    # A timeout well above the sleep below: a busy instance that timed out would be
    # killed, and the budget check at the end would see nothing committed.
    create(client, "big", code, MemorySize=512, Timeout=30)
    create(client, "small", code, MemorySize=256)
    create(client, "huge", code, MemorySize=1024)

    invoke_json(client, "big", {})
    st = node.status()
    assert st["node"]["memory_committed_mb"] == 512 and st["node"]["memory_budget_mb"] == 700, st["node"]
    # 512 + 256 > 700: big's idle instance is evicted to make room.
    invoke_json(client, "small", {})
    st = node.status()
    live = {f["name"]: f["instances"]["live"] for f in st["functions"]}
    assert live == {"big": 0, "small": 1, "huge": 0}, live
    assert st["node"]["memory_committed_mb"] == 256

    # While big is busy (nothing idle to evict), small cannot start a second instance...
    busy_result = []
    busy = threading.Thread(target=lambda: busy_result.append(invoke_json(client, "big", {"sleep": 3})))
    busy.start()
    try:
        # big's start evicts small's idle instance: 512 MB committed, all busy.
        deadline = time.time() + 30
        while node.status()["functions"][0]["instances"]["busy"] == 0 and time.time() < deadline:
            time.sleep(0.02)
        invoke_json(client, "small", {})  # would need 256 more: refused
    except ClientError as e:
        err = e
    else:
        err = None
    busy.join()
    assert [body for _, body in busy_result] == [{"ok": True}], "the busy invocation itself must succeed"
    assert err is not None, "a start over the memory budget was admitted"
    assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert err.response["Error"]["Code"] == "TooManyRequestsException"
    assert "memory budget" in err.response["Error"]["Message"]

    # A function larger than the whole budget is refused without evicting anyone.
    with pytest.raises(ClientError) as e:
        invoke_json(client, "huge", {})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert "1024 MB needed" in e.value.response["Error"]["Message"]
    assert node.status()["node"]["memory_committed_mb"] == 512
