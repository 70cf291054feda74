"""``subscribePattern`` is a Java regular expression (Spark's Kafka source compiles it with
``java.util.regex.Pattern`` and selects the topics it matches whole): its Python equivalent.

Python's ``re`` reads most of Java's syntax the same way.  Where it does not, the pattern is
translated or refused with the reason, never silently read differently:

    | Java                            | Python                        | here                      |
    |---------------------------------|-------------------------------|---------------------------|
    | \\d \\w \\s \\b: ASCII by default   | Unicode for str patterns      | compiled with re.ASCII    |
    | \\Q...\\E literal quoting         | (none)                        | re.escape of the text     |
    | (?<name>...) \\k<name>           | (?P<name>...) (?P=name)       | translated                |
    | \\z end of input; \\Z before a    | \\Z end of input               | \\Z; (?=\\n?\\Z)              |
    |   final line terminator         |                               |                           |
    | \\e escape, \\cX control char     | (none)                        | \\x1b, \\xNN                 |
    | \\p{..} \\P{..} \\h \\H \\v \\R \\X   | (none, or \\v = one character) | refused                   |
    |   \\G \\K                         |                               |                           |
    | [a-z&&[^e]] intersection, [[..]]| literal characters (warning)  | refused                   |
    |   nested classes                |                               |                           |
    | (?U) (?d) flags                 | (?U) unknown                  | refused                   |
    | possessive *+ ++ ?+ {n}+, (?>..)| Python 3.11 and later         | kept (refused before 3.11)|
"""

from __future__ import annotations

import re
import sys

_REFUSED_ESCAPES = {
    "p": "Unicode property classes (\\p{...})",
    "P": "Unicode property classes (\\P{...})",
    "h": "horizontal whitespace (\\h)",
    "H": "non-horizontal whitespace (\\H)",
    "v": "vertical whitespace (\\v; in Python a single vertical tab)",
    "R": "linebreak matcher (\\R)",
    "X": "grapheme clusters (\\X)",
    "G": "end of the previous match (\\G)",
    "K": "match reset (\\K)",
}


class JavaRegexError(ValueError):
    """A Java pattern that cannot be read the same way by Python's ``re``."""


def to_python(pattern: str) -> str:
    """The Python ``re`` pattern (to compile with ``re.ASCII``) matching what ``pattern``
    matches as a Java regular expression; raises :class:`JavaRegexError` saying what cannot be
    translated and where."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            if e == "Q":
                end = pattern.find("\\E", i + 2)
                text = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                if in_class:
                    raise JavaRegexError(f"\\Q...\\E inside a character class (at {i}) is not supported")
                out.append(re.escape(text))
                i = n if end < 0 else end + 2
                continue
            if e in _REFUSED_ESCAPES:
                raise JavaRegexError(f"{_REFUSED_ESCAPES[e]} at {i} has no Python equivalent")
            if e == "k" and pattern.startswith("<", i + 2):
                close = pattern.find(">", i + 3)
                if close < 0:
                    raise JavaRegexError(f"unterminated \\k<name> at {i}")
                out.append(f"(?P={pattern[i + 3 : close]})")
                i = close + 1
                continue
            if e == "z":
                out.append(r"\Z")
            elif e == "Z" and not in_class:
                out.append(r"(?=\n?\Z)")
            elif e == "e":
                out.append(r"\x1b")
            elif e == "c" and i + 2 < n:
                out.append(f"\\x{ord(pattern[i + 2]) ^ 64:02x}")
                i += 3
                continue
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "[":
                raise JavaRegexError(f"a nested character class (at {i}) is not supported")
            if c == "&" and pattern.startswith("&&", i):
                raise JavaRegexError(f"character class intersection && (at {i}) is not supported")
            if c == "]" and not _class_start(out):
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            continue
        if pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
            out.append("(?P<")
            i += 3
            continue
        if pattern.startswith("(?", i):
            flags = re.match(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?[:)]", pattern[i:])
            if flags and set(flags.group(1) + (flags.group(2) or "")) & {"U", "d"}:
                raise JavaRegexError(f"the flags (?U)/(?d) at {i} have no Python equivalent")
        possessive = c == "+" and i > 0 and pattern[i - 1] in "*+?}" and out[-1] != "\\"
        if sys.version_info < (3, 11) and (possessive or pattern.startswith("(?>", i)):
            raise JavaRegexError(f"possessive quantifiers and atomic groups (at {i}) need Python 3.11")
        out.append(c)
        i += 1
    if in_class:
        raise JavaRegexError("unterminated character class")
    return "".join(out)


def _class_start(out: list[str]) -> bool:
    """Whether a ``]`` would be the first character of the class being built (a literal)."""
    return bool(out) and (out[-1] == "[" or (out[-1] == "^" and len(out) > 1 and out[-2] == "["))


def compile_java(pattern: str) -> re.Pattern[str]:
    """``pattern`` (Java syntax) compiled for ``fullmatch`` of topic names."""
    return re.compile(to_python(pattern), re.ASCII)


__all__ = ["JavaRegexError", "compile_java", "to_python"]
