"""Fixtures shared by every test package: the storage backends a pylog root can live on.

``backend`` runs a test once on local disk and once on a real S3-compatible server (moto's
server, started on 127.0.0.1 for the test session), so the same test cases prove both."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.storage.root.manager import Root

BUCKET = "pylog-tests"
CREDENTIALS = {"key": "testing", "secret": "testing", "client_kwargs.region_name": "us-east-1"}


class S3Server:
    """moto's S3 server in this process, on a loopback port; restartable with its data (the
    objects live in moto's in-process backend, not in the HTTP server)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._cls = ThreadedMotoServer
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.running = True

    @property
    def options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, **CREDENTIALS}

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            endpoint_url=self.endpoint,
            key=CREDENTIALS["key"],
            secret=CREDENTIALS["secret"],
            use_listings_cache=False,
            skip_instance_cache=True,
        )

    def stop(self) -> None:
        if self.running:
            self.server.stop()
            self.running = False

    def start(self) -> None:
        if not self.running:
            self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
            self.server.start()
            self.running = True


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="s3fs is needed for the S3 backend (pip install '.[s3]')")
    pytest.importorskip("moto", reason="moto[server] is needed for the S3 backend (pip install '.[dev]')")
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(var, None)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    server = S3Server()
    server.filesystem().mkdir(BUCKET)
    yield server
    server.start()
    server.stop()


@dataclass
class Backend:
    """Where a test's root lives: ``url`` and the storage options to open it."""

    name: str
    url: str
    options: dict[str, str] = field(default_factory=dict)
    server: S3Server | None = None

    @property
    def is_local(self) -> bool:
        return self.server is None

    def open(self, *, read_only: bool = False, **kwargs: Any) -> Root:
        return pylog.open(self.url, self.options or None, read_only=read_only, **kwargs)

    def child(self, name: str) -> Backend:
        return Backend(self.name, f"{self.url.rstrip('/')}/{name}", dict(self.options), self.server)

    def spark_options(self) -> dict[str, str]:
        """``path`` plus the ``storage.*`` options of a Spark read or write of this root."""
        return {"path": self.url, **{f"storage.{k}": v for k, v in self.options.items()}}

    def cli_args(self) -> list[str]:
        """``--storage-option`` arguments of the pylog CLI."""
        return [a for k, v in self.options.items() for a in ("--storage-option", f"{k}={v}")]


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The root of a test, on local disk and on the S3 server."""
    if request.param == "local":
        return Backend("local", str(tmp_path / "root"))
    server: S3Server = request.getfixturevalue("s3_server")
    return Backend("s3", f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", dict(server.options), server)


@pytest.fixture
def s3_backend(s3_server: S3Server) -> Backend:
    """A root on the S3 server only (object-store specific tests)."""
    return Backend("s3", f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", dict(s3_server.options), s3_server)
