import pytest
from edgedistill.common import tables


def test_a_figure_not_measured_is_a_dash():
    assert tables.cell(None) == "-"


def test_a_count_has_thousands_separators():
    assert tables.cell(1234567) == "1,234,567"


def test_a_boolean_is_written_as_a_word_not_a_count():
    assert tables.cell(True) == "True"


def test_a_float_is_written_as_given():
    assert tables.cell(0.9123) == "0.9123"


def test_a_passed_check_reads_pass():
    assert tables.result(True) == "pass"


def test_a_missed_check_reads_miss_in_capitals():
    assert tables.result(False) == "MISS"


def test_verdict_rows_write_the_measured_figure_with_the_given_format():
    verdicts = [{"name": "p99_ms", "measured": 4.1234, "limit": "<= 3", "passed": False}]
    assert tables.verdict_rows(verdicts, lambda measured: f"{measured:.3g}") == [["p99_ms", "4.12", "<= 3", "MISS"]]


def test_a_markdown_table_has_a_header_its_rule_and_a_line_per_row():
    assert tables.markdown(["a", "b"], [["1", "2"], ["3", "4"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 | 4 |"]


def test_a_load_test_within_its_slo_reads_slo_passed():
    assert tables.slo(True) == "SLO passed"


def test_a_load_test_outside_its_slo_reads_slo_missed_in_capitals():
    assert tables.slo(False) == "SLO MISSED"


def test_a_console_tables_first_column_and_the_named_word_columns_are_left_aligned():
    table = tables.console_table("t", ["model", "ms", "arch", "MiB"], [["a", "1.0", "cnn", "2.0"]], ("arch",))
    assert [column.justify for column in table.columns] == ["left", "right", "left", "right"]


def test_a_console_table_holds_its_rows():
    table = tables.console_table("t", ["model", "ms"], [["a", "1.0"], ["b", "2.0"]])
    assert list(table.columns[1].cells) == ["1.0", "2.0"]


def test_a_markdown_cell_escapes_a_bar_that_would_end_it():
    assert tables.markdown(["a", "b"], [["x|y", "1"]])[2] == "| x\\|y | 1 |"


def test_a_markdown_cell_writes_a_line_break_as_a_space():
    assert tables.markdown(["a", "b"], [["x\ny", "1"]])[2] == "| x y | 1 |"


@pytest.mark.parametrize(
    ("measured", "limit", "written", "expected"),
    [
        pytest.param(
            3.00004,
            "<= 3",
            ".3g",
            "3.00004",
            id="a measured figure just over its limit shows the decimals that miss it",
        ),
        pytest.param(3.0, "<= 3", ".3g", "3", id="a measured figure at its limit keeps its format"),
        pytest.param(
            999.6,
            ">= 1000",
            ".3g",
            "999.6",
            id="a measured figure written with an exponent at its limit shows its decimals",
        ),
        pytest.param(
            1 / 99999,
            "<= 1e-05",
            ".3g",
            "1.00001e-05",
            id="a measured figure written with an exponent at its limits text shows more significant digits",
        ),
        pytest.param(
            0.0012, "<= 0.001", ".2f", "0.0012", id="a measured figure over its limit is not written under it"
        ),
        pytest.param(
            100.4,
            "<= 100.2",
            ".0f",
            "100.4",
            id="a whole millisecond figure over its limit shows the decimal that misses it",
        ),
        pytest.param(
            1e-300, "<= 0", ".2f", "1e-300", id="a measured figure far below its decimals is written with an exponent"
        ),
    ],
)
def test_a_measured_figure_gets_the_digits_that_put_it_on_its_side_of_its_limit(measured, limit, written, expected):
    verdict = {"name": "figure", "measured": measured, "limit": limit, "passed": False}
    assert tables.measured(verdict, lambda figure: f"{figure:{written}}") == expected


def test_one_of_a_noun_is_counted_in_the_singular():
    assert tables.counted(1, "thread") == "1 thread"


def test_more_of_a_noun_are_counted_in_the_plural():
    assert tables.counted(2, "thread") == "2 threads"


def test_a_markdown_cell_that_would_open_an_html_tag_is_escaped():
    assert tables.markdown(["label"], [["<neg>"]])[2] == "| \\<neg> |"


def test_a_markdown_cell_with_a_comparison_is_left_as_it_is():
    assert tables.markdown(["wanted"], [["<= 0.001"]])[2] == "| <= 0.001 |"
