"""Thaw Python runtime shim (AWS Lambda Python conventions).

Started inside the sandbox as

    /usr/bin/python3 /var/runtime/python/bootstrap.py

with cwd = $LAMBDA_TASK_ROOT (/var/task) and _HANDLER=module.function.
fd 0 = /dev/null, fd 1/2 = the function's log pipe, fd 3 = the control
channel (connected AF_UNIX SOCK_STREAM).  See README.md beside this file
for the wire protocol; it is the contract with the Rust node.

Snapshot rules this file obeys: after "ready" the process blocks in a plain
read(2) on fd 3.  The engine may freeze it there and resume it later, maybe
in a fresh process whose fd 3 is a NEW socket.  Therefore nothing about the
socket is cached beyond the number 3 (we only use os.read/os.write on it),
no threads are started, and no other file or socket stays open after init.
Standard library only.
"""

import gc
import json
import os
import sys
import time
import traceback

# Snapshot hooks (register_before_snapshot / register_after_restore).  Imported
# while sys.path[0] is still this script's directory, so the function's own
# `import thaw_runtime` gets this very module from sys.modules.
import thaw_runtime

CONTROL_FD = 3
MAX_FRAME = 64 * 1024 * 1024
_THIS_FILE = os.path.abspath(__file__)


# --------------------------------------------------------------------------
# framing: 4-byte big-endian length + UTF-8 JSON
# --------------------------------------------------------------------------

class _ChannelClosed(Exception):
    pass


def _read_exact(n):
    """Read exactly n bytes from fd 3. Raises _ChannelClosed on EOF.

    os.read retries EINTR by itself (PEP 475), so a SIGSTOP/SIGCONT or a
    freezer thaw while blocked here is harmless.
    """
    chunk = os.read(CONTROL_FD, n)
    if len(chunk) == n:
        return chunk
    if not chunk:
        raise _ChannelClosed()
    parts = [chunk]
    got = len(chunk)
    while got < n:
        chunk = os.read(CONTROL_FD, n - got)
        if not chunk:
            raise _ChannelClosed()
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _recv():
    header = _read_exact(4)
    length = int.from_bytes(header, "big")
    if length > MAX_FRAME:
        raise ProtocolError("frame of %d bytes exceeds the 64 MiB limit" % length)
    body = _read_exact(length) if length else b""
    try:
        msg = json.loads(body)
    except ValueError as e:
        raise ProtocolError("frame is not valid JSON: %s" % e)
    if not isinstance(msg, dict):
        raise ProtocolError("frame is not a JSON object")
    return msg


def _send(msg):
    # ensure_ascii (the default) keeps the frame pure ASCII, hence valid UTF-8
    # even if a string holds lone surrogates.
    body = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_FRAME:
        body = json.dumps(
            _result_error("Runtime.ResponseSizeTooLarge",
                          "Response of %d bytes exceeds the 64 MiB frame limit" % len(body),
                          []) if msg.get("type") == "result" else
            {"type": "init_error", "errorType": "Runtime.ResponseSizeTooLarge",
             "errorMessage": "init_error frame too large", "stackTrace": []},
            separators=(",", ":")).encode("utf-8")
    data = len(body).to_bytes(4, "big") + body
    view = memoryview(data)
    while view:
        written = os.write(CONTROL_FD, view)
        view = view[written:]


class ProtocolError(Exception):
    pass


def _flush_logs():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


# --------------------------------------------------------------------------
# errors, formatted as Lambda does
# --------------------------------------------------------------------------

def _user_frames(tb):
    """Traceback entries without this file's and importlib's frames."""
    frames = traceback.extract_tb(tb)
    return [f for f in frames
            if f.filename != _THIS_FILE and not f.filename.startswith("<frozen importlib")]


def _stack_trace(tb):
    return traceback.format_list(_user_frames(tb))


def _result_error(error_type, message, stack):
    return {"type": "result", "ok": False,
            "error": {"errorType": error_type, "errorMessage": message, "stackTrace": stack}}


class _InitFault(Exception):
    def __init__(self, error_type, message, stack=None):
        Exception.__init__(self, message)
        self.error_type = error_type
        self.message = message
        self.stack = stack or []


# --------------------------------------------------------------------------
# init
# --------------------------------------------------------------------------

def _load_handler(handler_name):
    try:
        modname, fname = handler_name.rsplit(".", 1)
    except ValueError as e:
        raise _InitFault("Runtime.MalformedHandlerName",
                         "Bad handler '%s': %s" % (handler_name, e))
    if not modname or not fname:
        raise _InitFault("Runtime.MalformedHandlerName",
                         "Bad handler '%s': empty module or function name" % handler_name)
    modname = modname.replace("/", ".")
    if modname.split(".")[0] in sys.builtin_module_names:
        raise _InitFault("Runtime.BuiltInModuleConflict",
                         "Cannot use built-in module %s as a handler module" % modname)
    try:
        __import__(modname)
        module = sys.modules[modname]
    except ImportError as e:
        raise _InitFault("Runtime.ImportModuleError",
                         "Unable to import module '%s': %s" % (modname, e),
                         _stack_trace(e.__traceback__))
    except SyntaxError as e:
        raise _InitFault("Runtime.UserCodeSyntaxError",
                         "Syntax error in module '%s': %s" % (modname, e),
                         ['  File "%s" Line %s\n    %s' % (e.filename, e.lineno,
                                                          (e.text or "").strip())])
    # any other exception from the module's top-level code propagates to
    # _init, which reports it under its own class name
    fn = getattr(module, fname, None)
    if fn is None or not callable(fn):
        raise _InitFault("Runtime.HandlerNotFound",
                         "Handler '%s' missing on module '%s'" % (fname, modname))
    return fn


def _init():
    task_root = os.environ.get("LAMBDA_TASK_ROOT") or "/var/task"
    # sys.path[0] is this script's directory; replace it by the task root
    # so a user module cannot be shadowed by (or shadow) the runtime.
    script_dir = os.path.dirname(_THIS_FILE)
    sys.path[:] = [p for p in sys.path if p not in (script_dir, task_root, "")]
    sys.path.insert(0, task_root)
    # Layers (extracted under /opt), after the function's own code, as Lambda orders them.
    layer_paths = ["/opt/python/lib/python%d.%d/site-packages" % sys.version_info[:2], "/opt/python"]
    sys.path[1:1] = [p for p in layer_paths if p not in sys.path]
    try:
        # Logs go to a pipe; line buffering makes each line reach the node
        # promptly (Lambda's runtime makes stdout/stderr unbuffered).
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
    except Exception:
        pass

    handler_name = os.environ.get("_HANDLER", "")
    try:
        fn = _load_handler(handler_name)
        thaw_runtime._run_before_snapshot()
    except _InitFault as f:
        return None, {"type": "init_error", "errorType": f.error_type,
                      "errorMessage": f.message, "stackTrace": f.stack}
    except Exception as e:
        return None, {"type": "init_error", "errorType": type(e).__name__,
                      "errorMessage": str(e), "stackTrace": _stack_trace(e.__traceback__)}
    return fn, None


# --------------------------------------------------------------------------
# invocation
# --------------------------------------------------------------------------

class LambdaContext(object):
    __slots__ = ("aws_request_id", "function_name", "function_version",
                 "invoked_function_arn", "memory_limit_in_mb", "log_group_name",
                 "log_stream_name", "client_context", "identity", "tenant_id",
                 "_deadline_ms")

    def __init__(self, msg, defaults):
        self.aws_request_id = msg.get("request_id", "")
        self.function_name = msg.get("function_name") or defaults[0]
        self.function_version = msg.get("function_version") or defaults[1]
        mem = msg.get("memory_limit_mb")
        self.memory_limit_in_mb = str(mem) if mem is not None else defaults[2]
        self.invoked_function_arn = msg.get("invoked_function_arn") or ""
        self.log_group_name = "/aws/lambda/" + self.function_name
        self.log_stream_name = msg.get("log_stream_name") or defaults[3]
        self.client_context = None
        self.identity = None
        self.tenant_id = None
        deadline = msg.get("deadline_ms")
        self._deadline_ms = int(deadline) if deadline is not None else None

    def get_remaining_time_in_millis(self):
        if self._deadline_ms is None:
            return 0
        return max(self._deadline_ms - int(time.time() * 1000), 0)

    def __repr__(self):
        return ("LambdaContext([aws_request_id=%s,function_name=%s,function_version=%s,"
                "invoked_function_arn=%s,memory_limit_in_mb=%s]" % (
                    self.aws_request_id, self.function_name, self.function_version,
                    self.invoked_function_arn, self.memory_limit_in_mb)) + ")"


def _context_defaults():
    # Read per invocation (cheap dict lookups) so a restored process sees
    # whatever the environment is now rather than at snapshot time.
    env = os.environ
    return (env.get("AWS_LAMBDA_FUNCTION_NAME", ""),
            env.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", ""),
            env.get("AWS_LAMBDA_LOG_STREAM_NAME", ""))


def _take_identity(msg):
    """The version this call runs, and the log stream named after it, come with the
    call: one snapshot (and one warm process) may serve $LATEST and several published
    versions, so the environment captured in the image must not decide what
    AWS_LAMBDA_FUNCTION_VERSION and AWS_LAMBDA_LOG_STREAM_NAME say."""
    env = os.environ
    for key, field in (("AWS_LAMBDA_FUNCTION_VERSION", "function_version"),
                       ("AWS_LAMBDA_LOG_STREAM_NAME", "log_stream_name")):
        value = msg.get(field)
        if value and env.get(key) != value:
            env[key] = value


def _invoke(fn, msg):
    payload = msg.get("payload")
    try:
        event = json.loads(payload) if payload not in (None, "") else None
    except ValueError as e:
        return _result_error("Runtime.UnmarshalError",
                             "Unable to unmarshal input: %s" % e, [])
    _take_identity(msg)
    context = LambdaContext(msg, _context_defaults())
    try:
        value = fn(event, context)
    except Exception as e:
        return _result_error(type(e).__name__, str(e), _stack_trace(e.__traceback__))
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        return _result_error("Runtime.MarshalError",
                             "Unable to marshal response: %s" % e, [])
    return {"type": "result", "ok": True, "result": text}


def _echo_nonce(msg, reply):
    """The node takes a reply only with its request's nonce (anything else on the
    channel is stale or was written by the function itself)."""
    if "nonce" in msg:
        reply["nonce"] = msg["nonce"]
    return reply


def _restored():
    """A restored clone: reseed, run the after-restore hooks; reply ok/error."""
    try:
        thaw_runtime._run_after_restore()
    except Exception as e:
        return {"type": "error", "errorType": type(e).__name__,
                "errorMessage": "afterRestore hook failed: %s" % e,
                "stackTrace": _stack_trace(e.__traceback__)}
    return {"type": "ok"}


def _wait_as_base():
    """THAW_BASE=1: this runtime is captured as a *base* (started, no function
    loaded; see the engine's layers.rs). Say so, then wait for the node to name the
    function: a "load" frame carries its whole environment (_HANDLER included).
    Returns False if the node said shutdown instead."""
    gc.collect()
    # The runtime's objects go to the permanent generation now, so the collections
    # of the function's init do not relink (write) every object of the base: its
    # pages stay equal to the base's and out of the diff.
    gc.freeze()
    _flush_logs()
    _send({"type": "ready", "base": True, "restore_notice": True})
    while True:
        # <- the engine snapshots a base blocked in this read
        msg = _recv()
        kind = msg.get("type")
        if kind == "load":
            break
        if kind == "restored":
            _send(_echo_nonce(msg, _restored()))
        elif kind == "shutdown":
            return False
        else:
            raise ProtocolError("a base expects load, got %r" % (kind,))
    env = msg.get("env")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ProtocolError("load carries no environment object of strings")
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        os.environ[key] = value
    # An idle base instance may have had its code replaced under it (repurposing, see
    # the engine's Instance::repurpose): its cwd is still the previous /var/task.
    os.chdir(os.environ.get("LAMBDA_TASK_ROOT") or "/var/task")
    return True


def main():
    if os.environ.get("THAW_BASE") == "1":
        try:
            if not _wait_as_base():
                return 0
        except (_ChannelClosed, BrokenPipeError, ConnectionResetError):
            return 0
        except ProtocolError as e:
            sys.stderr.write("thaw runtime: protocol error: %s\n" % e)
            _flush_logs()
            return 2
    fn, init_error = _init()
    _flush_logs()
    if init_error is not None:
        try:
            _send(init_error)
        except OSError:
            pass
        _flush_logs()
        os._exit(1)

    gc.collect()
    # Move every object that exists now into the permanent generation:
    # later collections will not walk (and so not page in) the snapshot's
    # heap, which keeps lazy restores lazy.
    gc.freeze()
    _flush_logs()
    try:
        _send({"type": "ready", "restore_notice": thaw_runtime._needs_restore_notice()})
        while True:
            # <- the engine snapshots the process blocked in this read
            msg = _recv()
            kind = msg.get("type")
            if kind == "invoke":
                reply = _invoke(fn, msg)
                _flush_logs()
                _send(_echo_nonce(msg, reply))
            elif kind == "restored":
                reply = _restored()
                _flush_logs()
                _send(_echo_nonce(msg, reply))
            elif kind == "shutdown":
                _flush_logs()
                return 0
            else:
                raise ProtocolError("unknown message type %r" % (kind,))
    except _ChannelClosed:
        _flush_logs()
        return 0
    except (BrokenPipeError, ConnectionResetError):
        _flush_logs()
        return 0
    except ProtocolError as e:
        sys.stderr.write("thaw runtime: protocol error: %s\n" % e)
        _flush_logs()
        return 2


if __name__ == "__main__":
    sys.exit(main())
