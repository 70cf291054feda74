"""subscribePattern is a Java regular expression: translated where Python's re reads it
differently, refused (naming the construct) where it has no equivalent."""

from __future__ import annotations

import pytest

from pylog.connector.javaregex import JavaRegexError, compile_java, to_python
from pylog.connector.options import Subscription, parse_options
from pylog.storage.errors import SourceOptionError

TOPICS = ["events", "events-eu", "events.2024", "orders", "a.b", "éclair", "x1", "x٣"]


@pytest.mark.parametrize(
    ("java", "selected"),
    [
        ("events.*", ["events", "events-eu", "events.2024"]),
        (r"\Qa.b\E", ["a.b"]),  # quoted: the dot is literal
        (r"events\Q.\E\d+", ["events.2024"]),
        (r"(?<region>events)-eu", ["events-eu"]),
        (r"(?<w>x)\k<w>?1", ["x1"]),
        (r"x\d", ["x1"]),  # Java's \d is ASCII: Arabic-Indic three is no digit there
        (r"\w+", ["events", "orders", "x1"]),  # nor is é a word character
        (r"(?i)ORDERS", ["orders"]),
        (r"orders\z", ["orders"]),
        (r"[a-e&]vents", ["events"]),  # a lone & in a class is a literal
    ],
)
def test_java_patterns_select_what_spark_would(java: str, selected: list[str]) -> None:
    sub = Subscription("subscribePattern", pattern=java)
    assert [t for t in TOPICS if sub.matches(t)] == selected
    assert [t for t in TOPICS if compile_java(java).fullmatch(t)] == selected


@pytest.mark.parametrize(
    ("java", "why"),
    [
        (r"\p{Alpha}+", "Unicode property"),
        (r"[a-z&&[^e]]+", "intersection"),
        (r"[[a-c][x-z]]", "nested character class"),
        (r"\h", "horizontal whitespace"),
        (r"(?U)\w+", "(?U)"),
        (r"[abc", "unterminated"),
    ],
)
def test_constructs_python_reads_differently_are_refused(java: str, why: str) -> None:
    with pytest.raises(JavaRegexError, match=why.replace("(", r"\(").replace("?", r"\?").replace(")", r"\)")):
        to_python(java)


def test_the_option_error_names_the_option_and_the_construct() -> None:
    with pytest.raises(SourceOptionError) as info:
        parse_options({"path": "/tmp", "subscribePattern": r"events\p{Digit}"})
    message = str(info.value)
    assert "subscribePattern" in message and "Java regular expression" in message and "\\p{...}" in message
