"""Thaw custom-runtime bridge (provided.al2023, provided.al2).

Started inside the sandbox as

    /usr/bin/python3 /var/runtime/provided/bridge.py

with cwd = /var/task, fd 1/2 = the function's log pipe and fd 3 = the node's control
channel (4-byte big-endian length + UTF-8 JSON, the protocol of the Python shim; see
runtimes/python/README.md). It serves Lambda's Runtime API (2018-06-01) on
$AWS_LAMBDA_RUNTIME_API (127.0.0.1:9001, loopback of the sandbox's own network
namespace) and runs the function's `bootstrap` (/var/task/bootstrap, else
/opt/bootstrap, as Lambda looks for it) as its child, so a Go or Rust function built
with the official runtime libraries (aws-lambda-go, the lambda_runtime crate) runs
unchanged:

- init ends when the bootstrap first asks for /runtime/invocation/next ("ready"), or
  fails when it posts /runtime/init/error or exits first ("init_error");
- each "invoke" frame becomes the answer to a pending /next; the bootstrap's
  /invocation/<id>/response or /error becomes the "result" frame;
- if the bootstrap exits, the bridge exits too: the node sees the channel close and
  reports Runtime.ExitError, as for any crashed instance.

Such an instance is never snapshotted (two processes and a TCP connection: the
engine restores neither); the node cold-boots each one. Standard library only.
"""

import json
import os
import queue
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The control channel's framing is the Python shim's (runtimes/python/bootstrap.py,
# installed beside this directory): reuse it rather than keep a second copy.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from bootstrap import ProtocolError, _ChannelClosed, _echo_nonce, _recv, _send  # noqa: E402

API = "/2018-06-01/runtime"
BOOTSTRAPS = ("/var/task/bootstrap", "/opt/bootstrap")

# What the HTTP threads and the bootstrap's watcher tell the main thread.
_control = queue.Queue()
# Invocations waiting for the bootstrap's next /next.
_pending = queue.Queue()
_state = {"asked_next": False, "current": None, "ready": False}
_lock = threading.Lock()


def _error_object(body, header_type, default_type):
    """A Lambda error object from what the bootstrap posted."""
    try:
        obj = json.loads(body or b"{}")
    except ValueError:
        obj = {}
    if not isinstance(obj, dict):
        obj = {}
    stack = obj.get("stackTrace") or []
    if not isinstance(stack, list):
        stack = [str(stack)]
    return {"errorType": str(obj.get("errorType") or header_type or default_type),
            "errorMessage": str(obj.get("errorMessage") or ""),
            "stackTrace": [str(s) for s in stack]}


class RuntimeApi(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the runtime clients expect

    def log_message(self, fmt, *args):  # the function's log is for the function
        pass

    def _body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _answer(self, code, obj=None, body=None, headers=()):
        data = body if body is not None else json.dumps(obj if obj is not None else {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != API + "/invocation/next":
            return self._answer(404, {"errorType": "NotFound", "errorMessage": "unknown path " + self.path})
        with _lock:
            first = not _state["asked_next"]
            _state["asked_next"] = True
        if first:
            _control.put(("next",))
        ev = _pending.get()
        with _lock:
            _state["current"] = ev["request_id"]
        headers = [("Lambda-Runtime-Aws-Request-Id", ev["request_id"]),
                   ("Lambda-Runtime-Deadline-Ms", str(ev.get("deadline_ms") or 0)),
                   ("Lambda-Runtime-Invoked-Function-Arn", ev.get("invoked_function_arn") or ""),
                   ("Lambda-Runtime-Trace-Id", "Root=1-00000000-%s;Sampled=0" % ev["request_id"].replace("-", "")[:24])]
        payload = ev.get("payload")
        self._answer(200, body=(payload if payload not in (None, "") else "{}").encode("utf-8"), headers=headers)

    def do_POST(self):
        body = self._body()
        error_type = self.headers.get("Lambda-Runtime-Function-Error-Type")
        if self.path == API + "/init/error":
            _control.put(("init_error", _error_object(body, error_type, "Runtime.Unknown")))
            return self._answer(202, {"status": "OK"})
        parts = self.path[len(API):].strip("/").split("/") if self.path.startswith(API) else []
        if len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
            with _lock:
                current = _state["current"]
                if parts[1] != current:
                    current = None
                else:
                    _state["current"] = None
            if current is None:
                return self._answer(400, {"errorType": "InvalidRequestID",
                                          "errorMessage": "Invalid request ID: " + parts[1]})
            if parts[2] == "response":
                _control.put(("response", parts[1], body))
            else:
                _control.put(("error", parts[1], _error_object(body, error_type, "Unhandled")))
            return self._answer(202, {"status": "OK"})
        self._answer(404, {"errorType": "NotFound", "errorMessage": "unknown path " + self.path})


def _start_bootstrap():
    for path in BOOTSTRAPS:
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):
                return None, {"errorType": "Runtime.InvalidEntrypoint",
                              "errorMessage": "%s is not executable (permission denied)" % path}
            break
    else:
        return None, {"errorType": "Runtime.InvalidEntrypoint",
                      "errorMessage": "Couldn't find valid bootstrap(s): [%s]" % " ".join(BOOTSTRAPS)}
    try:
        # close_fds: the control channel (fd 3) stays the bridge's alone.
        proc = subprocess.Popen([path], stdin=subprocess.DEVNULL, close_fds=True)
    except OSError as e:
        return None, {"errorType": "Runtime.InvalidEntrypoint", "errorMessage": "cannot start %s: %s" % (path, e)}

    def watch():
        code = proc.wait()
        with _lock:
            ready = _state["ready"]
        if not ready:
            _control.put(("exit", code))
            return
        # After init the bridge goes with its bootstrap: the node sees the channel
        # close (Runtime.ExitError) whether or not an invocation is running.
        sys.stderr.write("thaw bridge: the bootstrap ended (%s)\n" % _exit_message(code))
        sys.stderr.flush()
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
    return proc, None


def _exit_message(code):
    return "Runtime exited with error: %s" % ("signal: %d" % -code if code < 0 else "exit status %d" % code)


def _init_failed(err, proc):
    err.setdefault("stackTrace", [])
    try:
        _send(dict(err, type="init_error"))
    except OSError:
        pass
    if proc is not None and proc.poll() is None:
        proc.kill()
    os._exit(1)


def _invoke(msg, proc):
    _pending.put(msg)
    while True:
        ev = _control.get()
        if ev[0] == "response" and ev[1] == msg["request_id"]:
            return {"type": "result", "ok": True, "result": ev[2].decode("utf-8", "replace")}
        if ev[0] == "error" and ev[1] == msg["request_id"]:
            return {"type": "result", "ok": False, "error": ev[2]}
        if ev[0] == "exit":
            sys.stderr.write("thaw bridge: the bootstrap ended during an invocation (%s)\n" % _exit_message(ev[1]))
            sys.stderr.flush()
            os._exit(1)


def main():
    host, _, port = (os.environ.get("AWS_LAMBDA_RUNTIME_API") or "127.0.0.1:9001").rpartition(":")
    try:
        server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), RuntimeApi)
    except OSError as e:
        _init_failed({"errorType": "Runtime.Unknown", "errorMessage": "the Runtime API cannot listen: %s" % e}, None)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proc, err = _start_bootstrap()
    if err is not None:
        _init_failed(err, proc)
    ev = _control.get()
    if ev[0] == "init_error":
        _init_failed(ev[1], proc)
    if ev[0] == "exit":
        _init_failed({"errorType": "Runtime.ExitError", "errorMessage": _exit_message(ev[1])}, proc)
    with _lock:
        _state["ready"] = True
    _send({"type": "ready", "restore_notice": False})
    try:
        while True:
            msg = _recv()
            kind = msg.get("type")
            if kind == "invoke":
                _send(_echo_nonce(msg, _invoke(msg, proc)))
            elif kind == "restored":
                _send(_echo_nonce(msg, {"type": "ok"}))
            elif kind == "shutdown":
                break
            else:
                raise ProtocolError("unknown message type %r" % (kind,))
    except (_ChannelClosed, BrokenPipeError, ConnectionResetError):
        pass
    except ProtocolError as e:
        sys.stderr.write("thaw bridge: protocol error: %s\n" % e)
        proc.kill()
        return 2
    proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
