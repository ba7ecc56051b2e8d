"""Issue #16: published versions through boto3. A version freezes the code, handler,
memory and environment (and its snapshot) of $LATEST when published; qualified
invocations keep using it after $LATEST moves on, across a node restart; deleting a
version deletes only that version; aliases route to versions; asynchronous invocations
run the version they name."""

import time

import pytest
from botocore.exceptions import ClientError

from thaw_node_harness import NodeProcess, create, invoke_json, zip_bytes

CODE = """
import os

def handler(event, context):
    return {"mark": os.environ.get("MARK"), "memory": context.memory_limit_in_mb, "code": "%s"}
"""


def code(e):
    return e.value.response["Error"]["Code"]


def wait_updated(client, name):
    client.get_waiter("function_updated_v2").wait(FunctionName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def call(client, name, qualifier=None):
    kw = {"Qualifier": qualifier} if qualifier else {}
    resp, body = invoke_json(client, name, **kw)
    return resp["ExecutedVersion"], body


def test_versions_freeze_code_and_configuration(tmp_path):
    node = NodeProcess(tmp_path / "node")
    try:
        client = node.client()
        create(client, "ver", zip_bytes({"handler.py": CODE % "a"}), Environment={"Variables": {"MARK": "one"}})
        v1 = client.publish_version(FunctionName="ver", Description="first")
        assert v1["Version"] == "1" and v1["FunctionArn"].endswith(":ver:1") and v1["Description"] == "first"
        assert v1["SnapStart"]["OptimizationStatus"] == "On"
        assert client.publish_version(FunctionName="ver")["Version"] == "1", "nothing changed: the same version"

        client.update_function_configuration(FunctionName="ver", MemorySize=256, Environment={"Variables": {"MARK": "two"}})
        wait_updated(client, "ver")
        assert client.publish_version(FunctionName="ver")["Version"] == "2"
        client.update_function_code(FunctionName="ver", ZipFile=zip_bytes({"handler.py": CODE % "b"}))
        wait_updated(client, "ver")

        assert call(client, "ver", "1") == ("1", {"mark": "one", "memory": "128", "code": "a"})
        assert call(client, "ver", "2") == ("2", {"mark": "two", "memory": "256", "code": "a"})
        assert call(client, "ver") == ("$LATEST", {"mark": "two", "memory": "256", "code": "b"})
        assert call(client, "ver:1")[1]["mark"] == "one", "a qualified name works like Qualifier"
        listed = [v["Version"] for v in client.list_versions_by_function(FunctionName="ver")["Versions"]]
        assert listed == ["$LATEST", "1", "2"]
        cfg = client.get_function(FunctionName="ver", Qualifier="1")["Configuration"]
        assert (cfg["Version"], cfg["Environment"]["Variables"], cfg["MemorySize"]) == ("1", {"MARK": "one"}, 128)

        for bad in ("7", "staging"):
            with pytest.raises(ClientError) as e:
                call(client, "ver", bad)
            assert code(e) == "ResourceNotFoundException", bad
        with pytest.raises(ClientError) as e:
            client.publish_version(FunctionName="ver", CodeSha256="0" * 44)
        assert code(e) == "PreconditionFailedException"

        # Versions survive a node restart.
        assert node.stop() == 0
        node = NodeProcess(tmp_path / "node")
        client = node.client()
        assert call(client, "ver", "1")[1] == {"mark": "one", "memory": "128", "code": "a"}
        assert call(client, "ver")[1]["code"] == "b"

        client.delete_function(FunctionName="ver", Qualifier="1")
        with pytest.raises(ClientError) as e:
            call(client, "ver", "1")
        assert code(e) == "ResourceNotFoundException"
        assert call(client, "ver", "2")[1]["mark"] == "two"
        assert [v["Version"] for v in client.list_versions_by_function(FunctionName="ver")["Versions"]] == ["$LATEST", "2"]
        # Lambda never reuses a version number, not even the newest one's once deleted.
        client.delete_function(FunctionName="ver", Qualifier="2")
        assert client.publish_version(FunctionName="ver")["Version"] == "3"
        client.delete_function(FunctionName="ver")
    finally:
        node.stop()


def test_aliases_route_to_versions(client):
    create(client, "aliased", zip_bytes({"handler.py": CODE % "a"}), Environment={"Variables": {"MARK": "one"}})
    client.publish_version(FunctionName="aliased")
    client.update_function_configuration(FunctionName="aliased", Environment={"Variables": {"MARK": "two"}})
    wait_updated(client, "aliased")
    client.publish_version(FunctionName="aliased")

    a = client.create_alias(FunctionName="aliased", Name="prod", FunctionVersion="1", Description="live")
    assert a["AliasArn"].endswith(":aliased:prod") and a["FunctionVersion"] == "1"
    assert call(client, "aliased", "prod") == ("1", {"mark": "one", "memory": "128", "code": "a"})
    assert client.get_function(FunctionName="aliased", Qualifier="prod")["Configuration"]["Version"] == "1"
    with pytest.raises(ClientError) as e:
        client.create_alias(FunctionName="aliased", Name="prod", FunctionVersion="2")
    assert code(e) == "ResourceConflictException"
    for bad in ({"FunctionVersion": "9"}, {"RoutingConfig": {"AdditionalVersionWeights": {"2": 1.5}}},
                {"RoutingConfig": {"AdditionalVersionWeights": {"9": 0.5}}}):
        with pytest.raises(ClientError) as e:
            client.update_alias(FunctionName="aliased", Name="prod", **bad)
        assert code(e) in ("ResourceNotFoundException", "InvalidParameterValueException"), (bad, e.value.response)
    assert client.get_alias(FunctionName="aliased", Name="prod")["FunctionVersion"] == "1", "refused updates change nothing"

    # Weighted routing: half of the calls go to version 2.
    client.update_alias(FunctionName="aliased", Name="prod", RoutingConfig={"AdditionalVersionWeights": {"2": 0.5}})
    seen = {call(client, "aliased", "prod")[0] for _ in range(40)}
    assert seen == {"1", "2"}, seen
    client.update_alias(FunctionName="aliased", Name="prod", FunctionVersion="2", RoutingConfig={"AdditionalVersionWeights": {}})
    assert {call(client, "aliased", "prod")[0] for _ in range(5)} == {"2"}
    assert [x["Name"] for x in client.list_aliases(FunctionName="aliased")["Aliases"]] == ["prod"]
    assert client.list_aliases(FunctionName="aliased", FunctionVersion="1")["Aliases"] == []

    # A version an alias points at cannot be deleted; once the alias is gone it can.
    with pytest.raises(ClientError) as e:
        client.delete_function(FunctionName="aliased", Qualifier="2")
    assert code(e) == "ResourceConflictException"
    client.delete_alias(FunctionName="aliased", Name="prod")
    with pytest.raises(ClientError) as e:
        call(client, "aliased", "prod")
    assert code(e) == "ResourceNotFoundException"
    client.delete_function(FunctionName="aliased", Qualifier="2")
    client.delete_function(FunctionName="aliased")


def idle_instances(node, name):
    return node.function_status(name)["instances"]["idle"]


def test_provisioned_concurrency_keeps_instances_ready(tmp_path):
    import time
    node = NodeProcess(tmp_path / "node", keep_alive="1")
    try:
        client = node.client()
        create(client, "prov", zip_bytes({"handler.py": CODE % "p"}))
        client.publish_version(FunctionName="prov")
        r = client.put_provisioned_concurrency_config(FunctionName="prov", Qualifier="1", ProvisionedConcurrentExecutions=2)
        assert r["RequestedProvisionedConcurrentExecutions"] == 2 and r["Status"] in ("IN_PROGRESS", "READY")
        for _ in range(120):
            cfg = client.get_provisioned_concurrency_config(FunctionName="prov", Qualifier="1")
            if cfg["Status"] == "READY":
                break
            time.sleep(0.25)
        assert cfg["Status"] == "READY" and cfg["AllocatedProvisionedConcurrentExecutions"] == 2, cfg
        time.sleep(3)  # three keep-alives: provisioned instances are not reaped
        assert idle_instances(node, "prov") == 2
        resp, body = invoke_json(client, "prov", Qualifier="1")
        assert body["code"] == "p" and resp["ResponseMetadata"]["HTTPHeaders"]["x-thaw-start"] == "warm"
        listed = client.list_provisioned_concurrency_configs(FunctionName="prov")["ProvisionedConcurrencyConfigs"]
        assert [c["FunctionArn"].rsplit(":", 1)[1] for c in listed] == ["1"]
        with pytest.raises(ClientError) as e:
            client.put_provisioned_concurrency_config(FunctionName="prov", Qualifier="$LATEST", ProvisionedConcurrentExecutions=1)
        assert code(e) == "InvalidParameterValueException"
        with pytest.raises(ClientError) as e:
            client.put_provisioned_concurrency_config(FunctionName="prov", Qualifier="1", ProvisionedConcurrentExecutions=1000)
        assert code(e) == "InvalidParameterValueException"
        client.delete_provisioned_concurrency_config(FunctionName="prov", Qualifier="1")
        time.sleep(3)
        assert idle_instances(node, "prov") == 0, "without provisioning the keep-alive takes them"
        with pytest.raises(ClientError) as e:
            client.get_provisioned_concurrency_config(FunctionName="prov", Qualifier="1")
        assert code(e) in ("ProvisionedConcurrencyConfigNotFoundException", "ResourceNotFoundException")
    finally:
        assert node.stop() == 0
        assert node.leftover_sandboxes() == []


def test_an_alias_of_latest_follows_it(client):
    create(client, "latestalias", zip_bytes({"handler.py": CODE % "x"}))
    client.publish_version(FunctionName="latestalias")
    a = client.create_alias(FunctionName="latestalias", Name="dev", FunctionVersion="$LATEST")
    assert a["FunctionVersion"] == "$LATEST"
    assert call(client, "latestalias", "dev") == ("$LATEST", {"mark": None, "memory": "128", "code": "x"})
    client.update_function_code(FunctionName="latestalias", ZipFile=zip_bytes({"handler.py": CODE % "y"}))
    wait_updated(client, "latestalias")
    assert call(client, "latestalias", "dev")[1]["code"] == "y", "the alias follows $LATEST"
    assert [x["Name"] for x in client.list_aliases(FunctionName="latestalias", FunctionVersion="$LATEST")["Aliases"]] == ["dev"]
    with pytest.raises(ClientError) as e:
        client.update_alias(FunctionName="latestalias", Name="dev", RoutingConfig={"AdditionalVersionWeights": {"1": 0.5}})
    assert code(e) == "InvalidParameterValueException"
    with pytest.raises(ClientError) as e:
        client.put_provisioned_concurrency_config(FunctionName="latestalias", Qualifier="dev", ProvisionedConcurrentExecutions=1)
    assert code(e) == "InvalidParameterValueException"
    client.delete_function(FunctionName="latestalias")


FLAKY_V1 = """
def handler(event, context):
    raise RuntimeError("version 1 always fails")
"""


def test_async_invocations_run_the_version_they_name(tmp_path):
    """An Event invocation with a Qualifier runs that version (v1 fails, $LATEST succeeds):
    the qualified event is retried and dropped, the unqualified one is done."""
    node = NodeProcess(tmp_path / "node")
    try:
        client = node.client()
        create(client, "asyncv", zip_bytes({"handler.py": FLAKY_V1}))
        assert client.publish_version(FunctionName="asyncv")["Version"] == "1"
        client.update_function_code(FunctionName="asyncv", ZipFile=zip_bytes({"handler.py": CODE % "b"}))
        wait_updated(client, "asyncv")
        client.create_alias(FunctionName="asyncv", Name="old", FunctionVersion="1")

        def counters():
            return node.function_status("asyncv")["counters"]

        def wait(cond, what):
            deadline = time.time() + 20
            while not cond(counters()):
                assert time.time() < deadline, f"{what}: {counters()}"
                time.sleep(0.05)

        assert client.invoke(FunctionName="asyncv", InvocationType="Event", Payload=b"{}")["StatusCode"] == 202
        wait(lambda c: c["events_done"] == 1, "the $LATEST event was not done")
        assert counters()["events_dropped"] == 0
        for qualifier in ("1", "old"):
            resp = client.invoke(FunctionName="asyncv", InvocationType="Event", Qualifier=qualifier, Payload=b"{}")
            assert resp["StatusCode"] == 202
        wait(lambda c: c["events_dropped"] == 2, "the version-1 events were not retried and dropped")
        assert counters()["events_done"] == 1, "nothing of version 1 ran as $LATEST"
        assert node.status()["events"]["pending"] == 0
    finally:
        node.stop()


def test_snap_start_apply_on_is_recorded_and_reported(client):
    create(client, "snapstart", zip_bytes({"handler.py": CODE % "s"}), SnapStart={"ApplyOn": "PublishedVersions"})
    cfg = client.get_function_configuration(FunctionName="snapstart")
    assert cfg["SnapStart"] == {"ApplyOn": "PublishedVersions", "OptimizationStatus": "Off"}, "as Lambda reports $LATEST"
    v = client.publish_version(FunctionName="snapstart")
    assert v["SnapStart"] == {"ApplyOn": "PublishedVersions", "OptimizationStatus": "On"}
    with pytest.raises(ClientError) as e:
        client.update_function_configuration(FunctionName="snapstart", SnapStart={"ApplyOn": "Always"})
    assert code(e) == "InvalidParameterValueException"
    assert client.get_function_configuration(FunctionName="snapstart")["SnapStart"]["ApplyOn"] == "PublishedVersions"
    client.update_function_configuration(FunctionName="snapstart", SnapStart={"ApplyOn": "None"})
    assert client.get_function_configuration(FunctionName="snapstart")["SnapStart"]["ApplyOn"] == "None"
    client.delete_function(FunctionName="snapstart")
