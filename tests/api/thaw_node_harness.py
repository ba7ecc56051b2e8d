"""Harness for the Lambda API tests and the API benchmark: a real `thaw serve` node and boto3 clients.

The node runs from target/release/thaw (built by scripts/setup.sh) with a
temporary data directory, fixed keys and a 2 s keep-alive. At the end it is
stopped with SIGTERM and the tests check it exited cleanly and left no sandbox.
"""

import io
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import zipfile
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import WaiterError

ROOT = Path(__file__).resolve().parents[2]
THAW = ROOT / "target" / "release" / "thaw"
SAMPLES = ROOT / "build" / "samples" / "python"
SANDBOXES = Path("/run/thaw/sandboxes")
ACCESS_KEY = "AKIDTHAWTESTS0000001"
SECRET_KEY = "thaw-tests-secret/key+0123456789abcdefgh"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProcess:
    """One `thaw serve` process."""

    def __init__(self, data_dir, *extra, keys=True, keep_alive="2", listen_host="127.0.0.1", env=None):
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [str(THAW), "--data-dir", str(self.data_dir), "--log", os.environ.get("THAW_TEST_LOG", "warn"),
                "serve", "--listen", f"{listen_host}:{self.port}", "--keep-alive", keep_alive,
                "--event-retry-delay", "0.2", *extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")} | (env or {})
        if keys:
            args += ["--access-key-id", ACCESS_KEY, "--secret-access-key", SECRET_KEY]
        self.log_path = self.data_dir / f"node-{self.port}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, env=env)
        deadline = time.time() + 20
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"thaw serve exited with {self.proc.returncode}: {self.log_path.read_text()}")
            try:
                self.status()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def pid(self):
        return self.proc.pid

    def status(self):
        with urllib.request.urlopen(self.endpoint + "/thaw/status", timeout=5) as r:
            return json.load(r)

    def metrics(self):
        with urllib.request.urlopen(self.endpoint + "/metrics", timeout=5) as r:
            return r.read().decode()

    def function_status(self, name):
        for f in self.status()["functions"]:
            if f["name"] == name:
                return f
        return None

    def client(self, key=ACCESS_KEY, secret=SECRET_KEY, retries=1, timeout=60):
        return boto3.client(
            "lambda", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=key, aws_secret_access_key=secret,
            config=Config(retries={"max_attempts": retries, "mode": "standard"}, read_timeout=timeout,
                          connect_timeout=5, max_pool_connections=32))

    def leftover_sandboxes(self):
        if not SANDBOXES.is_dir():
            return []
        return [p.name for p in SANDBOXES.iterdir() if f"-{self.pid}-" in p.name]

    def stop(self, timeout=40):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"thaw serve did not stop within {timeout}s after SIGTERM")
        finally:
            self.log.close()
        return code


def zip_bytes(files):
    """A zip of {archive name: text or Path}. A file (Path) keeps its mode; a text
    starting with "#!" is stored executable (a script, e.g. a custom runtime's bootstrap)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in files.items():
            if isinstance(content, Path):
                z.write(content, name)
            else:
                info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = (0o100755 if content.startswith("#!") else 0o100644) << 16
                z.writestr(info, content)
    return buf.getvalue()


def cli_json(p):
    """The JSON an AWS CLI command printed ({} for none)."""
    return json.loads(p.stdout) if p.stdout.strip() else {}


JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64/bin")
JAVA_RUNTIME_JAR = ROOT / "build/runtimes/java/thaw-java-runtime.jar"


def compile_java(tmp_path, cls, source):
    """The class file of `cls` (package.Name) compiled from `source` against the Java
    runtime's jar; skips the test where there is no JDK 17 or runtime jar."""
    import pytest

    if not (JDK / "javac").exists() or not JAVA_RUNTIME_JAR.exists():
        pytest.skip("no JDK 17 or Java runtime jar (scripts/setup.sh builds them)")
    rel = cls.replace(".", "/")
    src = tmp_path / "src" / (rel + ".java")
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(source)
    subprocess.run([str(JDK / "javac"), "--release", "17", "-cp", str(JAVA_RUNTIME_JAR), "-d", str(tmp_path / "classes"), str(src)],
                   check=True, capture_output=True, timeout=120)
    return tmp_path / "classes" / (rel + ".class")


def sample_zip(sample):
    return zip_bytes({"handler.py": SAMPLES / sample / "handler.py"})


def create(client, name, code, handler="handler.handler", wait=True, **kw):
    params = dict(FunctionName=name, Runtime="python3.12", Role="arn:aws:iam::000000000000:role/thaw-tests",
                  Handler=handler, Code={"ZipFile": code})
    params.update(kw)
    resp = client.create_function(**params)
    if wait:
        client.get_waiter("function_active_v2").wait(FunctionName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return resp


def invoke_json(client, name, payload=None, **kw):
    resp = client.invoke(FunctionName=name, Payload=json.dumps(payload if payload is not None else {}), **kw)
    return resp, json.loads(resp["Payload"].read())


def wait_updated(client, name):
    """Wait for an update to end (Successful or Failed) and return the configuration."""
    try:
        client.get_waiter("function_updated_v2").wait(FunctionName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    except WaiterError:
        pass  # a Failed update ends the waiter too
    return client.get_function_configuration(FunctionName=name)
