"""The Lambda-compatible API of `thaw serve`, driven by boto3 like a real client."""

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from botocore.exceptions import ClientError, WaiterError

from thaw_node_harness import SAMPLES, THAW, NodeProcess, create, invoke_json, sample_zip, zip_bytes

ECHO = '''
import os, time

def handler(event, context):
    print("echo called", context.aws_request_id)
    if event.get("sleep"):
        time.sleep(event["sleep"])
    return {"event": event, "request_id": context.aws_request_id, "function": context.function_name,
            "memory": context.memory_limit_in_mb, "greeting": os.environ.get("GREETING"),
            "arn": context.invoked_function_arn, "region": os.environ.get("AWS_REGION")}
'''

HOG = '''
def handler(event, context):
    data = b"\\x01" * (event["mb"] * 1024 * 1024)
    return {"allocated_mb": len(data) >> 20}
'''


def error_code(exc):
    return exc.value.response["Error"]["Code"]


def configuration_after_failed_wait(client, name, waiter="function_active_v2"):
    """Wait until `waiter` gives up on `name` (its deployment failed); then its configuration."""
    with pytest.raises(WaiterError):
        client.get_waiter(waiter).wait(FunctionName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    return client.get_function(FunctionName=name)["Configuration"]


def status_code(exc):
    return exc.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_create_reports_pending_then_active(node, client):
    resp = create(client, "lifecycle", sample_zip("helloworld"), wait=False, MemorySize=256, Timeout=5)
    assert resp["State"] == "Pending"
    assert resp["LastUpdateStatus"] == "InProgress"
    assert resp["FunctionArn"] == "arn:aws:lambda:us-east-1:000000000000:function:lifecycle"
    assert resp["Runtime"] == "python3.12" and resp["Handler"] == "handler.handler"
    assert resp["MemorySize"] == 256 and resp["Timeout"] == 5 and resp["Version"] == "$LATEST"
    assert len(base64.b64decode(resp["CodeSha256"])) == 32 and resp["CodeSize"] > 0
    client.get_waiter("function_active_v2").wait(FunctionName="lifecycle", WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    cfg = client.get_function(FunctionName="lifecycle")["Configuration"]
    assert (cfg["State"], cfg["LastUpdateStatus"]) == ("Active", "Successful")
    assert client.get_function_configuration(FunctionName="lifecycle")["State"] == "Active"
    client.delete_function(FunctionName="lifecycle")


def test_invoke_sync(client, hello):
    resp, body = invoke_json(client, hello, {"name": "thaw"})
    assert resp["StatusCode"] == 200
    assert body == {"message": "hello, thaw"}
    assert "FunctionError" not in resp
    assert resp["ExecutedVersion"] == "$LATEST"
    # by ARN too
    _, body = invoke_json(client, "arn:aws:lambda:us-east-1:000000000000:function:hello", {"name": "arn"})
    assert body == {"message": "hello, arn"}


def test_request_id_env_and_log_tail(client):
    create(client, "echo", zip_bytes({"handler.py": ECHO}), Environment={"Variables": {"GREETING": "hi"}}, MemorySize=192)
    resp, body = invoke_json(client, "echo", {"x": 1}, LogType="Tail")
    rid = resp["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
    assert body["request_id"] == rid
    assert body["event"] == {"x": 1}
    assert (body["function"], body["memory"], body["greeting"]) == ("echo", "192", "hi")
    cfg = client.get_function(FunctionName="echo")["Configuration"]
    assert body["arn"] == cfg["FunctionArn"], (body, cfg["FunctionArn"])
    assert body["region"] == cfg["FunctionArn"].split(":")[3]
    log = base64.b64decode(resp["LogResult"]).decode()
    assert f"START RequestId: {rid}" in log
    assert f"echo called {rid}" in log
    assert f"REPORT RequestId: {rid}" in log
    assert len(base64.b64decode(resp["LogResult"])) <= 4096
    cfg = client.get_function(FunctionName="echo")["Configuration"]
    assert cfg["Environment"]["Variables"] == {"GREETING": "hi"}


def test_invoke_dry_run_and_event(node, client, hello):
    assert client.invoke(FunctionName=hello, InvocationType="DryRun")["StatusCode"] == 204
    before = node.function_status(hello)["counters"]["events_done"]
    resp = client.invoke(FunctionName=hello, InvocationType="Event", Payload=b'{"name": "async"}')
    assert resp["StatusCode"] == 202
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
    deadline = time.time() + 10
    while node.function_status(hello)["counters"]["events_done"] == before:
        assert time.time() < deadline, "the event was not processed"
        time.sleep(0.05)
    assert node.status()["events"]["pending"] == 0


def test_event_retried_when_function_fails(node, client):
    create(client, "failing", sample_zip("error"))
    client.invoke(FunctionName="failing", InvocationType="Event", Payload=b'{"fail": "SECRET-4711-async"}')
    # Queued (and between its attempts) the payload is sealed with the node key: no file of
    # the node's registry (the database, its WAL) holds it in clear.
    registry = [p for p in node.data_dir.rglob("*") if p.is_file() and ".sqlite" in p.name]
    assert registry, sorted(p.name for p in node.data_dir.iterdir())
    for p in registry:
        assert b"SECRET-4711" not in p.read_bytes(), f"{p} holds the event's payload in clear"
    deadline = time.time() + 15
    while node.function_status("failing")["counters"]["events_dropped"] == 0:
        assert time.time() < deadline, "the event was not retried and dropped"
        time.sleep(0.1)
    counters = node.function_status("failing")["counters"]
    assert counters["invocations"] == 3, counters  # 1 attempt + 2 retries
    assert node.status()["events"]["pending"] == 0


def test_function_error_is_unhandled(client):
    create(client, "raiser", sample_zip("error"))
    resp, body = invoke_json(client, "raiser", {"fail": "boom"})
    assert resp["StatusCode"] == 200
    assert resp["FunctionError"] == "Unhandled"
    assert body["errorType"] == "ValueError"
    assert body["errorMessage"] == "bad input: 'boom'"
    assert any("handler.py" in line for line in body["stackTrace"])
    # the instance survives a handled error
    _, body = invoke_json(client, "raiser", {})
    assert body == {"ok": True}


def test_update_code_changes_behaviour(node, client):
    create(client, "updatable", sample_zip("helloworld"))
    _, body = invoke_json(client, "updatable", {"name": "v1"})
    assert body == {"message": "hello, v1"}
    old_sha = client.get_function(FunctionName="updatable")["Configuration"]["CodeSha256"]
    v2 = zip_bytes({"handler.py": "def handler(event, context):\n    return {'version': 2, 'name': event.get('name')}\n"})
    resp = client.update_function_code(FunctionName="updatable", ZipFile=v2)
    assert resp["LastUpdateStatus"] == "InProgress"
    assert resp["CodeSha256"] != old_sha
    client.get_waiter("function_updated_v2").wait(FunctionName="updatable", WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    _, body = invoke_json(client, "updatable", {"name": "v2"})
    assert body == {"version": 2, "name": "v2"}
    assert client.get_function(FunctionName="updatable")["Configuration"]["State"] == "Active"


def test_update_with_failing_init_keeps_old_code(client):
    create(client, "keepold", sample_zip("helloworld"))
    client.update_function_code(FunctionName="keepold", ZipFile=sample_zip("initerror"))
    cfg = configuration_after_failed_wait(client, "keepold", "function_updated_v2")
    assert cfg["LastUpdateStatus"] == "Failed"
    assert cfg["LastUpdateStatusReason"] == "RuntimeError: initerror: failing at import on purpose"
    assert cfg["State"] == "Active"
    _, body = invoke_json(client, "keepold", {"name": "still"})
    assert body == {"message": "hello, still"}


def test_list_and_delete(client):
    create(client, "tobedeleted", sample_zip("helloworld"))
    names = [f["FunctionName"] for f in client.list_functions()["Functions"]]
    assert "tobedeleted" in names
    paged = client.get_paginator("list_functions").paginate(PaginationConfig={"PageSize": 1})
    assert "tobedeleted" in [f["FunctionName"] for page in paged for f in page["Functions"]]
    invoke_json(client, "tobedeleted", {})
    client.delete_function(FunctionName="tobedeleted")
    assert "tobedeleted" not in [f["FunctionName"] for f in client.list_functions()["Functions"]]
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.get_function(FunctionName="tobedeleted")


def test_missing_function(client):
    with pytest.raises(client.exceptions.ResourceNotFoundException) as e:
        client.invoke(FunctionName="does-not-exist", Payload=b"{}")
    assert status_code(e) == 404
    assert e.value.response["Error"]["Message"] == \
        "Function not found: arn:aws:lambda:us-east-1:000000000000:function:does-not-exist"
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.get_function(FunctionName="does-not-exist")
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.delete_function(FunctionName="does-not-exist")


def test_create_validation_errors(client):
    with pytest.raises(client.exceptions.InvalidParameterValueException) as e:
        create(client, "badzip", b"this is not a zip file", wait=False)
    assert status_code(e) == 400
    assert "Could not unzip uploaded file" in e.value.response["Error"]["Message"]
    with pytest.raises(client.exceptions.InvalidParameterValueException) as e:
        create(client, "badruntime", sample_zip("helloworld"), wait=False, Runtime="ruby3.3")
    assert "ruby3.3" in e.value.response["Error"]["Message"]
    with pytest.raises(client.exceptions.InvalidParameterValueException):
        create(client, "badhandler", sample_zip("helloworld"), wait=False, Handler="nodot")
    with pytest.raises(client.exceptions.ResourceConflictException) as e:
        create(client, "dup", sample_zip("helloworld"))
        create(client, "dup", sample_zip("helloworld"), wait=False)
    assert status_code(e) == 409
    assert [f for f in client.list_functions()["Functions"] if f["FunctionName"] in ("badzip", "badruntime")] == []


def test_nodejs_and_java_functions(node, client):
    """Node.js and Java bundles deploy, snapshot and answer like Python ones, cold and restored."""
    samples = SAMPLES.parent
    node_zip = zip_bytes({"index.js": samples / "nodejs" / "helloworld" / "index.js"})
    java_zip = zip_bytes({"example/Hello.class": samples / "java" / "helloworld" / "example" / "Hello.class"})
    resp = create(client, "node-hello", node_zip, handler="index.handler", Runtime="nodejs20.x")
    assert resp["Runtime"] == "nodejs20.x"
    create(client, "java-hello", java_zip, handler="example.Hello", Runtime="java17", MemorySize=256)
    assert client.get_function(FunctionName="java-hello")["Configuration"]["Runtime"] == "java17"
    for _ in range(2):
        resp, body = invoke_json(client, "node-hello", {"name": "node"}, LogType="Tail")
        assert body["message"] == "Hello, node!", body
        assert body["requestId"] == resp["ResponseMetadata"]["RequestId"]
        assert "hello node" in base64.b64decode(resp["LogResult"]).decode()
        _, body = invoke_json(client, "java-hello", {"name": "java"})
        assert body == "Hello, java!"
    # A handler that does not exist in the bundle fails the deployment with the runtime's error.
    create(client, "java-nohandler", java_zip, handler="example.Missing", Runtime="java17", wait=False)
    cfg = configuration_after_failed_wait(client, "java-nohandler")
    assert cfg["State"] == "Failed" and "example.Missing" in cfg["StateReason"], cfg
    for name in ("node-hello", "java-hello", "java-nohandler"):
        client.delete_function(FunctionName=name)


def test_init_error_fails_the_function(client):
    create(client, "initfail", sample_zip("initerror"), wait=False)
    cfg = configuration_after_failed_wait(client, "initfail")
    assert cfg["State"] == "Failed"
    assert cfg["StateReason"] == "RuntimeError: initerror: failing at import on purpose"
    assert cfg["StateReasonCode"] == "FunctionError"
    with pytest.raises(client.exceptions.ResourceConflictException):
        client.invoke(FunctionName="initfail", Payload=b"{}")


def test_missing_handler_module_and_function(client):
    create(client, "nomodule", sample_zip("helloworld"), wait=False, Handler="missing.handler")
    create(client, "nofunc", sample_zip("helloworld"), wait=False, Handler="handler.nothere")
    for name, expected in [("nomodule", "Runtime.ImportModuleError: Unable to import module 'missing'"),
                           ("nofunc", "Runtime.HandlerNotFound: Handler 'nothere' missing on module 'handler'")]:
        cfg = configuration_after_failed_wait(client, name)
        assert cfg["State"] == "Failed"
        assert cfg["StateReason"].startswith(expected), cfg["StateReason"]


def test_timeout_kills_and_next_call_recovers(node, client):
    create(client, "sleepy", zip_bytes({"handler.py": ECHO}), Timeout=1)
    t = time.time()
    resp, body = invoke_json(client, "sleepy", {"sleep": 5})
    assert 0.9 < time.time() - t < 3
    assert resp["FunctionError"] == "Unhandled"
    assert body["errorType"] == "Sandbox.Timedout"
    assert body["errorMessage"].endswith("Task timed out after 1.00 seconds")
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"] in body["errorMessage"]
    resp, body = invoke_json(client, "sleepy", {"n": 1})
    assert "FunctionError" not in resp and body["event"] == {"n": 1}
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-thaw-start"].startswith("restore")


def test_memory_limit_kills_and_next_call_recovers(client):
    create(client, "hog", zip_bytes({"handler.py": HOG}), MemorySize=128, Timeout=10)
    resp, body = invoke_json(client, "hog", {"mb": 300})
    assert resp["FunctionError"] == "Unhandled"
    assert body["errorType"] == "Runtime.OutOfMemory", body
    assert "memory limit of 128 MB" in body["errorMessage"]
    resp, body = invoke_json(client, "hog", {"mb": 10})
    assert body == {"allocated_mb": 10}


def test_payload_limits(client, hello):
    with pytest.raises(ClientError) as e:
        client.invoke(FunctionName=hello, Payload=b'"' + b"x" * (6 * 1024 * 1024) + b'"')
    assert (status_code(e), error_code(e)) == (413, "RequestEntityTooLargeException")
    with pytest.raises(client.exceptions.InvalidRequestContentException):
        client.invoke(FunctionName=hello, Payload=b"{not json")


def test_bad_signature_is_rejected(node):
    bad = node.client(secret="wrong-secret")
    with pytest.raises(ClientError) as e:
        bad.list_functions()
    assert (status_code(e), error_code(e)) == (403, "InvalidSignatureException")
    unknown = node.client(key="AKIDUNKNOWN")
    with pytest.raises(ClientError) as e:
        unknown.list_functions()
    assert (status_code(e), error_code(e)) == (403, "UnrecognizedClientException")
    req = urllib.request.Request(node.endpoint + "/2015-03-31/functions/", method="GET")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403
    assert e.value.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"


def test_metrics_and_status(node, client, hello):
    invoke_json(client, hello, {})
    m = node.metrics()
    for name in ["thaw_invocations_total", "thaw_starts_total", "thaw_start_seconds_bucket", "thaw_invoke_seconds_bucket",
                 "thaw_instances_alive", "thaw_snapshot_bytes"]:
        assert name in m
    assert 'thaw_starts_total{kind="warm"}' in m
    assert 'thaw_starts_total{kind="restore-lazy"}' in m
    st = node.function_status(hello)
    assert st["state"] == "Active" and st["snapshot"]["bytes"] > 0
    out = subprocess.run(
        [str(THAW), "status", "--endpoint", f"127.0.0.1:{node.port}"],
        capture_output=True, text=True, check=True).stdout
    assert "hello" in out and "FUNCTION" in out


def test_generated_keys_graceful_drain_and_restart(tmp_path):
    """A node without keys generates them; SIGTERM drains an in-flight call; state survives a
    restart; a snapshot that cannot be restored falls back to a cold boot."""
    n = NodeProcess(tmp_path, keys=False)
    try:
        first = n.proc.stdout.readline().decode()
        assert "Generated an access key" in first
        key = n.proc.stdout.readline().decode().strip().split("=", 1)[1]
        secret = n.proc.stdout.readline().decode().strip().split("=", 1)[1]
        cred = tmp_path / "node" / "credentials"
        assert stat.S_IMODE(os.stat(cred).st_mode) == 0o600
        c = n.client(key=key, secret=secret)
        create(c, "drain", zip_bytes({"handler.py": ECHO}), Timeout=10)
        create(c, "fallback", sample_zip("helloworld"))
        broken_snapshot = n.function_status("fallback")["snapshot"]["dir"]
        result = {}
        t = threading.Thread(target=lambda: result.update(invoke_json(c, "drain", {"sleep": 1.5})[1]))
        t.start()
        time.sleep(0.5)
        n.proc.send_signal(signal.SIGTERM)
        t.join(10)
        assert result.get("event") == {"sleep": 1.5}
    finally:
        code = n.stop()
    assert code == 0
    assert n.leftover_sandboxes() == []
    shutil.rmtree(broken_snapshot)  # its restores must fall back to a cold boot

    n2 = NodeProcess(tmp_path, keys=False)
    try:
        c = n2.client(key=key, secret=secret)
        assert c.get_function(FunctionName="drain")["Configuration"]["State"] == "Active"
        _, body = invoke_json(c, "drain", {"after": "restart"})
        assert body["event"] == {"after": "restart"}
        resp, body = invoke_json(c, "fallback", {"name": "boot"})
        assert body == {"message": "hello, boot"}
        assert resp["ResponseMetadata"]["HTTPHeaders"]["x-thaw-start"] == "boot"
        assert "thaw_restore_fallbacks_total 1" in n2.metrics()
    finally:
        assert n2.stop() == 0
    assert n2.proc.stdout.read() == b""  # the stored key is reused, nothing printed
    assert n2.leftover_sandboxes() == []


def test_concurrency_limit_throttles(client):
    """Beyond the per-function limit (8) callers get TooManyRequestsException at once, nothing queues."""
    create(client, "throttled", zip_bytes({"handler.py": ECHO}), Timeout=10)
    results = []
    lock = threading.Lock()
    barrier = threading.Barrier(10)

    def call():
        barrier.wait()
        try:
            invoke_json(client, "throttled", {"sleep": 1.0})
            out = "ok"
        except client.exceptions.TooManyRequestsException as e:
            out = (e.response["ResponseMetadata"]["HTTPStatusCode"], e.response.get("Reason"))
        with lock:
            results.append(out)

    threads = [threading.Thread(target=call) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results.count("ok") == 8, results
    assert results.count((429, "ReservedFunctionConcurrentInvocationLimitExceeded")) == 2, results


def test_operations_not_implemented_are_named(client, hello):
    """An operation the node does not implement answers Lambda's error shape naming it."""
    calls = [
        ("AddPermission", lambda: client.add_permission(FunctionName=hello, StatementId="s", Action="lambda:InvokeFunction",
                                                        Principal="s3.amazonaws.com")),
        ("GetPolicy", lambda: client.get_policy(FunctionName=hello)),
        ("ListEventSourceMappings", lambda: client.list_event_source_mappings()),
        ("PutFunctionEventInvokeConfig", lambda: client.put_function_event_invoke_config(FunctionName=hello, MaximumRetryAttempts=0)),
        ("InvokeWithResponseStream", lambda: client.invoke_with_response_stream(FunctionName=hello, Payload=b"{}")),
    ]
    for op, call in calls:
        with pytest.raises(ClientError) as e:
            call()
        err = e.value.response
        assert err["Error"]["Code"] == "UnknownOperationException", err
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 501
        assert err["Error"]["Message"].startswith(f"{op} is not implemented by this Thaw node"), err
