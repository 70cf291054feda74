"""The storage options of an object-store root: pylog's own (``pylog.*``) declared once, and the
reading of all of them into fsspec's keyword arguments and pylog's settings.

Storage options come as strings from Spark (the ``storage.*`` options, without the prefix) and
the CLI (``-S KEY=VALUE``, ``PYLOG_STORAGE_OPTIONS``), or as Python values from ``pylog.open``.
Each :class:`StorageOption` says its name, type, default, valid values and what it does.  From
these declarations come:

- the reading of storage options (:func:`split_options`, used by
  :class:`~pylog.storage.backends.objectstore.client.ObjectClient`): one coercion of each value,
  errors naming the option, an unknown ``pylog.*`` name refused with the closest declared one;
- the connector's check of its ``storage.pylog.*`` options when a read or write is defined
  (:func:`check_option`, the same parsing);
- the CLI's ``-S`` help (:func:`summary`) and the README's table (``docs/reference.py``).

Every other option goes to fsspec: strings become the types fsspec expects (booleans, None,
numbers, except where the option is a name, URL or credential) and dotted keys
(``client_kwargs.region_name``) nested dicts.  Values are never logged (:func:`redact`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pylog.storage.config import INT64_MAX, parse_bool, parse_integer, show
from pylog.storage.errors import ConfigError

PREFIX = "pylog."
"""pylog's own storage options start with this; the others are fsspec's."""

Kind = Literal["seconds", "int"]


@dataclass(frozen=True)
class StorageOption:
    """One of pylog's own storage options."""

    name: str
    """As documented (``pylog.<setting>``); the setting is the attribute of
    :class:`~pylog.storage.backends.objectstore.client.ObjectClient` it sets."""
    kind: Kind
    """``seconds`` (a number, fractions allowed) or ``int`` (an integer literal)."""
    default: float
    values: str
    """The valid values, as messages list them."""
    shown_default: str
    """The default as the README's table shows it."""
    about: str
    """What the option does (the README's table)."""

    @property
    def setting(self) -> str:
        return self.name[len(PREFIX) :]

    def parse(self, value: object, shown: str = "") -> float:
        """The typed value of ``value``; :class:`ConfigError` naming the option (as ``shown`` +
        its name), the value and the valid values otherwise."""
        try:
            number = _seconds(value) if self.kind == "seconds" else parse_integer(value)
            if not 0 <= number <= INT64_MAX:
                raise ValueError(f"{number} is out of range")
        except ValueError:
            raise ConfigError(
                f"storage option {shown}{self.name}: {show(value)} is not valid; valid values: {self.values}"
            ) from None
        return number


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


PYLOG_OPTIONS: dict[str, StorageOption] = {
    o.name: o
    for o in (
        StorageOption(
            "pylog.retry_timeout_s", "seconds", 60.0, "a number of seconds >= 0 (fractions allowed)", "`60`",
            "seconds for which transient failures (server unreachable, connection reset, timeouts, 5xx, "
            "throttling) are retried with backoff before the operation fails",
        ),
        StorageOption(
            "pylog.file_delete_delay_ms", "int", 60_000, "an integer >= 0 (milliseconds)", "`60000`",
            "how long objects superseded by a commit (old commits and checkpoints, replaced segments) are "
            "kept before a later commit deletes them, so that readers of an older snapshot can finish",
        ),
        StorageOption(
            "pylog.read_ahead_bytes", "int", 8 << 20, "an integer >= 0 (bytes)", "`8388608` (8 MiB)",
            "largest read-ahead (one ranged GET) of a sequential scan of one segment object",
        ),
    )
}  # fmt: skip
"""pylog's own storage options, by name."""


def did_you_mean(key: str, names: Iterable[str]) -> str | None:
    """The name in ``names`` closest to ``key`` (compared case-insensitively), if one is close."""
    spelled = {n.lower(): n for n in names}
    close = difflib.get_close_matches(key.lower(), sorted(spelled), n=1, cutoff=0.8)
    return spelled[close[0]] if close else None


def check_option(name: str, value: object, shown: str = "") -> float:
    """The typed value of pylog's storage option ``name``; :class:`ConfigError` for an unknown
    name (with the closest declared one) or an invalid value.  ``shown`` prefixes the names in
    messages (the connector's ``storage.``)."""
    spec = PYLOG_OPTIONS.get(name)
    if spec is None:
        close = did_you_mean(name, PYLOG_OPTIONS)
        hint = f" (did you mean {shown}{close}?)" if close else ""
        raise ConfigError(
            f"unknown storage option {shown + name!r}{hint}; pylog's own are: "
            f"{', '.join(shown + n for n in PYLOG_OPTIONS)}"
        )
    return spec.parse(value, shown)


def summary() -> str:
    """pylog's own storage options with their defaults, for a command-line help."""
    shown = ", ".join(f"{o.name}={o.shown_default.split()[0].strip('`')}" for o in PYLOG_OPTIONS.values())
    return f"{shown}: the defaults"


_SECRET_WORDS = ("secret", "key", "token", "password", "credential", "session")
_STRING_WORDS = (*_SECRET_WORDS, "endpoint", "region", "profile", "bucket", "url", "name", "version")


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """Storage options safe to print: values of credential-like keys are masked."""
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in options.items()}


def _fsspec_value(name: str, value: Any) -> Any:
    """An fsspec option's string as the type fsspec expects: a boolean, None or a number, except
    where the option is a name, URL or credential; other values as given."""
    if not isinstance(value, str):
        return value
    try:
        return parse_bool(value)
    except ValueError:
        pass
    if value.strip().lower() in ("none", "null"):
        return None
    if not any(w in name.lower() for w in _STRING_WORDS):
        try:
            return parse_integer(value)
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            pass
    return value


def split_options(options: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, float]]:
    """fsspec's keyword arguments and pylog's settings (by :attr:`StorageOption.setting`, every
    one, defaults filled in) from storage options (see the module doc)."""
    fs_kwargs: dict[str, Any] = {}
    own = {o.setting: o.default for o in PYLOG_OPTIONS.values()}
    for k, v in (options or {}).items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"storage option names must be non-empty strings, got {k!r}")
        if k.startswith(PREFIX):
            own[k[len(PREFIX) :]] = check_option(k, v)
            continue
        parts = k.split(".")
        node = fs_kwargs
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"storage option {k!r} conflicts with {part!r}")
            node = nxt
        node[parts[-1]] = _fsspec_value(parts[-1], v)
    return fs_kwargs, own


__all__ = [
    "PREFIX",
    "PYLOG_OPTIONS",
    "StorageOption",
    "check_option",
    "did_you_mean",
    "redact",
    "split_options",
    "summary",
]
