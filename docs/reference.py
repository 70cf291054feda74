"""The README's reference tables, generated from the code they document.

    python docs/reference.py                  # print every table
    python docs/reference.py --write README.md   # replace the generated blocks in README.md
    python docs/reference.py --check README.md   # exit 1 if README.md is out of date (a test runs it)

A generated block sits between ``<!-- reference:NAME -->`` and ``<!-- /reference:NAME -->``.
The tables come from the declarations of ``pylog.connector.optionspec`` (``SOURCE_OPTIONS``,
``SINK_OPTIONS``: the source's and sink's options, their defaults and values),
``pylog.storage.backends.objectstore.options.PYLOG_OPTIONS`` (pylog's own storage options of
object-store roots), ``LogConfig`` (topic configs, defaults and
broker synonyms), ``CleanerConfig`` (the cleaner settings, and which of them have no effect) and
``pylog.cli.COMMANDS`` (the CLI).  Defaults are written here once, as
users read them, and checked against what the option parsers actually produce, so that a
changed default fails ``--check`` instead of leaving the README wrong.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pylog.cli import COMMANDS
from pylog.connector.options import DEFAULT_GROUP_ID_PREFIX, parse_options
from pylog.connector.optionspec import SINK_OPTIONS, SOURCE_OPTIONS, SPECIFIC, Option
from pylog.connector.sink_options import parse_sink_options
from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.options import PYLOG_OPTIONS
from pylog.storage.codec import records
from pylog.storage.config import CleanerConfig, LogConfig

# ---------------------------------------------------------------------------------------------
# Source and sink options: from their declarations (connector/optionspec.py).  A declared default
# the parser uses is checked against the default the README shows.


def _check_defaults(side: str, specs: tuple[Option, ...], parsed: object) -> None:
    """Each option's parsed default (the field it sets on ``parsed``) is the declared one, and the
    README's default column shows it."""
    wrong = []
    for o in specs:
        if o.kind in SPECIFIC or o.default is None:
            continue
        shown = str(o.default).lower() if isinstance(o.default, bool) else str(o.default)
        if o.kind == "duration":
            shown = {15 * 60_000: "15m"}.get(o.default, shown)
        if f"`{shown}`" not in o.shown_default:
            wrong.append(o.name)
    if wrong:
        raise SystemExit(
            f"docs/reference.py: the README's {side} defaults of {wrong} are not the declared ones"
        )
    facts = _PARSED_DEFAULTS[side](parsed)
    wrong = [name for name, ok in facts.items() if not ok]
    if wrong:
        raise SystemExit(f"docs/reference.py: the declared {side} defaults of {wrong} are not the parser's")


_PARSED_DEFAULTS: dict[str, Callable[[Any], dict[str, bool]]] = {
    "source": lambda o: {
        "startingOffsets": o.starting is None,  # resolved per query kind: latest (stream), earliest (batch)
        "endingOffsets": o.ending is None,
        "startingOffsetsByTimestampStrategy": o.timestamp_strategy == "error",
        "failOnDataLoss": o.fail_on_data_loss is True,
        "maxOffsetsPerTrigger": o.max_offsets_per_trigger is None,
        "minOffsetsPerTrigger": o.min_offsets_per_trigger is None,
        "maxTriggerDelay": o.max_trigger_delay_ms == 15 * 60_000,
        "minPartitions": o.min_partitions is None,
        "maxRecordsPerPartition": o.max_records_per_partition is None,
        "includeHeaders": o.include_headers is False,
        "isolationLevel": o.isolation_level == "read_uncommitted",
        "groupId": o.group_id.startswith(DEFAULT_GROUP_ID_PREFIX + "-"),
    },
    "sink": lambda o: {
        "topic": o.topic is None,
        "partitions": o.partitions is None,
        "compression.type": o.codec is None,
        "batch.size": o.batch_bytes == records.DEFAULT_BATCH_BYTES == 1 << 20,
        "lockTimeoutMs": o.lock_timeout_s == 60.0,
        "maintenance": o.maintenance is True,
        "maintenance.budgetMs": o.maintenance_budget_ms == 2000,
        "directWrites": o.direct_writes is True,
        "queryRetentionMs": o.query_retention_ms == 7 * 24 * 3600 * 1000,
    },
}

GROUP_ID_DEFAULT = f"`{DEFAULT_GROUP_ID_PREFIX}-<random id of the run>-<hash of path and subscription>`"


def source_options() -> str:
    _check_defaults("source", SOURCE_OPTIONS, parse_options({"path": "/data/logs", "subscribe": "events"}))
    shown = {"groupId": GROUP_ID_DEFAULT, "groupIdPrefix": f"`{DEFAULT_GROUP_ID_PREFIX}`"}
    rows = ["| option | default | values |", "|---|---|---|"]
    for o in SOURCE_OPTIONS:
        default = shown.get(o.name, o.shown_default)
        rows.append(f"| `{o.name}` | {default} | {_cell(o.values)}{o.note} |")
    rows.append(f"| `storage.*` | | {STORAGE_PREFIX_DOC} |")
    return "\n".join(rows)


STORAGE_PREFIX_DOC = (
    "storage options of an object-store `path`, without the prefix: fsspec's (`storage.endpoint_url`, "
    "`storage.key`, `storage.client_kwargs.region_name`, ...) and pylog's (`storage.pylog.*`, in "
    "*Object stores (S3)*); never logged; refused with a local path"
)


def sink_options() -> str:
    _check_defaults("sink", SINK_OPTIONS, parse_sink_options({"path": "/data/logs"}, streaming=False))
    rows = ["| option | default | meaning |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.shown_default} | {_cell(o.about)} |" for o in SINK_OPTIONS]
    rows.append(f"| `storage.*` | | {STORAGE_PREFIX_DOC} |")
    rows.append(
        "| any topic config (`cleanup.policy`, `segment.bytes`, ...) | Kafka's | used when the sink "
        "creates the topic (see the topic configs below) |"
    )
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# pylog's own storage options: from their declarations (storage/backends/objectstore/options.py),
# each default checked against the README's and against what ObjectClient makes of no options


def _check_storage_defaults() -> None:
    store = ObjectClient("memory://pylog-reference")  # no I/O: the parsed defaults only
    wrong = []
    for o in PYLOG_OPTIONS.values():
        shown = f"`{int(o.default)}`" if float(o.default).is_integer() else f"`{o.default}`"
        if getattr(store, o.setting) != o.default or not o.shown_default.startswith(shown):
            wrong.append(o.name)
    if wrong:
        raise SystemExit(
            f"docs/reference.py: the declared defaults of {wrong} are not ObjectClient's or the README's"
        )


def storage_options() -> str:
    _check_storage_defaults()
    rows = ["| storage option | default | meaning |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.shown_default} | {_cell(o.about)} |" for o in PYLOG_OPTIONS.values()]
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Topic configs and CLI

NO_EFFECT = {"preallocate"}  # accepted, validated, stored; pylog's storage does not act on it


def topic_configs() -> str:
    defaults = LogConfig().to_dict()
    synonyms: dict[str, list[str]] = {}
    for spec in LogConfig._SPECS:
        synonyms[spec.key] = [s.key for s in spec.synonyms]
    accepted = set(defaults) | {s for names in synonyms.values() for s in names}
    if accepted != set(LogConfig.valid_keys()):
        raise SystemExit("docs/reference.py: LogConfig specs and valid_keys() disagree")
    rows = ["| topic config | default | broker synonyms |", "|---|---|---|"]
    for key, default in defaults.items():
        note = " (accepted, no effect)" if key in NO_EFFECT else ""
        names = ", ".join(f"`{s}`" for s in synonyms[key]) or "—"
        rows.append(f"| `{key}`{note} | `{default}` | {names} |")
    return "\n".join(rows)


CLEANER_DOCS: dict[str, str] = {
    "log.cleaner.enable": (
        "`false`: `maintain()` does not compact (retention still runs; the report says "
        "`compaction not run: log.cleaner.enable=false`)"
    ),
    "log.cleaner.dedupe.buffer.size": "memory of the offset map (one pass maps as many keys as fit)",
    "log.cleaner.io.buffer.load.factor": "how full the offset map gets, in (0, 1]",
    "log.cleaner.io.max.bytes.per.second": (
        "limit on the cleaner's reads plus writes: it sleeps whenever it is ahead of the rate "
        "(the sleeps count against a time budget)"
    ),
}


def cleaner_configs() -> str:
    defaults = CleanerConfig().to_dict()
    documented = set(CLEANER_DOCS) | set(CleanerConfig.NO_EFFECT)
    if documented != set(defaults) or set(CLEANER_DOCS) & set(CleanerConfig.NO_EFFECT):
        raise SystemExit(
            "docs/reference.py: CLEANER_DOCS and CleanerConfig.NO_EFFECT must together cover each "
            f"CleanerConfig key once; they differ on {sorted(documented ^ set(defaults))}"
        )
    if defaults["log.cleaner.io.max.bytes.per.second"] != repr(sys.float_info.max):
        raise SystemExit(
            "docs/reference.py: the documented unlimited I/O rate is not CleanerConfig's default"
        )
    shown = {"log.cleaner.io.max.bytes.per.second": "unlimited (Kafka's `Double.MAX_VALUE`)"}
    rows = ["| cleaner config | default | in pylog |", "|---|---|---|"]
    for key, default in defaults.items():
        if key in CleanerConfig.NO_EFFECT:
            text = (
                f"accepted, **no effect** (warns when set to another value): {CleanerConfig.NO_EFFECT[key]}"
            )
        else:
            text = CLEANER_DOCS[key]
        rows.append(f"| `{key}` | {shown.get(key, f'`{default}`')} | {_cell(text)} |")
    return "\n".join(rows)


def cli_commands() -> str:
    rows = ["| command | what it does |", "|---|---|"]
    rows += [f"| `pylog {c.name}` | {_cell(c.help)} |" for c in COMMANDS.values()]
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


TABLES: dict[str, Callable[[], str]] = {
    "source-options": source_options,
    "sink-options": sink_options,
    "storage-options": storage_options,
    "topic-configs": topic_configs,
    "cleaner-configs": cleaner_configs,
    "cli": cli_commands,
}


def render(text: str) -> str:
    """``text`` with every generated block replaced by its current table."""
    for name, make in TABLES.items():
        pattern = re.compile(rf"(<!-- reference:{name} -->\n).*?(<!-- /reference:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"docs/reference.py: no <!-- reference:{name} --> block in the file")
        table = make()
        text = pattern.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)  # type: ignore[misc]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="replace the generated blocks of FILE")
    group.add_argument("--check", metavar="FILE", help="exit 1 if FILE's generated blocks are out of date")
    args = parser.parse_args(argv)
    if args.write or args.check:
        path = Path(args.write or args.check)
        text = path.read_text()
        new = render(text)
        if args.write:
            path.write_text(new)
        elif new != text:
            print(f"{path} is out of date: run python docs/reference.py --write {path}")
            return 1
        return 0
    for name, make in TABLES.items():
        print(f"<!-- reference:{name} -->\n{make()}\n<!-- /reference:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
