"""Every measured figure in the product's README and docs is a quote of the baselines (quotes.py), so
that render --check holds it to the data. A number with a performance unit in prose fails here unless it
is quoted, sits in code or a rendered table, or is one of the few figures below that no GPU measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moetune_lab.baselines import cli as baselines
from moetune_lab.baselines import quotes

PAGES = (baselines.REPOSITORY / "README.md", *sorted((baselines.REPOSITORY / "docs").glob("*.md")))
UNIT = r"\s?(?:ms|us|µs|TF/s|TFLOP/s|TB/s|GB/s|tok/s|tokens/s)(?![\w/])|x(?![\w])|%"
FIGURE = re.compile(rf"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:{UNIT})")
# Figures that are not measurements: (page, the phrase around the figure, why it stays as written).
ALLOWED = {
    ("docs/performance.md", "989 TF/s dense bf16 on its datasheet"): "the vendor's figure, not a measurement",
    ("docs/performance.md", "takes 10% off the tensor cores' rate"): "a constant of the cost model",
    ("docs/training.md", "Estimates within 1% count as a tie"): "the drhs cost model's tie tolerance",
    ("docs/fp8.md", "the test bounds it at 10%"): "a test's tolerance",
    ("docs/fp8.md", "its test bounds the logits at 15%"): "a test's tolerance",
    ("docs/fp8.md", "each MoE block at 10%"): "a test's tolerance",
    ("docs/multi_gpu.md", "the test asks for more than 1.5x"): "a test's threshold",
    ("docs/multi_gpu.md", "or within 2%"): "the tolerance at which two winners agree",
    ("docs/glossary.md", "(default 2%)"): "the --min-gain default",
    ("docs/tuning.md", "(default 2%)"): "the --min-gain default",
    ("docs/glossary.md", "within 4x of M"): "the nearest-M lookup's window",
    ("docs/using.md", "within 4x"): "the nearest-M lookup's window",
    ("docs/bad-inputs.md", "min gain of 150%"): "a refused input of that test, not a figure",
}


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each line of prose: fenced and indented code, rendered baselines blocks,
    quotes and inline code spans left out."""
    text = quotes.QUOTE.sub("", text)
    out, fenced, block, code, previous, paragraph = [], False, False, False, "", ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if line.startswith("<!-- baselines "):
            block = True
        if line.startswith("<!-- /baselines -->"):
            block = False
            continue
        indented = line.startswith("    ") and not stripped.startswith(("- ", "* ", "| "))
        if indented and not code and previous == "" and not _in_list(paragraph):
            code = True
        elif stripped and not line.startswith("    "):
            code = False
        previous = stripped
        if fenced or block or code:
            continue
        paragraph = line if stripped else paragraph
        out.append((number, re.sub(r"`[^`]*`", "", line)))
    return out


def _in_list(line: str) -> bool:
    """Whether a paragraph ending at `line` belongs to a list item, where an indented line continues it."""
    return line.startswith((" ", "- ", "* ")) or re.match(r"\d+\. ", line) is not None


def unquoted_figures(page: Path) -> list[str]:
    name = str(page.relative_to(baselines.REPOSITORY))
    allowed = [phrase for (where, phrase) in ALLOWED if where == name]
    found = []
    for number, line in prose_lines(page.read_text()):
        spans = [(m.start(), m.end()) for phrase in allowed for m in re.finditer(re.escape(phrase), line)]
        for match in FIGURE.finditer(line):
            if not any(a <= match.start() and match.end() <= b for a, b in spans):
                found.append(f"{name}:{number}: {match.group(0)!r} in: {line.strip()}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(baselines.REPOSITORY)))
def test_every_figure_in_prose_is_quoted_from_the_baselines(page):
    assert unquoted_figures(page) == [], (
        "write each measured figure as <!-- q ENTRY FIELD -->TEXT<!-- /q --> (lab/baselines/quotes.py)"
    )


def test_every_allowed_figure_is_still_on_its_page():
    for where, phrase in ALLOWED:
        text = "\n".join(line for _, line in prose_lines((baselines.REPOSITORY / where).read_text()))
        assert phrase in text, (where, phrase)


def test_the_guard_sees_figures_in_prose_and_not_in_code_tables_or_quotes():
    text = (
        "It ran 1.57x faster, 753 TF/s, in 0.4 ms at 72% of the roofline, 4.8 TB/s, 5 us.\n"
        "Quoted: <!-- q x ms -->0.4 ms<!-- /q -->; code: `1.5x`; a tile 64x256; T=16; 2 GB.\n\n"
        "    python3 bench.py  # 9 ms\n\n"
        "- a list item\n\n    its paragraph: 3.2 ms\n\n"
        "```\n7 ms\n```\n<!-- baselines g full -->\n| 8 ms |\n<!-- /baselines -->\n"
    )
    lines = prose_lines(text)
    figures = [m.group(0) for _, line in lines for m in FIGURE.finditer(line)]
    assert figures == ["1.57x", "753 TF/s", "0.4 ms", "72%", "4.8 TB/s", "5 us", "3.2 ms"]
