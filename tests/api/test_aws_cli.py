"""Issue #16: the node through the AWS CLI (v1), as a user deploys with it: create
with tags, wait, invoke, update the configuration, reserve concurrency, read tags and
account settings, delete. Every command's JSON output is checked."""

import json
import subprocess

from thaw_node_harness import cli_json as out, zip_bytes

HANDLER = """
def handler(event, context):
    return {"echo": event, "memory": context.memory_limit_in_mb}
"""


def test_deploy_and_operate_with_the_aws_cli(aws, tmp_path):
    z = tmp_path / "fn.zip"
    z.write_bytes(zip_bytes({"handler.py": HANDLER}))
    created = out(aws("create-function", "--function-name", "cli", "--runtime", "python3.12", "--handler", "handler.handler",
                      "--role", "arn:aws:iam::000000000000:role/cli", "--zip-file", f"fileb://{z}", "--tags", "team=cli"))
    assert created["FunctionName"] == "cli" and created["State"] == "Pending"
    aws("wait", "function-active-v2", "--function-name", "cli")

    result = tmp_path / "out.json"
    inv = out(aws("invoke", "--function-name", "cli", "--payload", '{"x": 1}', str(result)))
    assert inv["StatusCode"] == 200 and "FunctionError" not in inv
    assert json.loads(result.read_text()) == {"echo": {"x": 1}, "memory": "128"}

    cfg = out(aws("update-function-configuration", "--function-name", "cli", "--memory-size", "256", "--timeout", "7"))
    assert (cfg["MemorySize"], cfg["Timeout"]) == (256, 7)
    aws("wait", "function-updated-v2", "--function-name", "cli")
    aws("invoke", "--function-name", "cli", "--payload", "{}", str(result))
    assert json.loads(result.read_text())["memory"] == "256"

    assert out(aws("put-function-concurrency", "--function-name", "cli", "--reserved-concurrent-executions", "2")) == \
        {"ReservedConcurrentExecutions": 2}
    assert out(aws("get-function-concurrency", "--function-name", "cli")) == {"ReservedConcurrentExecutions": 2}
    assert out(aws("list-tags", "--resource", created["FunctionArn"]))["Tags"] == {"team": "cli"}
    limits = out(aws("get-account-settings"))["AccountLimit"]
    assert limits["UnreservedConcurrentExecutions"] <= limits["ConcurrentExecutions"] - 2

    missing = aws("get-function", "--function-name", "no-such-function", ok=False)
    assert missing.returncode != 0 and "ResourceNotFoundException" in missing.stderr
    aws("delete-function", "--function-name", "cli")
    assert "cli" not in [f["FunctionName"] for f in out(aws("list-functions"))["Functions"]]


def test_layers_with_the_aws_cli(aws, tmp_path):
    lz = tmp_path / "layer.zip"
    lz.write_bytes(zip_bytes({"python/cli_helper.py": "GREETING = 'from a layer'\n"}))
    layer = out(aws("publish-layer-version", "--layer-name", "cli-layer", "--zip-file", f"fileb://{lz}",
                    "--compatible-runtimes", "python3.12", "--description", "helpers"))
    assert (layer["Version"], layer["Description"]) == (1, "helpers")
    assert out(aws("get-layer-version", "--layer-name", "cli-layer", "--version-number", "1"))["LayerVersionArn"] == \
        layer["LayerVersionArn"]
    assert "cli-layer" in [l["LayerName"] for l in out(aws("list-layers"))["Layers"]]

    z = tmp_path / "fn.zip"
    z.write_bytes(zip_bytes({"handler.py": "import cli_helper\ndef handler(e, c):\n    return cli_helper.GREETING\n"}))
    created = out(aws("create-function", "--function-name", "cli-layered", "--runtime", "python3.12", "--handler",
                      "handler.handler", "--role", "arn:aws:iam::000000000000:role/cli", "--zip-file", f"fileb://{z}",
                      "--layers", layer["LayerVersionArn"]))
    assert [l["Arn"] for l in created["Layers"]] == [layer["LayerVersionArn"]]
    aws("wait", "function-active-v2", "--function-name", "cli-layered")
    result = tmp_path / "out.json"
    aws("invoke", "--function-name", "cli-layered", str(result))
    assert json.loads(result.read_text()) == "from a layer"

    unsupported = aws("get-policy", "--function-name", "cli-layered", ok=False)
    assert unsupported.returncode != 0 and "GetPolicy is not implemented by this Thaw node" in unsupported.stderr
    by_arn = out(aws("get-layer-version-by-arn", "--arn", layer["LayerVersionArn"]))
    assert by_arn["Version"] == 1
    bad = aws("get-layer-version", "--layer-name", "cli-layer", "--version-number", "7", ok=False)
    assert bad.returncode != 0 and "ResourceNotFoundException" in bad.stderr
    aws("delete-function", "--function-name", "cli-layered")
    aws("delete-layer-version", "--layer-name", "cli-layer", "--version-number", "1")
    assert out(aws("list-layer-versions", "--layer-name", "cli-layer"))["LayerVersions"] == []


def test_versions_aliases_concurrency_urls_and_tags_with_the_aws_cli(aws, tmp_path):
    z = tmp_path / "fn.zip"
    z.write_bytes(zip_bytes({"handler.py": HANDLER}))
    created = out(aws("create-function", "--function-name", "cli-ops", "--runtime", "python3.12", "--handler",
                      "handler.handler", "--role", "arn:aws:iam::000000000000:role/cli", "--zip-file", f"fileb://{z}"))
    arn = created["FunctionArn"]
    aws("wait", "function-active-v2", "--function-name", "cli-ops")

    # Versions and aliases.
    assert out(aws("publish-version", "--function-name", "cli-ops", "--description", "first"))["Version"] == "1"
    aws("update-function-configuration", "--function-name", "cli-ops", "--memory-size", "256")
    aws("wait", "function-updated-v2", "--function-name", "cli-ops")
    assert out(aws("publish-version", "--function-name", "cli-ops"))["Version"] == "2"
    assert [v["Version"] for v in out(aws("list-versions-by-function", "--function-name", "cli-ops"))["Versions"]] == \
        ["$LATEST", "1", "2"]
    alias = out(aws("create-alias", "--function-name", "cli-ops", "--name", "live", "--function-version", "1",
                    "--routing-config", "AdditionalVersionWeights={2=0.25}"))
    assert alias["RoutingConfig"]["AdditionalVersionWeights"] == {"2": 0.25}
    assert out(aws("get-alias", "--function-name", "cli-ops", "--name", "live"))["FunctionVersion"] == "1"
    assert out(aws("update-alias", "--function-name", "cli-ops", "--name", "live", "--function-version", "2",
                   "--routing-config", "AdditionalVersionWeights={}"))["FunctionVersion"] == "2"
    assert [a["Name"] for a in out(aws("list-aliases", "--function-name", "cli-ops"))["Aliases"]] == ["live"]
    result = tmp_path / "out.json"
    inv = out(aws("invoke", "--function-name", "cli-ops", "--qualifier", "live", str(result)))
    assert inv["ExecutedVersion"] == "2" and json.loads(result.read_text())["memory"] == "256"
    assert out(aws("get-function-configuration", "--function-name", "cli-ops", "--qualifier", "1"))["MemorySize"] == 128
    for args, error in [
        (("get-function", "--function-name", "cli-ops", "--qualifier", "9"), "ResourceNotFoundException"),
        (("create-alias", "--function-name", "cli-ops", "--name", "bad", "--function-version", "9"), "ResourceNotFoundException"),
        (("update-alias", "--function-name", "cli-ops", "--name", "live", "--routing-config", "AdditionalVersionWeights={1=1.5}"),
         "InvalidParameterValueException"),
        (("delete-function", "--function-name", "cli-ops", "--qualifier", "2"), "ResourceConflictException"),
    ]:
        p = aws(*args, ok=False)
        assert p.returncode != 0 and error in p.stderr, (args, p.stderr)

    # Provisioned and reserved concurrency.
    prov = out(aws("put-provisioned-concurrency-config", "--function-name", "cli-ops", "--qualifier", "1",
                   "--provisioned-concurrent-executions", "1"))
    assert prov["RequestedProvisionedConcurrentExecutions"] == 1
    assert out(aws("get-provisioned-concurrency-config", "--function-name", "cli-ops", "--qualifier", "1"))[
        "RequestedProvisionedConcurrentExecutions"] == 1
    assert len(out(aws("list-provisioned-concurrency-configs", "--function-name", "cli-ops"))["ProvisionedConcurrencyConfigs"]) == 1
    aws("delete-provisioned-concurrency-config", "--function-name", "cli-ops", "--qualifier", "1")
    aws("put-function-concurrency", "--function-name", "cli-ops", "--reserved-concurrent-executions", "3")
    aws("delete-function-concurrency", "--function-name", "cli-ops")
    assert out(aws("get-function-concurrency", "--function-name", "cli-ops")) == {}
    too_many = aws("put-function-concurrency", "--function-name", "cli-ops", "--reserved-concurrent-executions", "100000", ok=False)
    assert too_many.returncode != 0 and "InvalidParameterValueException" in too_many.stderr

    # Tags.
    aws("tag-resource", "--resource", arn, "--tags", "team=cli,tier=gold")
    aws("untag-resource", "--resource", arn, "--tag-keys", "tier")
    assert out(aws("list-tags", "--resource", arn))["Tags"] == {"team": "cli"}

    # A function URL, called with curl.
    url = out(aws("create-function-url-config", "--function-name", "cli-ops", "--auth-type", "NONE"))["FunctionUrl"]
    assert out(aws("get-function-url-config", "--function-name", "cli-ops"))["FunctionUrl"] == url
    assert out(aws("update-function-url-config", "--function-name", "cli-ops", "--cors", "AllowOrigins=https://x.example"))[
        "Cors"]["AllowOrigins"] == ["https://x.example"]
    assert [c["FunctionUrl"] for c in out(aws("list-function-url-configs", "--function-name", "cli-ops"))["FunctionUrlConfigs"]] == [url]
    got = subprocess.run(["curl", "-s", "--fail", url + "?via=curl"], capture_output=True, timeout=60, check=True).stdout
    assert json.loads(got)["memory"] == "256"
    aws("delete-function-url-config", "--function-name", "cli-ops")
    gone = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url], capture_output=True, timeout=60).stdout
    assert gone == b"404"

    # New code.
    z.write_bytes(zip_bytes({"handler.py": HANDLER + "\n# v2\n"}))
    assert out(aws("update-function-code", "--function-name", "cli-ops", "--zip-file", f"fileb://{z}"))["LastUpdateStatus"] == \
        "InProgress"
    aws("wait", "function-updated-v2", "--function-name", "cli-ops")
    aws("delete-alias", "--function-name", "cli-ops", "--name", "live")
    aws("delete-function", "--function-name", "cli-ops", "--qualifier", "1")
    aws("delete-function", "--function-name", "cli-ops")
