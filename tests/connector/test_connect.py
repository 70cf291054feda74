"""``format("pylog")`` through Spark Connect: a local Connect server started by this module.

The server is its own process (``spark-submit --class ...SparkConnectServer``, what
``start-connect-server.sh`` runs) on a loopback port, started in a directory outside the clone
with no ``PYTHONPATH``: its Python workers find ``pyspark_pylog`` as an installed module, so
nothing here calls ``spark.dataSource.register``.  The client is the one users write,
``SparkSession.builder.remote("sc://host:port")`` (pyspark's ``connect`` extra); the README's
Connect example runs here too.  One server serves the whole module: it takes 10-50 s to start."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pytest

import pylog

# a Spark session on a server process this module starts
pytestmark = [pytest.mark.spark, pytest.mark.subprocess]

REPO = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = re.compile(r"Spark Connect server started at: ([0-9.]+):(\d+)")
START_TIMEOUT_S = 240
QUERY_TIMEOUT_S = 180
# warnings and errors only, plus the server's own line saying where it listens
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
"""
SERVER_CONF = {
    "spark.master": "local[2]",
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.connect.grpc.binding.port": "0",  # any free port: the server logs the one it bound
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.python.worker.reuse": "true",
}
# what the Connect client sets in this process's environment (it makes pyspark.sql route every
# call to Connect); restored when the module ends, for the classic-session tests that follow
CLIENT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
KAFKA_ROW = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
    "timestampType:int,headers:array<struct<key:string,value:binary>>>"
)


class ConnectServer:
    """A Spark Connect server process; its output goes to ``log`` as it comes."""

    def __init__(self, workdir: Path) -> None:
        import pyspark

        spark_home = Path(pyspark.__file__).resolve().parent
        conf_dir = workdir / "conf"
        conf_dir.mkdir()
        (conf_dir / "log4j2.properties").write_text(LOG4J2)
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", *CLIENT_ENV)}
        self.env.update(
            SPARK_HOME=str(spark_home),
            SPARK_CONF_DIR=str(conf_dir),
            PYSPARK_PYTHON=sys.executable,  # the workers' interpreter: the one with pylog installed
            SPARK_LOCAL_IP="127.0.0.1",
        )
        self.workdir = workdir
        self.log = workdir / "server.log"
        self.command = [
            str(spark_home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--name",
            "pylog-connect-tests",
            *(a for k, v in SERVER_CONF.items() for a in ("--conf", f"{k}={v}")),
        ]
        self.url = ""
        self._listening = threading.Event()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the server; return its ``sc://`` URL once it listens."""
        self.process = subprocess.Popen(
            self.command,
            cwd=self.workdir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its Python workers go with it at stop()
        )
        assert self.process.stdout is not None
        threading.Thread(target=self._drain, args=(self.process.stdout,), daemon=True).start()
        if not self._listening.wait(START_TIMEOUT_S) or not self.url:
            self.stop()
            raise RuntimeError(f"the Connect server did not start within {START_TIMEOUT_S} s:\n{self.tail()}")
        return self.url

    def _drain(self, out: IO[bytes]) -> None:
        with self.log.open("wb") as log:
            for line in out:
                log.write(line)
                log.flush()
                if not self._listening.is_set() and (m := STARTED.search(line.decode(errors="replace"))):
                    self.url = f"sc://{m.group(1)}:{m.group(2)}"
                    self._listening.set()
        self._listening.set()  # the process ended: start() stops waiting

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # the JVM's shutdown hooks stop the SparkContext and the gRPC server
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        with contextlib.suppress(ProcessLookupError):  # its Python workers, if any are left
            os.killpg(proc.pid, signal.SIGKILL)


def module_scan_finds_pylog(env: dict[str, str], cwd: Path) -> bool:
    """Whether Spark's data-source scan (``pkgutil.iter_modules``) sees ``pyspark_pylog`` in a
    worker started as the server starts them."""
    probe = "import pkgutil; print(any(m.name == 'pyspark_pylog' for m in pkgutil.iter_modules()))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == "True"


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A local Spark Connect server that has pylog installed, listening."""
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark's connect extra ('.[spark]')")
    pytest.importorskip("pyspark.sql.connect.session", reason="pyspark with Spark Connect is needed")
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    if not module_scan_finds_pylog(server.env, server.workdir):
        pytest.fail(
            "pyspark_pylog is not on sys.path of this interpreter outside the clone, so Spark cannot find "
            "format('pylog'): an editable install needs `python scripts/spark_discovery.py` (make runs it)"
        )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def connect(connect_server: ConnectServer) -> Iterator[Any]:
    """A Spark Connect session (the client) on ``connect_server``."""
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in CLIENT_ENV}
    try:
        # create(), not getOrCreate(): the latter refuses a remote session in a process that
        # runs a classic SparkContext (the other connector tests' session)
        session = SparkSession.builder.remote(connect_server.url).create()
        try:
            yield session
        finally:
            session.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_batch_write_then_read_through_connect(connect: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    rows = [
        (f"k{i}".encode(), f"v{i}".encode(), [("trace", f"t{i}".encode())] if i % 2 else [])
        for i in range(40)
    ]
    df = connect.createDataFrame(
        rows, "key binary, value binary, headers array<struct<key:string,value:binary>>"
    )
    df.write.format("pylog").mode("append").option("path", root).option("topic", "events").option(
        "partitions", 3
    ).save()

    read = (
        connect.read.format("pylog")
        .option("path", root)
        .option("subscribe", "events")
        .option("includeHeaders", "true")
        .load()
    )
    assert read.schema.simpleString() == KAFKA_ROW
    got = read.orderBy("partition", "offset").collect()
    assert sorted((r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in got) == sorted(rows)
    assert {(r.topic, r.timestampType) for r in got} == {("events", 0)}
    # the same records, at the same coordinates, as pylog's own reader sees them
    with pylog.open(root, read_only=True) as r:
        assert r.partitions("events") == 3
        table = r.read_table("events")
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == sorted(
        zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "key", "value")), strict=True)
    )
    # each partition's offsets run from 0 without a gap
    for p in range(3):
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets)))
    # an offset range, and a filter, read through Connect as well
    ranged = (
        connect.read.format("pylog")
        .option("path", root)
        .option("subscribe", "events")
        .option("startingOffsets", '{"events":{"0":1,"1":1,"2":1}}')
        .option("endingOffsets", '{"events":{"0":2,"1":2,"2":2}}')
        .load()
        .where("partition = 1")
        .select("offset", "value")
        .collect()
    )
    assert len(ranged) == 1
    assert [(r.offset, r.value) for r in ranged] == [
        (r.offset, r.value) for r in got if (r.partition, r.offset) == (1, 1)
    ]


def run_stream(connect: Any, source: str, sink: str, checkpoint: Path) -> list[Any]:
    """Copy every record of topic ``in`` to topic ``out`` with an availableNow trigger, in
    micro-batches of at most 25 records; return the query's progress reports."""
    records = (
        connect.readStream.format("pylog")
        .option("path", source)
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 25)
        .load()
    )
    query = (
        records.select("key", "value")
        .writeStream.format("pylog")
        .option("path", sink)
        .option("topic", "out")
        .option("partitions", 2)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), f"the query did not finish in {QUERY_TIMEOUT_S} s"
    assert query.exception() is None, query.exception()
    return list(query.recentProgress)


def test_stream_exactly_once_through_connect(connect: Any, tmp_path: Path) -> None:
    source, sink, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), tmp_path / "checkpoint"

    def append(first: int, count: int) -> None:
        with pylog.open(source) as r:
            if "in" not in r.topics():
                r.create_topic("in", partitions=2)
            ids = range(first, first + count)
            r.append(
                "in",
                pa.table(
                    {"key": [f"k{i % 7}".encode() for i in ids], "value": [f"v{i}".encode() for i in ids]}
                ),
            )

    append(0, 40)
    first = run_stream(connect, source, sink, checkpoint)
    rows = [p.numInputRows for p in first]
    assert sum(rows) == 40 and len(rows) == 2 and max(rows) <= 25  # bounded batches under availableNow

    # lose the last batch's commit record, as a crash between the sink's publish and Spark's
    # commit log would: the restarted query runs that batch again, and the sink skips it
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    append(40, 20)
    second = run_stream(connect, source, sink, checkpoint)
    assert (second[0].batchId, second[0].numInputRows) == (last, rows[-1])  # the replayed batch
    assert sum(p.numInputRows for p in second) == second[0].numInputRows + 20

    with pylog.open(sink, read_only=True) as r:
        out = r.read_table("out")
    values = out.column("value").to_pylist()
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(60))  # every record exactly once
    for p in range(2):
        offsets = [
            o
            for o, q in zip(
                out.column("offset").to_pylist(), out.column("partition").to_pylist(), strict=True
            )
            if q == p
        ]
        assert sorted(offsets) == list(range(len(offsets)))


def readme_connect_example() -> str:
    """The Python block of the README's "Spark Connect" section."""
    readme = (REPO / "README.md").read_text()
    section = re.split(r"\n#{2,3} ", readme.split("\n### Spark Connect\n", 1)[1], maxsplit=1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
    return block


def test_readme_connect_example(connect_server: ConnectServer, tmp_path: Path) -> None:
    """The README's client snippet, as written but for the server's port and the root's path, in
    a process of its own (a client without pylog on its path) from a directory outside the clone."""
    code = readme_connect_example()
    assert "sc://localhost:15002" in code and "/data/logs" in code
    root = tmp_path / "data" / "logs"
    code = code.replace("sc://localhost:15002", connect_server.url).replace("/data/logs", str(root))
    work = tmp_path / "cwd"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", *CLIENT_ENV)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=QUERY_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    assert proc.stdout.count("|events|") == 3, proc.stdout  # show() printed the three records
    with pylog.open(str(root), read_only=True) as r:
        assert r.partitions("events") == 4
        assert sorted(r.read_table("events").column("key").to_pylist()) == [b"0", b"1", b"2"]
