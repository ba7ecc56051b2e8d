"""Issue #27: a published version knows which version it is. Versions share snapshots
(and warm instances) with $LATEST, so the version and the invoked ARN travel with each
call: `context.function_version` / `functionVersion` / `getFunctionVersion()`, the
runtime's AWS_LAMBDA_FUNCTION_VERSION, and the invoked ARN with the qualifier the
caller used. Python, Node.js and Java, through boto3 and the AWS CLI; then weighted
alias routing, an asynchronous event through an alias and provisioned concurrency."""

import json
import re
import time

import pytest

from thaw_node_harness import NodeProcess, cli_json, compile_java, create, invoke_json, wait_updated, zip_bytes

PYTHON = """
import os

def handler(event, context):
    got = {"version": context.function_version, "env": os.environ.get("AWS_LAMBDA_FUNCTION_VERSION"),
           "arn": context.invoked_function_arn, "mark": os.environ.get("MARK"),
           "stream": context.log_stream_name, "env_stream": os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME")}
    want = event.get("expect")
    if want and (want["version"] != got["version"] or want["version"] != got["env"] or not got["arn"].endswith(want["arn_tail"])):
        raise RuntimeError("not the expected version: %r" % (got,))
    return got
"""

NODE = """
exports.handler = async (event, context) => ({
  version: context.functionVersion,
  env: process.env.AWS_LAMBDA_FUNCTION_VERSION,
  arn: context.invokedFunctionArn,
  mark: process.env.MARK || null,
  stream: context.logStreamName,
  env_stream: process.env.AWS_LAMBDA_LOG_STREAM_NAME,
});
"""

JAVA = """
package example;

import com.amazonaws.services.lambda.runtime.Context;
import java.util.HashMap;
import java.util.Map;

public class Ident {
    public Map<String, Object> handle(Map<String, Object> event, Context ctx) {
        Map<String, Object> m = new HashMap<>();
        m.put("version", ctx.getFunctionVersion());
        m.put("env", System.getenv("AWS_LAMBDA_FUNCTION_VERSION"));
        m.put("arn", ctx.getInvokedFunctionArn());
        m.put("mark", System.getenv("MARK"));
        m.put("stream", ctx.getLogStreamName());
        m.put("env_stream", System.getenv("AWS_LAMBDA_LOG_STREAM_NAME"));
        return m;
    }
}
"""

def java_bundle(tmp_path):
    return zip_bytes({"example/Ident.class": compile_java(tmp_path, "example.Ident", JAVA)})


def bundle(runtime, tmp_path):
    """(zip, handler, Lambda runtime name) of the identity function of `runtime`."""
    if runtime == "python":
        return zip_bytes({"handler.py": PYTHON}), "handler.handler", "python3.12"
    if runtime == "nodejs":
        return zip_bytes({"index.js": NODE}), "index.handler", "nodejs20.x"
    return java_bundle(tmp_path), "example.Ident::handle", "java17"


def expected(name, qualifier, version, mark):
    return {"version": version, "env": version, "mark": mark, "arn_tail": f":function:{name}" + (f":{qualifier}" if qualifier else "")}


def check(got, want, how):
    # Lambda's log stream: YYYY/MM/DD/[VERSION] and the environment's 32 hex digits.
    stream = re.fullmatch(r"\d{4}/\d{2}/\d{2}/\[(.+)\]([0-9a-f]{32})", got["stream"] or "")
    assert stream and stream.group(1) == want["version"] and got["env_stream"] == got["stream"], f"{how}: log stream {got}"
    tail = want["arn_tail"]
    assert got["arn"].endswith(tail) and got["arn"].count(":") == tail.count(":") + 4, f"{how}: invoked ARN {got['arn']!r}, want …{tail}"
    assert {k: got[k] for k in ("version", "env", "mark")} == {k: want[k] for k in ("version", "env", "mark")}, f"{how}: {got}"


@pytest.mark.parametrize("runtime", ["python", "nodejs", "java"])
def test_versions_report_themselves_through_boto3(client, runtime, tmp_path):
    name = f"ident-{runtime}"
    code, handler, rt = bundle(runtime, tmp_path)
    create(client, name, code, handler=handler, Runtime=rt, Environment={"Variables": {"MARK": "one"}})
    assert client.publish_version(FunctionName=name)["Version"] == "1"
    client.update_function_configuration(FunctionName=name, Environment={"Variables": {"MARK": "two"}})
    wait_updated(client, name)
    assert client.publish_version(FunctionName=name)["Version"] == "2"
    client.create_alias(FunctionName=name, Name="live", FunctionVersion="1")

    def call(qualifier=None):
        resp, body = invoke_json(client, name, **({"Qualifier": qualifier} if qualifier else {}))
        assert "FunctionError" not in resp, body
        return resp["ExecutedVersion"], body

    # $LATEST and version 2 share one revision (one snapshot, one warm instance), so the
    # order matters: each call must say its own version whatever served the one before.
    for qualifier, version, mark in [("live", "1", "one"), (None, "$LATEST", "two"), ("2", "2", "two"),
                                     (None, "$LATEST", "two"), ("$LATEST", "$LATEST", "two"), ("1", "1", "one")]:
        executed, got = call(qualifier)
        assert executed == version
        check(got, expected(name, qualifier, version, mark), f"{runtime} qualifier {qualifier}")
    client.delete_function(FunctionName=name)


@pytest.mark.parametrize("runtime", ["python", "nodejs", "java"])
def test_versions_report_themselves_through_the_aws_cli(aws, runtime, tmp_path):
    name = f"ident-cli-{runtime}"
    code, handler, rt = bundle(runtime, tmp_path)
    z = tmp_path / "fn.zip"
    z.write_bytes(code)
    aws("create-function", "--function-name", name, "--runtime", rt, "--handler", handler,
        "--role", "arn:aws:iam::000000000000:role/cli", "--zip-file", f"fileb://{z}", "--environment", "Variables={MARK=one}")
    aws("wait", "function-active-v2", "--function-name", name)
    assert cli_json(aws("publish-version", "--function-name", name))["Version"] == "1"
    aws("update-function-configuration", "--function-name", name, "--environment", "Variables={MARK=two}")
    aws("wait", "function-updated-v2", "--function-name", name)
    assert cli_json(aws("publish-version", "--function-name", name))["Version"] == "2"
    aws("create-alias", "--function-name", name, "--name", "live", "--function-version", "1")
    result = tmp_path / "out.json"
    for qualifier, version, mark in [("live", "1", "one"), (None, "$LATEST", "two"), ("2", "2", "two"), ("live", "1", "one")]:
        extra = ["--qualifier", qualifier] if qualifier else []
        inv = cli_json(aws("invoke", "--function-name", name, *extra, "--payload", "{}", str(result)))
        assert inv["StatusCode"] == 200 and inv["ExecutedVersion"] == version and "FunctionError" not in inv, inv
        check(json.loads(result.read_text()), expected(name, qualifier, version, mark), f"{runtime} CLI qualifier {qualifier}")
    aws("delete-function", "--function-name", name)


def test_routing_async_events_and_provisioned_instances_report_their_version(tmp_path):
    node = NodeProcess(tmp_path / "node", keep_alive="1")
    try:
        client = node.client()
        name = "ident-ways"
        create(client, name, zip_bytes({"handler.py": PYTHON}), Environment={"Variables": {"MARK": "one"}})
        client.publish_version(FunctionName=name)
        client.update_function_configuration(FunctionName=name, Environment={"Variables": {"MARK": "two"}})
        wait_updated(client, name)
        client.publish_version(FunctionName=name)

        # Weighted routing: whichever version the alias picks is the one the function reports.
        client.create_alias(FunctionName=name, Name="canary", FunctionVersion="1",
                            RoutingConfig={"AdditionalVersionWeights": {"2": 0.5}})
        seen = set()
        for _ in range(40):
            resp, got = invoke_json(client, name, Qualifier="canary")
            executed = resp["ExecutedVersion"]
            check(got, expected(name, "canary", executed, {"1": "one", "2": "two"}[executed]), "weighted alias")
            seen.add(executed)
        assert seen == {"1", "2"}, f"40 calls at 50/50 all went to {seen}"

        # An asynchronous event through an alias: the function fails unless it is told
        # version 1 and the alias's ARN, so a wrong identity shows as a dropped event.
        def counters():
            return node.function_status(name)["counters"]

        client.create_alias(FunctionName=name, Name="live", FunctionVersion="1")
        for qualifier, version in [("live", "1"), ("2", "2"), (None, "$LATEST")]:
            want = expected(name, qualifier, version, None)
            r = client.invoke(FunctionName=name, InvocationType="Event", Payload=json.dumps({"expect": want}),
                              **({"Qualifier": qualifier} if qualifier else {}))
            assert r["StatusCode"] == 202
        deadline = time.time() + 30
        while counters()["events_done"] + counters()["events_dropped"] < 3:
            assert time.time() < deadline, counters()
            time.sleep(0.05)
        assert (counters()["events_done"], counters()["events_dropped"]) == (3, 0), node.log_path.read_text()[-3000:]

        # Provisioned concurrency: instances started ahead for version 2 report "2".
        client.put_provisioned_concurrency_config(FunctionName=name, Qualifier="2", ProvisionedConcurrentExecutions=1)
        deadline = time.time() + 60
        while client.get_provisioned_concurrency_config(FunctionName=name, Qualifier="2")["Status"] != "READY":
            assert time.time() < deadline
            time.sleep(0.2)
        resp, got = invoke_json(client, name, Qualifier="2")
        assert resp["ResponseMetadata"]["HTTPHeaders"]["x-thaw-start"] == "warm"
        check(got, expected(name, "2", "2", "two"), "provisioned")
    finally:
        assert node.stop() == 0


def test_a_function_url_on_an_alias_runs_and_reports_its_version(client):
    """A function URL belongs to $LATEST or to an alias (Qualifier): the alias's URL
    runs the alias's version and the function sees that version and the alias's ARN.
    A version cannot have a URL, a missing alias neither; deleting the alias deletes
    its URL."""
    import urllib.error
    import urllib.request

    from botocore.exceptions import ClientError

    name = "ident-url"
    create(client, name, zip_bytes({"handler.py": PYTHON}), Environment={"Variables": {"MARK": "one"}})
    client.publish_version(FunctionName=name)
    client.update_function_configuration(FunctionName=name, Environment={"Variables": {"MARK": "two"}})
    wait_updated(client, name)
    client.create_alias(FunctionName=name, Name="live", FunctionVersion="1")
    live = client.create_function_url_config(FunctionName=name, Qualifier="live", AuthType="NONE")
    latest = client.create_function_url_config(FunctionName=name, AuthType="NONE")
    assert live["FunctionArn"].endswith(f":function:{name}:live") and live["FunctionUrl"] != latest["FunctionUrl"]
    assert client.get_function_url_config(FunctionName=name, Qualifier="live")["FunctionUrl"] == live["FunctionUrl"]
    listed = sorted(u["FunctionArn"].split(":function:")[1] for u in client.list_function_url_configs(FunctionName=name)["FunctionUrlConfigs"])
    assert listed == [name, f"{name}:live"]

    def get(url):
        with urllib.request.urlopen(url, timeout=60) as r:
            return json.loads(r.read())

    check(get(live["FunctionUrl"]), expected(name, "live", "1", "one"), "URL of alias live")
    check(get(latest["FunctionUrl"]), expected(name, None, "$LATEST", "two"), "URL of $LATEST")
    check(get(live["FunctionUrl"] + "again"), expected(name, "live", "1", "one"), "URL of alias live, after $LATEST")

    for qualifier, err in (("1", "InvalidParameterValueException"), ("nope", "ResourceNotFoundException")):
        with pytest.raises(ClientError) as e:
            client.create_function_url_config(FunctionName=name, Qualifier=qualifier, AuthType="NONE")
        assert e.value.response["Error"]["Code"] == err, qualifier
    with pytest.raises(ClientError) as e:
        client.create_function_url_config(FunctionName=name, Qualifier="live", AuthType="NONE")
    assert e.value.response["Error"]["Code"] == "ResourceConflictException"

    client.delete_alias(FunctionName=name, Name="live")
    with pytest.raises(ClientError) as e:
        client.get_function_url_config(FunctionName=name, Qualifier="live")
    assert e.value.response["Error"]["Code"] == "ResourceNotFoundException"
    with pytest.raises(urllib.error.HTTPError) as e:
        get(live["FunctionUrl"])
    assert e.value.code == 404
    check(get(latest["FunctionUrl"]), expected(name, None, "$LATEST", "two"), "URL of $LATEST, after the alias went")
    client.delete_function(FunctionName=name)
