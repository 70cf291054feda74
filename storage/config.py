"""Topic and cleaner configuration with Kafka's names, defaults, ranges and synonyms.

Values arrive as Python ints, floats, bools or strings (Spark options and CLI arguments are
strings: ``"1048576"``, ``"true"``, ``"delete,compact"``, ``" compact "``) and are parsed as
Kafka's ``ConfigDef`` parses them: strings are trimmed, integers must be integer literals in the
config's range, booleans are ``true``/``false`` (any case), choices are case-sensitive.

A topic config may also be given under its broker name (``log.segment.bytes`` for
``segment.bytes``).  The topic name wins when both are given; among broker names the first one
listed wins (``log.retention.ms`` over ``.minutes`` over ``.hours``, as in ``KafkaConfig``), and
``.hours``/``.minutes`` are converted to milliseconds.  Every given value is validated, also one
that loses to a higher-precedence name.

Sources: ``LogConfig.java`` / ``ServerLogConfigs.java`` / ``CleanerConfig.java`` in apache/kafka.
``segment.bytes`` keeps the minimum of 14 from the 4.0 snapshot (later Kafka releases raise it to
1 MiB and add an internal override for tests).  :class:`CleanerConfig` lists the cleaner settings
pylog accepts but does not act on (it has no broker), and warns when one is set.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from pylog.storage.errors import ConfigError

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TOPIC_NAME_LENGTH",
    "CleanerConfig",
    "LogConfig",
    "parse_bool",
    "parse_integer",
    "show",
    "validate_topic_name",
]

INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

MAX_TOPIC_NAME_LENGTH = 249  # Kafka's Topic.MAX_NAME_LENGTH
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_LIST_SPLIT_RE = re.compile(r"\s*,\s*")


def show(value: object, limit: int = 80) -> str:
    """``repr`` of a value, shortened so an error message stays readable."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def validate_topic_name(name: str) -> str:
    """Check a topic name against Kafka's rules (``Topic.validate``) and return it.

    Legal: 1 to 249 characters from ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``.  Anything else
    raises :class:`ConfigError` naming the topic and the rule it breaks.  These rules also keep a
    partition directory ``<topic>-<partition>`` inside the root.
    """
    if type(name) is str and name in _VALID_TOPIC_NAMES:
        return name
    if not isinstance(name, str):
        raise ConfigError(f"topic name must be a string, got {type(name).__name__} {show(name)}")
    if not name:
        raise ConfigError("topic name is illegal: it can't be empty")
    if name in (".", ".."):
        raise ConfigError(f"topic name {name!r} is illegal: it can't be '.' or '..'")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise ConfigError(
            f"topic name {show(name)} is illegal: it can't be longer than {MAX_TOPIC_NAME_LENGTH} "
            f"characters (it has {len(name)})"
        )
    if not _TOPIC_RE.fullmatch(name):
        bad = sorted({c for c in name if not _TOPIC_RE.fullmatch(c)})
        raise ConfigError(
            f"topic name {show(name)} is illegal: it contains {', '.join(map(repr, bad))}; only ASCII "
            "letters, digits, '.', '_' and '-' are allowed"
        )
    if type(name) is str:
        if len(_VALID_TOPIC_NAMES) >= _VALID_KEPT:
            _VALID_TOPIC_NAMES.clear()
        _VALID_TOPIC_NAMES.add(name)
    return name


_VALID_KEPT = 4096
_VALID_TOPIC_NAMES: set[str] = set()
"""Names found legal (up to ``_VALID_KEPT``): a name seen again is not matched again."""


# ---------------------------------------------------------------------------------------------
# Value parsing (each parser raises ValueError; callers turn it into a ConfigError naming the key).
# The typed values of every option pylog takes: topic configs here, the Spark source's and sink's
# options (pylog.connector.optionspec), the CLI's arguments.


def parse_integer(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("a bool is not an integer")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an integral number")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if _INT_RE.fullmatch(text):
            if len(text.lstrip("+-").lstrip("0")) > 20:  # beyond int64; Python refuses very long ones
                raise ValueError(f"{show(text)} is out of range")
            return int(text)
        raise ValueError(f"{text!r} is not an integer literal")
    raise ValueError(f"type {type(value).__name__} is not an integer")


def _parse_double(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("a bool is not a number")
    if isinstance(value, numbers.Real):
        result = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not _FLOAT_RE.fullmatch(text):
            raise ValueError(f"{text!r} is not a decimal number")
        result = float(text)
    else:
        raise ValueError(f"type {type(value).__name__} is not a number")
    if not math.isfinite(result):
        raise ValueError(f"{result!r} is not finite")
    return result


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ValueError(f"{value!r} is not 'true' or 'false'")
    raise ValueError(f"type {type(value).__name__} is not a boolean")


def _parse_string(value: object) -> str:
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"type {type(value).__name__} is not a string")


def _parse_list(value: object) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        return _LIST_SPLIT_RE.split(text) if text else []
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        if not all(isinstance(item, str) for item in items):
            raise ValueError("every element must be a string")
        return [item.strip() for item in items]
    raise ValueError(f"type {type(value).__name__} is not a list")


# ---------------------------------------------------------------------------------------------
# Field specifications


@dataclass(frozen=True)
class _Synonym:
    """A broker name for a topic config; ``factor`` converts hours/minutes to milliseconds."""

    key: str
    lo: int = INT64_MIN
    hi: int = INT64_MAX
    factor: int = 1
    negative_is_unlimited: bool = False  # log.retention.*: any negative value means -1


@dataclass(frozen=True)
class _Spec:
    attr: str
    key: str
    kind: str  # "int" | "double" | "bool" | "string" | "list"
    lo: float = 0
    hi: float = 0
    choices: tuple[str, ...] = ()
    synonyms: tuple[_Synonym, ...] = ()
    lo_open: bool = False  # the lower bound itself is excluded

    def in_range(self, number: float) -> bool:
        return (self.lo < number if self.lo_open else self.lo <= number) and number <= self.hi

    def expected(self) -> str:
        if self.kind == "int":
            return f"an integer in [{self.lo}, {self.hi}]"
        if self.kind == "double":
            return f"a number in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "string":
            return f"one of {', '.join(self.choices)}"
        return f"a comma-separated list of {', '.join(self.choices)} (case-sensitive)"

    def coerce(self, value: object, key: str | None = None) -> object:
        """The typed, canonical value, or ConfigError naming ``key`` (default: the topic name)."""
        key = key or self.key
        try:
            result: object
            if self.kind == "int":
                result = parse_integer(value)
                if not self.in_range(result):
                    raise ValueError(f"{result} is out of range")
            elif self.kind == "double":
                result = _parse_double(value)
                if not self.in_range(result):
                    raise ValueError(f"{result} is out of range")
            elif self.kind == "bool":
                result = parse_bool(value)
            elif self.kind == "string":
                result = _parse_string(value)
                if result not in self.choices:
                    raise ValueError(f"{result!r} is not a valid choice")
            else:
                items = _parse_list(value)
                bad = [item for item in items if item not in self.choices]
                if bad:
                    raise ValueError(f"{', '.join(map(repr, bad))} not valid")
                result = tuple(sorted(set(items)))
        except ValueError as e:
            raise ConfigError(f"invalid value {show(value)} for {key}: expected {self.expected()}") from e
        return result

    def coerce_synonym(self, syn: _Synonym, value: object) -> object:
        if syn.factor == 1 and syn.lo == INT64_MIN and syn.hi == INT64_MAX and not syn.negative_is_unlimited:
            return self.coerce(value, syn.key)
        unit = {1: "", 60_000: " (minutes)", 3_600_000: " (hours)"}[syn.factor]
        try:
            number = parse_integer(value)
            if not syn.lo <= number <= syn.hi:
                raise ValueError(f"{number} is out of range")
        except ValueError as e:
            raise ConfigError(
                f"invalid value {show(value)} for {syn.key}: expected an integer in "
                f"[{syn.lo}, {syn.hi}]{unit}"
            ) from e
        millis = number * syn.factor
        if syn.negative_is_unlimited and millis < 0:
            millis = -1
        return self.coerce(millis, syn.key)

    def format(self, value: object) -> str:
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind == "list":
            assert isinstance(value, tuple)
            return ",".join(value)
        return repr(value) if self.kind == "double" else str(value)


def _int(attr: str, key: str, lo: int, hi: int, *synonyms: _Synonym | str) -> _Spec:
    syns = tuple(s if isinstance(s, _Synonym) else _Synonym(s) for s in synonyms)
    return _Spec(attr, key, "int", lo, hi, synonyms=syns)


def _long(attr: str, key: str, lo: int, *synonyms: _Synonym | str) -> _Spec:
    return _int(attr, key, lo, INT64_MAX, *synonyms)


_C = TypeVar("_C", bound="_ConfigBase")


class _ConfigBase:
    """from_dict / to_dict / with_overrides over a table of ``_Spec`` (one per dataclass field)."""

    _SPECS: ClassVar[tuple[_Spec, ...]] = ()

    def __post_init__(self) -> None:
        # Direct construction gets the same checks (and canonical types) as from_dict.
        for spec in self._SPECS:
            value = getattr(self, spec.attr)
            coerced = spec.coerce(value)
            if coerced is not value:
                object.__setattr__(self, spec.attr, coerced)
        self._check()

    def _check(self) -> None:
        """Checks across fields (none by default)."""

    @classmethod
    def valid_keys(cls) -> list[str]:
        """Every accepted key (topic names and broker synonyms), sorted."""
        keys = {spec.key for spec in cls._SPECS}
        keys.update(syn.key for spec in cls._SPECS for syn in spec.synonyms)
        return sorted(keys)

    @classmethod
    def from_dict(cls: type[_C], props: Mapping[str, object] | None = None, *, base: _C | None = None) -> _C:
        """A config from ``base`` (default: Kafka's defaults) with ``props`` applied.

        Raises :class:`ConfigError` for an unknown key (listing the valid ones) or a bad value
        (naming the key, the value and what is expected).
        """
        start = cls() if base is None else base
        if props is None:
            return start
        if not isinstance(props, Mapping):
            raise ConfigError(f"config must be a mapping of names to values, got {type(props).__name__}")
        if not props:
            return start
        bad_keys = [k for k in props if not isinstance(k, str)]
        if bad_keys:
            raise ConfigError(f"config keys must be strings, got {', '.join(map(show, bad_keys))}")
        valid = cls.valid_keys()
        unknown = sorted(set(props) - set(valid))
        if unknown:
            raise ConfigError(
                f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"valid keys are: {', '.join(valid)}"
            )
        changes: dict[str, object] = {}
        for spec in cls._SPECS:
            # Every given name is validated, even one that loses to a higher-precedence name.
            if spec.key in props:
                changes[spec.attr] = spec.coerce(props[spec.key])
            for syn in spec.synonyms:
                if syn.key in props:
                    changes.setdefault(spec.attr, spec.coerce_synonym(syn, props[syn.key]))
        return dataclasses.replace(start, **changes)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, str]:
        """Kafka config names → string values, as Kafka's describe shows them.

        ``from_dict(c.to_dict()) == c`` for every valid config ``c``.
        """
        return {spec.key: spec.format(getattr(self, spec.attr)) for spec in self._SPECS}

    def with_overrides(self: _C, props: Mapping[str, object] | None) -> _C:
        """This config with ``props`` applied (same rules as :meth:`from_dict`)."""
        return type(self).from_dict(props, base=self)


# ---------------------------------------------------------------------------------------------
# LogConfig

_HOURS = 3_600_000
_MINUTES = 60_000
_LOG_SPECS: tuple[_Spec, ...] = (
    _int("segment_bytes", "segment.bytes", 14, INT32_MAX, "log.segment.bytes"),
    _long(
        "segment_ms", "segment.ms", 1,
        "log.roll.ms", _Synonym("log.roll.hours", 1, INT32_MAX, _HOURS),
    ),
    _long(
        "segment_jitter_ms", "segment.jitter.ms", 0,
        "log.roll.jitter.ms", _Synonym("log.roll.jitter.hours", 0, INT32_MAX, _HOURS),
    ),
    _int("segment_index_bytes", "segment.index.bytes", 4, INT32_MAX, "log.index.size.max.bytes"),
    _int("index_interval_bytes", "index.interval.bytes", 0, INT32_MAX, "log.index.interval.bytes"),
    _long(
        "retention_ms", "retention.ms", -1,
        _Synonym("log.retention.ms", negative_is_unlimited=True),
        _Synonym("log.retention.minutes", -(2**31), INT32_MAX, _MINUTES, negative_is_unlimited=True),
        _Synonym("log.retention.hours", -(2**31), INT32_MAX, _HOURS, negative_is_unlimited=True),
    ),
    _long("retention_bytes", "retention.bytes", INT64_MIN, "log.retention.bytes"),
    _Spec(
        "cleanup_policy", "cleanup.policy", "list", choices=("compact", "delete"),
        synonyms=(_Synonym("log.cleanup.policy"),),
    ),
    _Spec(
        "min_cleanable_dirty_ratio", "min.cleanable.dirty.ratio", "double", 0.0, 1.0,
        synonyms=(_Synonym("log.cleaner.min.cleanable.ratio"),),
    ),
    _long("delete_retention_ms", "delete.retention.ms", 0, "log.cleaner.delete.retention.ms"),
    _long("min_compaction_lag_ms", "min.compaction.lag.ms", 0, "log.cleaner.min.compaction.lag.ms"),
    _long("max_compaction_lag_ms", "max.compaction.lag.ms", 1, "log.cleaner.max.compaction.lag.ms"),
    _long("file_delete_delay_ms", "file.delete.delay.ms", 0, "log.segment.delete.delay.ms"),
    _long("flush_messages", "flush.messages", 1, "log.flush.interval.messages"),
    _long("flush_ms", "flush.ms", 0, "log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    _int("max_message_bytes", "max.message.bytes", 0, INT32_MAX, "message.max.bytes"),
    _Spec(
        "message_timestamp_type", "message.timestamp.type", "string", choices=("CreateTime", "LogAppendTime"),
        synonyms=(_Synonym("log.message.timestamp.type"),),
    ),
    _Spec("preallocate", "preallocate", "bool", synonyms=(_Synonym("log.preallocate"),)),
    _Spec(
        "compression_type", "compression.type", "string",
        choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
    ),
)  # fmt: skip


@dataclass(frozen=True)
class LogConfig(_ConfigBase):
    """One topic's configuration, with Kafka's topic-config names, broker synonyms and defaults.

    ===============================  ===========================================  ===================
    topic config                     broker synonyms (lower precedence)           default
    ===============================  ===========================================  ===================
    segment.bytes                    log.segment.bytes                            1073741824 (min 14)
    segment.ms                       log.roll.ms, log.roll.hours                  604800000 (7 days)
    segment.jitter.ms                log.roll.jitter.ms, log.roll.jitter.hours    0
    segment.index.bytes              log.index.size.max.bytes                     10485760 (min 4)
    index.interval.bytes             log.index.interval.bytes                     4096
    retention.ms                     log.retention.ms, .minutes, .hours           604800000 (-1: none)
    retention.bytes                  log.retention.bytes                          -1 (unlimited)
    cleanup.policy                   log.cleanup.policy                           delete
    min.cleanable.dirty.ratio        log.cleaner.min.cleanable.ratio              0.5 (in [0, 1])
    delete.retention.ms              log.cleaner.delete.retention.ms              86400000 (1 day)
    min.compaction.lag.ms            log.cleaner.min.compaction.lag.ms            0
    max.compaction.lag.ms            log.cleaner.max.compaction.lag.ms            2^63-1 (min 1)
    file.delete.delay.ms             log.segment.delete.delay.ms                  60000
    flush.messages                   log.flush.interval.messages                  2^63-1 (min 1)
    flush.ms                         log.flush.interval.ms,                       2^63-1
                                     log.flush.scheduler.interval.ms
    max.message.bytes                message.max.bytes                            1048588
    message.timestamp.type           log.message.timestamp.type                   CreateTime
    preallocate                      log.preallocate                              false
    compression.type                 (same name)                                  producer
    ===============================  ===========================================  ===================

    ``cleanup.policy`` is a comma list of ``delete`` and ``compact`` (stored sorted, without
    duplicates; empty means neither, as Kafka allows).  ``compression.type`` is one of producer,
    uncompressed, gzip, snappy, lz4, zstd.  A negative ``log.retention.*`` means unlimited (-1).
    ``min.compaction.lag.ms`` must not exceed ``max.compaction.lag.ms`` (``LogConfig.validateValues``).
    """

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    cleanup_policy: tuple[str, ...] = ("delete",)
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = INT64_MAX
    file_delete_delay_ms: int = 60000
    flush_messages: int = INT64_MAX
    flush_ms: int = INT64_MAX
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    preallocate: bool = False
    compression_type: str = "producer"

    _SPECS: ClassVar[tuple[_Spec, ...]] = _LOG_SPECS

    def _check(self) -> None:
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ConfigError(
                f"conflicting settings: min.compaction.lag.ms ({self.min_compaction_lag_ms}) > "
                f"max.compaction.lag.ms ({self.max_compaction_lag_ms})"
            )

    @property
    def compact(self) -> bool:
        """``cleanup.policy`` includes ``compact``."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """``cleanup.policy`` includes ``delete``."""
        return "delete" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """The roll age (Kafka ``LogConfig.maxSegmentMs``): capped by max.compaction.lag.ms if compacted."""
        return min(self.max_compaction_lag_ms, self.segment_ms) if self.compact else self.segment_ms


# ---------------------------------------------------------------------------------------------
# CleanerConfig

_CLEANER_SPECS: tuple[_Spec, ...] = (
    _Spec("enable", "log.cleaner.enable", "bool"),
    _int("threads", "log.cleaner.threads", 0, INT32_MAX),
    _long("dedupe_buffer_size", "log.cleaner.dedupe.buffer.size", 0),
    _Spec("dedupe_buffer_load_factor", "log.cleaner.io.buffer.load.factor", "double", 0.0, 1.0, lo_open=True),
    _int("io_buffer_size", "log.cleaner.io.buffer.size", 0, INT32_MAX),
    _Spec(
        "io_max_bytes_per_second", "log.cleaner.io.max.bytes.per.second", "double",
        0.0, sys.float_info.max, lo_open=True,
    ),
    _long("backoff_ms", "log.cleaner.backoff.ms", 0),
    _long("retention_check_interval_ms", "log.retention.check.interval.ms", 1),
)  # fmt: skip


_NO_EFFECT: dict[str, str] = {
    "log.cleaner.threads": (
        "maintain() cleans one log at a time in the calling thread, with the whole "
        "log.cleaner.dedupe.buffer.size for its offset map (to turn compaction off, set "
        "log.cleaner.enable=false)"
    ),
    "log.cleaner.io.buffer.size": (
        "the cleaner reads segments in 8 MiB chunks (grown to fit the largest batch) because its "
        "compiled kernels work a chunk at a time and run at about half the speed on Kafka's 512 KiB; "
        "its memory is the offset map (log.cleaner.dedupe.buffer.size) plus a few chunks, and its "
        "rate is limited by log.cleaner.io.max.bytes.per.second"
    ),
    "log.cleaner.backoff.ms": (
        "there is no background cleaner thread that sleeps between checks: compaction runs when "
        "maintain() is called (pylog compact, the Spark sink after each commit, the Python API)"
    ),
    "log.retention.check.interval.ms": (
        "there is no retention timer: retention is checked whenever maintain() runs (pylog retain, "
        "the Spark sink after each commit, the Python API)"
    ),
}


@dataclass(frozen=True)
class CleanerConfig(_ConfigBase):
    """Log cleaner and retention-checker settings, with Kafka's broker names (``CleanerConfig``).

    ===================================  =======================  ========================================
    key                                  default                  accepted
    ===================================  =======================  ========================================
    log.cleaner.enable                   true                     true / false
    log.cleaner.threads                  1                        integer >= 0 (no effect, see below)
    log.cleaner.dedupe.buffer.size       134217728 (128 MiB)      integer >= 0: the offset map's memory
    log.cleaner.io.buffer.load.factor    0.9                      number in (0, 1]: the dedupe-map load
    log.cleaner.io.buffer.size           524288 (512 KiB)         integer >= 0 (no effect, see below)
    log.cleaner.io.max.bytes.per.second  1.7976931348623157e308   number > 0 (Double.MAX_VALUE: no limit)
    log.cleaner.backoff.ms               15000                    integer >= 0 (no effect, see below)
    log.retention.check.interval.ms      300000                   integer >= 1 (no effect, see below)
    ===================================  =======================  ========================================

    ``log.cleaner.enable=false`` turns compaction off in :func:`maintain
    <pylog.storage.maintenance.runner.maintain>` (retention still runs), as it turns Kafka's
    cleaner threads off.  ``log.cleaner.io.max.bytes.per.second`` limits the cleaner's reads plus
    writes, as Kafka's throttler does: the cleaner sleeps whenever it is ahead of the rate.

    pylog has no broker: maintenance is one call that runs where it is called, so
    ``log.cleaner.threads``, ``log.cleaner.io.buffer.size``, ``log.cleaner.backoff.ms`` and
    ``log.retention.check.interval.ms`` (:attr:`NO_EFFECT`: key -> why) are accepted and
    validated, so that a Kafka broker's settings can be given as they are, but a value other than
    Kafka's default draws a :class:`UserWarning` naming the setting and why it has no effect.

    Kafka leaves the dedupe buffer size, load factor and I/O rate unvalidated; values it would only
    fail on later (negative sizes, a load factor outside (0, 1], a rate <= 0) are rejected here.
    """

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 134217728
    dedupe_buffer_load_factor: float = 0.9
    io_buffer_size: int = 524288
    io_max_bytes_per_second: float = sys.float_info.max
    backoff_ms: int = 15000
    retention_check_interval_ms: int = 300000

    _SPECS: ClassVar[tuple[_Spec, ...]] = _CLEANER_SPECS
    NO_EFFECT: ClassVar[Mapping[str, str]] = _NO_EFFECT
    """The keys pylog accepts but does not act on, with the reason (shown in the warning)."""

    def _check(self) -> None:
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for spec in self._SPECS:
            value = getattr(self, spec.attr)
            if spec.key in self.NO_EFFECT and value != defaults[spec.attr]:
                warnings.warn(
                    f"{spec.key}={spec.format(value)} has no effect in pylog: {self.NO_EFFECT[spec.key]}",
                    UserWarning,
                    stacklevel=2,
                )

    @property
    def throttled(self) -> bool:
        """``log.cleaner.io.max.bytes.per.second`` is set below Kafka's unlimited default."""
        return self.io_max_bytes_per_second < sys.float_info.max
