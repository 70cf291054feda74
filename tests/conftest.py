"""Fixtures shared by every test package: the storage backends a pylog root can live on, and
the markers ``make unit`` selects by.

``backend`` runs a test once on local disk and once on a real S3-compatible server (moto's
server, started on 127.0.0.1 for the test session), so the same test cases prove both.

Markers (``make unit`` runs ``-m "not spark and not s3 and not subprocess and not slow"``):

- ``spark`` and ``s3`` are given here, from what a test uses: the ``spark`` fixture; the
  ``s3_server`` fixture (also through ``s3_backend``) or a fixture parameter ``"s3"`` (as
  ``backend`` has).  So is ``subprocess`` for the ``serve`` fixtures (``FIXTURE_MARKERS``).
- Other tests that start processes are marked ``subprocess`` by hand (a module's ``pytestmark``
  or a decorator).  A test that starts one without it (or ``spark``), or talks to the S3 server
  without ``s3``, fails at teardown, seen by an audit hook (:func:`sys.addaudithook`) on process
  creation and socket connects, so the markers cannot fall behind the tests.
- ``slow`` is set by hand on in-process tests that run for long (campaigns, fuzzing); the run's
  summary lists the unmarked tests that took longer than ``SLOW_S``.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

import pylog
from pylog.storage.root.manager import Root

BUCKET = "pylog-tests"
CREDENTIALS = {"key": "testing", "secret": "testing", "client_kwargs.region_name": "us-east-1"}
SLOW_S = 10.0  # an unmarked test over this is named in the summary (candidates for `slow`)


class _Watch:
    """What the running test does that its markers must declare (see the module docstring)."""

    item: ClassVar[pytest.Item | None] = None
    did: ClassVar[dict[str, str]] = {}  # marker -> the first thing the test did that needs it
    s3_ports: ClassVar[set[int]] = set()
    unmarked_slow: ClassVar[list[tuple[str, float]]] = []


# process creation as audit events: subprocess, os.fork (multiprocessing's fork), os.posix_spawn,
# os.system, os.exec*; a connect to multiprocessing's fork server is the forkserver start method
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system"})


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _Watch.item is None:
        return
    if event in _PROCESS_EVENTS or event.startswith("os.exec"):
        _Watch.did.setdefault("subprocess", f"{event} {str(args[0])[:120]}")
    elif event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in _Watch.s3_ports:
            _Watch.did.setdefault("s3", f"connects to the S3 server on port {address[1]}")
        elif isinstance(address, str) and "pymp-" in address:
            _Watch.did.setdefault("subprocess", "starts a multiprocessing fork-server process")


# fixtures (also used through other fixtures) that give a test its marker
FIXTURE_MARKERS = {
    "spark": pytest.mark.spark,  # tests/connector/conftest.py
    "s3_server": pytest.mark.s3,
    "serve_factory": pytest.mark.subprocess,  # tests/server/conftest.py: `pylog serve` processes
}


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)  # once per process: audit hooks cannot be removed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in names:
                item.add_marker(marker)
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if any(isinstance(v, str) and v == "s3" for v in params):
            item.add_marker(pytest.mark.s3)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _Watch.item = item
    _Watch.did = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    marked = any(item.get_closest_marker(m) for m in ("spark", "s3", "subprocess", "slow"))
    if call.when == "call" and report.passed and report.duration > SLOW_S and not marked:
        _Watch.unmarked_slow.append((item.nodeid, report.duration))
    if call.when != "teardown":
        return report
    _Watch.item = None
    allowed = {"subprocess": ("subprocess", "spark"), "s3": ("s3",)}
    missing = {
        marker: what
        for marker, what in _Watch.did.items()
        if not any(item.get_closest_marker(m) for m in allowed[marker])
    }
    if missing and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"{item.nodeid} {what}, but is not marked `{marker}`: add `pytestmark = "
            f"pytest.mark.{marker}` to its module or `@pytest.mark.{marker}` to it "
            "(make unit leaves such tests out; see tests/conftest.py)"
            for marker, what in missing.items()
        )
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _Watch.unmarked_slow:
        terminalreporter.section(f"unmarked tests over {SLOW_S:.0f} s (mark them `slow`?)")
        for nodeid, seconds in sorted(_Watch.unmarked_slow, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")


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
        _Watch.s3_ports.add(self.port)
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
