"""Issue #16: function settings outside the snapshot and the account, through boto3
exactly as a deployment tool calls them: tags (CreateFunction Tags, TagResource,
UntagResource, ListTags, GetFunction's Tags), reserved concurrency
(Put/Get/DeleteFunctionConcurrency, enforced with TooManyRequestsException) and
GetAccountSettings with the node's real limits."""

import threading
import time

import pytest
from botocore.exceptions import ClientError

from thaw_node_harness import create, invoke_json, wait_updated, zip_bytes

SLEEPY = """
import time

def handler(event, context):
    time.sleep(event.get("sleep", 0))
    return {"slept": event.get("sleep", 0)}
"""


def code(e):
    return e.value.response["Error"]["Code"]


def test_tags_round_trip(client):
    arn = create(client, "tagged", zip_bytes({"handler.py": SLEEPY}), Tags={"team": "storage"})["FunctionArn"]
    assert client.list_tags(Resource=arn)["Tags"] == {"team": "storage"}
    client.tag_resource(Resource=arn, Tags={"env": "prod", "team": "compute"})
    assert client.list_tags(Resource=arn)["Tags"] == {"env": "prod", "team": "compute"}
    client.untag_resource(Resource=arn, TagKeys=["team", "absent"])
    assert client.list_tags(Resource=arn)["Tags"] == {"env": "prod"}
    assert client.get_function(FunctionName="tagged")["Tags"] == {"env": "prod"}
    with pytest.raises(ClientError) as e:
        client.tag_resource(Resource=arn, Tags={"aws:reserved": "x"})
    assert code(e) == "InvalidParameterValueException"
    assert client.list_tags(Resource=arn)["Tags"] == {"env": "prod"}, "a refused call changes nothing"
    with pytest.raises(ClientError) as e:
        client.list_tags(Resource=arn.replace("tagged", "no-such-function"))
    assert code(e) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as e:
        create(client, "badtags", zip_bytes({"handler.py": SLEEPY}), Tags={"": "empty key"})
    assert code(e) == "InvalidParameterValueException"
    names = [f["FunctionName"] for f in client.list_functions()["Functions"]]
    assert "badtags" not in names, "a refused create leaves no function"
    # Deleting the function deletes its tags: a new function of that name has none.
    client.delete_function(FunctionName="tagged")
    arn = create(client, "tagged", zip_bytes({"handler.py": SLEEPY}))["FunctionArn"]
    assert client.list_tags(Resource=arn)["Tags"] == {}
    client.delete_function(FunctionName="tagged")


def test_reserved_concurrency_is_enforced_and_counted(node, client):
    create(client, "reserved", zip_bytes({"handler.py": SLEEPY}))
    limit = client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"]
    assert client.get_function_concurrency(FunctionName="reserved").get("ReservedConcurrentExecutions") is None

    # 0: the function is switched off.
    assert client.put_function_concurrency(FunctionName="reserved", ReservedConcurrentExecutions=0)["ReservedConcurrentExecutions"] == 0
    with pytest.raises(ClientError) as e:
        invoke_json(client, "reserved")
    assert code(e) == "TooManyRequestsException"
    assert e.value.response["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded", e.value.response

    # 1: one invocation at a time; the reservation is taken out of the unreserved pool.
    client.put_function_concurrency(FunctionName="reserved", ReservedConcurrentExecutions=1)
    assert client.get_function_concurrency(FunctionName="reserved")["ReservedConcurrentExecutions"] == 1
    assert client.get_function(FunctionName="reserved")["Concurrency"] == {"ReservedConcurrentExecutions": 1}
    assert client.get_account_settings()["AccountLimit"]["UnreservedConcurrentExecutions"] == limit - 1
    outcomes = []

    def call(sleep):
        try:
            invoke_json(client, "reserved", {"sleep": sleep})
            outcomes.append("ok")
        except ClientError as e:
            outcomes.append(e.response["Error"]["Code"])

    t = threading.Thread(target=call, args=(3,))
    t.start()
    # The second call is made while the first one runs (the node reports it busy).
    for _ in range(200):
        if node.function_status("reserved")["instances"]["busy"] == 1:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the first call never started")
    call(0)
    t.join()
    assert sorted(outcomes) == ["TooManyRequestsException", "ok"], outcomes

    # Too much reserved: refused, nothing changed.
    with pytest.raises(ClientError) as e:
        client.put_function_concurrency(FunctionName="reserved", ReservedConcurrentExecutions=limit)
    assert code(e) == "InvalidParameterValueException"
    assert client.get_function_concurrency(FunctionName="reserved")["ReservedConcurrentExecutions"] == 1

    client.delete_function_concurrency(FunctionName="reserved")
    assert "ReservedConcurrentExecutions" not in client.get_function_concurrency(FunctionName="reserved")
    assert "Concurrency" not in client.get_function(FunctionName="reserved")
    assert invoke_json(client, "reserved", {"sleep": 0})[1] == {"slept": 0}
    with pytest.raises(ClientError) as e:
        client.put_function_concurrency(FunctionName="no-such-function", ReservedConcurrentExecutions=1)
    assert code(e) == "ResourceNotFoundException"
    client.delete_function(FunctionName="reserved")


def test_account_settings_are_the_nodes(node, client):
    s = client.get_account_settings()
    status = node.status()
    assert s["AccountLimit"]["ConcurrentExecutions"] == status["node"]["max_instances"], status["node"]
    assert s["AccountLimit"]["CodeSizeUnzipped"] == 250 * 1024 * 1024
    assert s["AccountUsage"]["FunctionCount"] == len(client.list_functions(MaxItems=1000)["Functions"])


CONFIGURED = """
import os

def handler(event, context):
    return {"greeting": os.environ.get("GREETING"), "memory": context.memory_limit_in_mb}

def other(event, context):
    return {"other": True}
"""


def test_update_function_configuration(client):
    create(client, "configured", zip_bytes({"handler.py": CONFIGURED}), Environment={"Variables": {"GREETING": "hi"}})
    assert invoke_json(client, "configured")[1] == {"greeting": "hi", "memory": "128"}

    # Not in the snapshot: applied at once.
    r = client.update_function_configuration(FunctionName="configured", Timeout=10, Description="described")
    assert (r["Timeout"], r["Description"], r["LastUpdateStatus"]) == (10, "described", "Successful")

    # In the snapshot: a new revision is built while the old one serves.
    before = client.get_function_configuration(FunctionName="configured")["RevisionId"]
    r = client.update_function_configuration(FunctionName="configured", MemorySize=256,
                                             Environment={"Variables": {"GREETING": "hello"}})
    assert r["MemorySize"] == 256 and r["Environment"]["Variables"] == {"GREETING": "hello"}
    assert r["RevisionId"] != before
    cfg = wait_updated(client, "configured")
    assert cfg["LastUpdateStatus"] == "Successful", cfg
    assert invoke_json(client, "configured")[1] == {"greeting": "hello", "memory": "256"}
    assert (cfg["Timeout"], cfg["Description"]) == (10, "described"), "earlier changes are kept"

    # A stale RevisionId, a malformed handler: refused, nothing changed.
    with pytest.raises(ClientError) as e:
        client.update_function_configuration(FunctionName="configured", Timeout=5, RevisionId=before)
    assert code(e) == "PreconditionFailedException"
    with pytest.raises(ClientError) as e:
        client.update_function_configuration(FunctionName="configured", Handler="nodot")
    assert code(e) == "InvalidParameterValueException"
    assert client.get_function_configuration(FunctionName="configured")["Timeout"] == 10

    # A handler that exists: switched; one that does not: the update fails, the old one serves.
    client.update_function_configuration(FunctionName="configured", Handler="handler.other")
    assert wait_updated(client, "configured")["LastUpdateStatus"] == "Successful"
    assert invoke_json(client, "configured")[1] == {"other": True}
    client.update_function_configuration(FunctionName="configured", Handler="handler.missing")
    cfg = wait_updated(client, "configured")
    assert cfg["LastUpdateStatus"] == "Failed", cfg
    assert invoke_json(client, "configured")[1] == {"other": True}
    client.delete_function(FunctionName="configured")


LEAKY = """
import os
STATE = {"n": 0}

def handler(event, context):
    seen = {"n": STATE["n"], "tmp": sorted(os.listdir("/tmp")), "env": os.environ.get("LEAK")}
    STATE["n"] += 1
    with open("/tmp/leak-%d" % STATE["n"], "w") as f:
        f.write(context.aws_request_id)
    os.environ["LEAK"] = context.aws_request_id
    return seen
"""


def test_isolation_tag_resets_instances_between_invocations(node, client):
    """Issue #12 in the node: a function tagged thaw:isolation=invocation is reset in place
    after every invocation, so the next caller sees nothing of the previous one, while
    the instance itself stays warm (no restore per call). The control function without
    the tag sees its previous invocation's state."""
    create(client, "isolated", zip_bytes({"handler.py": LEAKY}), Tags={"thaw:isolation": "invocation"})
    create(client, "shared", zip_bytes({"handler.py": LEAKY}))
    clean = {"n": 0, "tmp": [], "env": None}
    assert [invoke_json(client, "isolated")[1] for _ in range(4)] == [clean] * 4
    second = [invoke_json(client, "shared")[1] for _ in range(2)][1]
    assert second["n"] == 1 and second["tmp"] == ["leak-1"] and second["env"] is not None, second
    st = node.function_status("isolated")
    assert st["counters"]["resets"] >= 3 and st["counters"]["resets_refused"] == 0, st
    assert st["counters"]["starts_warm"] >= 3, f"the reset instance is reused, not restored per call: {st}"
    assert 'thaw_resets_total{outcome="done"}' in node.metrics()
    for n in ("isolated", "shared"):
        client.delete_function(FunctionName=n)
