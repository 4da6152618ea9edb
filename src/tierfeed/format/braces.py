"""Brace patterns of shard names, as WebDataset writes them (``shard-{000000..000009}.tar``).

WebDataset expands its URLs with the ``braceexpand`` package; this is the same rule for the
forms shard lists use, so that a pattern written for one names the same shards for the other:

- ``{a,b,c}``: each alternative in turn (alternatives may hold patterns: ``{a,b{1,2}}``);
- ``{0..12}``, ``{000000..000009}``, ``{9..0}``, ``{0..100..10}``: integers from the first to
  the last (inclusive, either direction, by the step if given); when either end is written
  with a leading zero, every number is padded with zeros to the longer end's width;
- ``{a..e}``: single letters the same way.

Groups expand left to right, the first varying slowest (``{a,b}{1,2}``: a1 a2 b1 b2). Braces
that make no group (no comma, no range: ``{x}``; an unmatched ``{`` or ``}``) are kept as they
are, as bash keeps them: a path holding them is read as written. There is no escape.
"""

from __future__ import annotations

import re

from tierfeed.errors import ConfigError

__all__ = ["MAX_NAMES", "expand_braces"]

MAX_NAMES = 1_000_000  # names one pattern may expand to: more is a typo, not a shard set
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?|([a-zA-Z])\.\.([a-zA-Z])(?:\.\.(-?\d+))?")


def expand_braces(pattern: str, limit: int = MAX_NAMES) -> list[str]:
    """Every name ``pattern`` stands for, in order (``[pattern]`` when it holds no group).

    Raises:
        ConfigError: it expands to more than ``limit`` names.
    """
    return _expand(pattern, limit, pattern)


def _expand(text: str, limit: int, whole: str) -> list[str]:
    start = 0
    while (at := text.find("{", start)) >= 0:
        end = _closing(text, at)
        if end is None:
            return [text]  # no group closes: the rest is literal
        options = _options(text[at + 1 : end], limit, whole)
        if options is None:  # not a group: that brace is literal, look further on
            start = at + 1
            continue
        head, tails = text[:at], _expand(text[end + 1 :], limit, whole)
        out: list[str] = []
        for option in options:
            for middle in _expand(option, limit, whole):
                out.extend(head + middle + tail for tail in tails)
                if len(out) > limit:
                    raise _too_many(whole, limit)
        return out
    return [text]


def _closing(text: str, at: int) -> int | None:
    """Where the brace opened at ``at`` closes (nested groups counted), or None."""
    depth = 0
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _options(body: str, limit: int, whole: str) -> list[str] | None:
    """The alternatives of a group's ``body``: its top-level comma parts, or a range's values;
    None when it is neither (then the braces are literal)."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(body):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(body[last:i])
            last = i + 1
    if parts:
        return [*parts, body[last:]]
    match = _RANGE.fullmatch(body)
    if match is None:
        return None
    first, last_text, step, a, b, letter_step = match.groups()
    if a is not None:
        return [chr(c) for c in _steps(ord(a), ord(b), letter_step, limit, whole)]
    width = 0
    if any(s.lstrip("-").startswith("0") and s.lstrip("-") != "0" for s in (first, last_text)):
        width = max(len(first), len(last_text))
    return [f"{n:0{width}d}" for n in _steps(int(first), int(last_text), step, limit, whole)]


def _steps(first: int, last: int, step: str | None, limit: int, whole: str) -> range:
    size = abs(int(step or 1)) or 1
    values = range(first, last + 1, size) if first <= last else range(first, last - 1, -size)
    if len(values) > limit:
        raise _too_many(whole, limit)
    return values


def _too_many(pattern: str, limit: int) -> ConfigError:
    return ConfigError(
        f"{pattern!r}: the brace pattern names more than {limit:,} shards; check its ranges"
    )
