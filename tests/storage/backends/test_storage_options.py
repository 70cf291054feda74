"""Storage options of object-store roots: pylog's own read by their declarations, the others
turned into the types fsspec expects; what the CLI and the README show comes from the same
declarations."""

from __future__ import annotations

import pytest

from pylog.storage.backends.objectstore.client import ObjectClient
from pylog.storage.backends.objectstore.options import PYLOG_OPTIONS, check_option, split_options, summary
from pylog.storage.errors import ConfigError


def test_strings_become_the_types_fsspec_takes_except_names_and_credentials() -> None:
    fs, own = split_options(
        {
            "anon": "TRUE",
            "use_ssl": " false ",
            "config_kwargs.retries.max_attempts": "2",
            "config_kwargs.connect_timeout": "1.5",
            "client_kwargs.region_name": "123",  # a name stays a string, however it looks
            "key": "0042",
            "default_cache_type": "none",
            "asynchronous": False,  # Python values as given
        }
    )
    assert fs == {
        "anon": True,
        "use_ssl": False,
        "config_kwargs": {"retries": {"max_attempts": 2}, "connect_timeout": 1.5},
        "client_kwargs": {"region_name": "123"},
        "key": "0042",
        "default_cache_type": None,
        "asynchronous": False,
    }
    assert own == {o.setting: o.default for o in PYLOG_OPTIONS.values()}


def test_pylog_options_are_typed_by_their_declarations() -> None:
    _, own = split_options(
        {
            "pylog.retry_timeout_s": "0.25",
            "pylog.file_delete_delay_ms": 300,
            "pylog.read_ahead_bytes": " 65536 ",
        }
    )
    assert own == {"retry_timeout_s": 0.25, "file_delete_delay_ms": 300, "read_ahead_bytes": 65536}
    store = ObjectClient(
        "memory://pylog-options", {"pylog.retry_timeout_s": "2", "pylog.read_ahead_bytes": "4096"}
    )
    assert (store.retry_timeout_s, store.file_delete_delay_ms, store.read_ahead_bytes) == (2.0, 60_000, 4096)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("pylog.retry_timeout_s", "soon", r"pylog\.retry_timeout_s: 'soon' is not valid; valid values: a"),
        ("pylog.retry_timeout_s", "-1", r"pylog\.retry_timeout_s: '-1' is not valid"),
        ("pylog.retry_timeout_s", "inf", r"pylog\.retry_timeout_s: 'inf' is not valid"),
        ("pylog.retry_timeout_s", True, r"pylog\.retry_timeout_s: True is not valid"),
        ("pylog.file_delete_delay_ms", "1.5", r"pylog\.file_delete_delay_ms: '1\.5' is not valid; "
         "valid values: an integer >= 0"),
        ("pylog.read_ahead_bytes", "-4096", r"pylog\.read_ahead_bytes: '-4096' is not valid"),
        ("pylog.read_ahead", "1", r"unknown storage option 'pylog\.read_ahead' \(did you mean "
         r"pylog\.read_ahead_bytes\?\); pylog's own are: pylog\.retry_timeout_s, "),
        ("pylog.nope", "1", r"unknown storage option 'pylog\.nope'; pylog's own are"),
    ],
)  # fmt: skip
def test_bad_pylog_options_are_refused_naming_the_option(name: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        split_options({name: value})
    with pytest.raises(ConfigError, match=message.replace("pylog\\.", "storage\\.pylog\\.")):
        check_option(name, value, "storage.")  # as the connector names them


def test_the_cli_help_names_every_option_with_its_default() -> None:
    text = summary()
    for o in PYLOG_OPTIONS.values():
        assert f"{o.name}={int(o.default)}" in text
