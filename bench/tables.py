"""Output shared by the benchmarks: a results table, then a table of checks marked pass/MISS (console or markdown)."""

from edgedistill.common import tables
from edgedistill.common.console import Console
from rich.table import Table


def print_results(
    console: Console, title: str, header: list[str], rows: list[list[str]], checks: tuple[str, str, list[list[str]]]
) -> None:
    """`rows` under `header` (first column left-aligned, the rest right), then `checks`: its title, the name
    of its first column, and rows of [name, measured, wanted, result]."""
    table = tables.console_table(title, header, rows)
    checks_title, first, check_rows = checks
    verdicts = Table(title=checks_title, title_justify="left")
    for column in (first, "measured", "wanted", "result"):
        verdicts.add_column(column)
    for name, measured, wanted, result in check_rows:
        verdicts.add_row(
            name, measured, wanted, f"[green]{result}[/]" if result == tables.PASSED else f"[red]{result}[/]"
        )
    console.print(table)
    console.print(verdicts)


def markdown_results(header: list[str], rows: list[list[str]], checks: tuple[str, list[list[str]]]) -> list[str]:
    """The same two tables as markdown lines: `rows` under `header`, then `checks` (the name of its first
    column and rows of [name, measured, wanted, result])."""
    first, check_rows = checks
    return [*tables.markdown(header, rows), "", *tables.markdown([first, "measured", "wanted", "result"], check_rows)]


def spread_cell(spread, digits: int) -> str:
    """A `Spread` as 'median (min-max)', or only the median when the repeats agree; '-' for None. A median of whole
    counts over an even number of repeats (0.5 failed calls) keeps its half, which no digits would round away."""
    if spread is None:
        return "-"
    counts = all(float(value).is_integer() for value in (spread.min, spread.max))
    median_digits = 1 if counts and not digits and not float(spread.median).is_integer() else digits
    median, low, high = (
        f"{v:.{d}f}" for v, d in ((spread.median, median_digits), (spread.min, digits), (spread.max, digits))
    )
    return median if low == high else f"{median} ({low}-{high})"


def target_rows(targets: list[dict]) -> list[list[str]]:
    """Rows of [name, measured, wanted, pass/MISS] for verdicts of `bench.slo.verdict`, each measured figure to three
    significant digits or as many more as `common.tables.measured` needs."""
    return tables.verdict_rows(targets, lambda measured: f"{measured:.3g}")


H2LOAD_COLUMNS = {
    "requests_per_s": "calls/s",
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
    "max_ms": "max ms",
    "failures": "failed",
    "rate_share": "of due",
    "client_cpu": "h2load CPU %",
    "server_cpu": "server CPU %",
}


H2LOAD_LEGEND = [  # the lines under an h2load benchmark's tables; each benchmark ends the last with its processes
    "calls/s: calls answered with a complete reply, per second; of due: those of a paced phase over the calls due",
    "at its rate (a call a server never answers holds its stream, and the calls due behind it are never sent).",
    "Latencies are timed from each call's send, not from when it was due. CPU %: 100 = one core; the server's",
]
COUNTS = ("requests_per_s", "failures", "client_cpu", "server_cpu")  # the columns written without decimals


def h2load_rows(summary: dict, rate: float) -> list[list[str]]:
    """One row per '<server> <phase>' of an h2load benchmark's summary: the server, the phase (saturated, or paced
    at `rate`) and each of H2LOAD_COLUMNS ('-' where the phase has none: a saturated one has no calls due)."""
    rows = []
    for key, figures in summary.items():
        server, phase = key.split(" ")
        label = "saturated" if phase == "capacity" else f"paced {rate:g}/s"
        cells = [spread_cell(figures.get(f), 0 if f in COUNTS else 2) for f in H2LOAD_COLUMNS]
        rows.append([server, label, *cells])
    return rows


def h2load_failures_line(runs: dict[str, list[dict]], rate: float) -> str | None:
    """For the runs of an h2load benchmark ('<server> <phase>' -> its repeats' records) that had calls without a
    complete reply: how many, over the repeats, and what that does to the figures; None when every call had one."""
    failed = {key: sum(r["failures"] for r in records) for key, records in runs.items()}
    if not any(failed.values()):
        return None
    parts = []
    for key, count in failed.items():
        if count:
            server, phase = key.split(" ")
            label = "saturated" if phase == "capacity" else f"paced {rate:g}/s"
            parts.append(f"{server} {label} {count} of {sum(r['requests'] for r in runs[key])}")
    return (
        f"Failed calls over the repeats: {', '.join(parts)}. Their calls/s counts complete replies only; their latency"
        " percentiles include the failed calls, which h2load times like any other, so they are not those of served calls."
    )


def record_line(record: dict) -> str:
    """The figures of one measured phase, in a line (texts/s and server CPU where the record has them)."""
    texts = f", {record['texts_per_s']:.0f} texts/s" if "texts_per_s" in record else ""
    server = f", server CPU {record['server_cpu']:.0f} %" if "server_cpu" in record else ""
    return (
        f"{record['requests_per_s']:.0f} calls/s{texts}, p99 {record['p99_ms']:.2f} ms, {record['failures']} failed, "
        f"client CPU {record['client_cpu']:.0f} %{server}"
    )


def threads_phrase(bundle: dict, threads: int, per: str = "") -> str:
    """The intra-op threads of a measured `bundle` (its `bundle_record`) run with `threads` (0: ONNX Runtime's default;
    `per` worker, say): none for a TensorRT engine, which runs without ONNX Runtime."""
    if bundle["runtime"] == "tensorrt":
        return "no intra-op threads (a TensorRT engine)"
    return (
        "ONNX Runtime's default intra-op threads" if threads == 0 else tables.counted(threads, "intra-op thread")
    ) + per
