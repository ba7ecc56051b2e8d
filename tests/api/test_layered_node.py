"""Layered snapshots in the node (issues #11, #31): without any flag the node builds the
Python base on the first deploy, captures each function as a (sealed) diff on it,
reports the base in its status and /metrics, and the functions answer as from full images, also
with several instances alive at once (their memory mapped from a shared copy)."""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from thaw_node_harness import THAW, NodeProcess, create, invoke_json, sample_zip


@pytest.fixture
def layered_node(tmp_path):
    n = NodeProcess(tmp_path, keep_alive="5")
    yield n
    assert n.stop() == 0, n.log_path.read_text()
    assert n.leftover_sandboxes() == []


def inspect(node, snapdir):
    out = subprocess.run([str(THAW), "--data-dir", str(node.data_dir), "snapshot", "inspect", str(snapdir)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def test_functions_are_diffs_on_one_base(layered_node):
    c = layered_node.client()
    create(c, "hello", sample_zip("helloworld"))
    create(c, "counter", sample_zip("counter"))
    bases = layered_node.status()["bases"]
    assert len(bases["bases"]) == 1 and bases["bases"][0]["runtime"] == "python3", bases
    assert bases["bytes"] > 1 << 20
    base_id = bases["bases"][0]["id"]

    snaps = sorted(p.parent for p in (layered_node.data_dir / "node").rglob("snapshot/state.bin"))
    assert len(snaps) == 2, snaps
    for s in snaps:
        v = inspect(layered_node, s)
        assert v["base"] == base_id, v
        assert v["sealed_with_key"], "the node seals its snapshots, diffs too"
        assert v["diff_bytes"] < v["full_equivalent_bytes"], v

    _, body = invoke_json(c, "hello", {"name": "layers"})
    assert body == {"message": "hello, layers"}
    # Several instances at once: each starts from the snapshot's state.
    with ThreadPoolExecutor(6) as ex:
        counts = list(ex.map(lambda _: invoke_json(c, "counter", {})[1]["count"], range(12)))
    assert min(counts) == 1 and all(n >= 1 for n in counts), counts

    # /metrics: the base and the memory of the shared copies the instances map.
    m = {l.split()[0]: float(l.split()[1]) for l in layered_node.metrics().splitlines() if l and not l.startswith("#")}
    assert m["thaw_bases"] == 1 and m["thaw_bases_bytes"] == bases["bytes"], m
    assert m["thaw_shared_memory_bytes"] > 0, m


def test_no_bases_gives_full_images(tmp_path):
    node = NodeProcess(tmp_path, "--no-bases")
    try:
        create(node.client(), "hello", sample_zip("helloworld"))
        _, body = invoke_json(node.client(), "hello", {"name": "full"})
        assert body == {"message": "hello, full"}
        assert "bases" not in node.status() or not node.status()["bases"], node.status().get("bases")
        snaps = [p.parent for p in (node.data_dir / "node").rglob("snapshot/state.bin")]
        assert len(snaps) == 1 and inspect(node, snaps[0])["base"] is None, snaps
        assert not (node.data_dir / "bases").exists()
    finally:
        assert node.stop() == 0, node.log_path.read_text()


def test_a_pool_of_base_instances_serves_cold_starts(tmp_path):
    """Issue #30, repurposing: with --base-pool 1 the node keeps a clean instance of the
    Python base (restored in the background after a start found the pool empty). A cold
    start of a function loads the function into it (its start is "repurposed"); when
    its keep-alive expires the instance goes back to the pool, reset to the base, and
    serves the next function's cold start. (The function itself is restored at its next
    cold start: the node measures that way's cost once, test below.)"""
    import re
    import time

    node = NodeProcess(tmp_path, "--base-pool", "1", keep_alive="1")

    def starts(kind):
        m = re.search(rf'^thaw_starts_total{{kind="{kind}"}} (\S+)$', node.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def repurposed():
        return starts("repurposed") + starts("repurposed-diff")

    def wait_for(cond, what, timeout=30):
        deadline = time.time() + timeout
        while not cond():
            assert time.time() < deadline, f"timed out waiting for {what}: {node.status().get('base_pool')}"
            time.sleep(0.1)

    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        create(c, "counter", sample_zip("counter"))
        create(c, "counter2", sample_zip("counter"))
        _, body = invoke_json(c, "hello", {"name": "first"})
        assert body == {"message": "hello, first"}
        assert repurposed() == 0
        wait_for(lambda: node.status()["base_pool"]["idle"] == 1, "a base instance in the pool")
        _, body = invoke_json(c, "counter", {})
        assert body["count"] == 1, body
        assert starts("repurposed-diff") == 1, "counter's diff installed into the pooled instance: " + node.metrics()
        assert node.status()["base_pool"]["idle"] == 0
        _, body = invoke_json(c, "counter", {})
        assert body["count"] == 2, "a warm call of the repurposed instance"
        # Its keep-alive expires: back to the pool, reset (hello's, restored from its diff, goes).
        wait_for(lambda: node.function_status("counter")["instances"]["live"] == 0 and node.status()["base_pool"]["idle"] == 1,
                 "the repurposed instance back in the pool")
        pool = node.status()["base_pool"]
        assert pool["restored"] == 1 and pool["returned"] == 1 and pool["resets_refused"] == 0, pool
        _, body = invoke_json(c, "counter2", {})
        assert body["count"] == 1, body
        assert repurposed() == 2, "the instance reset into the pool served another function"
        _, body = invoke_json(c, "counter", {})
        assert body["count"] == 1, "counter's next cold start (a restore, measured) starts from its snapshot"
        _, body = invoke_json(c, "hello", {"name": "again"})
        assert body == {"message": "hello, again"}
        m = {l.split()[0]: float(l.split()[1]) for l in node.metrics().splitlines() if l and not l.startswith("#")}
        assert "thaw_base_pool_idle" in m, m
    finally:
        assert node.stop() == 0, node.log_path.read_text()
        assert node.leftover_sandboxes() == []


def test_a_function_whose_load_costs_more_than_a_restore_is_restored(tmp_path):
    """Issue #30: loading a function into a base instance runs its init at the start; for
    a slow init (here 0.4 s) that costs more than restoring its snapshot. The node tries
    the pool once, measures a restore, then restores. (THAW_REPURPOSE=load: the pool
    loads functions instead of installing their diffs, which would not run the init.)"""
    import io
    import re
    import time
    import zipfile

    node = NodeProcess(tmp_path, "--base-pool", "1", keep_alive="1", env={"THAW_REPURPOSE": "load"})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("slow.py", "import time\ntime.sleep(0.4)\nCALLS = [0]\ndef handler(event, context):\n    CALLS[0] += 1\n    return {'calls': CALLS[0]}\n")

    def starts(kind):
        m = re.search(rf'^thaw_starts_total{{kind="{kind}"}} (\S+)$', node.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def cold_call():
        deadline = time.time() + 30
        while node.function_status("slow")["instances"]["live"] > 0:
            assert time.time() < deadline, "the keep-alive did not expire"
            time.sleep(0.1)
        _, body = invoke_json(node.client(), "slow", {})
        assert body == {"calls": 1}, body

    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        create(c, "slow", buf.getvalue(), handler="slow.handler")
        invoke_json(c, "hello", {"name": "x"})  # fills the pool behind it
        deadline = time.time() + 30
        while node.status()["base_pool"]["idle"] < 1:
            assert time.time() < deadline, node.status()["base_pool"]
            time.sleep(0.1)
        for _ in range(3):
            cold_call()
        costs = node.function_status("slow")["cold_start_costs"]
        assert starts("repurposed") == 1, (node.metrics(), costs)
        assert costs["repurposed_ms"] > 400 and costs["restore_ms"] < costs["repurposed_ms"], costs
    finally:
        assert node.stop() == 0, node.log_path.read_text()
        assert node.leftover_sandboxes() == []


def test_the_pool_serves_nodejs_functions_too(tmp_path):
    """Issue #30: a pooled Node.js base instance serves a Node.js function's cold start."""
    import io
    import time
    import zipfile

    def node_zip(tag):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("index.js", "let calls = 0;\nexports.handler = async () => ({tag: '%s', calls: ++calls, cwd: require('fs').readdirSync('.')});\n" % tag)
        return buf.getvalue()

    node = NodeProcess(tmp_path, "--base-pool", "1", keep_alive="1")
    try:
        c = node.client()
        create(c, "first", node_zip("first"), handler="index.handler", Runtime="nodejs20.x")
        create(c, "second", node_zip("second"), handler="index.handler", Runtime="nodejs20.x")
        _, body = invoke_json(c, "first", {})
        assert body == {"tag": "first", "calls": 1, "cwd": ["index.js"]}, body
        deadline = time.time() + 30
        while node.status()["base_pool"]["idle"] < 1:
            assert time.time() < deadline, node.status()["base_pool"]
            time.sleep(0.1)
        _, body = invoke_json(c, "second", {})
        assert body == {"tag": "second", "calls": 1, "cwd": ["index.js"]}, body
        assert 'thaw_starts_total{kind="repurposed-diff"} 1' in node.metrics(), "second's diff installed"
    finally:
        assert node.stop() == 0, node.log_path.read_text()
        assert node.leftover_sandboxes() == []


def test_a_pooled_instance_gets_the_functions_diff_installed(tmp_path):
    """Issue #30, repurposing by diff: a cold start served from the pool installs the
    function's diff (its snapshot on the base) instead of running its init: a value
    its init drew at random is the one its snapshot holds, as after a restore, and a
    slow init (0.4 s) is not waited for again."""
    import io
    import re
    import time
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tok.py", "import os, time\ntime.sleep(0.4)\nTOKEN = os.urandom(8).hex()\nCALLS = [0]\n"
                             "def handler(event, context):\n    CALLS[0] += 1\n    return {'token': TOKEN, 'calls': CALLS[0]}\n")
    node = NodeProcess(tmp_path, "--base-pool", "1", keep_alive="1")

    def starts(kind):
        m = re.search(rf'^thaw_starts_total{{kind="{kind}"}} (\S+)$', node.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def cold_call():
        deadline = time.time() + 30
        while node.function_status("tok")["instances"]["live"] > 0 or node.status()["base_pool"]["idle"] < 1:
            assert time.time() < deadline, node.status()["base_pool"]
            time.sleep(0.1)
        _, body = invoke_json(node.client(), "tok", {})
        return body

    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        create(c, "tok", buf.getvalue(), handler="tok.handler")
        invoke_json(c, "hello", {"name": "x"})  # fills the pool behind it
        first = cold_call()
        assert starts("repurposed-diff") == 1, node.metrics()
        assert first["calls"] == 1, first
        # The node measures each way once. Loaded into the pool's instance (back in the
        # pool, reset): its init runs again and draws another token.
        second = cold_call()
        assert starts("repurposed") == 1, node.metrics()
        assert second["calls"] == 1 and second["token"] != first["token"], (first, second)
        # Restored: the snapshot's token, as installed.
        third = cold_call()
        assert starts("repurposed-diff") == 1 and starts("restore-lazy") + starts("restore-prefetch") >= 2, node.metrics()
        assert third == first, (first, third)
        pool = node.status()["base_pool"]
        assert pool["returned"] >= 1 and pool["resets_refused"] == 0, pool
        costs = node.function_status("tok")["cold_start_costs"]
        assert costs["repurposed_diff_ms"] < costs["repurposed_ms"], "the slow init is not run by an install: %s" % costs
    finally:
        assert node.stop() == 0, node.log_path.read_text()
        assert node.leftover_sandboxes() == []


JAVA_TAG = """
package example;

import com.amazonaws.services.lambda.runtime.Context;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.Map;

public class Tag {
    public Map<String, Object> handle(Map<String, Object> event, Context ctx) throws Exception {
        Map<String, Object> m = new HashMap<>();
        m.put("tag", new String(Files.readAllBytes(Paths.get("tag.txt"))));
        m.put("function", ctx.getFunctionName());
        return m;
    }
}
"""


@pytest.mark.parametrize("way", ["load", "diff"])
def test_the_pool_serves_java_functions(tmp_path, way):
    """Issue #30: a pooled Java base instance serves a Java function's cold start, loaded
    (its classes from its bundle, its init run) or with its diff installed, and the
    function reads its own bundle through relative paths: the JVM's working directory
    follows the new /var/task (it was on the code the function replaced, a placeholder or
    the previous function's). Then an instance of the second function, reset to the base
    by the keep-alive, serves the first again."""
    import time

    from thaw_node_harness import compile_java, zip_bytes

    cls = compile_java(tmp_path, "example.Tag", JAVA_TAG)

    def bundle(tag):
        return zip_bytes({"example/Tag.class": cls, "tag.txt": tag})

    env = {"THAW_REPURPOSE": "load"} if way == "load" else {}
    node = NodeProcess(tmp_path / "node", "--base-pool", "1", keep_alive="1", env=env)

    def cold_call(name):
        deadline = time.time() + 60
        while any(node.function_status(f)["instances"]["live"] > 0 for f in ("first", "second")) or node.status()["base_pool"]["idle"] < 1:
            assert time.time() < deadline, node.status()["base_pool"]
            time.sleep(0.1)
        _, body = invoke_json(node.client(), name, {})
        return body

    kind = "repurposed" if way == "load" else "repurposed-diff"
    try:
        c = node.client()
        for name in ("first", "second"):
            create(c, name, bundle(name), handler="example.Tag::handle", Runtime="java17", MemorySize=512)
        _, body = invoke_json(c, "first", {})  # restored; the pool fills behind it
        assert body == {"tag": "first", "function": "first"}, body
        assert cold_call("second") == {"tag": "second", "function": "second"}
        assert f'thaw_starts_total{{kind="{kind}"}} 1' in node.metrics(), node.metrics()
        # second's instance goes back to the pool, reset, and becomes first's.
        deadline = time.time() + 60
        while node.status()["base_pool"]["returned"] < 1:
            assert time.time() < deadline, node.status()["base_pool"]
            time.sleep(0.1)
        assert cold_call("first") == {"tag": "first", "function": "first"}
        assert f'thaw_starts_total{{kind="{kind}"}} 2' in node.metrics(), node.metrics()
        assert node.status()["base_pool"]["resets_refused"] == 0, node.status()["base_pool"]
    finally:
        assert node.stop() == 0, node.log_path.read_text()
        assert node.leftover_sandboxes() == []


def test_idle_instances_give_back_their_unchanged_pages(tmp_path):
    """Issue #31: an instance idle for --give-back-after gives back the pages it copied
    from its snapshot's shared memory and holds unchanged (once per idle period). It
    keeps its state (the counter goes on), /thaw/status and /metrics count the pages,
    and an instance that fails nothing is not discarded."""
    import time
    node = NodeProcess(tmp_path, "--give-back-after", "0.3", keep_alive="60")
    try:
        c = node.client()
        create(c, "counter", sample_zip("counter"))
        assert invoke_json(c, "counter", {})[1] == {"count": 1}
        deadline = time.time() + 20
        while node.function_status("counter")["counters"]["give_backs"] == 0:
            assert time.time() < deadline, node.function_status("counter")
            time.sleep(0.1)
        counters = node.function_status("counter")["counters"]
        assert counters["pages_given_back"] > 0, counters
        # The same instance, its state kept: no new start.
        assert invoke_json(c, "counter", {})[1] == {"count": 2}
        counters = node.function_status("counter")["counters"]
        assert counters["starts_cold"] == 1 and counters["starts_warm"] == 1, counters
        m = {l.split()[0]: float(l.split()[1]) for l in node.metrics().splitlines() if l and not l.startswith("#")}
        assert m["thaw_pages_given_back_total"] == counters["pages_given_back"], m
        # Idle again after that call: given back again.
        while node.function_status("counter")["counters"]["give_backs"] < 2:
            assert time.time() < deadline, node.function_status("counter")
            time.sleep(0.1)
        assert invoke_json(c, "counter", {})[1] == {"count": 3}
        table = subprocess.run([str(THAW), "status", "--endpoint", f"127.0.0.1:{node.port}"], check=True, capture_output=True, text=True).stdout
        assert "give-back after 0.3s idle" in table, table
    finally:
        assert node.stop() == 0, node.log_path.read_text()


@pytest.mark.parametrize("mode,files", [("snapshot", 2), ("base", 1), ("auto", 1)])
def test_functions_on_one_base_map_its_memory_file(tmp_path, mode, files):
    """Issue #31: with --shared-memory-file base the instances of every function on a
    base map one file of the base's pages (the base counted once); with a file per
    snapshot (the default) each function's file holds them again; `auto` maps the
    base's for a function's first instances. (Files holding pages are counted: each
    snapshot has both files, the one its instances do not map stays empty.)"""
    import os
    node = NodeProcess(tmp_path, "--shared-memory-file", mode, keep_alive="60")
    try:
        c = node.client()
        create(c, "hello", sample_zip("helloworld"))
        create(c, "counter", sample_zip("counter"))
        assert invoke_json(c, "hello", {"name": mode})[1] == {"message": "hello, %s" % mode}
        assert invoke_json(c, "counter", {})[1] == {"count": 1}
        d = "/run/thaw/shared-mem"
        mine = [f for f in os.listdir(d) if f.startswith("%d-" % node.pid) and os.stat(os.path.join(d, f)).st_blocks > 0]
        assert len(mine) == files, mine
        assert invoke_json(c, "counter", {})[1] == {"count": 2}
    finally:
        assert node.stop() == 0, node.log_path.read_text()
