"""Issue #16: the node through the AWS CLI (v1), as a user deploys with it: create
with tags, wait, invoke, update the configuration, reserve concurrency, read tags and
account settings, delete. Every command's JSON output is checked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from thaw_node_harness import ACCESS_KEY, SECRET_KEY, zip_bytes

AWS = Path(sys.executable).parent / "aws"

HANDLER = """
def handler(event, context):
    return {"echo": event, "memory": context.memory_limit_in_mb}
"""


@pytest.fixture(scope="module")
def aws(node, tmp_path_factory):
    if not AWS.exists():
        pytest.skip("the AWS CLI is not installed in the venv (scripts/setup.sh installs it)")
    home = tmp_path_factory.mktemp("aws-home")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=str(home / "config"), AWS_SHARED_CREDENTIALS_FILE=str(home / "credentials"), HOME=str(home))

    def run(*args, ok=True):
        p = subprocess.run([str(AWS), "--endpoint-url", node.endpoint, "--output", "json", "lambda", *args],
                           env=env, capture_output=True, text=True, timeout=120)
        if ok:
            assert p.returncode == 0, f"aws lambda {' '.join(args)}: {p.stderr}"
        return p

    return run


def out(p):
    return json.loads(p.stdout) if p.stdout.strip() else {}


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
    bad = aws("get-layer-version", "--layer-name", "cli-layer", "--version-number", "7", ok=False)
    assert bad.returncode != 0 and "ResourceNotFoundException" in bad.stderr
    aws("delete-function", "--function-name", "cli-layered")
    aws("delete-layer-version", "--layer-name", "cli-layer", "--version-number", "1")
    assert out(aws("list-layer-versions", "--layer-name", "cli-layer"))["LayerVersions"] == []
