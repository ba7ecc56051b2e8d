"""Fixtures for the Lambda API tests (the harness is in thaw_node_harness.py).

At the end of the session the node is stopped with SIGTERM and the tests check
it exited cleanly and left no sandbox.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from thaw_node_harness import ACCESS_KEY, SECRET_KEY, THAW, NodeProcess, create, sample_zip

AWS = Path(sys.executable).parent / "aws"


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    if not THAW.exists():
        pytest.skip("target/release/thaw is missing: run scripts/setup.sh")
    n = NodeProcess(tmp_path_factory.mktemp("thaw-node"))
    yield n
    code = n.stop()
    assert code == 0, n.log_path.read_text()
    assert n.leftover_sandboxes() == []


@pytest.fixture(scope="session")
def client(node):
    return node.client()


@pytest.fixture(scope="session")
def hello(node, client):
    """The helloworld sample deployed once for the session."""
    create(client, "hello", sample_zip("helloworld"))
    return "hello"


@pytest.fixture(scope="session")
def aws(node, tmp_path_factory):
    """The AWS CLI (v1) against the session's node: aws(*args, ok=True) -> CompletedProcess."""
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
