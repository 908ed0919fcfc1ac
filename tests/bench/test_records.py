"""The result records: timings of calls, and the model benchmark's table as its JSON holds it."""

import os

import pytest
from edgedistill.bench import records
from edgedistill.bench.accuracy import AccuracyResult, ApiAccuracy, OwnAccuracy
from edgedistill.bench.records import Cell, ModelRow, ModelTable, Timing, bundle_record
from edgedistill.common.bundle import load_bundle


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


def test_a_cell_of_a_bench_json_without_the_timed_length_was_timed_at_its_length():
    recorded = {"median_ms": 2.0, "min_ms": 2.0, "max_ms": 2.0, "calls": 5, "batch": 1, "length": 16}
    assert Cell.model_validate(recorded | {"speedup": 1.0, "items_per_s": 500.0}).timed_length == 16


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


def test_a_bundle_is_recorded_by_its_folder_name_and_build(bundle):
    spec = load_bundle(bundle).spec
    assert bundle_record(bundle, spec) == {
        "path": str(bundle),
        "name": spec.name,
        "version": spec.version,
        "arch": spec.arch,
        "precision": spec.precision,
        "runtime": spec.runtime,
    }


def accuracy_result() -> AccuracyResult:
    figures = ApiAccuracy(
        correct=3,
        accuracy=0.75,
        differing=1,
        tie_flips=1,
        same_predictions=True,
        matches_own=True,
    )
    own = OwnAccuracy(correct=3, accuracy=0.75, near_ties=1, may_lose=1, may_gain=0, matches_bundle=True)
    return AccuracyResult(
        bundle={},
        texts={},
        bundle_dev_accuracy=0.75,
        bundle_dev_correct=3,
        own=own,
        tie_margin=0.1,
        apis={"classify": figures},
        agreement=1.0,
        passed=True,
    )


def test_a_saved_result_loads_back_equal(tmp_path):
    accuracy_result().save(tmp_path, "tables\n")
    assert AccuracyResult.load(tmp_path) == accuracy_result()


def test_a_result_is_saved_under_its_own_file_names(tmp_path):
    accuracy_result().save(tmp_path, "tables\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.json", "accuracy.md"]


@pytest.fixture
def quota_of_two(monkeypatch):
    """A machine of 16 CPUs of which this process may use 2 (a taskset, a container's CPU quota)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(records, "usable_cores", lambda: 2)


def test_a_measurements_machine_records_the_cores_it_could_use(quota_of_two):
    assert records.machine((0.0, 0.0, 0.0))["cores"] == 2


def test_a_measurements_machine_records_the_machines_cpus_as_well(quota_of_two):
    assert records.machine((0.0, 0.0, 0.0))["cpus"] == 16


def test_a_heading_names_the_usable_cores_and_the_machines_cpus_where_they_differ(quota_of_two):
    assert records.cores_phrase(records.machine((0.0, 0.0, 0.0))) == "2 cores of 16 CPUs"


def test_a_heading_names_the_cores_alone_where_the_run_could_use_every_cpu():
    assert records.cores_phrase({"cpus": 4, "cores": 4}) == "4 cores"
