"""The README's code blocks run as written.

Every fenced block of README.md is read here, found by the heading it is under and its place
there (:func:`readme_blocks`), so what runs cannot drift from what the README shows, and
:data:`BLOCKS` says for each one which test runs it or why none does: a block added, moved or
removed without updating it fails :func:`test_every_readme_block_is_run_or_excused`.

Each block runs in a fresh process (the venv's interpreter, or bash with the venv's ``bin`` on
``PATH``) whose working directory is outside the repository, on fresh paths.  Only what names
the reader's machine is replaced: ``/data/logs`` and ``/data/checkpoints`` by temporary
directories, the S3 endpoint and buckets by the local moto server's (its credentials come from
the environment, as the README advises), ``127.0.0.1:9092`` by a ``pylog serve`` started here.
What the README leaves to the reader comes from a prelude: a Spark session, ``events_df`` and
``static_df`` for the Spark blocks (and no register call before the Quickstart's queries: Spark
must find ``format("pylog")`` by itself from that directory; the README's register block runs
after them), the Quickstart's imports for the S3 blocks, the topic the kcat lines use and the
consumer group ``pylog describe-group`` describes."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pylog

pytestmark = pytest.mark.subprocess  # the README's blocks run in fresh processes

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # the venv's bin: pylog, python


@dataclass(frozen=True)
class Block:
    heading: str  # the heading the block is under, without its #s
    index: int  # its place among the blocks under that heading, from 0
    lang: str  # the fence's language ("" for none)
    code: str


def readme_blocks() -> list[Block]:
    """Every fenced block of README.md, with the heading it is under."""
    blocks: list[Block] = []
    heading, lang, lines = "", None, []
    for line in (REPO / "README.md").read_text().splitlines(keepends=True):
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.rstrip() == "```":
            index = sum(b.heading == heading for b in blocks)
            blocks.append(Block(heading, index, lang, "".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    assert lang is None, f"README.md: a block under {heading!r} is not closed"
    return blocks


def block(heading: str, index: int) -> str:
    (found,) = [b.code for b in readme_blocks() if (b.heading, b.index) == (heading, index)]
    return found


# (heading, index) -> the test that runs the block, or why none does ("untested: ...")
BLOCKS: dict[tuple[str, int], str] = {
    ("Two commands", 0): "untested: `make test` runs this suite; `make demo` runs examples/demo.py, "
    "which tests/test_examples.py runs",
    ("Quickstart", 0): "test_python_quickstart",
    ("Quickstart", 1): "test_spark_quickstart",
    ("Quickstart", 2): "test_spark_quickstart",  # the register call, after the queries
    ("Spark Connect", 0): "untested: the script serves port 15002 of every interface; "
    "tests/connector/test_connect.py starts the same server class, with PYSPARK_PYTHON set, on "
    "the loopback and a free port",
    ("Spark Connect", 1): "tests/connector/test_connect.py::test_readme_connect_example",
    ("Object stores (S3)", 0): "test_object_store_python_and_cli",
    ("Object stores (S3)", 1): "test_object_store_spark",
    ("Object stores (S3)", 2): "test_object_store_python_and_cli",
    ("Kafka clients", 0): "untested: servers that run until stopped, on the fixed port 9092 and "
    "0.0.0.0; tests/server/conftest.py runs `pylog serve ROOT --port 0` and reads where it "
    "listens from its first line",
    ("Kafka clients", 1): "test_kcat_commands",
    ("Kafka clients", 2): "test_confluent_kafka_clients",
    ("Examples", 0): "untested: tests/test_examples.py runs every example and the notebook",
    ("The `pylog` command", 0): "test_pylog_commands",
    ("Layout", 0): "untested: a directory listing, not code",
}


def test_every_readme_block_is_run_or_excused() -> None:
    found = {(b.heading, b.index): b for b in readme_blocks()}
    unlisted = [f"{k}: {found[k].code[:60]!r}" for k in found if k not in BLOCKS]
    assert not unlisted, f"README blocks no test runs (add each to BLOCKS: a test or why none): {unlisted}"
    gone = [k for k in BLOCKS if k not in found]
    assert not gone, f"BLOCKS names README blocks that are no longer there: {gone}"
    for where, runner in BLOCKS.items():
        if runner.startswith("untested: "):
            continue
        path, _, name = runner.rpartition("::")
        source = (REPO / path).read_text() if path else Path(__file__).read_text()
        assert f"def {name}(" in source, f"{where}: {runner} is not a test"
    code = [b for b in found.values() if b.lang in ("python", "bash", "sh")]
    assert len(code) >= 13, [b.heading for b in code]  # the parser found the README's blocks


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _local_paths(code: str, tmp_path: Path) -> str:
    code = code.replace("/data/logs", str(tmp_path / "data" / "logs"))
    return code.replace("/data/checkpoints", str(tmp_path / "data" / "checkpoints"))


def _run(
    code: str, tmp_path: Path, timeout: float, *, shell: bool = False, env: dict[str, str] | None = None
) -> str:
    """Run ``code`` (Python, or bash with ``shell``) from a directory outside the repository."""
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    args = ["bash", "-e", "-o", "pipefail", "-c", code] if shell else [sys.executable, "-c", code]
    proc = subprocess.run(args, cwd=work, env=env or _env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{code}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    return proc.stdout


def _keep_last_value(code: str, name: str) -> str:
    """``code`` with its last statement, an expression whose value the README leaves unused,
    assigned to ``name`` (so the test can look at what it gave)."""
    tree = ast.parse(code)
    last = tree.body[-1]
    assert isinstance(last, ast.Expr), "the block no longer ends in an expression"
    tree.body[-1] = ast.Assign(targets=[ast.Name(name, ast.Store())], value=last.value, lineno=last.lineno)
    return ast.unparse(ast.fix_missing_locations(tree))


def test_python_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    code = _local_paths(block("Quickstart", 0), tmp_path) + textwrap.dedent(
        """
        print("rows", events.num_rows, len(df), recent.num_rows)
        """
    )
    assert "rows 2 2 2" in _run(code, tmp_path, timeout=120)  # the time range holds today's records


SPARK_PRELUDE = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable     # the README: workers run an interpreter with pylog
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
events_df = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
             .selectExpr("CAST(value % 5 AS STRING) AS user", "value"))
static_df = spark.createDataFrame([("user-9", "static")], "key string, value string")
"""

# the reading query starts at once, as the block leaves it, before the sink may have created the
# root: it reads the records once they are there (the rate source always has new rows, so the
# writing query is stopped after its first micro-batch with rows, not when nothing is new)
SPARK_STOP_QUERIES = """
import time
reading = clicks.writeStream.format("memory").queryName("clicks").start()
deadline = time.monotonic() + 400
while not any(p["numInputRows"] for p in query.recentProgress):
    assert query.isActive and time.monotonic() < deadline, query.exception()
    time.sleep(0.2)
query.stop()
reading.processAllAvailable()
reading.stop()
print("read", spark.table("clicks").count() > 1)
"""

# after the README's register call: format("pylog") still reads
SPARK_READ_AGAIN = """
print("static", spark.read.format("pylog").option("path", "/data/logs").option("subscribe", "events")
      .load().where("value = CAST('static' AS BINARY)").count())
spark.stop()
"""


def test_spark_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    scan = "import pkgutil; print([m.name for m in pkgutil.iter_modules() if m.name == 'pyspark_pylog'])"
    seen = subprocess.run([sys.executable, "-c", scan], cwd="/", capture_output=True, text=True, timeout=60)
    assert "pyspark_pylog" in seen.stdout, (
        "Spark's module scan does not see pyspark_pylog outside the clone: run make (it runs "
        f"scripts/spark_discovery.py for the editable install) {seen.stderr[-2000:]}"
    )
    register = block("Quickstart", 2)
    assert "spark.dataSource.register(DefaultSource)" in register
    code = SPARK_PRELUDE + block("Quickstart", 1) + SPARK_STOP_QUERIES + register + SPARK_READ_AGAIN
    out = _run(_local_paths(code, tmp_path), tmp_path, timeout=600)  # a first micro-batch can take a minute
    assert "read True" in out and "static 1" in out, out


# ---------------------------------------------------------------------------- object stores

PUBLIC_BUCKET = "pylog-readme-public"  # anonymous reads allowed, as the README's public-bucket


def _s3(s3_server: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(the README's names -> the moto server's, the environment of a block): the README's
    endpoint and buckets become the server's and a bucket that anonymous clients may read; the
    credentials come from the environment, as the README advises."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    if PUBLIC_BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=PUBLIC_BUCKET)
        public = {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"]}
        public["Resource"] = [f"arn:aws:s3:::{PUBLIC_BUCKET}", f"arn:aws:s3:::{PUBLIC_BUCKET}/*"]
        client.put_bucket_policy(Bucket=PUBLIC_BUCKET, Policy=json.dumps({"Statement": [public]}))
    url = f"s3://{PUBLIC_BUCKET}/{uuid.uuid4().hex[:12]}"
    names = {
        "http://localhost:9000": s3_server.endpoint,
        "s3://my-bucket/logs": url,
        "s3://public-bucket/logs": url,
    }
    env = _env(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL=s3_server.endpoint,  # for the line that gives no endpoint (anonymous reads)
    )
    return names, env


def _rename(code: str, names: dict[str, str]) -> str:
    for readme, here in names.items():
        assert readme in code or readme == "s3://public-bucket/logs", f"the README no longer names {readme}"
        code = code.replace(readme, here)
    return code


S3_PYTHON_PRELUDE = "import pylog, pyarrow as pa  # the Quickstart's imports\n"


def test_object_store_python_and_cli(s3_server: Any, tmp_path: Path) -> None:
    names, env = _s3(s3_server)
    _run(_rename(S3_PYTHON_PRELUDE + block("Object stores (S3)", 0), names), tmp_path, timeout=120, env=env)
    with pylog.open(names["s3://my-bucket/logs"], dict(s3_server.options), read_only=True) as root:
        assert root.partitions("events") == 4
        assert root.read_table("events").column("key").to_pylist() == [b"user-1"]
    cli = _rename(block("Object stores (S3)", 2), names)
    assert "pylog describe" in cli and '"anon": "true"' in cli
    out = _run(cli, tmp_path, timeout=180, shell=True, env=env)
    assert "topic events  partitions 4" in out, out  # describe
    assert '"key": "user-1", "value": "v1"' in out, out  # the anonymous consume


def test_object_store_spark(s3_server: Any, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    names, env = _s3(s3_server)
    read = _keep_last_value(block("Object stores (S3)", 1), "df")
    code = SPARK_PRELUDE + S3_PYTHON_PRELUDE + block("Object stores (S3)", 0) + read
    code += '\nprint("keys", [bytes(r.key) for r in df.collect()])\nspark.stop()\n'
    out = _run(_rename(code, names), tmp_path, timeout=600, env=env)
    assert "keys [b'user-1']" in out, out


# ---------------------------------------------------------------------------- Kafka clients


def test_confluent_kafka_clients(tmp_path: Path) -> None:
    pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")
    pytest.importorskip("confluent_kafka", reason="the block uses confluent-kafka (pip install '.[dev]')")
    from tests.server.conftest import ServeProcess

    server = ServeProcess(str(tmp_path / "root"), tmp_path).start()
    try:
        code = block("Kafka clients", 2)
        assert '"bootstrap.servers": "127.0.0.1:9092"' in code
        out = _run(code.replace("127.0.0.1:9092", server.bootstrap), tmp_path, timeout=180)
        assert re.search(r"^\d \d b'user-1' b'\{\"page\": \"home\"\}'$", out, flags=re.M), out
        assert len(out.splitlines()) == 1, out  # the one record, once
    finally:
        server.stop()
    with pylog.open(server.root, read_only=True) as root:
        assert root.partitions("events") == 4
        assert root.read_table("events").column("key").to_pylist() == [b"user-1"]


def _group_lag(root: Path, group: str) -> int | None:
    """The lag of ``group``'s committed offsets in ``root`` (None: no offsets committed yet)."""
    from pylog.storage.errors import UnknownGroupError
    from pylog.storage.root.groups import describe_group

    with pylog.open(root, read_only=True) as r:
        try:
            return describe_group(r, group)["lag"]
        except UnknownGroupError:
            return None


def test_kcat_commands(tmp_path: Path) -> None:
    """kcat's lines as written against a ``pylog serve`` started here, on a root where ``users``
    exists (the server does not create topics, as the README says).  The consumer-group line runs
    until stopped: it is stopped (SIGTERM, on which kcat prints what it consumed and leaves the
    group) once the group's committed offsets reach the log end."""
    pytest.importorskip("kio", reason="pylog serve needs the serve extra (pip install '.[serve]')")
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not on the PATH (Debian: apt-get install kcat)")
    from tests.server.conftest import ServeProcess

    root = tmp_path / "root"
    _run(f"pylog create-topic {root} users --partitions 4", tmp_path, timeout=120, shell=True)
    server = ServeProcess(str(root), tmp_path).start()
    code = block("Kafka clients", 1)
    assert "kcat -b 127.0.0.1:9092 -G audit" in code
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    shell = ["bash", "-e", "-o", "pipefail", "-c", code.replace("127.0.0.1:9092", server.bootstrap)]
    proc = subprocess.Popen(
        shell, cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while _group_lag(root, "audit") != 0:  # kcat commits every 5 s (auto.commit.interval.ms)
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        server.stop()
    text = stdout.decode()
    assert "1 brokers:" in text, text  # -L
    assert re.search(r"^users \[\d\] @0 user-1: \{\"plan\":\"pro\"\}$", text, flags=re.M), text  # -C
    group_lines = [line for line in text.splitlines() if line.startswith('{"plan"')]  # -G: values
    assert sorted(group_lines) == ['{"plan":"free"}', '{"plan":"pro"}'], (text, stderr.decode()[-3000:])
    with pylog.open(root, read_only=True) as r:
        got = r.read_table("users")
    assert sorted(got.column("key").to_pylist()) == [b"user-1", b"user-2"]


# ---------------------------------------------------------------------------- the pylog command


def test_pylog_commands(tmp_path: Path) -> None:
    """The block as written, but for its paths: ``.venv/bin/pylog`` is the ``pylog`` of the venv
    (on ``PATH``), the optional ``[--json]`` is given, ``/data/logs`` a fresh root holding only
    the group the block describes (``my-query``: the offsets a streaming query with that
    ``groupId`` leaves, 0 of ``users-0``), as the README assumes a reader has one."""
    from pylog.storage.root.consumers import write_consumer_offsets

    code = block("The `pylog` command", 0)
    assert ".venv/bin/pylog create-topic /data/logs users" in code and " [--json]" in code
    assert "describe-group /data/logs my-query" in code  # the group seeded here
    with pylog.open(tmp_path / "data" / "logs") as root:
        write_consumer_offsets(root.storage, "my-query", {("users", 0): 0})
    code = _local_paths(code.replace(".venv/bin/pylog", "pylog").replace(" [--json]", " --json"), tmp_path)
    out = _run(code, tmp_path, timeout=300, shell=True)
    assert '"key": "user-1", "value": "{\\"plan\\": \\"pro\\"}"' in out, out  # consume
    assert '"topics"' in out, out  # describe --json
    assert "GROUP my-query  lag 1" in out, out  # describe-group: user-1's record not consumed
    with pylog.open(tmp_path / "data" / "logs", read_only=True) as root:
        assert ("users" in root.topics()) == ("delete-topic" not in code)
