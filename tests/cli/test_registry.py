"""What every ``pylog`` subcommand offers: ``--json``, a description with its exit statuses, and
its own usage on a bad argument."""

from __future__ import annotations

import argparse

import pytest

from pylog.cli import COMMANDS, build_parser, main


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser, _ = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_json_and_documents_its_exit_statuses(name: str) -> None:
    sub = subparsers()[name]
    assert "--json" in {o for a in sub._actions for o in a.option_strings}
    description = COMMANDS[name].description
    assert description != COMMANDS[name].help and "exit status" in description.lower()
    assert "exit status" in sub.format_help().replace("\n", " ").lower()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_bad_argument_shows_the_subcommands_usage(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: pylog {name} ") and f"pylog {name}: error: " in err


def test_the_operator_commands_of_kafkas_tools_are_there() -> None:
    assert {
        "create-topic",
        "list-topics",
        "delete-topic",
        "alter-config",
        "add-partitions",
        "list-groups",
        "describe-group",
        "delete-group",
    } <= set(COMMANDS)
