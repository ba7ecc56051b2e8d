"""Issue #13: `thaw serve --snapshot-store s3://BUCKET/PREFIX` against a real MinIO.

A node publishes every snapshot it builds, keeps only a bounded cache of them, fetches a
snapshot it lost back from the store (a restore, not a cold boot), falls back to a cold
boot while the store is down and recovers by itself once it is back, and deletes a
function's stored snapshot with the function."""

import json
import re
import shutil
import threading
import time

import pytest

from fault_proxy import FaultProxy
from minio_harness import Minio
from thaw_node_harness import NodeProcess, create, invoke_json, sample_zip, zip_bytes

BUCKET = "node-snaps"


@pytest.fixture(scope="module")
def minio(tmp_path_factory):
    m = Minio(tmp_path_factory.mktemp("minio"))
    yield m
    m.stop()


def store_node(data, minio, *extra, prefix="fns", endpoint=None, layered=False):
    """A node on the store. Full images unless `layered` (the node's default, diffs on
    a base: test_diffs_are_published_with_their_base_stored_once): these tests look at
    one snapshot's objects (its manifest, head and packs)."""
    bases = () if layered else ("--no-bases",)
    return NodeProcess(data, "--snapshot-store", f"s3://{BUCKET}/{prefix}", "--store-endpoint-url", endpoint or minio.endpoint,
                       "--create-bucket", "--store-timeout", "3", *bases, *extra, env=minio.env())


def metric(node, name):
    """Sum of a counter over its labels."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", node.metrics(), re.M))


def starts(node, kind):
    m = re.search(rf'^thaw_starts_total{{kind="{kind}"}} (\S+)$', node.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def restores(node):
    return sum(float(v) for v in re.findall(r'^thaw_starts_total{kind="restore-[^"]*"} (\S+)$', node.metrics(), re.M))


def wait_for(cond, what, timeout=30):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def cold(node, name):
    """Wait until `name` has no instance left (keep-alive 2 s), so the next call is a cold start."""
    wait_for(lambda: node.function_status(name)["instances"]["live"] == 0, f"{name}'s instances to expire")


def deployed_then_evicted(data, minio, prefix):
    """Deploy helloworld on a node, stop it and drop its cached snapshots: the next
    node on `data` must fetch it. Returns the stored snapshot id."""
    node = store_node(data, minio, prefix=prefix)
    create(node.client(), "hello", sample_zip("helloworld"))
    sid = node.function_status("hello")["snapshot"]["stored"]
    assert sid and node.stop() == 0
    shutil.rmtree(data / "node" / "snapshot-cache" / "entries")
    return sid


def test_snapshots_live_in_the_store_and_come_back(minio, tmp_path):
    data = tmp_path / "node"
    node = store_node(data, minio)
    client = node.client()
    create(client, "hello", sample_zip("helloworld"))
    snap = node.function_status("hello")["snapshot"]
    sid = snap["stored"]
    assert sid and re.fullmatch(r"[0-9a-f]{64}", sid), snap
    assert f"fns/snapshots/{sid}.json" in minio.keys(BUCKET, "fns/snapshots/")
    assert minio.keys(BUCKET, "fns/packs/"), "the chunks are stored, in packs"
    assert not minio.keys(BUCKET, "fns/chunks/"), "no chunk is an object of its own"
    # The local copy lives in the bounded cache, not in the revision's directory.
    entry = data / "node" / "snapshot-cache" / "entries" / sid
    assert (entry / "state.bin").is_file()
    assert not list((data / "node").glob("revisions/*/snapshot/state.bin")), "no second local copy"

    _, body = invoke_json(client, "hello", {"name": "store"})
    assert body == {"message": "hello, store"}
    assert restores(node) == 1 and metric(node, "thaw_restore_fallbacks_total") == 0
    # The first restore recorded the working set; the node publishes the snapshot again
    # with it (in its head, issue #28): a new stored snapshot, which replaces the first.
    assert starts(node, "restore-lazy") == 1, node.metrics()  # recording pages lazily
    wait_for(lambda: node.function_status("hello")["snapshot"]["stored"] != sid, "the snapshot to be published again")
    first, sid = sid, node.function_status("hello")["snapshot"]["stored"]
    m = minio.manifest(BUCKET, f"fns/snapshots/{sid}.json")
    assert "ws.trace" in [f["name"] for f in m["files"]] and m["head"] is not None, m["files"]
    # The node seals its snapshots: the working set is stored as its ws.lz4 (compressed,
    # then sealed; format 7, binary), not as ws.pages, whose ciphertext would not compress.
    assert m["format"] == 7 and "ws.lz4" in [f["name"] for f in m["files"]] and m["derived"] == ["ws.pages"], m["files"]
    assert node.status()["snapshot_store"]["working_sets_published"] == 1
    wait_for(lambda: f"fns/snapshots/{first}.json" not in minio.keys(BUCKET, "fns/snapshots/"), "the first to be deleted")
    entry = data / "node" / "snapshot-cache" / "entries" / sid
    assert (entry / "ws.trace").is_file(), "cached under its new id"
    assert node.stop() == 0

    # The node loses its local snapshot: the next start fetches it back and restores.
    shutil.rmtree(data / "node" / "snapshot-cache" / "entries")
    node = store_node(data, minio)
    client = node.client()
    _, body = invoke_json(client, "hello", {"name": "again"})
    assert body == {"message": "hello, again"}
    st = node.status()["snapshot_store"]
    # The head so far (the manifest, state.bin, the working set as sealed ws.lz4 frames).
    assert st["fetches"] == 1 and st["fetch_failures"] == 0 and st["bytes_fetched"] > 0, st
    assert restores(node) == 1 and starts(node, "boot") == 0, node.metrics()
    assert starts(node, "restore-prefetch") == 1, "the fetched snapshot came with its working set"
    assert st["lazy_fetches"] == 1, "the miss started from the snapshot's head (issue #28)"
    # The rest arrives in the background once the first response is out, then moves
    # into the cache: the call was answered before the image was here.
    wait_for(lambda: node.status()["snapshot_store"]["lazy_settled"] == 1, "the rest of the snapshot to arrive")
    fetch = node.function_status("hello")["snapshot"]["fetch"]
    assert fetch["lazy"] and fetch["complete"], fetch
    assert fetch["bytes_fetched_before_first_response"] < fetch["bytes_fetched"], fetch
    # The manifest and the head (in two parallel reads), the working set in it.
    assert fetch["requests_before_first_response"] <= 4, fetch
    assert (entry / "state.bin").is_file() and (entry / "ws.pages").is_file(), "fetched into the cache"
    assert not list((data / "node" / "snapshot-cache" / "lazy").iterdir()), "nothing left of the lazy fetch"

    # The store goes down and the cache is lost: starts fall back to a cold boot, in bounded time.
    cold(node, "hello")
    assert node.stop() == 0
    shutil.rmtree(data / "node" / "snapshot-cache" / "entries")
    minio.stop()
    try:
        node = store_node(data, minio)
        client = node.client()
        t0 = time.time()
        _, body = invoke_json(client, "hello", {"name": "down"})
        assert body == {"message": "hello, down"}
        assert time.time() - t0 < 30, "a miss while the store is down falls back within the store timeout"
        assert starts(node, "boot") == 1 and metric(node, "thaw_restore_fallbacks_total") == 1
        assert node.status()["snapshot_store"]["fetch_failures"] >= 1
        cold(node, "hello")
    finally:
        minio.resume()
    # ...and recover by themselves once it is back.
    _, body = invoke_json(client, "hello", {"name": "back"})
    assert body == {"message": "hello, back"}
    assert restores(node) == 1, node.metrics()
    assert node.status()["snapshot_store"]["bytes_fetched"] > 0, "fetched from the store"

    # Deleting the function deletes its stored snapshot (its manifest; chunks go to `thaw snapshot gc`).
    client.delete_function(FunctionName="hello")
    wait_for(lambda: f"fns/snapshots/{sid}.json" not in minio.keys(BUCKET, "fns/snapshots/"), "the manifest to be deleted")
    assert f"fns/ws/{sid}.trace" not in minio.keys(BUCKET, "fns/ws/"), "and its working set"
    wait_for(lambda: not entry.exists(), "the cached copy to be removed")
    assert node.stop() == 0


def test_a_publish_that_failed_is_retried_at_start(minio, tmp_path):
    data = tmp_path / "node"
    minio.stop()
    try:
        node = store_node(data, minio, prefix="retry")
        client = node.client()
        create(client, "hello", sample_zip("helloworld"))
        snap = node.function_status("hello")["snapshot"]
        assert snap["stored"] is None, snap
        _, body = invoke_json(client, "hello", {"name": "local"})
        assert body == {"message": "hello, local"}, "served from this node's disk meanwhile"
        assert restores(node) == 1
        assert node.status()["snapshot_store"]["publish_failures"] == 1
        assert node.stop() == 0
    finally:
        minio.resume()
    node = store_node(data, minio, prefix="retry")
    wait_for(lambda: node.function_status("hello")["snapshot"]["stored"] is not None, "the snapshot to be published")
    sid = node.function_status("hello")["snapshot"]["stored"]
    assert f"retry/snapshots/{sid}.json" in minio.keys(BUCKET, "retry/snapshots/")
    _, body = invoke_json(node.client(), "hello", {"name": "stored"})
    assert body == {"message": "hello, stored"}
    assert restores(node) == 1 and starts(node, "boot") == 0
    assert node.stop() == 0


def test_the_cache_is_bounded(minio, tmp_path):
    data = tmp_path / "node"
    node = store_node(data, minio, prefix="bounded")
    client = node.client()
    for name in ["one", "two"]:
        create(client, name, sample_zip("helloworld"))
        invoke_json(client, name, {})  # records the working set (kept in the cached copy)
    sizes = [node.function_status(n)["snapshot"]["bytes"] for n in ["one", "two"]]
    used = node.status()["snapshot_store"]["cache"]["used_bytes"]
    assert node.stop() == 0
    # Restarted with room for one snapshot, not two: the index rebuilt at start is cut down to it.
    bound = used * 3 // 4
    assert bound > max(sizes), (sizes, used)
    node = store_node(data, minio, "--cache-max-bytes", str(bound), prefix="bounded")
    client = node.client()
    assert node.status()["snapshot_store"]["cache"]["entries"] == 1
    for _ in range(2):
        for name in ["one", "two"]:
            _, body = invoke_json(client, name, {"name": name})
            assert body == {"message": f"hello, {name}"}
            cache = node.status()["snapshot_store"]["cache"]
            assert cache["used_bytes"] + cache["reserved_bytes"] <= cache["max_bytes"], cache
            cold(node, name)
            # Closed (unpinned) once unused for a keep-alive period: evictable.
            wait_for(lambda: not node.function_status(name)["snapshot"]["loaded"], f"{name}'s snapshot to be closed")
    st = node.status()["snapshot_store"]
    assert st["cache"]["evictions"] >= 3 and st["fetches"] >= 3, st
    assert metric(node, "thaw_restore_fallbacks_total") == 0 and starts(node, "boot") == 0, node.metrics()
    assert node.stop() == 0


def test_a_corrupt_object_is_never_restored_from(minio, tmp_path):
    data = tmp_path / "node"
    sid = deployed_then_evicted(data, minio, "corrupt")
    # Flip the bytes of one pack the manifest names (same length, same name): the head,
    # and its copy under the snapshot's id, both parts (which a miss reads first; it
    # fails its check, and the head is read from its pack).
    manifest = minio.manifest(BUCKET, f"corrupt/snapshots/{sid}.json")
    pack = manifest["packs"][0]["name"]
    for key in (f"corrupt/packs/{pack}", f"corrupt/heads/{sid}", f"corrupt/heads/{sid}.rest"):
        good = minio.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        minio.s3().put_object(Bucket=BUCKET, Key=key, Body=bytes(b ^ 0xFF for b in good))

    node = store_node(data, minio, prefix="corrupt")
    _, body = invoke_json(node.client(), "hello", {"name": "corrupt"})
    assert body == {"message": "hello, corrupt"}, "the call is served by a cold boot"
    assert starts(node, "boot") == 1 and restores(node) == 0 and metric(node, "thaw_restore_fallbacks_total") == 1
    assert node.status()["snapshot_store"]["fetch_failures"] == 1
    assert not list((data / "node" / "snapshot-cache" / "entries").iterdir()), "nothing was installed"
    assert node.stop() == 0
    assert f"packs/{pack} is corrupt or truncated" in node.log_path.read_text(), "the log names the object"


def test_a_bad_recorded_working_set_is_ignored(minio, tmp_path):
    """The published working set is advisory: one that does not match its snapshot is
    skipped (the restore records a new one), never a reason to fail or boot."""
    data = tmp_path / "node"
    sid = deployed_then_evicted(data, minio, "badws")
    minio.s3().put_object(Bucket=BUCKET, Key=f"badws/ws/{sid}.trace", Body=b"THAWWS" + bytes(64))

    node = store_node(data, minio, prefix="badws")
    _, body = invoke_json(node.client(), "hello", {"name": "ws"})
    assert body == {"message": "hello, ws"}
    assert restores(node) == 1 and starts(node, "restore-lazy") == 1 and starts(node, "boot") == 0, node.metrics()
    assert node.stop() == 0
    assert "ignoring a recorded working set" in node.log_path.read_text()


def test_the_node_collects_what_no_snapshot_references(minio, tmp_path):
    """Deleting a function deletes its manifest; the node's collector then deletes its
    packs (two runs a grace period apart), and keeps those another snapshot uses."""
    node = store_node(tmp_path / "node", minio, "--store-gc-interval", "1", "--store-gc-grace", "1", prefix="gc")
    client = node.client()
    create(client, "keep", sample_zip("helloworld"))
    keep = node.function_status("keep")["snapshot"]["stored"]
    manifest = minio.manifest(BUCKET, f"gc/snapshots/{keep}.json")
    kept = {f"gc/packs/{p['name']}" for p in manifest["packs"]}
    create(client, "gone", zip_bytes({"handler.py": "def handler(event, context):\n    return {'gone': True}\n"}))
    assert set(minio.keys(BUCKET, "gc/packs/")) > kept
    client.delete_function(FunctionName="gone")
    wait_for(lambda: set(minio.keys(BUCKET, "gc/packs/")) == kept, "the deleted function's packs to be collected", timeout=60)
    assert node.status()["snapshot_store"]["gc_chunks_deleted"] > 0
    _, body = invoke_json(client, "keep", {"name": "kept"})
    assert body == {"message": "hello, kept"}
    assert node.stop() == 0


def test_a_store_that_dies_after_the_start_costs_a_retry_not_a_wrong_answer(minio, tmp_path):
    """Issue #28: a miss starts the instance from the snapshot's head and fetches the
    other pages as it faults on them. The store goes away right after the head: the
    instance is killed for the page it cannot have (never run on a page the image did
    not provide, never left hanging), and the node runs the call again on a cold boot.
    Once the store is back, the next cold start fetches the snapshot again and restores."""
    data = tmp_path / "node"
    sid = deployed_then_evicted(data, minio, "dies")  # no working set: everything but the head is fetched on faults
    manifest = minio.manifest(BUCKET, f"dies/snapshots/{sid}.json")
    head = manifest["packs"][manifest["head"]]["name"]

    def rule(method, path, headers):
        # The manifest and the head pass; every other pack read fails.
        return "cut" if "/packs/" in path and head not in path else "pass"

    proxy = FaultProxy(minio.port, rule)
    try:
        node = store_node(data, minio, prefix="dies", endpoint=proxy.endpoint)
        client = node.client()
        _, body = invoke_json(client, "hello", {"name": "retried"})
        assert body == {"message": "hello, retried"}, "the retry on a cold boot answered"
        wait_for(lambda: node.status()["snapshot_store"]["fetch_failures"] >= 1, "the fill to fail too")
        assert node.status()["snapshot_store"]["lazy_fetches"] == 1
        assert restores(node) == 1 and starts(node, "boot") == 1, node.metrics()
        assert metric(node, "thaw_restore_fallbacks_total") == 1
        assert proxy.requests("cut"), "the store was down for the faults"
        log = node.log_path.read_text()
        assert "retrying the call on a cold boot" in log, log[-3000:]
        assert not list((data / "node" / "snapshot-cache" / "entries").iterdir()), "nothing partial was cached"

        # The store comes back: the next cold start fetches the snapshot again, and restores.
        cold(node, "hello")
        proxy.rule = lambda method, path, headers: "pass"
        _, body = invoke_json(client, "hello", {"name": "back"})
        assert body == {"message": "hello, back"}
        assert restores(node) == 2 and starts(node, "boot") == 1, node.metrics()
        wait_for(lambda: node.status()["snapshot_store"]["lazy_settled"] == 1, "the snapshot to arrive whole")
        assert (data / "node" / "snapshot-cache" / "entries" / sid / "pages.img").is_file()
        assert node.stop() == 0
    finally:
        proxy.close()


def test_diffs_are_published_with_their_base_stored_once(minio, tmp_path):
    """Issue #28: with --snapshot-store (and bases, the default) a node publishes each function
    as a diff naming its base, a stored snapshot of its own that every diff shares. A
    node without the base (its cache and its bases gone, as on another machine) fetches
    the base once for both diffs and restores them."""
    data = tmp_path / "node"
    node = store_node(data, minio, prefix="layered", layered=True)
    c = node.client()
    create(c, "hello", sample_zip("helloworld"))
    create(c, "counter", sample_zip("counter"))
    sids = [node.function_status(n)["snapshot"]["stored"] for n in ("hello", "counter")]
    assert all(sids), sids

    def manifest(sid):
        return minio.manifest(BUCKET, f"layered/snapshots/{sid}.json")

    bases = {manifest(s).get("base") for s in sids}
    assert len(bases) == 1 and None not in bases, bases
    base = bases.pop()
    assert manifest(base).get("base") is None, "a base is a full image"
    assert sorted(minio.keys(BUCKET, "layered/snapshots/")) == sorted(f"layered/snapshots/{s}.json" for s in [base, *sids])
    _, body = invoke_json(c, "hello", {"name": "here"})
    assert body == {"message": "hello, here"}
    assert node.stop() == 0

    shutil.rmtree(data / "node" / "snapshot-cache" / "entries")
    shutil.rmtree(data / "bases")
    node = store_node(data, minio, prefix="layered", layered=True)
    c = node.client()
    _, body = invoke_json(c, "hello", {"name": "there"})
    assert body == {"message": "hello, there"}
    _, body = invoke_json(c, "counter", {})
    assert body["count"] == 1, body
    st = node.status()["snapshot_store"]
    assert st["lazy_fetches"] == 2 and st["fetch_failures"] == 0, st
    assert restores(node) == 2 and starts(node, "boot") == 0, node.metrics()
    wait_for(lambda: node.status()["snapshot_store"]["lazy_settled"] == 2, "both diffs to arrive whole")
    entries = data / "node" / "snapshot-cache" / "entries"
    assert sorted(p.name for p in entries.iterdir()) == sorted([base, *sids]), "the base once, and the two diffs"
    for s in sids:
        assert (entries / s / "base").resolve() == (entries / base).resolve()
    assert node.stop() == 0


def test_a_node_killed_while_a_snapshot_arrives_leaves_a_consistent_cache(minio, tmp_path):
    """Issue #28: kill -9 while the rest of a lazily fetched snapshot is on its way:
    nothing partial is ever in the cache; the next node fetches it again, restores,
    and removes what the dead one left."""
    data = tmp_path / "node"
    sid = deployed_then_evicted(data, minio, "killed")  # no working set: the instance faults on pages beyond the head
    manifest = minio.manifest(BUCKET, f"killed/snapshots/{sid}.json")
    head = manifest["packs"][manifest["head"]]["name"]

    def rule(method, path, headers):
        # The manifest and the head pass; every other pack read waits (forever, here).
        return "hold" if "/packs/" in path and head not in path else "pass"

    proxy = FaultProxy(minio.port, rule)
    try:
        node = store_node(data, minio, prefix="killed", endpoint=proxy.endpoint)
        def first_call():
            try:
                invoke_json(node.client(), "hello", {"name": "first"})
            except Exception:  # the node is killed under it
                pass

        call = threading.Thread(target=first_call, daemon=True)
        call.start()
        wait_for(lambda: proxy.requests("hold"), "the pages beyond the head to be on their way")
        lazy = data / "node" / "snapshot-cache" / "lazy"
        assert list(lazy.iterdir()), "the snapshot is arriving"
        node.proc.kill()
        node.proc.wait()
        call.join(timeout=30)
    finally:
        proxy.release()
        proxy.close()
    entries = data / "node" / "snapshot-cache" / "entries"
    assert not list(entries.iterdir()), "nothing partial in the cache"
    node = store_node(data, minio, prefix="killed")
    _, body = invoke_json(node.client(), "hello", {"name": "again"})
    assert body == {"message": "hello, again"}
    assert restores(node) == 1 and starts(node, "boot") == 0, node.metrics()
    wait_for(lambda: node.status()["snapshot_store"]["lazy_settled"] == 1, "the snapshot to arrive whole")
    assert (entries / sid / "pages.img").is_file()
    assert not list(lazy.iterdir()), "what the killed node left is gone"
    assert node.stop() == 0
