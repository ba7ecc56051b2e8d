//! The custom-runtime bridge (`provided.al2023`), native: what the node starts in the
//! sandbox as `/var/runtime/provided/bridge` (see runtimes/provided/README.md for the
//! contract; `runtimes/provided/bridge.py` is the same bridge in Python, used when this
//! binary was not built beside `thaw`). It serves Lambda's Runtime API on
//! `$AWS_LAMBDA_RUNTIME_API` to the bundle's `bootstrap`, its child, and speaks the
//! node's framed protocol on fd 3. Native because a Python bridge spends ~35 ms of
//! every cold start importing json, socket and threading (measured).
//!
//! Hand-written HTTP/1.1: four routes of keep-alive HTTP for one local client; an HTTP
//! server crate (hyper, tiny_http) would bring an async runtime or more code than this.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::{json, Value};

const API: &str = "/2018-06-01/runtime";
const BOOTSTRAPS: [&str; 2] = ["/var/task/bootstrap", "/opt/bootstrap"];
const MAX_FRAME: usize = 64 << 20;

mod sys {
    use std::os::fd::{FromRawFd, OwnedFd};

    /// The control channel the sandbox passes as fd 3, close-on-exec so the bootstrap
    /// never inherits it.
    pub fn control() -> std::io::Result<std::fs::File> {
        // SAFETY: the sandbox starts this program with fd 3 open (the control socket)
        // and nothing else in this process owns or closes it; it is taken once.
        let fd = unsafe { OwnedFd::from_raw_fd(3) };
        nix::fcntl::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
        Ok(std::fs::File::from(fd))
    }
}

/// What the HTTP threads and the bootstrap's watcher tell the main thread.
enum Event {
    Next,
    InitError(Value),
    Response(String, Vec<u8>),
    Error(String, Value),
    /// The bootstrap ended during init (Lambda's message).
    Exit(String),
}

#[derive(Default)]
struct State {
    pending: VecDeque<Value>,
    current: Option<String>,
    asked_next: bool,
    ready: bool,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
    events: Mutex<Sender<Event>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tell(&self, e: Event) {
        let _ = self.events.lock().unwrap_or_else(|p| p.into_inner()).send(e);
    }
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Value>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {n} bytes exceeds the 64 MiB limit")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(std::io::Error::other)
}

fn write_frame(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    w.write_all(&out)
}

/// A Lambda error object from what the bootstrap posted.
fn error_object(body: &[u8], header_type: Option<&str>, default_type: &str) -> Value {
    let obj: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let s = |k: &str| obj.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    let stack: Vec<String> = match obj.get("stackTrace") {
        Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())).collect(),
        Some(Value::Null) | None => vec![],
        Some(other) => vec![other.to_string()],
    };
    json!({
        "errorType": s("errorType").or(header_type.map(str::to_string)).unwrap_or_else(|| default_type.to_string()),
        "errorMessage": s("errorMessage").unwrap_or_default(),
        "stackTrace": stack,
    })
}

struct Request {
    method: String,
    path: String,
    keep_alive: bool,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [method, path, version] = parts[..] else { return Err(std::io::Error::other("malformed request line")) };
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut req = Request { method: method.into(), path: path.into(), keep_alive: false, headers, body: Vec::new() };
    req.keep_alive = version == "HTTP/1.1" && !req.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
    if req.header("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.split(';').next().unwrap_or("0").trim(), 16).map_err(std::io::Error::other)?;
            if n == 0 {
                loop {
                    let mut t = String::new();
                    if r.read_line(&mut t)? == 0 || t.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            if req.body.len() + n > MAX_FRAME {
                return Err(std::io::Error::other("body too large"));
            }
            let start = req.body.len();
            req.body.resize(start + n, 0);
            r.read_exact(&mut req.body[start..])?;
            let mut crlf = String::new();
            r.read_line(&mut crlf)?;
        }
    } else if let Some(n) = req.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if n > MAX_FRAME {
            return Err(std::io::Error::other("body too large"));
        }
        req.body.resize(n, 0);
        r.read_exact(&mut req.body)?;
    }
    Ok(Some(req))
}

/// (status, body, extra headers) for one Runtime API request.
fn handle(shared: &Shared, req: &Request) -> (u16, Vec<u8>, Vec<(String, String)>) {
    let js = |v: Value| serde_json::to_vec(&v).expect("JSON serializes");
    let not_found = || (404, js(json!({"errorType": "NotFound", "errorMessage": format!("unknown path {} {}", req.method, req.path)})), vec![]);
    if req.method == "GET" && req.path == format!("{API}/invocation/next") {
        let mut st = shared.lock();
        if !st.asked_next {
            st.asked_next = true;
            shared.tell(Event::Next);
        }
        let ev = loop {
            if let Some(ev) = st.pending.pop_front() {
                break ev;
            }
            st = shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        let id = ev["request_id"].as_str().unwrap_or_default().to_string();
        st.current = Some(id.clone());
        drop(st);
        let trace: String = id.chars().filter(|c| *c != '-').take(24).collect();
        let headers = vec![
            ("Lambda-Runtime-Aws-Request-Id".into(), id),
            ("Lambda-Runtime-Deadline-Ms".into(), ev["deadline_ms"].as_u64().unwrap_or(0).to_string()),
            ("Lambda-Runtime-Invoked-Function-Arn".into(), ev["invoked_function_arn"].as_str().unwrap_or_default().into()),
            ("Lambda-Runtime-Trace-Id".into(), format!("Root=1-00000000-{trace};Sampled=0")),
        ];
        let payload = match ev["payload"].as_str() {
            Some(p) if !p.is_empty() => p.as_bytes().to_vec(),
            _ => b"{}".to_vec(),
        };
        return (200, payload, headers);
    }
    if req.method != "POST" {
        return not_found();
    }
    let error_type = req.header("lambda-runtime-function-error-type");
    if req.path == format!("{API}/init/error") {
        shared.tell(Event::InitError(error_object(&req.body, error_type, "Runtime.Unknown")));
        return (202, js(json!({"status": "OK"})), vec![]);
    }
    let rest = req.path.strip_prefix(API).unwrap_or("").trim_matches('/');
    let parts: Vec<&str> = rest.split('/').collect();
    let ["invocation", id, kind @ ("response" | "error")] = parts[..] else { return not_found() };
    {
        let mut st = shared.lock();
        if st.current.as_deref() != Some(id) {
            return (400, js(json!({"errorType": "InvalidRequestID", "errorMessage": format!("Invalid request ID: {id}")})), vec![]);
        }
        st.current = None;
    }
    if kind == "response" {
        shared.tell(Event::Response(id.to_string(), req.body.clone()));
    } else {
        shared.tell(Event::Error(id.to_string(), error_object(&req.body, error_type, "Unhandled")));
    }
    (202, js(json!({"status": "OK"})), vec![])
}

fn serve_connection(shared: Arc<Shared>, stream: TcpStream) {
    let Ok(mut out) = stream.try_clone() else { return };
    let mut r = BufReader::new(stream);
    loop {
        let (status, body, headers, keep) = match read_request(&mut r) {
            Ok(None) => return,
            Ok(Some(req)) => {
                let (s, b, h) = handle(&shared, &req);
                (s, b, h, req.keep_alive)
            }
            Err(e) => (400, serde_json::to_vec(&json!({"errorType": "BadRequest", "errorMessage": e.to_string()})).unwrap_or_default(), vec![], false),
        };
        let reason = match status {
            200 => "OK",
            202 => "Accepted",
            400 => "Bad Request",
            _ => "Not Found",
        };
        let mut head = format!("HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in &headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !keep {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut msg = head.into_bytes();
        msg.extend_from_slice(&body);
        if out.write_all(&msg).is_err() || !keep {
            return;
        }
    }
}

fn exit_message(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("Runtime exited with error: exit status {c}"),
        (None, Some(s)) => format!("Runtime exited with error: signal: {s}"),
        _ => "Runtime exited".into(),
    }
}

/// Start the bundle's bootstrap; a watcher thread owns it and reports its end.
/// Returns its pid (to kill it) or the init error to report.
fn start_bootstrap(shared: &Arc<Shared>) -> Result<u32, Value> {
    use std::os::unix::fs::PermissionsExt;
    let invalid = |m: String| json!({"errorType": "Runtime.InvalidEntrypoint", "errorMessage": m, "stackTrace": []});
    let path = BOOTSTRAPS
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .ok_or_else(|| invalid(format!("Couldn't find valid bootstrap(s): [{}]", BOOTSTRAPS.join(" "))))?;
    let meta = std::fs::metadata(path).map_err(|e| invalid(format!("{path}: {e}")))?;
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(invalid(format!("{path} is not executable (permission denied)")));
    }
    let child: Child = Command::new(path).stdin(Stdio::null()).spawn().map_err(|e| invalid(format!("cannot start {path}: {e}")))?;
    let pid = child.id();
    let watcher = shared.clone();
    std::thread::spawn(move || {
        let mut child = child;
        let msg = match child.wait() {
            Ok(s) => exit_message(s),
            Err(e) => format!("Runtime exited: {e}"),
        };
        if watcher.lock().ready {
            // After init the bridge goes with its bootstrap: the node sees the channel
            // close (Runtime.ExitError) whether or not an invocation is running.
            eprintln!("thaw bridge: the bootstrap ended ({msg})");
            std::process::exit(1);
        }
        watcher.tell(Event::Exit(msg));
    });
    Ok(pid)
}

fn kill(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Report an init error to the node and end.
fn init_failed(control: &mut std::fs::File, mut err: Value, pid: Option<u32>) -> i32 {
    err["type"] = json!("init_error");
    if err.get("stackTrace").is_none() {
        err["stackTrace"] = json!([]);
    }
    let _ = write_frame(control, &err);
    kill(pid);
    1
}

fn with_nonce(msg: &Value, mut reply: Value) -> Value {
    if let Some(n) = msg.get("nonce") {
        reply["nonce"] = n.clone();
    }
    reply
}

fn run() -> i32 {
    let mut control = match sys::control() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("thaw bridge: no control channel on fd 3: {e}");
            return 2;
        }
    };
    let (tx, rx): (Sender<Event>, Receiver<Event>) = channel();
    let shared = Arc::new(Shared { st: Mutex::new(State::default()), cv: Condvar::new(), events: Mutex::new(tx) });
    let addr = std::env::var("AWS_LAMBDA_RUNTIME_API").unwrap_or_else(|_| "127.0.0.1:9001".into());
    let listener = match TcpListener::bind(&addr) {
        Ok(l) => l,
        Err(e) => {
            let err = json!({"errorType": "Runtime.Unknown", "errorMessage": format!("the Runtime API cannot listen on {addr}: {e}")});
            return init_failed(&mut control, err, None);
        }
    };
    let acceptor = shared.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let s = acceptor.clone();
            std::thread::spawn(move || serve_connection(s, stream));
        }
    });
    let pid = match start_bootstrap(&shared) {
        Ok(pid) => pid,
        Err(err) => return init_failed(&mut control, err, None),
    };
    match rx.recv() {
        Ok(Event::Next) => {}
        Ok(Event::InitError(err)) => return init_failed(&mut control, err, Some(pid)),
        Ok(Event::Exit(msg)) => {
            return init_failed(&mut control, json!({"errorType": "Runtime.ExitError", "errorMessage": msg}), Some(pid));
        }
        Ok(_) | Err(_) => return init_failed(&mut control, json!({"errorType": "Runtime.Unknown", "errorMessage": "the bridge lost its bootstrap"}), Some(pid)),
    }
    shared.lock().ready = true;
    if write_frame(&mut control, &json!({"type": "ready", "restore_notice": false})).is_err() {
        kill(Some(pid));
        return 0;
    }
    loop {
        let msg = match read_frame(&mut control) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                eprintln!("thaw bridge: protocol error: {e}");
                kill(Some(pid));
                return 2;
            }
        };
        let reply = match msg["type"].as_str() {
            Some("invoke") => {
                let id = msg["request_id"].as_str().unwrap_or_default().to_string();
                {
                    let mut st = shared.lock();
                    st.pending.push_back(msg.clone());
                    shared.cv.notify_all();
                }
                loop {
                    match rx.recv() {
                        Ok(Event::Response(rid, body)) if rid == id => {
                            break json!({"type": "result", "ok": true, "result": String::from_utf8_lossy(&body)});
                        }
                        Ok(Event::Error(rid, err)) if rid == id => break json!({"type": "result", "ok": false, "error": err}),
                        Ok(Event::Exit(m)) => {
                            eprintln!("thaw bridge: the bootstrap ended during an invocation ({m})");
                            std::process::exit(1);
                        }
                        Ok(_) => continue,
                        Err(_) => std::process::exit(1),
                    }
                }
            }
            Some("restored") => json!({"type": "ok"}),
            Some("shutdown") => break,
            other => {
                eprintln!("thaw bridge: protocol error: unknown message type {other:?}");
                kill(Some(pid));
                return 2;
            }
        };
        if write_frame(&mut control, &with_nonce(&msg, reply)).is_err() {
            break;
        }
    }
    kill(Some(pid));
    0
}

fn main() {
    std::process::exit(run());
}
