"""A real MinIO for the node's snapshot-store tests, started on 127.0.0.1 with a free
port and a temporary data directory. The binary is built by scripts/build-minio.sh
(scripts/setup.sh runs it) into ${THAW_CACHE_DIR:-/var/cache/thaw}/minio-<version>/minio."""

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
from botocore.config import Config

ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY = "thawtest"
SECRET_KEY = "thawtest-secret"


def minio_bin():
    version = re.search(r'^MINIO_VERSION="([^"]+)"', (ROOT / "scripts/build-minio.sh").read_text(), re.M).group(1)
    cache = Path(os.environ.get("THAW_CACHE_DIR", "/var/cache/thaw"))
    b = cache / f"minio-{version}" / "minio"
    assert b.is_file(), f"MinIO {version} is not built ({b} is missing): run scripts/build-minio.sh"
    return b


class Minio:
    def __init__(self, data_dir):
        self.data = Path(data_dir)
        self.data.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.resume()

    def resume(self):
        log = open(self.data / "minio.log", "ab")
        self.proc = subprocess.Popen(
            [str(minio_bin()), "server", "--quiet", "--address", f"127.0.0.1:{self.port}", str(self.data / "store")],
            env={**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
                 "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"},
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            assert self.proc.poll() is None, (self.data / "minio.log").read_text()
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2)
            except urllib.error.HTTPError as e:
                if e.code == 403:  # the object layer is up (503 before)
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"MinIO not ready on {self.endpoint} after 30 s")

    def stop(self):
        """The store goes down (resume() brings it back on the same port and data)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def env(self):
        """Environment for a node using this store (as the AWS tools read it)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def s3(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            config=Config(retries={"max_attempts": 1}))

    def manifest(self, bucket, key):
        """A stored snapshot's manifest (`PREFIX/snapshots/ID.json`), as JSON: format 3 on
        stores it zstd-compressed (format 7 only where that saves an eighth), format 6
        on in a binary encoding, which `thaw snapshot inspect s3://BUCKET/PREFIX/ID` shows
        as JSON."""
        data = self.s3().get_object(Bucket=bucket, Key=key)["Body"].read()
        if data[:4] == b"\x28\xb5\x2f\xfd":
            import zstandard
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=64 << 20)
        if data[:1] == b"{":
            return json.loads(data)
        prefix, sid = key.rsplit("/snapshots/", 1)
        url = f"s3://{bucket}/{prefix}/{sid.removesuffix('.json')}"
        thaw = ROOT / "target" / "release" / "thaw"
        r = subprocess.run([str(thaw), "snapshot", "inspect", url, "--endpoint-url", self.endpoint],
                           env=dict(os.environ, **self.env()), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"thaw snapshot inspect {url}: {r.stderr}"
        return json.loads(r.stdout)

    def keys(self, bucket, prefix=""):
        out, token = [], None
        while True:
            kw = {"Bucket": bucket, "Prefix": prefix} | ({"ContinuationToken": token} if token else {})
            r = self.s3().list_objects_v2(**kw)
            out += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return out
            token = r["NextContinuationToken"]
