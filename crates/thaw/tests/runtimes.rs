//! Issue "Node.js and Java functions": multi-threaded runtimes captured and
//! restored through the CLI, as root. Needs `scripts/build-samples.sh` (and
//! `scripts/build-runtimes.sh` for Java), which the test script runs.

mod common;

use std::path::{Path, PathBuf};

use common::{bundle, root, scratch, stdout, thaw};

/// stdout of a successful thaw run.
fn ok(o: std::process::Output) -> String {
    stdout(&common::ok(o))
}

struct Fun {
    runtime: &'static str,
    code: PathBuf,
    handler: &'static str,
}

fn fun(runtime: &'static str, dir: &str, name: &str, handler: &'static str) -> Fun {
    let code = root().join("build/samples").join(dir).join(name);
    assert!(code.is_dir(), "sample {dir}/{name} not built: run scripts/build-samples.sh");
    Fun { runtime, code, handler }
}

fn boot(f: &Fun, payload: &str) -> String {
    ok(thaw(&["boot", "--runtime", f.runtime, "--code", f.code.to_str().unwrap(), "--handler", f.handler, "--payload", payload, "--quiet"]))
}

fn snapshot(f: &Fun, tag: &str) -> PathBuf {
    let out = scratch().join(format!("snap-{tag}"));
    ok(thaw(&["snapshot", "create", "--runtime", f.runtime, "--code", f.code.to_str().unwrap(), "--handler", f.handler, "--out", out.to_str().unwrap()]));
    out
}

fn restore(snap: &Path, payload: &str, paging: &str, n: u32) -> Vec<serde_json::Value> {
    let n = n.to_string();
    let out = ok(thaw(&["snapshot", "restore", snap.to_str().unwrap(), "--payload", payload, "--paging", paging, "--invocations", &n, "--quiet"]));
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A result that echoes the invocation's request id (node helloworld) must echo
/// exactly `id` (`thaw boot` sends "boot-1", a restore "restore-N"); the id is then
/// dropped so results of different invocations compare.
fn checked_request_id(mut v: serde_json::Value, id: &str) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        if let Some(got) = o.remove("requestId") {
            assert_eq!(got, id, "request id echoed by the function");
        }
    }
    v
}

fn assert_restores_match_boot(f: &Fun, tag: &str, payload: &str, pick: fn(serde_json::Value) -> serde_json::Value) {
    let want = pick(checked_request_id(serde_json::from_str(boot(f, payload).trim()).unwrap(), "boot-1"));
    let snap = snapshot(f, tag);
    for paging in ["lazy", "record", "prefetch", "eager"] {
        let got = restore(&snap, payload, paging, 12);
        assert_eq!(got.len(), 12);
        for (i, g) in got.into_iter().enumerate() {
            assert_eq!(pick(checked_request_id(g, &format!("restore-{}", i + 1))), want, "{tag} {paging} invocation {i}");
        }
    }
}

fn all(v: serde_json::Value) -> serde_json::Value {
    v
}

fn deterministic(v: serde_json::Value) -> serde_json::Value {
    v["deterministic"].clone()
}

#[test]
fn node_functions_restore_like_they_boot() {
    assert_restores_match_boot(&fun("nodejs20.x", "nodejs", "helloworld", "index.handler"), "node-hello", r#"{"name":"n"}"#, all);
    assert_restores_match_boot(&fun("nodejs20.x", "nodejs", "jsontransform", "index.handler"), "node-json", r#"{"rows":300}"#, all);
    // Timers, promises, fs.readFileSync of a bundled file, crypto.
    let f = fun("nodejs20.x", "nodejs", "features", "index.handler");
    assert_restores_match_boot(&f, "node-features", "{}", deterministic);
}

#[test]
fn java_functions_restore_like_they_boot() {
    assert_restores_match_boot(&fun("java17", "java", "helloworld", "example.Hello"), "java-hello", r#"{"name":"j"}"#, all);
    assert_restores_match_boot(&fun("java17", "java", "matmul", "example.MatMul::multiply"), "java-matmul", r#"{"n":64}"#, all);
    let orders = r#"{"orders":[{"id":"a","region":"west","items":[{"sku":"x","qty":2,"price":1.5}]}],"generate":30}"#;
    assert_restores_match_boot(&fun("java17", "java", "jsonhandler", "example.Orders"), "java-json", orders, all);
    // Allocation + GC, an ExecutorService created at init, a resource read from its jar.
    assert_restores_match_boot(&fun("java17", "java", "features", "example.Features"), "java-features", "{}", all);
}

#[test]
fn instances_restored_from_one_image_do_not_share_random_state() {
    // Node.js: also crypto's randomBytes as the function kept it at init (the runtime
    // replaces the generators before the function loads).
    for (f, tag, keys) in [
        (fun("nodejs20.x", "nodejs", "random", "index.handler"), "node-random", &["math", "uuid", "bytes", "captured"][..]),
        (fun("java17", "java", "random", "example.Randoms"), "java-random", &["math", "uuid"][..]),
    ] {
        let snap = snapshot(&f, tag);
        let a = restore(&snap, "{}", "lazy", 1).remove(0);
        let b = restore(&snap, "{}", "lazy", 1).remove(0);
        for &key in keys {
            assert!(a.get(key).is_some(), "{tag}: no {key} in {a}");
            assert_ne!(a[key], b[key], "{tag}: {key} repeats across restored instances: {a} {b}");
        }
    }
    // Python: the runtime reseeds `random` in every restored clone.
    let code = bundle("py-random", &[("handler.py", "import random\n\ndef handler(event, context):\n    return random.random()\n")]);
    let f = Fun { runtime: "python3", code, handler: "handler.handler" };
    let snap = snapshot(&f, "py-random");
    assert_ne!(restore(&snap, "{}", "lazy", 1), restore(&snap, "{}", "lazy", 1));
}

#[test]
fn a_multithreaded_process_with_pipes_eventfds_and_epoll_is_restored() {
    let code = bundle(
        "py-mt",
        &[
            ("data.txt", "hello world, thaw\n"),
            (
                "handler.py",
                r#"import os, select, threading, queue, time
DATA = open('/var/task/data.txt', 'rb')
DATA.read(6)
R, W = os.pipe()
os.write(W, b"x")            # a byte left in the pipe at capture
EV = os.eventfd(3, os.EFD_NONBLOCK)
EP = select.epoll()
EP.register(R, select.EPOLLIN)
EP.register(EV, select.EPOLLIN)
REQ, RESP = queue.Queue(), queue.Queue()
def worker():
    while True:
        RESP.put(REQ.get() * 2)
threading.Thread(target=worker, daemon=True, name="worker-1").start()
def sleeper():
    while True:
        time.sleep(0.01)
threading.Thread(target=sleeper, daemon=True, name="sleeper").start()
time.sleep(0.05)

def handler(event, context):
    REQ.put(event["x"])
    doubled = RESP.get(timeout=5)
    ready = sorted(fd for fd, _ in EP.poll(1))
    got = os.read(R, 1).decode()
    os.write(W, b"x")
    ev = os.eventfd_read(EV)
    os.eventfd_write(EV, 3)
    rest = DATA.read(5).decode()
    DATA.seek(6)
    names = sorted(t.name for t in threading.enumerate())
    return {"doubled": doubled, "pipe": got, "eventfd": ev, "ready": len(ready), "file": rest, "threads": names}
"#,
            ),
        ],
    );
    let f = Fun { runtime: "python3", code, handler: "handler.handler" };
    let want: serde_json::Value = serde_json::from_str(boot(&f, r#"{"x":21}"#).trim()).unwrap();
    assert_eq!(want["threads"], serde_json::json!(["MainThread", "sleeper", "worker-1"]));
    assert_eq!(want["pipe"], "x");
    let snap = snapshot(&f, "py-mt");
    for paging in ["lazy", "eager", "record", "prefetch"] {
        for got in restore(&snap, r#"{"x":21}"#, paging, 5) {
            assert_eq!(got, want, "{paging}");
        }
    }
}

#[test]
fn a_node_function_holding_a_tcp_connection_is_refused() {
    let code = bundle(
        "node-tcp",
        &[
            (
                "index.js",
                "const net = require('net');\nconst srv = net.createServer(() => {});\n\
                 module.exports.ready = new Promise(r => srv.listen(0, '127.0.0.1', () => { \
                 const c = net.connect(srv.address().port, '127.0.0.1', r); }));\n\
                 exports.handler = async () => 1;\n",
            ),
            ("index.mjs.disabled", ""),
        ],
    );
    let out = scratch().join("node-tcp-snap");
    let o = thaw(&["snapshot", "create", "--runtime", "nodejs20.x", "--code", code.to_str().unwrap(), "--handler", "index.handler", "--out", out.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("cannot capture pid"), "{e}");
    assert!(e.contains("TCP socket"), "{e}");
    assert!(!out.exists());
}

/// A custom runtime (provided.al2023): the bundle's bootstrap speaks the Runtime API to
/// the bridge; it boots and answers, and a snapshot of it is refused with the reason.
#[test]
fn a_custom_runtime_boots_and_its_snapshot_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let code = bundle(
        "custom-runtime",
        &[(
            "bootstrap",
            "#!/usr/bin/python3\nimport json, os, urllib.request\n\
             api = 'http://' + os.environ['AWS_LAMBDA_RUNTIME_API'] + '/2018-06-01/runtime'\n\
             while True:\n\
             \x20   r = urllib.request.urlopen(api + '/invocation/next')\n\
             \x20   rid = r.headers['Lambda-Runtime-Aws-Request-Id']\n\
             \x20   body = json.dumps({'echo': json.loads(r.read()), 'handler': os.environ['_HANDLER']}).encode()\n\
             \x20   urllib.request.urlopen(urllib.request.Request(api + '/invocation/' + rid + '/response', data=body, method='POST'))\n",
        )],
    );
    std::fs::set_permissions(code.join("bootstrap"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = Fun { runtime: "provided.al2023", code, handler: "my.handler" };
    let out: serde_json::Value = serde_json::from_str(boot(&f, r#"{"x": 1}"#).trim()).unwrap();
    assert_eq!(out, serde_json::json!({"echo": {"x": 1}, "handler": "my.handler"}));
    let dir = scratch().join("snap-custom");
    let o = thaw(&["snapshot", "create", "--runtime", "provided.al2023", "--code", f.code.to_str().unwrap(), "--handler", "x", "--out", dir.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(common::stderr(&o).contains("provided.al2023 functions cannot be snapshotted yet"), "{}", common::stderr(&o));
    assert!(!dir.exists(), "nothing was written");
}
