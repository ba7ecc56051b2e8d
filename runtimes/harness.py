#!/usr/bin/python3
"""Minimal stand-in for the Rust node for every runtime (python, nodejs, java).

Starts a runtime shim over a socketpair at fd 3, speaks the control protocol
(runtimes/python/README.md) and prints one JSON object:

    {"init": <ready or init_error frame>, "results": [<result frames>],
     "exit_code": N, "log": "<stdout+stderr of the function>",
     "init_ms": .., "invoke_ms": [..], "threads": N, "fds": [..]}

Usage:
    harness.py --runtime nodejs --code DIR --handler index.handler [--payload JSON]...
               [--invocations N] [--restored]

The runtime directory is laid out as install_shims() does (a temp dir with
symlinks to runtimes/<rt>/ files and build/runtimes/java/*.jar), and the
environment mirrors crates/runtime/src/runtimes.rs.  No sandbox: this only
exercises the runtime shim and the function.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JAVA_JAR = os.path.join(ROOT, "build", "runtimes", "java", "thaw-java-runtime.jar")
MAX_FD = os.sysconf("SC_OPEN_MAX")


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


_runtime_dir = None


def runtime_dir():
    """A directory shaped like install_shims() output, made of symlinks."""
    global _runtime_dir
    if _runtime_dir is None:
        d = tempfile.mkdtemp(prefix="thaw-runtimes-")
        for rt, files in (("python", ["bootstrap.py", "thaw_runtime.py"]),
                          ("nodejs", ["bootstrap.sh", "bootstrap.js"]),
                          ("java", ["bootstrap.sh"])):
            os.makedirs(os.path.join(d, rt))
            for f in files:
                src = os.path.join(HERE, rt, f)
                if os.path.exists(src):
                    os.symlink(src, os.path.join(d, rt, f))
        for built in (JAVA_JAR, os.path.join(os.path.dirname(JAVA_JAR), "libthawenv.so")):
            if os.path.exists(built):
                os.symlink(built, os.path.join(d, "java", os.path.basename(built)))
        _runtime_dir = d
        import atexit
        atexit.register(shutil.rmtree, d, True)
    return _runtime_dir


def argv_for(runtime):
    d = runtime_dir()
    if runtime == "python":
        return ["/usr/bin/python3", os.path.join(d, "python", "bootstrap.py")]
    if runtime == "nodejs":
        return ["/bin/sh", os.path.join(d, "nodejs", "bootstrap.sh")]
    if runtime == "java":
        if not os.path.exists(JAVA_JAR):
            raise RuntimeError("%s missing: run scripts/build-runtimes.sh" % JAVA_JAR)
        return ["/bin/sh", os.path.join(d, "java", "bootstrap.sh")]
    raise ValueError("unknown runtime %r" % runtime)


def env_for(runtime, code_dir, handler, function_name="test-fn", memory_mb=256):
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TZ": ":UTC",
        "HOME": tempfile.gettempdir(),
        "LAMBDA_TASK_ROOT": os.path.abspath(code_dir),
        "LAMBDA_RUNTIME_DIR": runtime_dir(),
        "_HANDLER": handler,
        "AWS_LAMBDA_FUNCTION_NAME": function_name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb),
        "AWS_REGION": "local",
    }
    if runtime == "python":
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    elif runtime == "nodejs":
        env.update(NODE_OPTIONS="", UV_THREADPOOL_SIZE="1",
                   NODE_PATH="/opt/nodejs/node20/node_modules:/opt/nodejs/node_modules:" + os.path.abspath(code_dir),
                   AWS_EXECUTION_ENV="AWS_Lambda_nodejs20.x")
    elif runtime == "java":
        env.update(AWS_EXECUTION_ENV="AWS_Lambda_java17",
                   JAVA_HOME="/usr/lib/jvm/java-17-openjdk-amd64")
    return env


class Runtime(object):
    """A running shim with its control socket (the node's end)."""

    def __init__(self, runtime, code_dir, handler, env=None, function_name="test-fn", memory_mb=256):
        self.runtime = runtime
        self.parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log = tempfile.TemporaryFile()
        full_env = env_for(runtime, code_dir, handler, function_name, memory_mb)
        if env:
            full_env.update(env)
        cfd = child.fileno()

        def to_fd3():
            if cfd != 3:
                os.dup2(cfd, 3)
            else:
                os.set_inheritable(3, True)
            os.closerange(4, MAX_FD)

        stdin = open(os.devnull, "rb")
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(
            argv_for(runtime), cwd=os.path.abspath(code_dir), env=full_env,
            stdin=stdin, stdout=self.log, stderr=subprocess.STDOUT,
            close_fds=False, preexec_fn=to_fd3)
        stdin.close()
        child.close()
        try:
            self.init = recv_frame(self.parent)
        except EOFError:
            self.init = None
        self.init_ms = (time.perf_counter() - self.t_start) * 1000.0

    @property
    def pid(self):
        return self.proc.pid

    def threads(self):
        return len(os.listdir("/proc/%d/task" % self.pid))

    def fds(self):
        out = []
        base = "/proc/%d/fd" % self.pid
        for n in sorted(os.listdir(base), key=int):
            try:
                out.append("%s -> %s" % (n, os.readlink(os.path.join(base, n))))
            except OSError:
                pass
        return out

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

    def restored(self):
        send_frame(self.parent, {"type": "restored"})
        return recv_frame(self.parent)

    def send(self, msg):
        send_frame(self.parent, msg)

    def recv(self):
        return recv_frame(self.parent)

    def shutdown(self, timeout=20):
        try:
            send_frame(self.parent, {"type": "shutdown"})
        except OSError:
            pass
        return self.close(timeout)

    def close(self, timeout=20):
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
    ap.add_argument("--runtime", default="python", choices=["python", "nodejs", "java"])
    ap.add_argument("--code", required=True)
    ap.add_argument("--handler", required=True)
    ap.add_argument("--payload", action="append", default=None,
                    help="event JSON; repeat for several invocations")
    ap.add_argument("--invocations", type=int, default=None)
    ap.add_argument("--memory", type=int, default=256)
    ap.add_argument("--restored", action="store_true", help="send a 'restored' frame before invoking")
    a = ap.parse_args(argv)
    payloads = a.payload or ["{}"]
    if a.invocations:
        payloads = [payloads[i % len(payloads)] for i in range(a.invocations)]
    rt = Runtime(a.runtime, a.code, a.handler, memory_mb=a.memory)
    out = {"init": rt.init, "init_ms": round(rt.init_ms, 3), "results": [], "invoke_ms": []}
    if rt.init and rt.init.get("type") == "ready":
        try:
            out["threads"] = rt.threads()
            out["fds"] = rt.fds()
        except OSError:
            pass
        if a.restored:
            out["restored"] = rt.restored()
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
