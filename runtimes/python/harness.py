#!/usr/bin/python3
"""Minimal stand-in for the Rust node, for tests and smoke checks.

Runs bootstrap.py against a code directory over a socketpair placed at fd 3,
speaks the control protocol (README.md) and prints one JSON object:

    {"init": <ready or init_error frame>, "results": [<result frames>],
     "exit_code": N, "log": "<stdout+stderr of the function>",
     "init_ms": .., "invoke_ms": [..]}

Usage:
    harness.py --code DIR --handler handler.handler [--payload JSON]...
               [--invocations N] [--python /usr/bin/python3]

No sandbox: this only exercises the runtime shim and the function.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BOOTSTRAP = os.path.join(HERE, "bootstrap.py")
MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("control channel closed")
        buf += chunk
    return buf


def recv_frame(sock):
    n = int.from_bytes(_recv_exact(sock, 4), "big")
    return json.loads(_recv_exact(sock, n).decode("utf-8"))


def send_frame(sock, msg):
    body = json.dumps(msg).encode("utf-8")
    sock.sendall(len(body).to_bytes(4, "big") + body)


class Runtime(object):
    """A running bootstrap.py process with its control socket."""

    def __init__(self, code_dir, handler, python="/usr/bin/python3", env=None,
                 function_name="test-fn"):
        self.parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log = tempfile.TemporaryFile()
        full_env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "_HANDLER": handler,
            "LAMBDA_TASK_ROOT": os.path.abspath(code_dir),
            "AWS_LAMBDA_FUNCTION_NAME": function_name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        }
        if env:
            full_env.update(env)
        cfd = child.fileno()

        def to_fd3():
            # dup2 clears FD_CLOEXEC on fd 3; then close everything above it
            # (subprocess's own close_fds would run after us and close fd 3).
            if cfd != 3:
                os.dup2(cfd, 3)
            else:
                os.set_inheritable(3, True)
            os.closerange(4, MAX_FD)

        stdin = open(os.devnull, "rb")
        self.proc = subprocess.Popen(
            [python, BOOTSTRAP], cwd=os.path.abspath(code_dir), env=full_env,
            stdin=stdin, stdout=self.log, stderr=subprocess.STDOUT,
            close_fds=False, preexec_fn=to_fd3)
        stdin.close()
        child.close()
        t0 = time.perf_counter()
        try:
            self.init = recv_frame(self.parent)
        except EOFError:
            self.init = None
        self.init_ms = (time.perf_counter() - t0) * 1000.0

    def invoke(self, payload, request_id="req-1", deadline_ms=None, **extra):
        if deadline_ms is None:
            deadline_ms = int(time.time() * 1000) + 30000
        msg = {"type": "invoke", "request_id": request_id,
               "payload": payload if isinstance(payload, str) else json.dumps(payload),
               "deadline_ms": deadline_ms, "function_name": "test-fn",
               "function_version": "$LATEST", "memory_limit_mb": 128,
               "invoked_function_arn": "arn:thaw:function:test-fn"}
        msg.update(extra)
        send_frame(self.parent, msg)
        return recv_frame(self.parent)

    def shutdown(self, timeout=10):
        try:
            send_frame(self.parent, {"type": "shutdown"})
        except OSError:
            pass
        return self.close(timeout)

    def close(self, timeout=10):
        self.parent.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code

    def read_log(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", required=True)
    ap.add_argument("--handler", default="handler.handler")
    ap.add_argument("--payload", action="append", default=None,
                    help="event JSON; repeat for several invocations")
    ap.add_argument("--invocations", type=int, default=None)
    ap.add_argument("--python", default="/usr/bin/python3")
    a = ap.parse_args(argv)
    payloads = a.payload or ["{}"]
    if a.invocations:
        payloads = [payloads[i % len(payloads)] for i in range(a.invocations)]
    rt = Runtime(a.code, a.handler, python=a.python)
    out = {"init": rt.init, "init_ms": round(rt.init_ms, 3), "results": [], "invoke_ms": []}
    if rt.init and rt.init.get("type") == "ready":
        for i, p in enumerate(payloads):
            t0 = time.perf_counter()
            out["results"].append(rt.invoke(p, request_id="req-%d" % (i + 1)))
            out["invoke_ms"].append(round((time.perf_counter() - t0) * 1000.0, 3))
        out["exit_code"] = rt.shutdown()
    else:
        out["exit_code"] = rt.close()
    out["log"] = rt.read_log()
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
