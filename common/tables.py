"""Tables of figures as every stage writes them: a cell's text, a check's result, markdown lines."""

PASSED, MISSED = "pass", "MISS"  # a check's result; a miss in capitals, so that it stands out in a table


def cell(value) -> str:
    """A table cell: "-" for a figure not measured (None), counts with thousands separators, the rest as `str`."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def result(passed: bool) -> str:
    """The result cell of a check: PASSED or MISSED."""
    return PASSED if passed else MISSED


def slo(passed: bool) -> str:
    """A load test's verdict: 'SLO passed', or 'SLO MISSED' in capitals as a missed check."""
    return "SLO passed" if passed else "SLO MISSED"


def verdict_rows(verdicts: list[dict], measured) -> list[list[str]]:
    """Rows of [name, measured, wanted, result] for verdicts {name, measured, limit, passed} (`bench.slo.verdict`),
    each measured figure written by `measured`."""
    return [[v["name"], measured(v["measured"]), v["limit"], result(v["passed"])] for v in verdicts]


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table: `header`, its rule, then one line per row of cells (text, as given)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
