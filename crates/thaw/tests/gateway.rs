//! `thaw gateway` with a real kube-apiserver and two `thaw serve --cluster` agents, which
//! publish their own ThawNodes: requests are authenticated at the gateway, placed from
//! those advertisements and forwarded with the client's own signature to the chosen
//! agent (which verifies it again); an agent that dies gives an immediate Lambda-shaped
//! 502, the other keeps serving; restarted, it republishes under a new boot and serves again.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use thaw_cluster::controlplane::{binary, ControlPlane, Options};

#[path = "../../store/tests/common/minio.rs"]
#[allow(dead_code)]
mod minio;
use thaw_node::sigv4::{sign, Credentials, SignedRequest};

mod netns;

const KEY: &str = "AKIDTHAWGATEWAYTEST1";
const SECRET: &str = "gateway-test-secret/0123456789abcdef";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The address a port listens on, for the helpers that take a port: an agent in a
/// network namespace of its own listens on its namespace's address (registered by
/// [`agent_in`]), everything else on 127.0.0.1.
static HOSTS: std::sync::Mutex<std::collections::BTreeMap<u16, String>> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn host(port: u16) -> String {
    HOSTS.lock().unwrap().get(&port).cloned().unwrap_or_else(|| "127.0.0.1".into())
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((host(port), port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "{what} exited");
        assert!(Instant::now() < deadline, "{what} not listening on {port} after 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let mut c = Command::new(binary("kubectl").unwrap_or_else(|e| panic!("{e}")))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The boot id agent `name` published (empty: none yet).
fn boot_id(cp: &ControlPlane, name: &str) -> String {
    kubectl(cp, &["get", "thawnode", name, "--ignore-not-found", "-o", "jsonpath={.status.bootId}"], None)
}

/// A signed Invoke through `port`: (status, headers lower-cased, body).
fn invoke(port: u16, function: &str, secret: &str) -> (u16, Vec<(String, String)>, String) {
    call(port, "POST", &format!("/2015-03-31/functions/{function}/invocations"), b"{\"name\": \"thaw\"}", secret)
}

/// A signed Lambda API request through `port`: (status, headers lower-cased, body).
fn call(port: u16, method: &str, path: &str, body: &[u8], secret: &str) -> (u16, Vec<(String, String)>, String) {
    call_as(port, method, path, body, secret, "RequestResponse")
}

/// [`call`] with `X-Amz-Invocation-Type: {kind}`.
fn call_as(port: u16, method: &str, path: &str, body: &[u8], secret: &str, kind: &str) -> (u16, Vec<(String, String)>, String) {
    let host = format!("{}:{port}", host(port));
    let base = vec![("host", host.as_str()), ("x-amz-invocation-type", kind)];
    let (raw_path, raw_query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    let req = SignedRequest { method, raw_path, raw_query, headers: base.clone(), body };
    let key = Credentials { access_key_id: KEY.into(), secret_access_key: secret.into() };
    let added = sign(&key, "us-east-1", "lambda", &req, SystemTime::now());
    let mut text = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in base.iter().map(|(k, v)| (*k, v.to_string())).chain(added) {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    let mut s = TcpStream::connect(&host).unwrap();
    s.write_all(text.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    answer(s)
}

/// Read a whole `connection: close` answer: (status, headers lower-cased, body).
fn answer(mut s: TcpStream) -> (u16, Vec<(String, String)>, String) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("a complete answer (never a hang)");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    (status, headers, body.to_string())
}

/// An unsigned GET of `path` through `port`: (status, headers lower-cased, body).
fn get(port: u16, path: &str) -> (u16, Vec<(String, String)>, String) {
    let h = host(port);
    let mut s = TcpStream::connect((h.as_str(), port)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: {h}:{port}\r\nconnection: close\r\n\r\n").as_bytes()).unwrap();
    answer(s)
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `thaw serve --cluster` as the agent of Node `name`, publishing with `kubeconfig`.
fn agent(dir: &Path, port: u16, name: &str, kubeconfig: &Path) -> Proc {
    agent_with(dir, port, name, kubeconfig, &[], &[])
}

/// [`agent`] with more arguments and environment.
fn agent_with(dir: &Path, port: u16, name: &str, kubeconfig: &Path, args: &[&str], env: &[(&str, String)]) -> Proc {
    agent_in(None, dir, port, name, kubeconfig, args, env)
}

/// [`agent_with`], in namespace `i` of `net` when given (it listens on that
/// namespace's address, which its ThawNode then advertises).
fn agent_in(net: Option<(&netns::Net, usize)>, dir: &Path, port: u16, name: &str, kubeconfig: &Path, args: &[&str], env: &[(&str, String)]) -> Proc {
    let mut c = match net {
        Some((net, i)) => {
            HOSTS.lock().unwrap().insert(port, net.addr(i));
            net.command(i, env!("CARGO_BIN_EXE_thaw"))
        }
        None => Command::new(env!("CARGO_BIN_EXE_thaw")),
    };
    c.args(["--data-dir", dir.to_str().unwrap(), "serve", "--listen", &format!("{}:{port}", host(port)), "--access-key-id", KEY, "--secret-access-key", SECRET])
        .args(["--cluster", "--node-name", name, "--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(args)
        .env_remove("THAW_ACCESS_KEY_ID")
        .env_remove("THAW_SECRET_ACCESS_KEY")
        .stdout(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut c = c.spawn().unwrap();
    wait_port(port, "thaw serve", &mut c);
    Proc(c)
}

/// `thaw gateway` on `port`, watching the apiserver of `kubeconfig`.
fn gateway(port: u16, kubeconfig: &Path) -> Proc {
    gateway_with(port, kubeconfig, &[], &[])
}

/// [`gateway`] with more arguments and environment.
fn gateway_with(port: u16, kubeconfig: &Path, args: &[&str], env: &[(&str, String)]) -> Proc {
    gateway_logged(port, kubeconfig, args, env, Stdio::inherit())
}

/// [`gateway_with`], its log (stderr) to `log`.
fn gateway_logged(port: u16, kubeconfig: &Path, args: &[&str], env: &[(&str, String)], log: impl Into<Stdio>) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_thaw"));
    c.args(["gateway", "--listen", &format!("127.0.0.1:{port}"), "--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(args)
        .env("THAW_ACCESS_KEY_ID", KEY)
        .env("THAW_SECRET_ACCESS_KEY", SECRET)
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut g = c.spawn().unwrap();
    wait_port(port, "thaw gateway", &mut g);
    Proc(g)
}

#[test]
fn gateway_forwards_to_the_placed_agent_and_fails_fast_when_it_dies() {
    let cp = ControlPlane::start(Options::default()).unwrap_or_else(|e| panic!("{e}"));
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/crd-thawnode.yaml");
    kubectl(&cp, &["apply", "--server-side", "-f", crd.to_str().unwrap()], None);
    kubectl(&cp, &["wait", "--for=condition=Established", "crd/thawnodes.thaw.dev", "--timeout=30s"], None);

    let tmp = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    // The Nodes the agents run on (their ThawNodes are owned by them).
    for i in 0..2 {
        kubectl(&cp, &["apply", "-f", "-"], Some(&format!("{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"agent-{i}\"}}}}")));
    }
    let kc = cp.kubeconfig();
    let start = |i: usize| agent(&tmp.path().join(format!("agent-{i}")), ports[i], &format!("agent-{i}"), &kc);
    let mut agents: Vec<Option<Proc>> = (0..2).map(|i| Some(start(i))).collect();
    // Each publishes its ThawNode before it takes work.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (0..2).any(|i| boot_id(&cp, &format!("agent-{i}")).is_empty()) {
        assert!(Instant::now() < deadline, "the agents did not publish their ThawNodes in 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let endpoint = kubectl(&cp, &["get", "thawnode", "agent-1", "-o", "jsonpath={.spec.endpoint}"], None);
    assert_eq!(endpoint, format!("http://127.0.0.1:{}", ports[1]), "the endpoint defaults to the address --listen bound");

    let gport = free_port();
    let _gateway = gateway(gport, &cp.kubeconfig());

    // Bad signature: refused by the gateway itself (no agent involved).
    let (status, h, _) = invoke(gport, "f-0", "wrong-secret");
    assert_eq!(status, 403);
    assert_eq!(header(&h, "x-amzn-errortype"), Some("InvalidSignatureException"));
    assert!(header(&h, "x-thaw-node").is_none());

    // Functions land on both agents (consistent hashing); each agent verified the
    // forwarded signature and answered itself (no such function deployed there: 404).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut on: [Option<String>; 2] = [None, None];
    let mut i = 0;
    while on.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "functions did not spread over both agents: {on:?}");
        let f = format!("f-{i}");
        i += 1;
        let (status, h, body) = invoke(gport, &f, SECRET);
        if status == 503 {
            std::thread::sleep(Duration::from_millis(200)); // view not loaded yet
            continue;
        }
        assert_eq!(status, 404, "{body}");
        assert_eq!(header(&h, "x-amzn-errortype"), Some("ResourceNotFoundException"), "{body}");
        assert!(body.contains(&format!("function:{f}")), "{body}");
        let node = header(&h, "x-thaw-node").expect("x-thaw-node").to_string();
        let idx: usize = node.strip_prefix("agent-").unwrap().parse().unwrap();
        on[idx].get_or_insert(f.clone());
        // Placement is stable: the same function goes to the same agent again.
        let (_, h2, _) = invoke(gport, &f, SECRET);
        assert_eq!(header(&h2, "x-thaw-node"), Some(node.as_str()));
    }

    // A cold start goes where the function's snapshot is: a function whose ring home is
    // agent 0, deployed on agent 1 alone (through agent 1's own API), is placed on agent 1
    // once its advertisement says it has the snapshot.
    let f0 = on[0].clone().unwrap();
    let zip = zip_of(tmp.path(), "cached.zip", &[("app.py", "def handler(event, context):\n    return 'cached here'\n")]);
    use base64::Engine;
    let create = serde_json::json!({"FunctionName": f0, "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "Code": {"ZipFile": base64::engine::general_purpose::STANDARD.encode(std::fs::read(&zip).unwrap())}});
    let (status, _, body) = call(ports[1], "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubectl(&cp, &["get", "thawnode", "agent-1", "-o", "jsonpath={.status.cachedSnapshots[*].function}"], None).split(' ').any(|f| f == f0) {
        assert!(Instant::now() < deadline, "agent-1 did not advertise the snapshot of {f0} in 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let body = invoke_until(gport, &f0, "placed where its snapshot is", |st, _| st == 200);
    assert!(body.contains("cached here"), "{body}");
    let (_, h, _) = invoke(gport, &f0, SECRET);
    assert_eq!(header(&h, "x-thaw-node"), Some("agent-1"), "placed where the snapshot is, not at its ring home");
    on[0] = None;
    let mut i = 1000;
    while on[0].is_none() {
        let f = format!("f-{i}");
        i += 1;
        let (_, h, _) = invoke(gport, &f, SECRET);
        if header(&h, "x-thaw-node") == Some("agent-0") {
            on[0] = Some(f);
        }
    }

    // A function URL needs no signature at the gateway (its agent enforces the URL's
    // AuthType) and goes where an Invoke of its function goes; no URL is configured
    // here, so the agent itself answers 404.
    for f in on.iter().flatten() {
        let (_, h, _) = invoke(gport, f, SECRET);
        let (status, uh, body) = get(gport, &format!("/url/{f}/some/path?x=1"));
        assert_eq!(status, 404, "{body}");
        assert_eq!(header(&uh, "x-thaw-node"), header(&h, "x-thaw-node"), "a URL of {f} was placed elsewhere");
    }

    // Agent 0 dies: connecting to it is refused, so the call never reached it; the
    // gateway leaves agent 0 out and places the call again, on agent 1 (none lost).
    drop(agents[0].take());
    let f0 = on[0].clone().unwrap();
    let (status, h, body) = invoke(gport, &f0, SECRET);
    assert_eq!((status, header(&h, "x-thaw-node")), (404, Some("agent-1")), "{body}");
    let (status, h, _) = invoke(gport, on[1].as_ref().unwrap(), SECRET);
    assert_eq!((status, header(&h, "x-thaw-node")), (404, Some("agent-1")));

    // Agent 0 comes back: it republishes under a new boot id, and its functions are
    // answered by it again.
    let old_boot = boot_id(&cp, "agent-0");
    agents[0] = Some(start(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    while boot_id(&cp, "agent-0") == old_boot {
        assert!(Instant::now() < deadline, "the restarted agent did not republish in 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, h, body) = invoke(gport, &f0, SECRET);
    assert_eq!((status, header(&h, "x-thaw-node")), (404, Some("agent-0")), "{body}");

    // An agent that takes the request and then fails (it may have run it): a
    // Lambda-shaped 502 at once, never a second run elsewhere. And a node whose
    // heartbeat is an hour old is never placed on.
    let broken = TcpListener::bind("127.0.0.1:0").unwrap();
    let bport = broken.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in broken.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf); // the request arrives; the agent "dies" before answering
        }
    });
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let secs = hour_ago.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let stale_time = k8s_openapi_time(secs);
    // (The silent node's endpoint is agent 1's, which answers: were it placed on, the
    // answer would come back named agent-stale.)
    for (name, port, beat) in [("agent-broken", bport, None), ("agent-stale", ports[1], Some(stale_time))] {
        let obj = format!("{{\"apiVersion\":\"thaw.dev/v1alpha1\",\"kind\":\"ThawNode\",\"metadata\":{{\"name\":\"{name}\"}},\"spec\":{{\"endpoint\":\"http://127.0.0.1:{port}\"}}}}");
        kubectl(&cp, &["apply", "-f", "-"], Some(&obj));
        let hb = beat.map(|t| format!(",\"heartbeatTime\":\"{t}\"")).unwrap_or_default();
        kubectl(&cp, &["patch", "thawnode", name, "--subresource=status", "--type=merge", "-p", &format!("{{\"status\":{{\"bootId\":\"b1\",\"freeInstances\":8{hb}}}}}")], None);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut hit_broken = false;
    let mut i = 0;
    while !hit_broken || i < 20 {
        assert!(Instant::now() < deadline, "no function was placed on agent-broken");
        let f = format!("g-{i}");
        i += 1;
        let (status, h, body) = invoke(gport, &f, SECRET);
        assert!(!body.contains("agent-stale") && header(&h, "x-thaw-node") != Some("agent-stale"), "placed on a silent node: {body}");
        if body.contains("node agent agent-broken") {
            assert_eq!(status, 502, "{body}");
            assert_eq!(header(&h, "x-amzn-errortype"), Some("ServiceException"));
            hit_broken = true;
        }
    }

    // The apiserver goes away: the gateway serves on from its last-known view.
    cp.stop();
    let (status, h, body) = invoke(gport, on[1].as_ref().unwrap(), SECRET);
    assert_eq!((status, header(&h, "x-thaw-node")), (404, Some("agent-1")), "{body}");
    drop(agents);
}

/// RFC 3339 UTC of `secs` since the epoch (what a ThawNode's heartbeatTime holds).
fn k8s_openapi_time(secs: u64) -> String {
    k8s_openapi::chrono::DateTime::from_timestamp(secs as i64, 0).unwrap().to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true)
}

/// A zip of `files` (name, text), made with Python's zipfile (as a user's tooling would).
fn zip_of(dir: &Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let out = dir.join(name);
    // A custom runtime's `bootstrap` is executable, as a user's zip would have it.
    let py = "import json, sys, zipfile\nz = zipfile.ZipFile(sys.argv[1], 'w')\nfor n, t in json.loads(sys.argv[2]):\n    \
              i = zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0))\n    i.external_attr = (0o100755 if n == 'bootstrap' else 0o100644) << 16\n    \
              z.writestr(i, t)\nz.close()\n";
    let files = serde_json::to_string(files).unwrap();
    let st = Command::new("python3").args(["-c", py, out.to_str().unwrap(), &files]).status().unwrap();
    assert!(st.success(), "making {name}");
    out
}

/// `thaw bundle push ZIP URL` with the store's environment: (key, sha256) from the `code:` block it prints.
fn bundle_push(m: &minio::Minio, zip: &Path, url: &str) -> (String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_thaw"));
    c.args(["bundle", "push", zip.to_str().unwrap(), url, "--create-bucket"]);
    for (k, v) in m.env() {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "thaw bundle push: {}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let field = |k: &str| out.lines().find_map(|l| l.trim().strip_prefix(k)).unwrap_or_else(|| panic!("no {k} in {out}")).trim().to_string();
    assert!(out.starts_with("code:\n"), "{out}");
    (field("key:"), field("sha256:"))
}

/// Invoke `function` through `port` until `done(status, body)` holds (deploys are
/// asynchronous: the agents fetch the bundle and build a snapshot).
fn invoke_until(port: u16, function: &str, what: &str, done: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _, body) = invoke(port, function, SECRET);
        if done(status, &body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}: still {status} {body} after 120 s");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A control plane with Thaw's CRDs, a MinIO, and three `thaw serve --cluster` agents
/// (Nodes `{name}-0`..`{name}-2`) sharing the store `s3://{bucket}` and the cluster's
/// snapshot key, each of which has published its ThawNode. Functions are applied to a
/// running cluster: an agent that has not published yet is not counted when a
/// function's builder is chosen (one that comes later only adds a build).
/// Each agent runs in a network namespace of its own, as on a machine of its own: the
/// apiserver and MinIO listen on the bridge that joins them (`net.host()`), the
/// gateways reach each agent at the address its ThawNode advertises. A fourth
/// namespace is left for an agent that joins later ([`LATE`]).
struct Cluster {
    m: minio::Minio,
    cp: ControlPlane,
    tmp: tempfile::TempDir,
    ports: [u16; 3],
    env: Vec<(&'static str, String)>,
    agents: Vec<Proc>,
    net: netns::Net,
}

/// The namespace of a cluster's agent that joins later.
const LATE: usize = 3;

fn cluster(name: &str, bucket: &str) -> Cluster {
    let net = netns::Net::new(LATE + 1);
    let m = minio::Minio::start_on(&net.host());
    let address = Some(net.host().parse().unwrap());
    let cp = ControlPlane::start(Options { address, ..Options::default() }).unwrap_or_else(|e| panic!("{e}"));
    for crd in ["thawnodes", "thawfunctions", "thawlayers"] {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../deploy/base/crd-{}.yaml", crd.trim_end_matches('s')));
        kubectl(&cp, &["apply", "--server-side", "-f", file.to_str().unwrap()], None);
        kubectl(&cp, &["wait", "--for=condition=Established", &format!("crd/{crd}.thaw.dev"), "--timeout=30s"], None);
    }
    let tmp = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let kc = cp.kubeconfig();
    let mut env: Vec<(&str, String)> = m.env();
    // The cluster's snapshot key, shared by the agents (deploy/: Secret thaw-node-key).
    env.push(("THAW_NODE_KEY", "5e".repeat(32)));
    let mut agents = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        kubectl(&cp, &["apply", "-f", "-"], Some(&format!("{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{name}-{i}\"}}}}")));
        // Room for 16 concurrent calls of one function on one agent (the kill tests);
        // /metrics to the test, a peer on the bridge (as the DaemonSet serves it to Prometheus).
        let store = ["--snapshot-store", &format!("s3://{bucket}"), "--create-bucket", "--max-instances-per-function", "16", "--metrics-public"];
        agents.push(agent_in(Some((&net, i)), &tmp.path().join(format!("{name}-{i}")), *port, &format!("{name}-{i}"), &kc, &store, &env));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while kubectl(&cp, &["get", "thawnodes", "-o", "jsonpath={range .items[*]}{.status.bootId} {end}"], None).split_whitespace().count() < 3 {
        assert!(Instant::now() < deadline, "the agents did not publish their ThawNodes");
        std::thread::sleep(Duration::from_millis(100));
    }
    Cluster { m, cp, tmp, ports, env, agents, net }
}

/// The registry (issue #29; three agents, two gateways): a ThawFunction applied with kubectl is deployed on every
/// agent from its bundle in the store and answers through the gateway; new code in
/// the object is deployed; a bundle whose bytes do not match the object's sha256 is
/// never deployed; deleting the object deletes the function. Through two gateways, the
/// Lambda API writes the registry (create through one, invoke through the other), 1,008
/// calls survive an agent killed midway, and the apiserver away refuses writes only.
#[test]
fn a_thawfunction_applied_is_deployed_on_every_agent_and_answers_through_the_gateway() {
    let Cluster { m, cp, tmp, ports, env, mut agents, net: _net } = cluster("reg", "registry");
    let kc = cp.kubeconfig();
    // Two gateways: what one writes, the other serves (they share nothing but the apiserver).
    let (gport, gport2) = (free_port(), free_port());
    let gateway1 = gateway_with(gport, &kc, &["--snapshot-store", "s3://registry"], &env);
    let _gateway2 = gateway_with(gport2, &kc, &["--snapshot-store", "s3://registry"], &env);

    let v1 = zip_of(tmp.path(), "v1.zip", &[("app.py", "def handler(event, context):\n    return {'from': 'registry', 'v': 1}\n")]);
    let v2 = zip_of(tmp.path(), "v2.zip", &[("app.py", "def handler(event, context):\n    return {'from': 'registry', 'v': 2}\n")]);
    let (key1, sha1) = bundle_push(&m, &v1, "s3://registry");
    let (key2, sha2) = bundle_push(&m, &v2, "s3://registry");
    assert_eq!(key1, format!("bundles/{sha1}.zip"));
    let thawfunction = |name: &str, key: &str, sha: &str| {
        format!("{{\"apiVersion\":\"thaw.dev/v1alpha1\",\"kind\":\"ThawFunction\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"default\"}},\
                 \"spec\":{{\"runtime\":\"python3.12\",\"handler\":\"app.handler\",\"code\":{{\"key\":\"{key}\",\"sha256\":\"{sha}\"}}}}}}")
    };
    // One whose bundle does not match its sha256 (v1's bytes under v2's hash), applied first.
    kubectl(&cp, &["apply", "-f", "-"], Some(&thawfunction("a-mismatched", &key1, &sha2)));
    kubectl(&cp, &["apply", "-f", "-"], Some(&thawfunction("hello", &key1, &sha1)));
    kubectl(&cp, &["apply", "-f", "-"], Some(&thawfunction("keep", &key1, &sha1)));
    let body = invoke_until(gport, "hello", "the ThawFunction deployed", |st, _| st == 200);
    assert!(body.contains("\"v\": 1") && body.contains("registry"), "{body}");
    // Every agent has it (each fetched the bundle; one built the snapshot).
    for port in ports {
        invoke_until(port, "hello", "deployed on each agent", |st, b| st == 200 && b.contains("\"v\": 1"));
        invoke_until(port, "keep", "keep deployed on each agent", |st, _| st == 200);
    }
    // One build per function in the cluster: its builder (its home on the placement
    // ring) captured and published the snapshot and recorded it in the status; the
    // other agents serve from what it published (the same zip unpacks to the same
    // bundle fingerprint on every agent).
    let names: Vec<String> = (0..3).map(|i| format!("reg-{i}")).collect();
    for f in ["hello", "keep"] {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            let st = kubectl(&cp, &["get", "thawfunction", f, "-o", "jsonpath={.status.snapshot.builtBy} {.status.snapshot.id} {.status.conditions[0].status}"], None);
            if st.split(' ').count() == 3 && !st.starts_with(' ') {
                break st;
            }
            assert!(Instant::now() < deadline, "{f}: no snapshot recorded in the status: {st:?}");
            std::thread::sleep(Duration::from_millis(200));
        };
        let builder = thaw_cluster::follow::builder_of(f, &names).unwrap();
        assert!(status.starts_with(&format!("{builder} ")) && status.ends_with(" True"), "{f}: {status}");
    }
    let builds = |how: &str| -> u64 {
        ports
            .iter()
            .map(|&p| {
                let (_, _, body) = get(p, "/metrics");
                let line = format!("thaw_snapshot_builds_total{{how=\"{how}\"}} ");
                body.lines().find_map(|l| l.strip_prefix(line.as_str())).map_or(0, |n| n.trim().parse().unwrap())
            })
            .sum()
    };
    assert_eq!((builds("captured"), builds("adopted")), (2, 4), "hello and keep: each captured once, adopted by the two other agents");
    let listed = kubectl(&cp, &["get", "thawfunctions", "-A"], None);
    assert!(listed.contains("hello") && listed.contains("python3.12"), "{listed}");
    // The mismatched one (first in name order) was tried before hello, and refused.
    for port in ports {
        let (status, h, body) = invoke(port, "a-mismatched", SECRET);
        assert_eq!((status, header(&h, "x-amzn-errortype")), (404, Some("ResourceNotFoundException")), "{body}");
    }

    // A function whose init fails: its builder says so in the status (Ready False,
    // BuildFailed, the error), and the other agents do not wait for a snapshot that
    // will not come (well within the 60 s they would wait for a silent builder).
    let broken = zip_of(tmp.path(), "broken.zip", &[("app.py", "raise RuntimeError('boom at init')\n")]);
    let (bkey, bsha) = bundle_push(&m, &broken, "s3://registry");
    kubectl(&cp, &["apply", "-f", "-"], Some(&thawfunction("broken", &bkey, &bsha)));
    let deadline = Instant::now() + Duration::from_secs(45);
    let status = loop {
        let st = kubectl(&cp, &["get", "thawfunction", "broken", "-o", "jsonpath={.status.conditions[0].status} {.status.conditions[0].reason} {.status.conditions[0].message}"], None);
        if st.starts_with("False BuildFailed") {
            break st;
        }
        assert!(Instant::now() < deadline, "no failed build in the status: {st:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.contains("boom at init"), "{status}");
    for port in ports {
        loop {
            let (_, _, body) = call(port, "GET", "/2015-03-31/functions/broken/configuration", b"", SECRET);
            if body.contains("\"State\":\"Failed\"") {
                assert!(body.contains("boom at init"), "{body}");
                break;
            }
            assert!(Instant::now() < deadline, "an agent still waits: {body}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    kubectl(&cp, &["delete", "thawfunction", "broken"], None);

    // A custom runtime (not snapshotted): every agent deploys it at once and serves it by
    // cold boots, none waits for a snapshot that will not come (they would for 60 s);
    // its builder says so in the status (Ready True, ColdBoot).
    let bootstrap = "#!/usr/bin/python3\nimport json, os, urllib.request\n\
                     api = 'http://' + os.environ['AWS_LAMBDA_RUNTIME_API'] + '/2018-06-01/runtime'\n\
                     while True:\n\
                     \x20   r = urllib.request.urlopen(api + '/invocation/next')\n\
                     \x20   rid = r.headers['Lambda-Runtime-Aws-Request-Id']\n\
                     \x20   body = json.dumps({'custom': os.environ['_HANDLER']}).encode()\n\
                     \x20   urllib.request.urlopen(urllib.request.Request(api + '/invocation/' + rid + '/response', data=body, method='POST'))\n";
    let custom = zip_of(tmp.path(), "custom.zip", &[("bootstrap", bootstrap)]);
    let (ckey, csha) = bundle_push(&m, &custom, "s3://registry");
    let applied = Instant::now();
    kubectl(&cp, &["apply", "-f", "-"], Some(&thawfunction("custom", &ckey, &csha).replace("python3.12", "provided.al2023")));
    for port in ports {
        let body = invoke_until(port, "custom", "the custom runtime on each agent", |st, _| st == 200);
        assert!(body.contains("\"custom\": \"app.handler\""), "{body}");
    }
    let waited = applied.elapsed();
    assert!(waited < thaw_cluster::follow::BUILD_WAIT / 2, "an agent waited for a build: {waited:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = kubectl(&cp, &["get", "thawfunction", "custom", "-o", "jsonpath={.status.conditions[0].status} {.status.conditions[0].reason} {.status.snapshot.id}"], None);
        if st.trim() == "True ColdBoot" {
            break;
        }
        assert!(Instant::now() < deadline, "not recorded as served by cold boots: {st:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    kubectl(&cp, &["delete", "thawfunction", "custom"], None);

    // New code in the object: deployed.
    kubectl(&cp, &["patch", "thawfunction", "hello", "--type=merge", "-p", &format!("{{\"spec\":{{\"code\":{{\"key\":\"{key2}\",\"sha256\":\"{sha2}\"}}}}}}")], None);
    invoke_until(gport, "hello", "the new code deployed", |st, b| st == 200 && b.contains("\"v\": 2"));
    for port in ports {
        invoke_until(port, "hello", "the new code on each agent", |st, b| st == 200 && b.contains("\"v\": 2"));
    }
    assert_eq!((builds("captured"), builds("adopted")), (3, 6), "the update built once too, by the same builder");

    // Environment from a Secret and a ConfigMap (valueFrom), read by each agent once per
    // generation of the object, as a pod reads them when it starts. One that names a
    // missing key is deployed nowhere until the key exists.
    let envy = zip_of(tmp.path(), "envy.zip", &[("app.py", "import os\n\ndef handler(event, context):\n    return [os.environ.get(k) for k in ('PLAIN', 'TOKEN', 'MODE')]\n")]);
    let (ekey, esha) = bundle_push(&m, &envy, "s3://registry");
    kubectl(&cp, &["create", "secret", "generic", "fn-env", "--from-literal=token=s3cr3t"], None);
    kubectl(&cp, &["create", "configmap", "fn-conf", "--from-literal=mode=fast"], None);
    let with_env = |name: &str, plain: &str, secret_key: &str| {
        format!("{{\"apiVersion\":\"thaw.dev/v1alpha1\",\"kind\":\"ThawFunction\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"default\"}},\
                 \"spec\":{{\"runtime\":\"python3.12\",\"handler\":\"app.handler\",\"code\":{{\"key\":\"{ekey}\",\"sha256\":\"{esha}\"}},\
                 \"env\":[{{\"name\":\"PLAIN\",\"value\":\"{plain}\"}},\
                          {{\"name\":\"TOKEN\",\"valueFrom\":{{\"secretKeyRef\":{{\"name\":\"fn-env\",\"key\":\"{secret_key}\"}}}}}},\
                          {{\"name\":\"MODE\",\"valueFrom\":{{\"configMapKeyRef\":{{\"name\":\"fn-conf\",\"key\":\"mode\"}}}}}}]}}}}")
    };
    kubectl(&cp, &["apply", "-f", "-"], Some(&with_env("envy", "p1", "token")));
    kubectl(&cp, &["apply", "-f", "-"], Some(&with_env("envless", "p1", "later")));
    for port in ports {
        invoke_until(port, "envy", "env from a Secret and a ConfigMap", |st, b| st == 200 && b.contains(r#"["p1", "s3cr3t", "fast"]"#));
    }
    invoke_until(gport2, "envy", "through the gateway", |st, b| st == 200 && b.contains(r#"["p1", "s3cr3t", "fast"]"#));
    for port in ports {
        let (status, _, body) = invoke(port, "envless", SECRET);
        assert_eq!(status, 404, "a function whose Secret lacks the key is not deployed: {body}");
    }
    kubectl(&cp, &["patch", "secret", "fn-env", "-p", r#"{"stringData": {"later": "now-here", "token": "rotated"}}"#], None);
    for port in ports {
        invoke_until(port, "envless", "deployed once the key exists", |st, b| st == 200 && b.contains(r#"["p1", "now-here", "fast"]"#));
    }
    // The Secret changed under envy: its running generation keeps what it read; the
    // next generation reads it again.
    let (_, _, body) = invoke(ports[0], "envy", SECRET);
    assert!(body.contains(r#"["p1", "s3cr3t", "fast"]"#), "read once per generation: {body}");
    kubectl(&cp, &["apply", "-f", "-"], Some(&with_env("envy", "p2", "token")));
    for port in ports {
        invoke_until(port, "envy", "the next generation reads the Secret again", |st, b| st == 200 && b.contains(r#"["p2", "rotated", "fast"]"#));
    }
    assert_eq!((builds("captured"), builds("adopted")), (6, 12), "still one build per generation in the cluster (envy twice, envless once)");

    // Deleted: gone from every agent.
    kubectl(&cp, &["delete", "thawfunction", "hello"], None);
    for port in ports {
        invoke_until(port, "hello", "the function deleted with its ThawFunction", |st, _| st == 404);
    }

    // The Lambda API at the gateway writes the registry: CreateFunction puts the bundle
    // into the store and the ThawFunction into the apiserver; the agents deploy it.
    use base64::Engine;
    let b64 = |p: &Path| base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap());
    let create = serde_json::json!({"FunctionName": "viaapi", "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "MemorySize": 256, "Environment": {"Variables": {"GREETING": "hi"}}, "Code": {"ZipFile": b64(&v1)}});
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((created["FunctionName"].as_str(), created["State"].as_str(), created["MemorySize"].as_u64()), (Some("viaapi"), Some("Pending"), Some(256)), "{body}");
    let spec = kubectl(&cp, &["get", "thawfunction", "viaapi", "-o", "jsonpath={.spec.memory} {.spec.code.sha256} {.spec.env[0].value}"], None);
    assert_eq!(spec, format!("256 {sha1} hi"), "the ThawFunction holds the function");
    let (status, h, body) = call(gport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!((status, header(&h, "x-amzn-errortype")), (409, Some("ResourceConflictException")), "{body}");
    invoke_until(gport2, "viaapi", "the function created through one gateway, invoked through the other", |st, b| st == 200 && b.contains("\"v\": 1"));
    invoke_until(gport, "viaapi", "the function created through the gateway", |st, b| st == 200 && b.contains("\"v\": 1"));
    let (status, _, body) = call(gport, "GET", "/2015-03-31/functions/viaapi", b"", SECRET);
    assert!(status == 200 && body.contains("\"State\":\"Active\""), "GetFunction answered by an agent that has it: {status} {body}");
    let (status, _, body) = call(gport, "GET", "/2015-03-31/functions/", b"", SECRET);
    assert!(status == 200 && body.contains("\"FunctionName\":\"viaapi\"") && !body.contains("\"FunctionName\":\"hello\""), "{status} {body}");
    // New code, a new configuration, then deleted.
    let update = serde_json::json!({"ZipFile": b64(&v2)});
    let (status, _, body) = call(gport, "PUT", "/2015-03-31/functions/viaapi/code", update.to_string().as_bytes(), SECRET);
    assert_eq!(status, 200, "{body}");
    invoke_until(gport, "viaapi", "the code updated through the gateway", |st, b| st == 200 && b.contains("\"v\": 2"));
    let configure = serde_json::json!({"MemorySize": 512, "Environment": {"Variables": {"GREETING": "hello"}}});
    let (status, _, body) = call(gport, "PUT", "/2015-03-31/functions/viaapi/configuration", configure.to_string().as_bytes(), SECRET);
    assert!(status == 200 && body.contains("\"MemorySize\":512"), "{status} {body}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _, body) = call(ports[0], "GET", "/2015-03-31/functions/viaapi/configuration", b"", SECRET);
        if status == 200 && body.contains("\"MemorySize\":512") && body.contains("\"GREETING\":\"hello\"") {
            break;
        }
        assert!(Instant::now() < deadline, "the new configuration did not reach the agent: {status} {body}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, _, body) = call(gport, "DELETE", "/2015-03-31/functions/viaapi", b"", SECRET);
    assert_eq!(status, 204, "{body}");
    assert!(kubectl(&cp, &["get", "thawfunctions", "-A", "-o", "name"], None).lines().all(|l| !l.ends_with("/viaapi")), "the ThawFunction is deleted");
    invoke_until(gport, "viaapi", "the function deleted through the gateway", |st, _| st == 404);
    let (status, h, _) = call(gport, "DELETE", "/2015-03-31/functions/viaapi", b"", SECRET);
    assert_eq!((status, header(&h, "x-amzn-errortype")), (404, Some("ResourceNotFoundException")));

    // 1,000 invocations from 16 clients, agent 0 killed midway: every answer is the
    // function's or an explicit Lambda-shaped 5xx, and none is lost (each client gets an
    // answer to every call; a dead agent's calls are placed again or fail at once).
    invoke_until(gport, "keep", "keep deployed", |st, _| st == 200);
    for port in ports {
        invoke_until(port, "keep", "keep deployed on each agent", |st, _| st == 200);
    }
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let outcomes: Vec<Vec<(u16, Option<String>, bool)>> = std::thread::scope(|sc| {
        let clients: Vec<_> = (0..16)
            .map(|_| {
                sc.spawn(|| {
                    (0..63)
                        .map(|_| {
                            let (status, h, body) = invoke(gport, "keep", SECRET);
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            (status, header(&h, "x-amzn-errortype").map(str::to_string), body.contains("registry"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        while answered.load(std::sync::atomic::Ordering::Relaxed) < 300 {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(agents.remove(0));
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let all: Vec<_> = outcomes.iter().flatten().collect();
    assert_eq!(all.len(), 16 * 63, "an answer to every call");
    for (status, kind, theirs) in &all {
        assert!((*status == 200 && *theirs) || (*status >= 500 && kind.is_some()), "neither the function's answer nor an explicit 5xx: {status} {kind:?}");
    }
    let ok = all.iter().filter(|(s, _, _)| *s == 200).count();
    eprintln!("1,008 calls, agent 0 killed after 300: {ok} answered by the function, {} explicit 5xx", all.len() - ok);
    assert!(outcomes.iter().all(|c| c.last().is_some_and(|(s, _, _)| *s == 200)), "after the kill, agent 1 answers: {:?}", outcomes.iter().map(|c| c.last()).collect::<Vec<_>>());

    // A gateway killed: the other serves on (they share nothing but the apiserver).
    drop(gateway1);
    let (status, _, body) = invoke(gport2, "keep", SECRET);
    assert_eq!(status, 200, "the other gateway: {body}");
    assert!(TcpStream::connect(("127.0.0.1", gport)).is_err(), "the killed gateway is gone");
    let _gateway1 = gateway_with(gport, &kc, &["--snapshot-store", "s3://registry"], &env);

    // The apiserver goes away: what is deployed is still served; writes to the registry
    // are refused with a clear error.
    cp.stop();
    let (status, _, body) = invoke(gport, "keep", SECRET);
    assert_eq!(status, 200, "served from the last-known state: {body}");
    let again = serde_json::json!({"FunctionName": "later", "Runtime": "python3.12", "Role": "r", "Handler": "app.handler", "Code": {"ZipFile": b64(&v1)}});
    let (status, h, body) = call(gport, "POST", "/2015-03-31/functions", again.to_string().as_bytes(), SECRET);
    assert_eq!((status, header(&h, "x-amzn-errortype")), (503, Some("ServiceException")), "{body}");
    assert!(body.contains("the registry (apiserver) is unavailable"), "{body}");
    drop(agents);
}

/// A signed asynchronous Invoke (`X-Amz-Invocation-Type: Event`) through `port`.
fn invoke_event(port: u16, function: &str, payload: &[u8]) -> (u16, Vec<(String, String)>, String) {
    call_as(port, "POST", &format!("/2015-03-31/functions/{function}/invocations"), payload, SECRET, "Event")
}

/// Asynchronous invocations through the gateways (issue #29): each event is queued in
/// the store before its 202 and runs at least once although an agent and the gateway
/// that took half of them are killed while they run (the other gateway takes over the
/// dead one's events once their lease has run out); a failing function is retried
/// twice, then dropped; what Lambda refuses at once is refused at once. The proof that
/// an event ran is the function's own answer, with the event's nonce, in a gateway's log.
#[test]
fn asynchronous_events_run_at_least_once_whichever_agent_or_gateway_dies() {
    let Cluster { m, cp, tmp, ports, env, mut agents, net: _net } = cluster("ev", "events");
    let kc = cp.kubeconfig();
    // Leases of 3 s (a dead gateway's events are taken over within ~4 s), retries after 0.2 s.
    let gw_args = ["--snapshot-store", "s3://events", "--event-lease", "3", "--event-retry-delay", "0.2"];
    let mut gw_env = env.clone();
    gw_env.push(("THAW_LOG", "warn,thaw_cluster=debug".into()));
    let logs = [tmp.path().join("gateway-0.log"), tmp.path().join("gateway-1.log")];
    let (gport, gport2) = (free_port(), free_port());
    let gateway0 = gateway_logged(gport, &kc, &gw_args, &gw_env, std::fs::File::create(&logs[0]).unwrap());
    let _gateway1 = gateway_logged(gport2, &kc, &gw_args, &gw_env, std::fs::File::create(&logs[1]).unwrap());
    let code = "import time\n\
                def handler(event, context):\n\
                \x20   if event.get('fail'):\n\
                \x20       raise RuntimeError('failing on purpose ' + event['nonce'])\n\
                \x20   time.sleep(event.get('sleep', 0))\n\
                \x20   return {'ran': event['nonce']}\n";
    let zip = zip_of(tmp.path(), "events.zip", &[("app.py", code)]);
    use base64::Engine;
    let create = serde_json::json!({"FunctionName": "events", "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "Code": {"ZipFile": base64::engine::general_purpose::STANDARD.encode(std::fs::read(&zip).unwrap())}});
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    for port in ports {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, _, body) = call(port, "POST", "/2015-03-31/functions/events/invocations", b"{\"nonce\": \"warm\"}", SECRET);
            if status == 200 && body.contains("\"ran\": \"warm\"") {
                break;
            }
            assert!(Instant::now() < deadline, "the function on each agent: {status} {body}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    // Refused at once, as Lambda refuses them: a payload that is not JSON, one over
    // 256 KiB, a function nobody has.
    let (status, h, body) = invoke_event(gport, "events", b"not json");
    assert_eq!((status, header(&h, "x-amzn-errortype")), (400, Some("InvalidRequestContentException")), "{body}");
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(300 << 10));
    let (status, h, body) = invoke_event(gport, "events", big.as_bytes());
    assert_eq!((status, header(&h, "x-amzn-errortype")), (413, Some("RequestEntityTooLargeException")), "{body}");
    let (status, h, body) = invoke_event(gport, "nosuch", b"{}");
    assert_eq!((status, header(&h, "x-amzn-errortype")), (404, Some("ResourceNotFoundException")), "{body}");

    // 60 events through both gateways, then agent 0 and gateway 0 killed while they run.
    let nonces: Vec<String> = (0..60).map(|i| format!("n{i:03}x")).collect();
    for (i, n) in nonces.iter().enumerate() {
        let port = if i % 2 == 0 { gport } else { gport2 };
        let (status, h, body) = invoke_event(port, "events", format!("{{\"nonce\": \"{n}\", \"sleep\": 0.5}}").as_bytes());
        assert_eq!(status, 202, "{body}");
        assert!(header(&h, "x-amzn-requestid").is_some_and(|r| !r.is_empty()));
    }
    // One whose function fails every time: retried twice, then dropped.
    let (status, _, body) = invoke_event(gport2, "events", b"{\"nonce\": \"fails\", \"fail\": true}");
    assert_eq!(status, 202, "{body}");
    std::thread::sleep(Duration::from_millis(300));
    drop(agents.remove(0));
    drop(gateway0);

    let store = thaw_store::Store::open(
        &thaw_store::StoreUrl::parse("s3://events").unwrap(),
        &thaw_store::StoreConfig { endpoint: Some(m.endpoint()), access_key_id: Some(minio::ACCESS_KEY.into()), secret_access_key: Some(minio::SECRET_KEY.into()), ..Default::default() },
    )
    .unwrap();
    let store = std::sync::Arc::new(store);
    let queue = thaw_store::events::EventQueue::new(store.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    let ran = |n: &str| logs.iter().any(|l| std::fs::read_to_string(l).unwrap().lines().any(|line| line.contains("event ran") && line.contains(&format!("\\\"ran\\\": \\\"{n}\\\""))));
    loop {
        let left = store.block_on(queue.ids()).unwrap().len();
        let missing: Vec<&String> = nonces.iter().filter(|n| !ran(n)).collect();
        if left == 0 && missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "after 90 s: {left} events still queued; never ran: {missing:?}\n{}", std::fs::read_to_string(&logs[1]).unwrap());
        std::thread::sleep(Duration::from_millis(500));
    }
    let log1 = std::fs::read_to_string(&logs[1]).unwrap();
    let log0 = std::fs::read_to_string(&logs[0]).unwrap();
    let taken = log1.lines().filter(|l| l.contains("took over an event")).count();
    eprintln!("60 events, agent 0 and gateway 0 killed 0.3 s after: every one ran; gateway 1 took over {taken} of gateway 0's");
    assert!(taken > 0, "gateway 0 was killed holding events, so gateway 1 took some over:\n{log1}");
    let dropped: Vec<&str> = log1.lines().filter(|l| l.contains("event dropped after its last attempt")).collect();
    assert!(dropped.len() == 1 && dropped[0].contains("attempts=3") && dropped[0].contains("failing on purpose fails"), "{log1}");
    assert_eq!(log1.matches("event failed; will retry").count(), 2, "two retries:\n{log1}");
    assert!(!log0.contains("panicked") && !log1.contains("panicked"));

    // The store down: an event cannot be made durable, so the caller gets a clear 5xx
    // (to retry), never a 202 for an event that would be lost.
    let mut m = m;
    m.stop();
    let (status, h, body) = invoke_event(gport2, "events", b"{\"nonce\": \"store-down\"}");
    assert_eq!((status, header(&h, "x-amzn-errortype")), (503, Some("ServiceException")), "{body}");
    assert!(body.contains("could not be queued"), "{body}");
    drop(agents);
}

/// Call `method path` through `port` until `done(status, body)` holds (the agents
/// deploy what the registry holds asynchronously).
fn call_until(port: u16, method: &str, path: &str, what: &str, done: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _, body) = call(port, method, path, b"{}", SECRET);
        if done(status, &body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}: still {status} {body} after 120 s");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Versions through the gateway (issue #29): PublishVersion writes the version's own
/// ThawFunction, numbered by the registry (never a number twice, the same version
/// again when nothing changed, CodeSha256 checked); every agent serves each version
/// under its number, also one that joins after $LATEST has moved on (it builds the old
/// version from its bundle); ListVersionsByFunction lists them; a deleted version is
/// gone everywhere; deleting the function deletes its versions. Aliases written through
/// the gateway reach every agent (a version, then another, then a weighted split whose
/// both sides answer); a version an alias routes to cannot be deleted; a deleted alias
/// is gone everywhere. Tags and function URL configurations written through the gateway
/// are on every agent's function.
#[test]
fn versions_and_aliases_through_the_gateway_are_served_by_every_agent() {
    let Cluster { m: _m, cp, tmp, ports, env, mut agents, net } = cluster("ver", "versions");
    let kc = cp.kubeconfig();
    let gport = free_port();
    let _gateway = gateway_with(gport, &kc, &["--snapshot-store", "s3://versions"], &env);
    use base64::Engine;
    let zip = |v: u32| {
        let z = zip_of(tmp.path(), &format!("v{v}.zip"), &[("app.py", &format!("def handler(event, context):\n    return {{'v': {v}}}\n"))]);
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(z).unwrap())
    };
    let create = serde_json::json!({"FunctionName": "pv", "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "Code": {"ZipFile": zip(1)}});
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    let invocation = |q: &str| format!("/2015-03-31/functions/pv{q}/invocations");
    for port in ports {
        call_until(port, "POST", &invocation(""), "pv on each agent", |st, b| st == 200 && b.contains("\"v\": 1"));
    }
    let publish = |body: &str| {
        let (status, h, out) = call(gport, "POST", "/2015-03-31/functions/pv/versions", body.as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default())
    };
    let (status, _, v) = publish("{\"Description\": \"first\"}");
    assert_eq!((status, v["Version"].as_str(), v["Description"].as_str()), (201, Some("1"), Some("first")), "{v}");
    assert!(v["FunctionArn"].as_str().unwrap().ends_with(":function:pv:1"), "{v}");
    let (status, _, v) = publish("");
    assert_eq!((status, v["Version"].as_str()), (201, Some("1")), "nothing changed: the same version: {v}");
    let (status, kind, _) = publish("{\"CodeSha256\": \"not-the-code\"}");
    assert_eq!((status, kind.as_deref()), (412, Some("PreconditionFailedException")));

    // New code, then version 2; both versions answer on every agent, under their numbers.
    let (status, _, body) = call(gport, "PUT", "/2015-03-31/functions/pv/code", serde_json::json!({"ZipFile": zip(2)}).to_string().as_bytes(), SECRET);
    assert_eq!(status, 200, "{body}");
    for port in ports {
        call_until(port, "POST", &invocation(""), "the new code on each agent", |st, b| st == 200 && b.contains("\"v\": 2"));
    }
    let (status, _, v) = publish("");
    assert_eq!((status, v["Version"].as_str()), (201, Some("2")), "{v}");
    let objects = kubectl(&cp, &["get", "thawfunctions", "-o", "name"], None);
    assert!(objects.contains("/pv.v1") && objects.contains("/pv.v2"), "a ThawFunction per version: {objects}");
    for port in ports.iter().copied().chain([gport]) {
        call_until(port, "POST", &invocation(":1"), "version 1", |st, b| st == 200 && b.contains("\"v\": 1"));
        call_until(port, "POST", &invocation(":2"), "version 2", |st, b| st == 200 && b.contains("\"v\": 2"));
        call_until(port, "POST", &invocation(""), "$LATEST", |st, b| st == 200 && b.contains("\"v\": 2"));
    }
    let (status, _, body) = call(gport, "GET", "/2015-03-31/functions/pv/versions", b"", SECRET);
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let numbers: Vec<&str> = listed["Versions"].as_array().unwrap().iter().filter_map(|v| v["Version"].as_str()).collect();
    assert_eq!((status, numbers), (200, vec!["$LATEST", "1", "2"]), "{body}");

    // Aliases: in the registry, put on every agent, routed by the agent that runs the call.
    let alias = |method: &str, path: &str, body: serde_json::Value| {
        let (status, h, out) = call(gport, method, &format!("/2015-03-31/functions/pv/aliases{path}"), body.to_string().as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default())
    };
    let (status, _, a) = alias("POST", "", serde_json::json!({"Name": "live", "FunctionVersion": "1", "Description": "prod"}));
    assert_eq!((status, a["FunctionVersion"].as_str()), (201, Some("1")), "{a}");
    assert!(a["AliasArn"].as_str().unwrap().ends_with(":function:pv:live"), "{a}");
    assert_eq!(alias("POST", "", serde_json::json!({"Name": "live", "FunctionVersion": "1"})).1.as_deref(), Some("ResourceConflictException"));
    assert_eq!(alias("POST", "", serde_json::json!({"Name": "next", "FunctionVersion": "9"})).0, 404, "no version 9");
    for port in ports.iter().copied().chain([gport]) {
        call_until(port, "POST", &invocation(":live"), "live -> 1", |st, b| st == 200 && b.contains("\"v\": 1"));
    }
    let (status, _, a) = alias("PUT", "/live", serde_json::json!({"FunctionVersion": "2"}));
    assert_eq!((status, a["FunctionVersion"].as_str(), a["Description"].as_str()), (200, Some("2"), Some("prod")), "{a}");
    for port in ports.iter().copied().chain([gport]) {
        call_until(port, "POST", &invocation(":live"), "live -> 2", |st, b| st == 200 && b.contains("\"v\": 2"));
    }
    // Half the calls to version 1: both answer through the gateway.
    let (status, _, a) = alias("PUT", "/live", serde_json::json!({"FunctionVersion": "2", "RoutingConfig": {"AdditionalVersionWeights": {"1": 0.5}}}));
    assert_eq!(status, 200, "{a}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut ones, mut twos) = (0, 0);
    while ones == 0 || twos == 0 {
        assert!(Instant::now() < deadline, "the routing did not reach the agents: {ones} x v1, {twos} x v2");
        let (_, _, b) = call(gport, "POST", &invocation(":live"), b"{}", SECRET);
        ones += usize::from(b.contains("\"v\": 1"));
        twos += usize::from(b.contains("\"v\": 2"));
    }
    let (status, _, got) = alias("GET", "/live", serde_json::json!({}));
    assert_eq!((status, got["RoutingConfig"]["AdditionalVersionWeights"]["1"].as_f64()), (200, Some(0.5)), "{got}");
    let (_, _, listed) = alias("GET", "", serde_json::json!({}));
    assert_eq!(listed["Aliases"].as_array().map(Vec::len), Some(1), "{listed}");

    // Tags: in the registry, on every agent's function.
    let tags = format!("/2017-03-31/tags/{}", got["AliasArn"].as_str().unwrap().trim_end_matches(":live"));
    let (status, _, body) = call(gport, "POST", &tags, b"{\"Tags\": {\"team\": \"a\", \"tier\": \"gold\"}}", SECRET);
    assert_eq!(status, 204, "{body}");
    let (status, h, body) = call(gport, "POST", &tags, b"{\"Tags\": {\"aws:reserved\": \"x\"}}", SECRET);
    assert_eq!((status, header(&h, "x-amzn-errortype")), (400, Some("InvalidParameterValueException")), "{body}");
    let (status, _, body) = call(gport, "DELETE", &format!("{tags}?tagKeys=tier"), b"", SECRET);
    assert_eq!(status, 204, "{body}");
    let (status, _, body) = call(gport, "GET", &tags, b"", SECRET);
    assert_eq!((status, body.as_str()), (200, "{\"Tags\":{\"team\":\"a\"}}"));
    for port in ports {
        call_until(port, "GET", &tags, "the tags on each agent", |st, b| st == 200 && b == "{\"Tags\":{\"team\":\"a\"}}");
    }

    // Function URLs: configured through the gateway, served by every agent (and through
    // the gateway, whose URL the configuration shows).
    let url_config = |method: &str, q: &str, body: &str| {
        let (status, h, out) = call(gport, method, &format!("/2021-10-31/functions/pv/url{q}"), body.as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default())
    };
    let (status, _, u) = url_config("POST", "", "{\"AuthType\": \"NONE\"}");
    assert_eq!(status, 201, "{u}");
    assert_eq!(u["FunctionUrl"].as_str(), Some(format!("http://127.0.0.1:{gport}/url/pv/").as_str()), "{u}");
    assert_eq!(url_config("POST", "", "{\"AuthType\": \"NONE\"}").1.as_deref(), Some("ResourceConflictException"));
    assert_eq!(url_config("POST", "?Qualifier=nosuch", "{\"AuthType\": \"NONE\"}").0, 404, "no such alias");
    let (status, _, _) = url_config("POST", "?Qualifier=live", "{\"AuthType\": \"AWS_IAM\"}");
    assert_eq!(status, 201);
    let open_url = |port: u16, path: &str, what: &str, done: &dyn Fn(u16, &str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, _, body) = get(port, path);
            if done(status, &body) {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: still {status} {body}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    for port in ports.iter().copied().chain([gport]) {
        open_url(port, "/url/pv/", "an open URL on each agent", &|st, b| st == 200 && b.contains("\"v\": 2"));
        open_url(port, "/url/pv:live/", "an AWS_IAM URL refuses an unsigned call", &|st, _| st == 403);
    }
    let (status, _, u) = url_config("PUT", "", "{\"AuthType\": \"AWS_IAM\"}");
    assert_eq!((status, u["AuthType"].as_str()), (200, Some("AWS_IAM")), "{u}");
    let (_, _, listed) = url_config("GET", "s", "");
    assert_eq!(listed["FunctionUrlConfigs"].as_array().map(Vec::len), Some(2), "{listed}");
    for port in ports {
        open_url(port, "/url/pv/", "the URL now AWS_IAM on each agent", &|st, _| st == 403);
    }
    assert_eq!(url_config("DELETE", "?Qualifier=live", "").0, 204);
    assert_eq!(url_config("GET", "?Qualifier=live", "").0, 404);
    for port in ports {
        open_url(port, "/url/pv:live/", "the alias's URL removed on each agent", &|st, _| st == 404);
    }

    // An agent that joins now: $LATEST is version 2's code, so it builds version 1 from
    // its bundle.
    kubectl(&cp, &["apply", "-f", "-"], Some("{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"ver-3\"}}"));
    let late = free_port();
    agents.push(agent_in(Some((&net, LATE)), &tmp.path().join("ver-3"), late, "ver-3", &kc, &["--snapshot-store", "s3://versions", "--metrics-public"], &env));
    call_until(late, "POST", &invocation(":1"), "version 1 on an agent that joined later", |st, b| st == 200 && b.contains("\"v\": 1"));
    // One capture per version per cluster: the function's builder recorded version 1's
    // snapshot in its object's status, and the late agent's revision for version 1
    // serves from it (as its $LATEST serves from the builder's): it captured nothing.
    let recorded = kubectl(&cp, &["get", "thawfunction", "pv.v1", "-o", "jsonpath={.status.snapshot.id}"], None);
    assert!(!recorded.is_empty(), "version 1's snapshot recorded in its object");
    let (_, _, metrics) = get(late, "/metrics");
    let count = |how: &str| {
        let line = format!("thaw_snapshot_builds_total{{how=\"{how}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(line.as_str())).map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    assert_eq!((count("captured"), count("adopted")), (0, 2), "the late agent adopted $LATEST and version 1, captured none");
    call_until(late, "POST", &invocation(":2"), "version 2 on an agent that joined later", |st, b| st == 200 && b.contains("\"v\": 2"));
    call_until(late, "POST", &invocation(":live"), "the alias on an agent that joined later", |st, b| st == 200 && (b.contains("\"v\": 1") || b.contains("\"v\": 2")));

    // Version 1 deleted (once no alias routes to it): gone from every agent; a new
    // version takes a new number.
    let (status, h, body) = call(gport, "DELETE", "/2015-03-31/functions/pv:1", b"", SECRET);
    assert_eq!((status, header(&h, "x-amzn-errortype")), (409, Some("ResourceConflictException")), "live routes to it: {body}");
    let (status, _, a) = alias("PUT", "/live", serde_json::json!({"RoutingConfig": {"AdditionalVersionWeights": {}}}));
    assert!(status == 200 && a.get("RoutingConfig").is_none(), "{a}");
    let (status, _, body) = call(gport, "DELETE", "/2015-03-31/functions/pv:1", b"", SECRET);
    assert_eq!(status, 204, "{body}");
    for port in ports.iter().copied().chain([late]) {
        call_until(port, "POST", &invocation(":1"), "version 1 deleted", |st, _| st == 404);
        call_until(port, "POST", &invocation(":2"), "version 2 kept", |st, b| st == 200 && b.contains("\"v\": 2"));
    }
    let (status, _, body) = call(gport, "PUT", "/2015-03-31/functions/pv/code", serde_json::json!({"ZipFile": zip(1)}).to_string().as_bytes(), SECRET);
    assert_eq!(status, 200, "{body}");
    let (_, _, v) = publish("");
    assert_eq!(v["Version"].as_str(), Some("3"), "never a number twice: {v}");
    call_until(late, "POST", &invocation(":3"), "version 3", |st, b| st == 200 && b.contains("\"v\": 1"));
    assert_eq!(alias("DELETE", "/live", serde_json::json!({})).0, 204);
    for port in ports.iter().copied().chain([late]) {
        call_until(port, "POST", &invocation(":live"), "the alias deleted", |st, _| st == 404);
    }

    // The function deleted: its versions' objects go with it.
    let (status, _, body) = call(gport, "DELETE", "/2015-03-31/functions/pv", b"", SECRET);
    assert_eq!(status, 204, "{body}");
    let objects = kubectl(&cp, &["get", "thawfunctions", "-o", "name"], None);
    assert!(!objects.contains("pv"), "{objects}");
    call_until(ports[0], "POST", &invocation(":2"), "the function deleted", |st, _| st == 404);
    drop(agents);
}

/// Layers through the gateway (issue #29): PublishLayerVersion writes a ThawLayer
/// (its zip in the store), numbered by the registry and never twice; Get/List/
/// GetLayerVersionByArn/ListLayers answer through either gateway; a function naming
/// layer versions gets them under /opt on every agent, under the same ARNs; changing
/// them reaches every agent; bad `Layers` are refused with Lambda's errors; a deleted
/// version is gone from the API but the function using it still deploys on an agent
/// that joins later (from its zip in the store), serving the builder's snapshot.
#[test]
fn layers_through_the_gateway_are_installed_by_every_agent() {
    let Cluster { m: _m, cp, tmp, ports, env, mut agents, net } = cluster("lay", "layers");
    let kc = cp.kubeconfig();
    let (g1, g2) = (free_port(), free_port());
    let _gateways = [gateway_with(g1, &kc, &["--snapshot-store", "s3://layers"], &env), gateway_with(g2, &kc, &["--snapshot-store", "s3://layers"], &env)];
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let json_of = |body: &str| serde_json::from_str::<serde_json::Value>(body).unwrap_or_default();
    let publish = |port: u16, name: &str, who: &str, runtimes: &[&str]| {
        let zip = std::fs::read(zip_of(tmp.path(), &format!("{name}-{who}.zip"), &[("python/shared.py", &format!("WHO = '{who}'\n"))])).unwrap();
        let body = serde_json::json!({"Content": {"ZipFile": b64(&zip)}, "Description": who, "CompatibleRuntimes": runtimes});
        let (status, _, out) = call(port, "POST", &format!("/2018-10-31/layers/{name}/versions"), body.to_string().as_bytes(), SECRET);
        assert_eq!(status, 201, "{out}");
        let v = json_of(&out);
        assert_eq!(v["Content"]["CodeSha256"].as_str(), Some(thaw_node::bundle::code_sha256(&zip).as_str()), "{v}");
        v
    };
    let v1 = publish(g1, "shared", "one", &["python3.12"]);
    let v2 = publish(g2, "shared", "two", &["python3.12"]);
    let odd = publish(g1, "Team_Deps", "deps", &[]);
    assert_eq!((v1["Version"].as_u64(), v2["Version"].as_u64(), odd["Version"].as_u64()), (Some(1), Some(2), Some(1)));
    let (arn1, arn2) = (v1["LayerVersionArn"].as_str().unwrap().to_string(), v2["LayerVersionArn"].as_str().unwrap().to_string());
    assert!(arn1.ends_with(":layer:shared:1") && v1["LayerArn"].as_str().is_some_and(|a| arn2 == format!("{a}:2")), "{v1} {v2}");
    let names = kubectl(&cp, &["get", "thawlayers", "-o", "jsonpath={range .items[*]}{.spec.name} {end}"], None);
    assert_eq!(names.split_whitespace().collect::<std::collections::BTreeSet<_>>(), ["Team_Deps", "shared"].into(), "a ThawLayer per layer");

    // Read through the other gateway.
    let read = |port: u16, path: &str| {
        let (status, _, out) = call(port, "GET", path, b"", SECRET);
        (status, json_of(&out))
    };
    let (status, listed) = read(g2, "/2018-10-31/layers/shared/versions");
    let numbers: Vec<u64> = listed["LayerVersions"].as_array().unwrap().iter().filter_map(|v| v["Version"].as_u64()).collect();
    assert_eq!((status, numbers), (200, vec![2, 1]), "newest first: {listed}");
    let (status, one) = read(g2, "/2018-10-31/layers/shared/versions/1");
    assert_eq!((status, one["Description"].as_str(), one["CompatibleRuntimes"][0].as_str()), (200, Some("one"), Some("python3.12")), "{one}");
    let (status, by_arn) = read(g1, &format!("/2018-10-31/layers?find=LayerVersion&Arn={arn1}"));
    assert_eq!((status, by_arn["Version"].as_u64()), (200, Some(1)), "{by_arn}");
    let (_, all) = read(g2, "/2018-10-31/layers");
    let latest: Vec<(String, u64)> = all["Layers"].as_array().unwrap().iter().map(|l| (l["LayerName"].as_str().unwrap().to_string(), l["LatestMatchingVersion"]["Version"].as_u64().unwrap())).collect();
    assert_eq!(latest, [("Team_Deps".to_string(), 1), ("shared".to_string(), 2)], "{all}");
    let (_, py) = read(g2, "/2018-10-31/layers?CompatibleRuntime=nodejs20.x");
    assert_eq!(py["Layers"].as_array().map(Vec::len), Some(0), "{py}");

    // A function on layer version 1: /opt on every agent.
    let code = std::fs::read(zip_of(tmp.path(), "uses.zip", &[("app.py", "import os\n\ndef handler(event, context):\n    import shared\n    return {'who': shared.WHO, 'opt': sorted(os.listdir('/opt/python'))}\n")])).unwrap();
    let create = |name: &str, layers: &[&str]| {
        let body = serde_json::json!({"FunctionName": name, "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
            "Handler": "app.handler", "Code": {"ZipFile": b64(&code)}, "Layers": layers});
        let (status, h, out) = call(g1, "POST", "/2015-03-31/functions", body.to_string().as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), out)
    };
    let (status, _, out) = create("uses", &[&arn1]);
    assert_eq!(status, 201, "{out}");
    assert_eq!(json_of(&out)["Layers"][0]["Arn"].as_str(), Some(arn1.as_str()), "{out}");
    for port in ports {
        invoke_until(port, "uses", "layer 1 on each agent", |st, b| st == 200 && b.contains("\"who\": \"one\""));
    }
    let (status, f) = read(g2, "/2015-03-31/functions/uses");
    assert_eq!((status, f["Configuration"]["Layers"][0]["Arn"].as_str()), (200, Some(arn1.as_str())), "an agent's configuration names the cluster's ARN: {f}");

    // Refused as Lambda refuses them, and nothing is written.
    let foreign = arn1.replace("us-east-1", "eu-west-1");
    let nine = arn1.replace(":shared:1", ":shared:9");
    let six: Vec<&str> = std::iter::repeat_n(arn1.as_str(), 6).collect();
    for (layers, what) in [(vec![nine.as_str()], "a version that does not exist"), (vec![&arn1, &arn2], "one layer twice"), (six, "six layers"), (vec![&foreign], "another region's layer")] {
        let (status, kind, out) = create("refused", &layers);
        assert_eq!((status, kind.as_deref()), (400, Some("InvalidParameterValueException")), "{what}: {out}");
    }
    assert!(!kubectl(&cp, &["get", "thawfunctions", "-o", "name"], None).contains("refused"));

    // Moved to version 2: on every agent.
    let (status, _, out) = call(g2, "PUT", "/2015-03-31/functions/uses/configuration", serde_json::json!({"Layers": [arn2]}).to_string().as_bytes(), SECRET);
    assert_eq!(status, 200, "{out}");
    for port in ports {
        invoke_until(port, "uses", "layer 2 on each agent", |st, b| st == 200 && b.contains("\"who\": \"two\""));
    }

    // Version 2 deleted: gone from the API (again: no error), not from the function.
    assert_eq!(call(g1, "DELETE", "/2018-10-31/layers/shared/versions/2", b"", SECRET).0, 204);
    assert_eq!(call(g2, "DELETE", "/2018-10-31/layers/shared/versions/2", b"", SECRET).0, 204);
    assert_eq!(read(g2, "/2018-10-31/layers/shared/versions/2").0, 404);
    let (status, kind, _) = create("late-user", &[&arn2]);
    assert_eq!((status, kind.as_deref()), (400, Some("InvalidParameterValueException")), "a deleted version cannot be newly used");
    // An agent that joins now installs it from the function's object (its zip stays in
    // the store) and serves the snapshot the builder published (the same files under
    // /opt on every agent: the same fingerprint).
    kubectl(&cp, &["apply", "-f", "-"], Some("{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"lay-3\"}}"));
    let late = free_port();
    agents.push(agent_in(Some((&net, LATE)), &tmp.path().join("lay-3"), late, "lay-3", &kc, &["--snapshot-store", "s3://layers", "--metrics-public"], &env));
    invoke_until(late, "uses", "the deleted layer version on an agent that joined later", |st, b| st == 200 && b.contains("\"who\": \"two\""));
    let (_, _, metrics) = get(late, "/metrics");
    assert!(metrics.contains("thaw_snapshot_builds_total{how=\"adopted\"} 1"), "the late agent served the builder's snapshot: {}", metrics.lines().filter(|l| l.starts_with("thaw_snapshot_builds_total")).collect::<Vec<_>>().join("; "));
    // Never a number twice.
    assert_eq!(publish(g1, "shared", "three", &[])["Version"].as_u64(), Some(3));

    // A Lambda name that cannot be an object's (capitals, `_`): its object is named
    // after it (spec.name keeps the name), and it works as any other.
    let (status, _, out) = create("Team_Fn", &[&arn1]);
    assert_eq!((status, json_of(&out)["FunctionName"].as_str()), (201, Some("Team_Fn")), "{out}");
    invoke_until(ports[0], "Team_Fn", "a function named with capitals and _", |st, b| st == 200 && b.contains("\"who\": \"one\""));
    let (status, _, out) = call(g2, "POST", "/2015-03-31/functions/Team_Fn/versions", b"", SECRET);
    assert_eq!(status, 201, "{out}");
    call_until(ports[1], "POST", "/2015-03-31/functions/Team_Fn:1/invocations", "its version 1", |st, b| st == 200 && b.contains("\"who\": \"one\""));
    let (status, f) = read(g1, "/2015-03-31/functions/Team_Fn");
    assert_eq!((status, f["Configuration"]["FunctionName"].as_str()), (200, Some("Team_Fn")), "{f}");
    assert_eq!(read(g1, "/2015-03-31/functions/team_fn").0, 404, "another name");
    assert_eq!(call(g1, "DELETE", "/2015-03-31/functions/Team_Fn", b"", SECRET).0, 204);
    invoke_until(ports[0], "Team_Fn", "deleted", |st, _| st == 404);
    drop(agents);
}

/// Reserved concurrency through the gateway (issue #29) is the cluster's limit: each
/// agent enforces its share (the shares add up to the limit), and a call an agent
/// refuses for its share is tried on the next. With a limit of 2 and six calls at once
/// through two gateways (each runs 2 s), exactly 2 run and 4 get Lambda's 429
/// (ReservedFunctionConcurrentInvocationLimitExceeded), whichever agents they were
/// placed on; 0 refuses every call; deleted, all run again. Get/Put/Delete and
/// GetFunction's Concurrency show the cluster's limit, not an agent's share.
/// Provisioned concurrency is split the same way (one instance ready on each of three
/// agents for 3, READY through the gateway once all are), refused on $LATEST and over
/// the reserved limit; GetAccountSettings adds up the agents' limits.
#[test]
fn reserved_concurrency_is_the_clusters_limit() {
    let Cluster { m: _m, cp, tmp, ports, env, agents: _agents, net: _net } = cluster("conc", "concurrency");
    let kc = cp.kubeconfig();
    let (gport, gport2) = (free_port(), free_port());
    let _gateway = gateway_with(gport, &kc, &["--snapshot-store", "s3://concurrency"], &env);
    let _gateway2 = gateway_with(gport2, &kc, &["--snapshot-store", "s3://concurrency"], &env);
    use base64::Engine;
    let z = zip_of(tmp.path(), "slow.zip", &[("app.py", "import time\n\ndef handler(event, context):\n    time.sleep(event.get('sleep', 0))\n    return {'ran': True}\n")]);
    let create = serde_json::json!({"FunctionName": "limited", "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "Code": {"ZipFile": base64::engine::general_purpose::STANDARD.encode(std::fs::read(z).unwrap())}});
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    let invoke_path = "/2015-03-31/functions/limited/invocations";
    for port in ports {
        call_until(port, "POST", invoke_path, "the function on each agent", |st, b| st == 200 && b.contains("ran"));
    }
    let concurrency = |method: &str, body: &str| {
        let (status, h, out) = call(gport2, method, "/2017-10-31/functions/limited/concurrency", body.as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default())
    };
    let get_concurrency = |port: u16| {
        let (status, _, out) = call(port, "GET", "/2019-09-30/functions/limited/concurrency", b"", SECRET);
        assert_eq!(status, 200, "{out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["ReservedConcurrentExecutions"].as_u64()
    };
    assert_eq!(concurrency("PUT", "{\"ReservedConcurrentExecutions\": -1}").1.as_deref(), Some("InvalidParameterValueException"));
    let (status, _, v) = call(gport, "PUT", "/2017-10-31/functions/missing/concurrency", b"{\"ReservedConcurrentExecutions\": 1}", SECRET);
    assert_eq!(status, 404, "{v}");
    let (status, _, v) = concurrency("PUT", "{\"ReservedConcurrentExecutions\": 2}");
    assert_eq!((status, v["ReservedConcurrentExecutions"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(get_concurrency(gport), Some(2), "the cluster's limit through either gateway");
    // Each agent holds its share; the shares add up to the limit.
    let deadline = Instant::now() + Duration::from_secs(60);
    let shares = loop {
        let shares: Vec<u64> = ports.iter().map(|&p| get_concurrency(p).unwrap_or(u64::MAX)).collect();
        if shares.iter().all(|&n| n != u64::MAX) && shares.iter().sum::<u64>() == 2 {
            break shares;
        }
        assert!(Instant::now() < deadline, "the agents did not take their shares of 2: {shares:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(shares.iter().all(|&n| n <= 1), "split as evenly as it goes: {shares:?}");
    let (status, _, body) = call(gport, "GET", "/2015-03-31/functions/limited", b"", SECRET);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, v["Concurrency"]["ReservedConcurrentExecutions"].as_u64()), (200, Some(2)), "GetFunction shows the cluster's limit: {body}");

    // Six calls at once through the two gateways, each running 2 s: 2 run, 4 are refused.
    let burst = || -> Vec<(u16, String)> {
        let calls: Vec<_> = (0..6)
            .map(|i| {
                let port = if i % 2 == 0 { gport } else { gport2 };
                std::thread::spawn(move || {
                    let (status, h, body) = call(port, "POST", "/2015-03-31/functions/limited/invocations", b"{\"sleep\": 2}", SECRET);
                    (status, format!("{} {body}", header(&h, "x-amzn-errortype").unwrap_or_default()))
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    };
    let got = burst();
    let ran = got.iter().filter(|(st, b)| *st == 200 && b.contains("ran")).count();
    let refused = got.iter().filter(|(st, b)| *st == 429 && b.contains("TooManyRequestsException") && b.contains("ReservedFunctionConcurrentInvocationLimitExceeded")).count();
    assert_eq!((ran, refused), (2, 4), "{got:?}");
    // The gateways' metrics say so: each refused call was tried on every agent (two
    // retries each, three agents), and the answers are counted by operation and code.
    let metric = |port: u16, name: &str| -> u64 {
        let (status, _, body) = get(port, "/metrics");
        assert_eq!(status, 200, "{body}");
        body.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() as u64
    };
    let both = |name: &str| metric(gport, name) + metric(gport2, name);
    assert!(both("thaw_gateway_reserved_concurrency_retries_total") >= 8, "{}", both("thaw_gateway_reserved_concurrency_retries_total"));
    assert_eq!(both("thaw_gateway_requests_total{code=\"429\",operation=\"Invoke\"}"), 4);
    assert!(both("thaw_gateway_requests_total{code=\"200\",operation=\"Invoke\"}") >= 2);
    assert!(both("thaw_gateway_forwarded_total") >= 6 + 8, "every try is a forward");
    assert!(both("thaw_gateway_requests_total{code=\"200\",operation=\"PutFunctionConcurrency\"}") >= 1);
    assert_eq!(metric(gport, "thaw_gateway_agents "), 3);

    // 0: every call refused, whichever agent.
    assert_eq!(concurrency("PUT", "{\"ReservedConcurrentExecutions\": 0}").0, 200);
    call_until(gport, "POST", invoke_path, "a limit of 0 refuses every call", |st, b| st == 429 && b.contains("ReservedFunctionConcurrentInvocationLimitExceeded"));
    for _ in 0..6 {
        let (status, _, body) = call(gport2, "POST", invoke_path, b"{}", SECRET);
        assert_eq!(status, 429, "{body}");
    }
    // Deleted: no limit, everywhere.
    assert_eq!(concurrency("DELETE", "").0, 204);
    assert_eq!(get_concurrency(gport2), None, "none reserved");
    for port in ports {
        call_until(port, "GET", "/2019-09-30/functions/limited/concurrency", "the share removed on each agent", |st, b| st == 200 && b.trim() == "{}");
    }
    let got = burst();
    assert!(got.iter().all(|(st, _)| *st == 200), "{got:?}");

    // Provisioned concurrency is the cluster's too: 3 on alias live (version 1), one
    // ready on each agent, READY through the gateway once all are.
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions/limited/versions", b"", SECRET);
    assert_eq!(status, 201, "{body}");
    let (status, _, body) = call(gport, "POST", "/2015-03-31/functions/limited/aliases", b"{\"Name\": \"live\", \"FunctionVersion\": \"1\"}", SECRET);
    assert_eq!(status, 201, "{body}");
    let pc = |port: u16, method: &str, q: &str, body: &str| {
        let (status, h, out) = call(port, method, &format!("/2019-09-30/functions/limited/provisioned-concurrency{q}"), body.as_bytes(), SECRET);
        (status, header(&h, "x-amzn-errortype").map(str::to_string), serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default())
    };
    let three = "{\"ProvisionedConcurrentExecutions\": 3}";
    assert_eq!(pc(gport, "PUT", "", three).1.as_deref(), Some("InvalidParameterValueException"), "not on $LATEST");
    assert_eq!(pc(gport, "PUT", "?Qualifier=9", three).0, 404, "no version 9");
    assert_eq!(concurrency("PUT", "{\"ReservedConcurrentExecutions\": 2}").0, 200);
    let (status, kind, v) = pc(gport, "PUT", "?Qualifier=live", three);
    assert_eq!((status, kind.as_deref()), (400, Some("InvalidParameterValueException")), "more than the reserved 2: {v}");
    // GetAccountSettings: the agents' limits added up, less the cluster's reserved concurrency.
    let settings = |port: u16| {
        let (status, _, out) = call(port, "GET", "/2016-08-19/account-settings", b"", SECRET);
        assert_eq!(status, 200, "{out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let total: u64 = ports.iter().map(|&p| settings(p)["AccountLimit"]["ConcurrentExecutions"].as_u64().unwrap()).sum();
    let cluster = settings(gport2);
    assert_eq!(cluster["AccountLimit"]["ConcurrentExecutions"].as_u64(), Some(total), "{cluster}");
    assert_eq!(cluster["AccountLimit"]["UnreservedConcurrentExecutions"].as_u64(), Some(total - 2), "{cluster}");
    assert_eq!(cluster["AccountUsage"]["FunctionCount"].as_u64(), Some(1), "{cluster}");
    assert_eq!(cluster["AccountUsage"]["TotalCodeSize"].as_u64(), Some(std::fs::metadata(tmp.path().join("slow.zip")).unwrap().len()), "{cluster}");
    assert_eq!(concurrency("DELETE", "").0, 204);

    let (status, _, v) = pc(gport, "PUT", "?Qualifier=live", three);
    assert_eq!((status, v["Status"].as_str(), v["RequestedProvisionedConcurrentExecutions"].as_u64()), (202, Some("IN_PROGRESS"), Some(3)), "{v}");
    for port in ports {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, _, v) = pc(port, "GET", "?Qualifier=1", "");
            if status == 200 && v["Status"] == "READY" {
                assert_eq!(v["AllocatedProvisionedConcurrentExecutions"].as_u64(), Some(1), "each agent's share of 3 over 3 agents: {v}");
                break;
            }
            assert!(Instant::now() < deadline, "agent {port}: its share not ready: {status} {v}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let (status, _, v) = pc(gport2, "GET", "?Qualifier=live", "");
    assert_eq!((status, v["Status"].as_str(), v["AllocatedProvisionedConcurrentExecutions"].as_u64()), (200, Some("READY"), Some(3)), "{v}");
    let (status, _, v) = pc(gport, "GET", "?List=ALL", "");
    let configs = v["ProvisionedConcurrencyConfigs"].as_array().cloned().unwrap_or_default();
    assert_eq!((status, configs.len()), (200, 1), "{v}");
    assert!(configs[0]["FunctionArn"].as_str().unwrap().ends_with(":function:limited:1") && configs[0]["Status"] == "READY", "{v}");
    assert_eq!(pc(gport, "DELETE", "?Qualifier=1", "").0, 204);
    assert_eq!(pc(gport2, "GET", "?Qualifier=live", "").0, 404);
    for port in ports {
        call_until(port, "GET", "/2019-09-30/functions/limited/provisioned-concurrency?Qualifier=1", "the share removed on each agent", |st, _| st == 404);
    }
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Benchmark (issue #29: the gateway's overhead on a warm invoke, target ≤ 1 ms median),
/// not part of the normal run: `bench/gateway.py` runs it (`cargo test --release -p thaw
/// --test gateway -- --ignored gateway_overhead`) and draws the chart. One agent, one
/// gateway, a warm helloworld-sized function; warm invokes straight to the agent and
/// through the gateway, interleaved in the same run; writes THAW_BENCH_OUT (JSON).
#[test]
#[ignore]
fn gateway_overhead_on_a_warm_invoke() {
    let runs: usize = std::env::var("THAW_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(300);
    let cp = ControlPlane::start(Options::default()).unwrap_or_else(|e| panic!("{e}"));
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/crd-thawnode.yaml");
    kubectl(&cp, &["apply", "--server-side", "-f", crd.to_str().unwrap()], None);
    kubectl(&cp, &["wait", "--for=condition=Established", "crd/thawnodes.thaw.dev", "--timeout=30s"], None);
    kubectl(&cp, &["apply", "-f", "-"], Some("{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"bench-0\"}}"));
    let tmp = tempfile::tempdir().unwrap();
    let (aport, gport) = (free_port(), free_port());
    let _agent = agent(&tmp.path().join("bench-0"), aport, "bench-0", &cp.kubeconfig());
    let _gateway = gateway(gport, &cp.kubeconfig());
    let zip = zip_of(tmp.path(), "hello.zip", &[("app.py", "def handler(event, context):\n    return {'message': 'hello, ' + event.get('name', '')}\n")]);
    use base64::Engine;
    let create = serde_json::json!({"FunctionName": "hello", "Runtime": "python3.12", "Role": "arn:aws:iam::000000000000:role/t",
        "Handler": "app.handler", "Code": {"ZipFile": base64::engine::general_purpose::STANDARD.encode(std::fs::read(&zip).unwrap())}});
    let (status, _, body) = call(aport, "POST", "/2015-03-31/functions", create.to_string().as_bytes(), SECRET);
    assert_eq!(status, 201, "{body}");
    invoke_until(aport, "hello", "deployed", |st, _| st == 200);
    invoke_until(gport, "hello", "placed through the gateway", |st, _| st == 200);
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for i in 0..runs + 20 {
        for (port, out) in if i % 2 == 0 { [(aport, &mut direct), (gport, &mut through)] } else { [(gport, &mut through), (aport, &mut direct)] } {
            let t = Instant::now();
            let (status, _, body) = invoke(port, "hello", SECRET);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            assert_eq!(status, 200, "{body}");
            if i >= 20 {
                out.push(ms); // the first 20 rounds warm up
            }
        }
    }
    let (d, g) = (median(&mut direct.clone()), median(&mut through.clone()));
    let p99 = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    };
    let (dp, gp) = (p99(&mut direct.clone()), p99(&mut through.clone()));
    println!("warm invoke, {runs} each, interleaved: direct median {d:.3} ms (p99 {dp:.3}), through the gateway {g:.3} ms (p99 {gp:.3}): overhead {:.3} ms", g - d);
    if let Ok(out) = std::env::var("THAW_BENCH_OUT") {
        let json = serde_json::json!({"runs": runs, "direct_ms": direct, "gateway_ms": through,
            "median_direct_ms": d, "median_gateway_ms": g, "p99_direct_ms": dp, "p99_gateway_ms": gp, "overhead_median_ms": g - d});
        std::fs::write(out, json.to_string()).unwrap();
    }
}

/// Benchmark (issue #29: a cold start on an agent that has never had the function's
/// snapshot, fetched from the store, against a cold start from the local cache of the
/// agent that built it; target ≤ 2x), not part of the normal run: `bench/gateway.py
/// --fresh` runs it. Two agents, MinIO on loopback, a ThawFunction; each sample restarts
/// the adopter with an empty snapshot cache (what a new node, or one that evicted the
/// snapshot, has) and the builder with its cache's page cache dropped, then invokes each
/// once, straight to the agent; the node's own start time (x-thaw-timing-ms) is kept.
/// Writes THAW_BENCH_OUT (JSON).
#[test]
#[ignore]
fn fresh_agent_cold_start() {
    let runs: usize = std::env::var("THAW_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let m = minio::Minio::start();
    let cp = ControlPlane::start(Options::default()).unwrap_or_else(|e| panic!("{e}"));
    for crd in ["thawnode", "thawfunction"] {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../deploy/base/crd-{crd}.yaml"));
        kubectl(&cp, &["apply", "--server-side", "-f", file.to_str().unwrap()], None);
        kubectl(&cp, &["wait", "--for=condition=Established", &format!("crd/{crd}s.thaw.dev"), "--timeout=30s"], None);
    }
    let tmp = tempfile::tempdir().unwrap();
    let kc = cp.kubeconfig();
    let mut env: Vec<(&str, String)> = m.env();
    env.push(("THAW_NODE_KEY", "5e".repeat(32)));
    let store = ["--snapshot-store", "s3://fresh", "--create-bucket"];
    let names = ["fresh-0", "fresh-1"];
    let ports = [free_port(), free_port()];
    let start = |i: usize| agent_with(&tmp.path().join(names[i]), ports[i], names[i], &kc, &store, &env);
    let mut agents: Vec<Option<Proc>> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        kubectl(&cp, &["apply", "-f", "-"], Some(&format!("{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{name}\"}}}}")));
        agents.push(Some(start(i)));
    }
    let zip = zip_of(tmp.path(), "hello.zip", &[("app.py", "import json\n\ndef handler(event, context):\n    return {'message': 'hello, ' + event.get('name', '')}\n")]);
    let (key, sha) = bundle_push(&m, &zip, "s3://fresh");
    kubectl(&cp, &["apply", "-f", "-"], Some(&format!("{{\"apiVersion\":\"thaw.dev/v1alpha1\",\"kind\":\"ThawFunction\",\"metadata\":{{\"name\":\"cold\",\"namespace\":\"default\"}},\
        \"spec\":{{\"runtime\":\"python3.12\",\"handler\":\"app.handler\",\"code\":{{\"key\":\"{key}\",\"sha256\":\"{sha}\"}}}}}}")));
    for port in ports {
        invoke_until(port, "cold", "deployed", |st, _| st == 200);
    }
    let built_by = kubectl(&cp, &["get", "thawfunction", "cold", "-o", "jsonpath={.status.snapshot.builtBy}"], None);
    let builder = names.iter().position(|n| *n == built_by).unwrap_or_else(|| panic!("built by {built_by:?}"));
    let adopter = 1 - builder;
    let cache = |i: usize| tmp.path().join(names[i]).join("node/snapshot-cache");
    assert!(cache(adopter).is_dir(), "the adopter's snapshot cache is at {}", cache(adopter).display());
    // The start time the node reports for one invocation, and how it started.
    let start_ms = |port: u16| -> (f64, String) {
        let (status, h, body) = invoke(port, "cold", SECRET);
        assert_eq!(status, 200, "{body}");
        let timing = header(&h, "x-thaw-timing-ms").unwrap_or_default().to_string();
        let ms = timing.split(';').find_map(|kv| kv.strip_prefix("start=")).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{timing}"));
        (ms, header(&h, "x-thaw-start").unwrap_or_default().to_string())
    };
    let (mut fresh, mut local, mut kinds) = (Vec::new(), Vec::new(), std::collections::BTreeSet::new());
    for i in 0..runs {
        for who in if i % 2 == 0 { [adopter, builder] } else { [builder, adopter] } {
            drop(agents[who].take());
            if who == adopter {
                std::fs::remove_dir_all(cache(who)).unwrap();
            } else {
                // The builder's cached snapshot stays on disk, out of the page cache.
                let files = Command::new("find").args([cache(who).to_str().unwrap(), "-type", "f"]).output().unwrap();
                for f in String::from_utf8_lossy(&files.stdout).lines() {
                    let _ = Command::new("dd").args([&format!("if={f}"), "iflag=nocache", "count=0", "status=none"]).status();
                }
            }
            agents[who] = Some(start(who));
            // Wait until the agent serves the function (its registry is on disk), without invoking it.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !call(ports[who], "GET", "/2015-03-31/functions/cold/configuration", b"", SECRET).2.contains("\"State\":\"Active\"") {
                assert!(Instant::now() < deadline, "the restarted agent does not serve the function");
                std::thread::sleep(Duration::from_millis(100));
            }
            let (ms, kind) = start_ms(ports[who]);
            kinds.insert(format!("{}: {kind}", if who == adopter { "fresh" } else { "local" }));
            if who == adopter { fresh.push(ms) } else { local.push(ms) }
        }
    }
    let (f, l) = (median(&mut fresh.clone()), median(&mut local.clone()));
    println!("cold start, {runs} each, interleaved: fresh agent (snapshot fetched from the store) {f:.2} ms, the builder from its cache {l:.2} ms: {:.2}x ({kinds:?})", f / l);
    if let Ok(out) = std::env::var("THAW_BENCH_OUT") {
        let json = serde_json::json!({"runs": runs, "fresh_ms": fresh, "local_ms": local, "median_fresh_ms": f, "median_local_ms": l,
            "ratio": f / l, "start_kinds": kinds, "store": "MinIO on loopback", "function": "python3.12 hello"});
        std::fs::write(out, json.to_string()).unwrap();
    }
    drop(agents);
}
