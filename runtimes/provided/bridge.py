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
import signal
import socket
import sys
import threading

# The control channel's framing is the Python shim's (runtimes/python/bootstrap.py,
# installed beside this directory): reuse it rather than keep a second copy.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from bootstrap import ProtocolError, _ChannelClosed, _echo_nonce, _recv, _send  # noqa: E402

CONTROL_FD = 3
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


REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large"}
MAX_BODY = 64 * 1024 * 1024


def _read_body(f, headers):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts, total = [], 0
        while True:
            size = int(f.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while f.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise ValueError("body too large")
            parts.append(f.read(size))
            f.readline(3)
    n = int(headers.get("content-length") or 0)
    if n > MAX_BODY:
        raise ValueError("body too large")
    return f.read(n) if n else b""


def _next():
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
    return 200, (payload if payload not in (None, "") else "{}").encode("utf-8"), headers


def _post(path, headers, body):
    error_type = headers.get("lambda-runtime-function-error-type")
    if path == API + "/init/error":
        _control.put(("init_error", _error_object(body, error_type, "Runtime.Unknown")))
        return 202, {"status": "OK"}
    parts = path[len(API):].strip("/").split("/") if path.startswith(API) else []
    if len(parts) != 3 or parts[0] != "invocation" or parts[2] not in ("response", "error"):
        return 404, {"errorType": "NotFound", "errorMessage": "unknown path " + path}
    with _lock:
        ok = parts[1] == _state["current"]
        if ok:
            _state["current"] = None
    if not ok:
        return 400, {"errorType": "InvalidRequestID", "errorMessage": "Invalid request ID: " + parts[1]}
    if parts[2] == "response":
        _control.put(("response", parts[1], body))
    else:
        _control.put(("error", parts[1], _error_object(body, error_type, "Unhandled")))
    return 202, {"status": "OK"}


def _handle(method, path, headers, body):
    """(status, JSON object or bytes, extra headers) for one Runtime API request."""
    if method == "GET" and path == API + "/invocation/next":
        return _next()
    if method == "POST":
        return _post(path, headers, body) + ([],)
    return 404, {"errorType": "NotFound", "errorMessage": "unknown path %s %s" % (method, path)}, []


def _connection(sock):
    """One keep-alive HTTP/1.1 connection of the bootstrap's client. Hand-written rather
    than http.server: importing that costs ~35 ms at every cold start (measured), and
    the Runtime API needs four routes of plain HTTP/1.1."""
    f = sock.makefile("rb")
    try:
        while True:
            line = f.readline(65537)
            if not line:
                return
            request = line.decode("latin-1").split()
            headers = {}
            while True:
                h = f.readline(65537)
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            if len(request) != 3:
                code, obj, extra, keep = 400, {"errorType": "BadRequest", "errorMessage": "malformed request line"}, [], False
            else:
                method, path, version = request
                try:
                    body = _read_body(f, headers)
                    code, obj, extra = _handle(method, path, headers, body)
                except ValueError as e:
                    code, obj, extra = 413, {"errorType": "RequestTooLarge", "errorMessage": str(e)}, []
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close" and code != 413
            data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            head = ["HTTP/1.1 %d %s" % (code, REASONS.get(code, "")), "Content-Type: application/json",
                    "Content-Length: %d" % len(data)] + ["%s: %s" % kv for kv in extra]
            if not keep:
                head.append("Connection: close")
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            if not keep:
                return
    except OSError:
        return
    finally:
        f.close()
        sock.close()


def _serve(listener):
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=_connection, args=(sock,), daemon=True).start()


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
    # The control channel (fd 3) stays the bridge's alone; the listening socket is
    # close-on-exec already (PEP 446).
    os.set_inheritable(CONTROL_FD, False)
    try:
        pid = os.posix_spawn(path, [path], os.environ,
                             file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)])
    except OSError as e:
        return None, {"errorType": "Runtime.InvalidEntrypoint", "errorMessage": "cannot start %s: %s" % (path, e)}

    def watch():
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
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
    return pid, None


def _kill(pid):
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _exit_message(code):
    return "Runtime exited with error: %s" % ("signal: %d" % -code if code < 0 else "exit status %d" % code)


def _init_failed(err, proc):
    err.setdefault("stackTrace", [])
    try:
        _send(dict(err, type="init_error"))
    except OSError:
        pass
    _kill(proc)
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
        listener = socket.create_server((host or "127.0.0.1", int(port)), backlog=16)
    except OSError as e:
        _init_failed({"errorType": "Runtime.Unknown", "errorMessage": "the Runtime API cannot listen: %s" % e}, None)
    threading.Thread(target=_serve, args=(listener,), daemon=True).start()
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
        _kill(proc)
        return 2
    _kill(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
