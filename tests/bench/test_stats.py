"""Call statistics, spreads over repeats, and the model benchmark's table as its JSON holds it."""

import numpy as np
import pytest
from edgedistill.bench.stats import Cell, ModelRow, ModelTable, Spread, Timing, call_stats, percentiles, summarize


def test_call_stats_count_failures_but_time_only_successes():
    stats = call_stats(np.arange(1, 191) / 100, failures=10, seconds=2.0, offered_rate=125)
    assert (stats["requests"], stats["failures"], stats["error_rate"]) == (200, 10, 0.05)
    assert (stats["requests_per_s"], stats["rate_share"]) == (100, 0.76)  # 190 successful calls in 2 s of 125/s
    assert stats["max_ms"] == 1.9
    assert stats["mean_ms"] == pytest.approx(0.955)


def test_refused_calls_achieve_none_of_the_offered_rate():
    stats = call_stats(np.array([]), failures=100, seconds=1.0, offered_rate=100)
    assert stats["rate_share"] == 0


def test_call_stats_without_an_offered_rate_have_no_rate_share():
    stats = call_stats(np.ones(5), failures=0, seconds=1.0)
    assert stats["offered_rate"] is None
    assert stats["rate_share"] is None


def test_percentiles_of_no_calls_are_none():
    assert percentiles(np.array([])) == {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}


def test_summarize_spreads_every_number_over_repeats():
    repeats = [
        {"p99_ms": 2.0, "requests": 10, "offered_rate": None, "error_codes": {}},
        {"p99_ms": 1.0, "requests": 30, "offered_rate": None, "error_codes": {"UNAVAILABLE": 1}},
        {"p99_ms": 3.0, "requests": 20, "offered_rate": None, "error_codes": {}},
    ]
    assert summarize(repeats) == {
        "p99_ms": Spread(median=2.0, min=1.0, max=3.0),
        "requests": Spread(median=20, min=10, max=30),
    }


def test_timing_of_calls_is_their_median_min_max_and_count():
    assert Timing.of([3.0, 1.0, 2.0, 10.0]) == Timing(median_ms=2.5, min_ms=1.0, max_ms=10.0, calls=4)


def test_model_table_round_trip_and_lookup(tmp_path):
    cells = [
        Cell(median_ms=m, min_ms=m, max_ms=m, calls=5, batch=b, length=16, speedup=1.0, items_per_s=b * 1e3 / m)
        for b, m in ((1, 2.0), (4, 5.0))
    ]
    row = ModelRow(model="m", precision="fp32", runtime="onnxruntime", size_bytes=10, dev_accuracy=0.9, cells=cells)
    table = ModelTable(threads=1, rows=[row])
    (tmp_path / "bench.json").write_text(table.model_dump_json())
    loaded = ModelTable.load(tmp_path)
    assert loaded == table
    assert loaded.shapes == [(1, 16), (4, 16)]
    assert loaded.rows[0].cell(4, 16).median_ms == 5.0
    assert loaded.rows[0].cell(4, 32) is None
    assert [c.label for c in loaded.rows[0].cells] == ["b1_s16", "b4_s16"]


def f1_table(dev_selected: float | None) -> ModelTable:
    """A one-row table of a recipe that selects on F1."""
    cells = [Cell(median_ms=2.0, min_ms=2.0, max_ms=2.0, calls=5, batch=1, length=16, speedup=1.0, items_per_s=500.0)]
    row = ModelRow(
        model="m",
        precision="fp32",
        runtime="ort",
        size_bytes=10,
        dev_accuracy=0.8,
        dev_selected=dev_selected,
        cells=cells,
    )
    return ModelTable(threads=1, metric="f1", rows=[row])


def test_model_table_of_an_f1_recipe_has_a_dev_f1_column_beside_accuracy():
    assert f1_table(0.85).dev_columns() == ["dev acc", "dev F1"]


def test_model_table_of_an_f1_recipe_shows_each_rows_f1():
    table = f1_table(0.85)
    assert table.dev_figures(table.rows[0]) == ["0.8000", "0.8500"]


def test_model_table_shows_a_dash_for_a_row_without_the_selection_metric():
    table = f1_table(None)
    assert table.dev_figures(table.rows[0]) == ["0.8000", "-"]


def test_model_table_of_an_accuracy_recipe_shows_accuracy_alone():
    cells = [Cell(median_ms=2.0, min_ms=2.0, max_ms=2.0, calls=5, batch=1, length=16, speedup=1.0, items_per_s=500.0)]
    row = ModelRow(model="m", precision="fp32", runtime="ort", size_bytes=10, dev_accuracy=0.8, cells=cells)
    assert ModelTable(threads=1, rows=[row]).dev_columns() == ["dev acc"]
