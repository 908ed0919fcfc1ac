"""The tables of a run's result: a missed check never shows its limit's number as the measured figure."""

from edgedistill.loadtests import result


def measured_cell(value: float, limit: str, passed: bool) -> str:
    """The measured cell of one check as summary.md and the console write it."""
    check = {"name": "check", "measured": value, "limit": limit, "passed": passed}
    return result.verdict_rows({"checks": [check]})[0][1]


def test_one_failed_call_in_12000_does_not_show_an_error_rate_of_zero():
    assert measured_cell(1 / 12_000, "<= 0", passed=False) == "0.0001"


def test_a_p99_just_over_its_limit_shows_the_decimals_that_miss_it():
    assert measured_cell(3.004, "<= 3", passed=False) == "3.004"


def test_a_rate_share_just_under_its_limit_shows_the_decimals_that_miss_it():
    assert measured_cell(0.9496, ">= 0.95", passed=False) == "0.9496"


def test_a_figure_away_from_its_limit_keeps_two_decimals():
    assert measured_cell(2.5, "<= 3", passed=True) == "2.50"


def test_the_heading_names_the_cores_the_run_could_use():
    run = {"profile": "steady", "duration_s": 5.0, "scenarios": {"single": 1}, "machine": {"cpus": 16, "cores": 2}}
    bundle = {"name": "smoke-bilstm-int8", "arch": "bilstm", "precision": "int8", "runtime": "onnxruntime"}
    assert "2 cores of 16 CPUs" in result.heading(run | {"bundle": bundle})


def test_the_tables_give_the_calls_due_but_unsent():
    overall = {"unsent_calls": 3}
    header = list(result.COLUMNS.values())
    assert result.rows({"stages": [overall], "overall": overall})[-1][1 + header.index("unsent")] == "3"
