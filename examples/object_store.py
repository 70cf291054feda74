"""pylog on an object store (S3): the same root API, every change published by one atomic commit.

    .venv/bin/python examples/object_store.py                      # a local S3 server (moto)
    .venv/bin/python examples/object_store.py s3://my-bucket/demo  # a real bucket: an empty prefix

Without a URL (argument, or PYLOG_OBJECT_STORE_URL) moto's S3 server is started on 127.0.0.1
with a bucket; the argument may then name a working directory, as for the other examples
(nothing is written there).  With a URL, credentials come from the environment as for any AWS
client (AWS_ACCESS_KEY_ID..., a profile, an instance role) and other storage options (endpoint_url,
client_kwargs.region_name...) from PYLOG_STORAGE_OPTIONS (JSON), as for the pylog CLI.

Creates a topic, appends keyed orders in many small commits, reads them back (and a snapshot
reader), lists the objects (commits, checkpoints, immutable segment objects), runs maintenance (small
segments merged, superseded objects deleted), prints the Spark options and runs
``pylog describe`` on the same URL.  Secrets are never printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import pylog
from pylog.storage.backends.objectstore.client import is_object_url, redact, split_options
from pylog.storage.backends.objectstore.snapshot import CHECKPOINTS, LOG
from pylog.storage.maintenance.runner import maintain


def local_s3(workdir: str) -> tuple[str, dict[str, str]]:
    """moto's S3 server on a loopback port, with a bucket; test credentials in the environment."""
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        sys.exit(
            f"without a bucket URL this example runs moto's S3 server, which needs moto and s3fs "
            f"({(e.name or '?').split('.')[0]} is missing):\n"
            "  .venv/bin/pip install -e '.[dev,s3]'     (what make demo and make test install)\n"
            "or give it a bucket: python examples/object_store.py s3://my-bucket/prefix"
        )
    Path(workdir).mkdir(parents=True, exist_ok=True)
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "PYLOG_STORAGE_OPTIONS"):
        os.environ.pop(var, None)
    # moto takes any credentials: they reach pylog (and the CLI run below) from the environment,
    # the usual way, so that no storage option holds one
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3fs.S3FileSystem(endpoint_url=f"http://{host}:{port}").mkdir("pylog-example")
    return "s3://pylog-example/demo", {
        "endpoint_url": f"http://{host}:{port}",
        "client_kwargs.region_name": "us-east-1",  # dotted keys become nested fsspec arguments
    }


def listing(url: str, options: dict[str, Any]) -> tuple[Any, str, dict[str, int]]:
    """The filesystem (s3fs), the prefix, and every object under it with its size."""
    import fsspec

    fs, base = fsspec.core.url_to_fs(url, **split_options(options)[0], use_listings_cache=False)
    return fs, base, {p[len(base) + 1 :]: int(d["size"]) for p, d in fs.find(base, detail=True).items()}


def orders(first: int, n: int) -> pa.Table:
    ids = range(first, first + n)
    return pa.table(
        {
            "key": [b"customer-%d" % (i % 7) for i in ids],
            "value": [
                b'{"order": %d, "amount": %d, "note": "%s"}' % (i, 10 + i % 90, b"x" * 640) for i in ids
            ],
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "target",
        nargs="?",
        default=os.environ.get("PYLOG_OBJECT_STORE_URL", "demo-data/object_store"),
        help="s3://bucket/prefix (an empty prefix), or a working directory for a local S3 server",
    )
    target = parser.parse_args().target
    if is_object_url(target):
        url, options = target.rstrip("/"), json.loads(os.environ.get("PYLOG_STORAGE_OPTIONS") or "{}")
        if listing(url, options)[2]:
            sys.exit(f"{url} already holds objects: give this example an empty prefix")
    else:
        url, options = local_s3(target)
    secret = sorted(k for k, v in redact(options).items() if v == "***")  # never printed
    where = "" if secret else ", credentials from the environment"
    print(f"root {url}, storage options {redact(options)}{where}")

    commits, n = 24, 20
    with pylog.open(url, options) as root:
        root.create_topic("orders", partitions=3, config={"file.delete.delay.ms": 0})
        root.append("orders", orders(0, n))
        snapshot = pylog.open(url, options, read_only=True)  # sees the newest state when opened
        for i in range(1, commits):  # many small appends: each is one commit of the commit log
            root.append("orders", orders(i * n, n))
        print(f"appended {commits * n} orders in {commits} commits ({root.commits} commits published)")
        table = root.read_table("orders")
        counts = {
            r["partition"]: r["offset_count"]
            for r in table.group_by("partition").aggregate([("offset", "count")]).to_pylist()
        }
        print(f"read back {table.num_rows} records, per partition {dict(sorted(counts.items()))}")
        seen = snapshot.read_table("orders").num_rows
        snapshot.refresh()
        now_seen = snapshot.read_table("orders").num_rows
        snapshot.close()
        print(f"a reader opened after the first commit: {seen} records, {now_seen} after refresh()")

    fs, base, before = listing(url, options)
    commit_log = sorted(k for k in before if k.startswith(LOG))
    checkpoints = sorted(k for k in before if k.startswith(CHECKPOINTS))
    segments = sorted(k for k in before if ".log." in k)
    newest = json.loads(fs.cat_file(f"{base}/{commit_log[-1]}"))
    print(
        f"\n{len(before)} objects under {url}/: {len(commit_log)} commits, {len(checkpoints)} checkpoints, "
        f"{len(segments)} segments"
    )
    for key in [*commit_log[-2:], *checkpoints[-1:], *segments[:3]]:
        print(f"  {key}  ({before[key]:,} bytes)")
    print(
        f"  ...\ncommit {newest['number']} changed {len(newest['put'])} files (small ones inline, appended "
        "in place); superseded objects are kept for pylog.file_delete_delay_ms"
    )

    # maintenance merges runs of small segments (batches copied byte for byte, offsets unchanged);
    # the delete delay is 0 here to see superseded objects go now rather than a minute later
    with pylog.open(url, {**options, "pylog.file_delete_delay_ms": "0"}) as root:
        segs = sum(len(root.log("orders", p).segments) for p in range(3))
        report = maintain(root, now=int(time.time() * 1000))
        after_segs = sum(len(root.log("orders", p).segments) for p in range(3))
        assert root.read_table("orders").column("value") == table.column("value")
    after = listing(url, options)[2]
    print(
        f"\nmaintain(): {report.summary()}; segments {segs} -> {after_segs}, objects {len(before)} -> "
        f"{len(after)}"
    )

    shown = [(k, v) for k, v in options.items() if k not in secret]
    print(f'\nSpark: spark.read.format("pylog").option("path", "{url}").option("subscribe", "orders")')
    for k, v in shown:
        print(f'    .option("storage.{k}", "{v}")')
    print(
        f"    .load()    # and the same on df.write / df.writeStream{', plus storage.' if secret else ''}"
        + ", storage.".join(secret)
    )
    cli = ["describe", url, *[a for k, v in shown for a in ("-S", f"{k}={v}")]]
    print(f"\n$ pylog {' '.join(cli)}" + ("    # the secrets from PYLOG_STORAGE_OPTIONS" if secret else ""))
    out = subprocess.run([sys.executable, "-m", "pylog", *cli], capture_output=True, text=True, timeout=120)
    print(out.stdout.rstrip() or out.stderr)
    assert out.returncode == 0 and "topic orders  partitions 3" in out.stdout, out.stderr
    assert seen == n and len(after) < len(before) and after_segs < segs
    print(f"\nOK: checked {commits * n} records, a snapshot, merged segments and {len(after)} objects left")


if __name__ == "__main__":
    main()
