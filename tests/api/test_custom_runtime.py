"""Issue #16: custom runtimes (provided.al2023). A Go function built with aws-lambda-go
and a Rust one built with the lambda_runtime crate (samples/provided, built by
scripts/build-provided.sh) run unchanged through the Runtime API; a hand-written
bootstrap checks the API's edges (wrong request id, init/error). Such functions are
served by cold boots, and GetFunction says so (SnapStart Off)."""

import json
import subprocess
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, WaiterError

from thaw_node_harness import NodeProcess, create, invoke_json, zip_bytes

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "build" / "samples" / "provided"

HANDMADE = """#!/usr/bin/python3
# A custom runtime written by hand against the Runtime API.
import json, os, urllib.error, urllib.request

api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"

def post(path, body, headers=None):
    req = urllib.request.Request(api + path, data=body, method="POST", headers=headers or {})
    try:
        return urllib.request.urlopen(req).status
    except urllib.error.HTTPError as e:
        return e.code

if os.environ.get("FAIL_INIT"):
    post("/init/error", json.dumps({"errorType": "Custom.InitFailed", "errorMessage": "no configuration"}).encode())
    raise SystemExit(1)
while True:
    r = urllib.request.urlopen(api + "/invocation/next")
    rid = r.headers["Lambda-Runtime-Aws-Request-Id"]
    event = json.loads(r.read())
    wrong = post("/invocation/not-" + rid + "/response", b"{}")
    if event.get("error"):
        post("/invocation/" + rid + "/error", json.dumps({"errorMessage": "handmade failure"}).encode(),
             {"Lambda-Runtime-Function-Error-Type": "Handmade.Error"})
        continue
    post("/invocation/" + rid + "/response", json.dumps({
        "event": event, "wrong_id_status": wrong, "deadline_ms": int(r.headers["Lambda-Runtime-Deadline-Ms"]),
        "arn": r.headers["Lambda-Runtime-Invoked-Function-Arn"],
        "version": os.environ.get("AWS_LAMBDA_FUNCTION_VERSION"), "mark": os.environ.get("MARK")}).encode())
"""


@pytest.fixture(scope="module")
def built():
    # Idempotent: a sample whose sources did not change is not rebuilt.
    subprocess.run(["bash", str(ROOT / "scripts" / "build-provided.sh")], check=True, timeout=900)
    return {n: BUILT / n / "bootstrap" for n in ("go-hello", "rust-hello")}


def deploy(client, name, bootstrap, **kw):
    return create(client, name, zip_bytes({"bootstrap": bootstrap}), handler="bootstrap", Runtime="provided.al2023", **kw)


@pytest.mark.parametrize("sample,lang,error_type", [("go-hello", "go", "errorString"), ("rust-hello", "rust", None)])
def test_official_runtime_libraries_run_unchanged(node, client, built, sample, lang, error_type):
    name = f"custom-{lang}"
    deploy(client, name, built[sample])
    resp, out = invoke_json(client, name, {"name": "thaw"})
    assert "FunctionError" not in resp, out
    assert out["request_id"] == resp["ResponseMetadata"]["RequestId"]
    assert out["function_arn"].endswith(f":function:{name}")
    assert (out["hello"], out["runtime"], out["function"], out["handler"], out["has_deadline"]) == \
        ("thaw", lang, name, "bootstrap", True)

    # The handler's error, in Lambda's shape.
    resp, out = invoke_json(client, name, {"fail": True})
    assert resp["FunctionError"] == "Unhandled" and out["errorMessage"] == "asked to fail", out
    if error_type:
        assert out["errorType"] == error_type

    # The bootstrap exiting mid-call: Runtime.ExitError, and the next call gets a new instance.
    resp, out = invoke_json(client, name, {"exit": True})
    assert resp["FunctionError"] == "Unhandled" and out["errorType"] == "Runtime.ExitError", out
    assert invoke_json(client, name, {"name": "again"})[1]["hello"] == "again"

    # Served by cold boots, and said so.
    cfg = client.get_function(FunctionName=name)["Configuration"]
    assert (cfg["Runtime"], cfg["State"], cfg["SnapStart"]["OptimizationStatus"]) == ("provided.al2023", "Active", "Off")
    status = node.function_status(name)
    assert status["cold_start"] == "boot" and status["snapshot"] is None, status
    bridges = [p.read_bytes()[:4] for p in node.data_dir.glob("runtimes-*/provided/bridge")]
    assert bridges == [b"\x7fELF"], "the native bridge (thaw-runtime-bridge beside thaw) serves"
    client.delete_function(FunctionName=name)


def check_api_edges(client):
    create(client, "handmade", zip_bytes({"bootstrap": HANDMADE}), handler="whatever", Runtime="provided.al2023")
    resp, out = invoke_json(client, "handmade", {"k": [1, 2]})
    assert out["event"] == {"k": [1, 2]}
    assert out["wrong_id_status"] == 400, "a response for another request id is refused"
    assert out["deadline_ms"] > 0 and out["arn"].endswith(":function:handmade")
    resp, out = invoke_json(client, "handmade", {"error": True})
    assert resp["FunctionError"] == "Unhandled"
    assert (out["errorType"], out["errorMessage"]) == ("Handmade.Error", "handmade failure"), out
    client.delete_function(FunctionName="handmade")


def test_runtime_api_edges_with_a_handmade_bootstrap(client):
    check_api_edges(client)


def test_a_custom_runtime_is_told_its_version(client):
    """Issue #27: a custom runtime's bootstrap reads its version from its environment,
    fixed when it starts, so its warm instances serve one version each (a $LATEST
    instance never answers for version 2 although both share a revision)."""
    deploy(client, "handver", HANDMADE, Environment={"Variables": {"MARK": "one"}})
    client.publish_version(FunctionName="handver")
    client.update_function_configuration(FunctionName="handver", Environment={"Variables": {"MARK": "two"}})
    client.get_waiter("function_updated_v2").wait(FunctionName="handver", WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    client.publish_version(FunctionName="handver")
    client.create_alias(FunctionName="handver", Name="live", FunctionVersion="1")
    for qualifier, version, mark in [(None, "$LATEST", "two"), ("2", "2", "two"), ("live", "1", "one"), (None, "$LATEST", "two"), ("2", "2", "two")]:
        resp, out = invoke_json(client, "handver", **({"Qualifier": qualifier} if qualifier else {}))
        assert resp["ExecutedVersion"] == version
        assert (out["version"], out["mark"]) == (version, mark), (qualifier, out)
        assert out["arn"].endswith(":function:handver" + (f":{qualifier}" if qualifier else "")), (qualifier, out["arn"])
    client.delete_function(FunctionName="handver")


def test_the_python_bridge_serves_the_same(tmp_path, built):
    """THAW_RUNTIME_BRIDGE=python (and a node without the native bridge beside it) installs
    runtimes/provided/bridge.py: same contract."""
    node = NodeProcess(tmp_path / "node", env={"THAW_RUNTIME_BRIDGE": "python"})
    try:
        client = node.client()
        check_api_edges(client)
        deploy(client, "py-bridge-go", built["go-hello"])
        resp, out = invoke_json(client, "py-bridge-go", {"name": "bridge"})
        assert (out["hello"], out["request_id"]) == ("bridge", resp["ResponseMetadata"]["RequestId"])
        resp, out = invoke_json(client, "py-bridge-go", {"exit": True})
        assert out["errorType"] == "Runtime.ExitError", out
        assert invoke_json(client, "py-bridge-go", {"name": "again"})[1]["hello"] == "again"
        bridge = next((node.data_dir).glob("runtimes-*/provided/bridge")).read_text()
        assert "bridge.py" in bridge, "the Python bridge was installed"
    finally:
        assert node.stop() == 0, node.log_path.read_text()


def test_failed_inits_fail_the_deploy_with_lambdas_reasons(client):
    cases = [
        ({"bootstrap": HANDMADE}, {"FAIL_INIT": "1"}, "Custom.InitFailed: no configuration"),
        ({"main.go": "package main"}, {}, "Runtime.InvalidEntrypoint"),
        ({"bootstrap": "#!/bin/sh\nexit 4\n"}, {}, "Runtime.ExitError: Runtime exited with error: exit status 4"),
    ]
    for i, (files, env, reason) in enumerate(cases):
        name = f"bad-custom-{i}"
        create(client, name, zip_bytes(files), handler="bootstrap", Runtime="provided.al2023",
               Environment={"Variables": env}, wait=False)
        with pytest.raises(WaiterError):
            client.get_waiter("function_active_v2").wait(FunctionName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        cfg = client.get_function_configuration(FunctionName=name)
        assert cfg["State"] == "Failed" and reason in cfg["StateReason"], cfg
        with pytest.raises(ClientError):
            client.invoke(FunctionName=name, Payload=json.dumps({}))
        client.delete_function(FunctionName=name)
