"""Tables of figures as every stage writes them: a cell's text, a check's result, markdown lines, a console table."""

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

MOST_DECIMALS = 6  # a measured figure refined past these is written with an exponent (`measured`)
PASSED, MISSED = "pass", "MISS"  # a check's result; a miss in capitals, so that it stands out in a table


def cell(value) -> str:
    """A table cell: "-" for a figure not measured (None), counts with thousands separators, the rest as `str`."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def counted(count: int, noun: str) -> str:
    """`count` of `noun`, plural but for one: "1 thread", "2 threads"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def result(passed: bool) -> str:
    """The result cell of a check: PASSED or MISSED."""
    return PASSED if passed else MISSED


def slo(passed: bool) -> str:
    """A load test's verdict: 'SLO passed', or 'SLO MISSED' in capitals as a missed check."""
    return "SLO passed" if passed else "SLO MISSED"


def _limit_value(limit: str) -> float | None:
    """The number a verdict's limit text ends with ('<= 3', '>= 0.95', '0'); None for one without."""
    try:
        return float(limit.split()[-1])
    except ValueError:
        return None


def measured(verdict: dict, text: Callable[[object], str]) -> str:
    """A verdict's measured figure as `text` writes it, with as many more digits as it takes not to print its limit's
    number unless it is that number, nor a number on its other side: a p99 of 3.00004 ms is not 3 against <= 3, nor
    100.4 ms 100 against <= 100.2, nor 1 failed call in 12,000 an error rate of 0.00 against <= 0. A figure written
    with an exponent gets more significant digits (an error rate of
    1.00001e-05 against <= 1e-05), one written without more decimals, up to `MOST_DECIMALS`, then significant digits
    (1e-300 against <= 0)."""
    value, limit = verdict["measured"], _limit_value(verdict["limit"])
    written = text(value)
    if not isinstance(value, float) or limit is None or value == limit:
        return written
    style = "g" if "e" in written else "f"
    digits = 0 if style == "g" else len(written.partition(".")[2])
    while float(written) == limit or (float(written) < limit) != (value < limit):
        if style == "f" and digits >= MOST_DECIMALS:  # a figure this close to its limit, in significant digits
            style, digits = "g", 2
        digits += 1
        written = f"{value:.{digits}{style}}"
    return written


def verdict_rows(verdicts: list[dict], text: Callable[[object], str]) -> list[list[str]]:
    """Rows of [name, measured, wanted, result] for verdicts {name, measured, limit, passed} (`bench.slo.verdict`),
    each measured figure written by `text` as `measured` refines it."""
    return [[v["name"], measured(v, text), v["limit"], result(v["passed"])] for v in verdicts]


_TAG_OPENING = re.compile(r"<(?=[A-Za-z/!?])")  # where markdown would read raw HTML (a label `<neg>`), not `<= 3`


def _markdown_row(cells: list[str]) -> str:
    """A markdown table's line of `cells`, each kept whole inside its cell and read as text: a `|` and a `<` that
    would open an HTML tag escaped, line breaks as spaces."""
    escaped = (_TAG_OPENING.sub(r"\\<", c.replace("|", "\\|")) for c in cells)
    return "| " + " | ".join(" ".join(c.splitlines()) for c in escaped) + " |"


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table: `header`, its rule, then one line per row of cells (text, with `|` and a tag's
    `<` escaped and line breaks as spaces, so that a cell holds its text whole, `_markdown_row`)."""
    return [_markdown_row(header), "|" + "---|" * len(header), *(_markdown_row(row) for row in rows)]


def console_table(title: str, header: list[str], rows: list[list[str]], words: Collection[str] = ()) -> "Table":
    """A rich `Table` of `rows` (cells' text, as given) under `header`, titled on the left: the first column and those
    named in `words` left-aligned, the figures in the rest right-aligned."""
    # Imported here: rich comes with the stages that print tables, not with what common needs (the server has none).
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for index, column in enumerate(header):
        table.add_column(column, justify="left" if index == 0 or column in words else "right")
    for row in rows:
        table.add_row(*row)
    return table
