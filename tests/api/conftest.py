"""Fixtures for the Lambda API tests (the harness is in thaw_node_harness.py).

At the end of the session the node is stopped with SIGTERM and the tests check
it exited cleanly and left no sandbox.
"""

import pytest

from thaw_node_harness import THAW, NodeProcess, create, sample_zip


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
