//! The node side of the control channel (fd 3 in the sandbox) plus the log
//! pipe (fd 1/2). Reads from both are multiplexed with poll so a function that
//! logs a lot can never block on a full pipe while we wait for its reply.
//!
//! Every request (`invoke`, `restored`) carries a fresh random `nonce` that the
//! shim echoes in its reply; a frame with any other nonce (or none) is stale or
//! forged — a function can write to fd 3 itself, and a previous tenant's frames
//! may still be queued — and is dropped, never taken as the answer.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Frames above this size are a protocol violation.
pub const MAX_FRAME: usize = 64 << 20;
/// Logs kept per invocation (the tail is kept, like Lambda's log tail).
const MAX_LOG: usize = 1 << 20;

/// An error reported by the function (init or invocation), in Lambda's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionError {
    #[serde(rename = "errorType")]
    pub error_type: String,
    #[serde(rename = "errorMessage")]
    pub error_message: String,
    #[serde(rename = "stackTrace", default)]
    pub stack_trace: Vec<String>,
}

#[derive(Debug, Error)]
pub enum ChannelError {
    #[error("function init failed: {}: {}", .0.error_type, .0.error_message)]
    Init(FunctionError),
    #[error("no response from the instance within {0:?}")]
    Timeout(Duration),
    #[error("the instance exited or closed its control channel{}", if .logs.is_empty() { String::new() } else { format!("; last log lines:\n{}", .logs) })]
    Closed { logs: String },
    #[error("protocol violation by the instance: {0}")]
    Protocol(String),
    #[error("control channel I/O")]
    Io(#[source] io::Error),
}

/// One invocation as sent to the runtime shim.
#[derive(Debug, Clone, Serialize)]
pub struct InvokeRequest {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub request_id: String,
    /// The event as JSON text.
    pub payload: String,
    pub deadline_ms: u64,
    pub function_name: String,
    pub function_version: String,
    pub memory_limit_mb: u64,
    pub invoked_function_arn: String,
    /// The execution environment's log stream (`context.log_stream_name`); none: the
    /// shim's environment says.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub log_stream_name: String,
    /// Echoed by the shim in its reply (see the module documentation).
    pub nonce: String,
}

/// A fresh request nonce: 128 random bits, hex.
fn new_nonce() -> String {
    let mut b = [0u8; 16];
    // Without the kernel's randomness a nonce is still unique within the process.
    if getrandom::fill(&mut b).is_err() {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        b[..8].copy_from_slice(&N.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl InvokeRequest {
    pub fn new(request_id: String, payload: String, function_name: &str, memory_mb: u64, timeout: Duration) -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        InvokeRequest {
            kind: "invoke",
            request_id,
            payload,
            deadline_ms: (now + timeout).as_millis() as u64,
            function_name: function_name.to_string(),
            function_version: crate::runtimes::LATEST_VERSION.into(),
            memory_limit_mb: memory_mb,
            invoked_function_arn: format!("arn:aws:lambda:local:000000000000:function:{function_name}"),
            log_stream_name: String::new(),
            nonce: new_nonce(),
        }
    }
}

/// Result of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvokeOutcome {
    /// The function returned; JSON text of its result.
    Ok(String),
    /// The function raised.
    Error(FunctionError),
}

#[derive(Deserialize)]
struct Reply {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    ok: bool,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<FunctionError>,
    #[serde(default)]
    nonce: Option<String>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

pub struct Channel {
    control: UnixStream,
    log: std::fs::File,
    inbuf: Vec<u8>,
    logs: Vec<u8>,
    /// Frames dropped because they did not carry the request's nonce.
    pub stale_frames: u64,
}

/// What a runtime's `ready` frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// A restored clone must be sent `restored` (absent means yes).
    pub restore_notice: bool,
    /// The runtime waits as a base: started, no function loaded (see [`Channel::load`]).
    pub base: bool,
}

impl Channel {
    pub fn new(control: OwnedFd, log: OwnedFd) -> io::Result<Channel> {
        let control = UnixStream::from(control);
        let log = std::fs::File::from(log);
        nix::fcntl::fcntl(std::os::fd::AsRawFd::as_raw_fd(&log), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
        Ok(Channel { control, log, inbuf: Vec::new(), logs: Vec::new(), stale_frames: 0 })
    }

    /// Log output collected so far (and forget it).
    pub fn take_logs(&mut self) -> String {
        self.drain_log();
        String::from_utf8_lossy(&std::mem::take(&mut self.logs)).into_owned()
    }

    /// Log output collected so far, kept for [`Channel::take_logs`]: the error that
    /// reports a closed channel quotes the last lines, and the invocation's log (the
    /// Lambda log tail) still holds them.
    fn peek_logs(&mut self) -> String {
        self.drain_log();
        String::from_utf8_lossy(&self.logs).into_owned()
    }

    fn drain_log(&mut self) {
        let mut buf = [0u8; 16384];
        loop {
            match self.log.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.logs.extend_from_slice(&buf[..n]);
                    if self.logs.len() > MAX_LOG {
                        let cut = self.logs.len() - MAX_LOG;
                        self.logs.drain(..cut);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    }

    fn send(&mut self, msg: &impl Serialize) -> Result<(), ChannelError> {
        let body = serde_json::to_vec(msg).map_err(|e| ChannelError::Protocol(e.to_string()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        match self.control.write_all(&frame) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(ChannelError::Closed { logs: self.peek_logs() }),
            Err(e) => Err(ChannelError::Io(e)),
        }
    }

    /// Read one frame, draining logs meanwhile, within `timeout`.
    fn recv(&mut self, timeout: Duration) -> Result<Reply, ChannelError> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if self.inbuf.len() >= 4 {
                let len = u32::from_be_bytes(self.inbuf[..4].try_into().expect("4 bytes")) as usize;
                if len > MAX_FRAME {
                    return Err(ChannelError::Protocol(format!("frame of {len} bytes exceeds {MAX_FRAME}")));
                }
                if self.inbuf.len() >= 4 + len {
                    let body: Vec<u8> = self.inbuf.drain(..4 + len).skip(4).collect();
                    self.drain_log();
                    return serde_json::from_slice(&body)
                        .map_err(|e| ChannelError::Protocol(format!("bad frame: {e}")));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.drain_log();
                return Err(ChannelError::Timeout(timeout));
            }
            let (ctl, log) = {
                let mut fds = [
                    PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.log.as_fd(), PollFlags::POLLIN),
                ];
                let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
                match poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(ChannelError::Io(e.into())),
                }
                let r = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
                (r(0), r(1))
            };
            if log {
                self.drain_log();
            }
            if ctl {
                match self.control.read(&mut buf) {
                    Ok(0) => return Err(ChannelError::Closed { logs: self.peek_logs() }),
                    Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                        return Err(ChannelError::Closed { logs: self.peek_logs() })
                    }
                    Err(e) => return Err(ChannelError::Io(e)),
                }
            }
        }
    }

    /// Wait for the runtime's `ready` (its init finished) or `init_error`.
    /// Returns whether a restored clone must be sent `restored` (the shim says
    /// so with `restore_notice`; absent means yes).
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<bool, ChannelError> {
        self.wait_ready_as(timeout).map(|r| r.restore_notice)
    }

    /// [`Channel::wait_ready`], with everything the `ready` frame says.
    pub fn wait_ready_as(&mut self, timeout: Duration) -> Result<Ready, ChannelError> {
        let r = self.recv(timeout)?;
        let flag = |k: &str| r.rest.get(k).and_then(|v| v.as_bool());
        match r.kind.as_str() {
            "ready" => Ok(Ready { restore_notice: flag("restore_notice").unwrap_or(true), base: flag("base").unwrap_or(false) }),
            "init_error" => {
                let v = serde_json::Value::Object(r.rest);
                let e: FunctionError = serde_json::from_value(v).map_err(|e| ChannelError::Protocol(format!("init_error: {e}")))?;
                Err(ChannelError::Init(e))
            }
            other => Err(ChannelError::Protocol(format!("expected ready, got '{other}'"))),
        }
    }

    /// Read frames until one carries `nonce` (dropping the others), within `timeout`.
    fn recv_reply(&mut self, nonce: &str, timeout: Duration) -> Result<Reply, ChannelError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self.recv(left).map_err(|e| match e {
                ChannelError::Timeout(_) => ChannelError::Timeout(timeout),
                e => e,
            })?;
            if r.nonce.as_deref() == Some(nonce) {
                return Ok(r);
            }
            self.stale_frames += 1;
            tracing::warn!(kind = %r.kind, "dropped a control frame without this request's nonce (stale or written by the function)");
        }
    }

    /// Drop everything queued on the control channel (the runtime is idle: whatever
    /// is there was written by a previous tenant). Called before an instance is reused
    /// by someone else, so that half a frame cannot desynchronise the next reply.
    pub fn discard_pending(&mut self) -> Result<usize, ChannelError> {
        self.drain_log();
        let mut dropped = std::mem::take(&mut self.inbuf).len();
        self.control.set_nonblocking(true).map_err(ChannelError::Io)?;
        let mut buf = [0u8; 16384];
        let r = loop {
            match self.control.read(&mut buf) {
                Ok(0) => break Err(ChannelError::Closed { logs: self.peek_logs() }),
                Ok(n) => dropped += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(dropped),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(ChannelError::Io(e)),
            }
        };
        self.control.set_nonblocking(false).map_err(ChannelError::Io)?;
        r
    }

    /// Tell a runtime waiting as a base (`ready` with `base`) which function it is:
    /// its environment (`_HANDLER` names the handler). The runtime imports it and
    /// answers as a booting runtime does (`ready` or `init_error`). `serve`: the
    /// instance serves invocations next, it is not captured (a repurposed base
    /// instance): the runtime skips what only makes a snapshot smaller (a full GC).
    pub fn load(&mut self, env: &[(String, String)], serve: bool, timeout: Duration) -> Result<Ready, ChannelError> {
        let env: serde_json::Map<String, serde_json::Value> = env.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        self.send(&serde_json::json!({"type": "load", "env": env, "serve": serve}))?;
        self.wait_ready_as(timeout)
    }

    /// Tell a restored runtime it is a new clone (it reseeds and runs its
    /// after-restore hooks) and wait for its `ok`. A hook failure is an
    /// `Init` error: the instance must be discarded.
    pub fn restored(&mut self, timeout: Duration) -> Result<(), ChannelError> {
        let nonce = new_nonce();
        self.send(&serde_json::json!({"type": "restored", "nonce": nonce}))?;
        let r = self.recv_reply(&nonce, timeout)?;
        match r.kind.as_str() {
            "ok" => Ok(()),
            "error" => {
                let e: FunctionError = serde_json::from_value(serde_json::Value::Object(r.rest))
                    .map_err(|e| ChannelError::Protocol(format!("error reply to restored: {e}")))?;
                Err(ChannelError::Init(e))
            }
            other => Err(ChannelError::Protocol(format!("expected ok after restored, got '{other}'"))),
        }
    }

    /// Send one invocation and wait for its result.
    pub fn invoke(&mut self, req: &InvokeRequest, timeout: Duration) -> Result<InvokeOutcome, ChannelError> {
        self.send(req)?;
        let r = self.recv_reply(&req.nonce, timeout)?;
        if r.kind != "result" {
            return Err(ChannelError::Protocol(format!("expected result, got '{}'", r.kind)));
        }
        match (r.ok, r.result, r.error) {
            (true, Some(res), _) => Ok(InvokeOutcome::Ok(res)),
            (false, _, Some(e)) => Ok(InvokeOutcome::Error(e)),
            _ => Err(ChannelError::Protocol("result frame without result or error".into())),
        }
    }

    /// Ask the runtime to exit.
    pub fn shutdown(&mut self) {
        let _ = self.send(&serde_json::json!({"type": "shutdown"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn pair() -> (Channel, UnixStream, std::fs::File) {
        let (a, b) = UnixStream::pair().unwrap();
        let (lr, lw) = nix::unistd::pipe().unwrap();
        (Channel::new(a.into(), lr).unwrap(), b, std::fs::File::from(lw))
    }

    fn frame(v: serde_json::Value) -> Vec<u8> {
        let b = serde_json::to_vec(&v).unwrap();
        let mut f = (b.len() as u32).to_be_bytes().to_vec();
        f.extend(b);
        f
    }

    #[test]
    fn ready_then_result_with_logs() {
        let (mut ch, mut peer, mut log) = pair();
        peer.write_all(&frame(serde_json::json!({"type":"ready"}))).unwrap();
        assert!(ch.wait_ready(Duration::from_secs(5)).unwrap(), "no restore_notice field means a notice is needed");
        peer.write_all(&frame(serde_json::json!({"type":"ready","restore_notice":false}))).unwrap();
        assert!(!ch.wait_ready(Duration::from_secs(5)).unwrap());
        log.write_all(b"hello log\n").unwrap();
        let req = InvokeRequest::new("r1".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"{\"a\":1}","nonce":req.nonce}))).unwrap();
        assert_eq!(ch.invoke(&req, Duration::from_secs(5)).unwrap(), InvokeOutcome::Ok("{\"a\":1}".into()));
        assert_eq!(ch.take_logs(), "hello log\n");
        // The request reached the peer as a frame.
        let mut len = [0u8; 4];
        peer.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        peer.read_exact(&mut body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "invoke");
        assert_eq!(v["request_id"], "r1");
        assert_eq!(v["nonce"], req.nonce.as_str());
    }

    /// Frames without the request's nonce (a function writing to fd 3, a previous
    /// tenant's leftovers) are dropped; queued junk is discarded before reuse.
    #[test]
    fn stale_or_forged_frames_are_never_the_answer() {
        let (mut ch, mut peer, _log) = pair();
        let req = InvokeRequest::new("r1".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"\"forged\""}))).unwrap();
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"\"old\"","nonce":"0123"}))).unwrap();
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"\"real\"","nonce":req.nonce}))).unwrap();
        assert_eq!(ch.invoke(&req, Duration::from_secs(5)).unwrap(), InvokeOutcome::Ok("\"real\"".into()));
        assert_eq!(ch.stale_frames, 2);
        // Half a frame left behind would swallow the next reply: discarded before reuse.
        peer.write_all(&[0, 0, 1, 0, b'{']).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(ch.discard_pending().unwrap(), 5);
        let req = InvokeRequest::new("r2".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        assert_ne!(req.nonce, InvokeRequest::new("r2".into(), "{}".into(), "f", 128, Duration::from_secs(3)).nonce);
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"2","nonce":req.nonce}))).unwrap();
        assert_eq!(ch.invoke(&req, Duration::from_secs(5)).unwrap(), InvokeOutcome::Ok("2".into()));
        // Only stale frames until the deadline: a timeout, not a stale answer.
        let req = InvokeRequest::new("r3".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":true,"result":"\"forged\""}))).unwrap();
        assert!(matches!(ch.invoke(&req, Duration::from_millis(200)), Err(ChannelError::Timeout(_))));
    }

    /// A crash's last words are both in the error and in the invocation's log.
    #[test]
    fn logs_before_a_crash_stay_in_the_log() {
        let (mut ch, peer, mut log) = pair();
        log.write_all(b"line one\nlast words\n").unwrap();
        drop(log);
        drop(peer);
        let req = InvokeRequest::new("r1".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        match ch.invoke(&req, Duration::from_secs(5)).unwrap_err() {
            ChannelError::Closed { logs } => assert!(logs.ends_with("last words\n"), "{logs:?}"),
            e => panic!("unexpected {e}"),
        }
        assert_eq!(ch.take_logs(), "line one\nlast words\n");
    }

    #[test]
    fn init_error_and_function_error_and_close() {
        let (mut ch, mut peer, _log) = pair();
        peer.write_all(&frame(serde_json::json!({"type":"init_error","errorType":"Runtime.ImportModuleError","errorMessage":"Unable to import module 'x'","stackTrace":[]}))).unwrap();
        let e = ch.wait_ready(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.to_string(), "function init failed: Runtime.ImportModuleError: Unable to import module 'x'");
        let req = InvokeRequest::new("r2".into(), "{}".into(), "f", 128, Duration::from_secs(3));
        peer.write_all(&frame(serde_json::json!({"type":"result","ok":false,"error":{"errorType":"ValueError","errorMessage":"bad","stackTrace":["x"]},"nonce":req.nonce}))).unwrap();
        match ch.invoke(&req, Duration::from_secs(5)).unwrap() {
            InvokeOutcome::Error(e) => assert_eq!((e.error_type.as_str(), e.error_message.as_str()), ("ValueError", "bad")),
            other => panic!("unexpected {other:?}"),
        }
        drop(peer);
        let e = ch.invoke(&req, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ChannelError::Closed { .. }), "{e}");
    }

    /// A peer that answers each of `replies` to the next request, echoing its nonce.
    fn echo_peer(mut peer: UnixStream, replies: Vec<serde_json::Value>) -> std::thread::JoinHandle<Vec<serde_json::Value>> {
        std::thread::spawn(move || {
            let mut seen = vec![];
            for mut reply in replies {
                let mut len = [0u8; 4];
                peer.read_exact(&mut len).unwrap();
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                peer.read_exact(&mut body).unwrap();
                let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
                reply["nonce"] = req["nonce"].clone();
                peer.write_all(&frame(reply)).unwrap();
                seen.push(req);
            }
            seen
        })
    }

    #[test]
    fn restored_handshake() {
        let (mut ch, peer, _log) = pair();
        let t = echo_peer(
            peer,
            vec![
                serde_json::json!({"type":"ok"}),
                serde_json::json!({"type":"error","errorType":"HookError","errorMessage":"boom","stackTrace":[]}),
            ],
        );
        ch.restored(Duration::from_secs(5)).unwrap();
        let e = ch.restored(Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.to_string(), "function init failed: HookError: boom");
        let seen = t.join().unwrap();
        assert_eq!(seen[0]["type"], "restored");
        assert_ne!(seen[0]["nonce"], seen[1]["nonce"], "a fresh nonce per request");
    }

    #[test]
    fn times_out() {
        let (mut ch, _peer, _log) = pair();
        let e = ch.wait_ready(Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.to_string(), "no response from the instance within 50ms");
    }
}
