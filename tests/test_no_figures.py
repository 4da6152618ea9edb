"""No measured figure in a comment or docstring of src/: figures go stale there; they belong in
docs/BENCHMARKS.md beside the command that produced them (STYLE.md, "What to unlearn").

A measured figure is a time, a rate, a share or a speed-up ("40 µs", "3.2 GB/s", "12%", "4x")
read as an outcome: given as approximate ("~", "about"), or beside a word that says it was
measured (took, costs, faster, against, here, on 2 cores, a bench/ script). A bound or a
setting ("waits at most 30 s", "4 MiB pieces", "median 1 ms") is not one; sizes are not looked
at, being settings far more often than outcomes.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import tierfeed

SRC = Path(tierfeed.__file__).parent

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A number or a range of two, its unit, and whether it was given as approximate.
_QUANTITY = re.compile(
    r"(?P<approx>(?:~|\babout\b|\baround\b|\broughly\b|\bnearly\b)\s*)?"
    rf"(?<![\w.]){_NUMBER}(?:\s*[-–]\s*{_NUMBER})?"
    r"(?:\s?(?P<unit>[A-Za-z]+/s|[µu]s|ns|ms|s|sec|seconds?|minutes?|%|×)|(?P<times>x))"
    r"(?![\w/])"
)
# Words that make a nearby figure an outcome rather than a setting.
_MEASURED = re.compile(
    r"\b(?:measured|measures?|took|takes?|taking|costs?|costing|spent|spends?|"
    r"faster|slower|fewer|sooner|later|against|versus|vs|speed-?ups?|here|"
    r"(?:this|one|the same) (?:machine|host|run)|on \d+ cores?|per core)\b|bench/|BENCHMARKS"
)
_WINDOW = 80  # characters either side of a figure in which a word makes it measured
_SENTENCE_END = re.compile(r"[.;!?](?=\s)|\n\s*\n")


def _clause(text: str, start: int, end: int) -> str:
    """The text within `_WINDOW` characters of ``text[start:end]``, cut at sentence ends."""
    before = text[max(0, start - _WINDOW) : start]
    after = text[end : end + _WINDOW]
    ends = list(_SENTENCE_END.finditer(before))
    before = before[ends[-1].end() :] if ends else before
    first = _SENTENCE_END.search(after)
    after = after[: first.start()] if first else after
    return before + " " + after


def measured_figures(text: str) -> list[tuple[int, str]]:
    """(line within ``text`` from 0, the figure with what makes it measured) for each figure."""
    out = []
    for m in _QUANTITY.finditer(text):
        share = m["unit"] == "%"
        approximate = m["approx"] is not None and not share  # "~6% resolution": a setting's
        if approximate or _MEASURED.search(_clause(text, m.start(), m.end())):
            line = text.count("\n", 0, m.start())
            out.append((line, " ".join(text[max(0, m.start() - 30) : m.end() + 30].split())))
    return out


def prose_of(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each comment block and each string statement (docstrings)."""
    blocks: list[tuple[int, str]] = []
    last_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line, text = tok.start[0], tok.string.lstrip("#").strip()
        if line == last_line + 1 and blocks:  # a comment continued on the next line
            first, joined = blocks[-1]
            blocks[-1] = (first, joined + "\n" + text)
        else:
            blocks.append((line, text))
        last_line = line
    for node in ast.walk(ast.parse(source)):
        value = node.value if isinstance(node, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            blocks.append((node.lineno, value.value))
    return blocks


def figures_in(source: str) -> list[tuple[int, str]]:
    """(line, figure) of each measured figure in the comments and docstrings of ``source``."""
    return sorted(
        (first + line, figure)
        for first, text in prose_of(source)
        for line, figure in measured_figures(text)
    )


def test_no_comment_or_docstring_quotes_a_measured_figure() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}: {figure}"
        for path in sorted(SRC.rglob("*.py"))
        for line, figure in figures_in(path.read_text())
    ]
    assert found == [], "\n".join(["point to docs/BENCHMARKS.md instead:", *found])


@pytest.mark.parametrize(
    "text",
    [
        "two tensors of 64 int64s took 893 µs a batch on 2 cores, against 20-30 µs",
        "a 64 KiB read took 28 µs, 6 µs with the freed heap kept",
        "parsing the models again (~66 ms of CPU in a forked child)",
        "O(samples), ~10 ms per million on 2 cores.",
        "# not `with fds.fd(...)`: a generator per read costs ~2 us",
        "slicing it is ~4x faster than `key_bytes` per sample",
        "FUSE alone costs ~0.15 ms per small file here",
        "the readahead read 0.9-1.9% of a store twice over FUSE,\n`bench/cold_path.py`",
        "the cold epoch 9-40% slower through the endpoint",
        "xxh3 reads 3.2 GB/s here",
        "it reached 25,517 samples/s on this machine",
    ],
)
def test_a_measured_figure_is_found(text: str) -> None:
    assert measured_figures(text), text


@pytest.mark.parametrize(
    "text",
    [
        "The placement lock is waited for at most 30 s; then the copy is left unplaced.",
        "in 4 MiB pieces, read in 64 KiB blocks",
        "``nfs`` (median 1 ms, sigma 0.5, 400 MB/s), ``heavy-tail`` (a 1 s stall in 1000)",
        "buckets per decade: ~6% relative resolution",
        "a rank sends to at most 2x this many peers",
        "PyTorch waits 5 s for each such worker before it kills it",
        "margin (5% of the file system, at least 1 GiB)",
        "an ``N x 3 x H x W`` batch; torchvision 0.2x",
    ],
)
def test_a_setting_is_not_a_measured_figure(text: str) -> None:
    assert measured_figures(text) == [], text
