"""Report sections drawn from one artifact, without a run: fast checks of what they show."""

import json
import time

import pytest
from edgedistill.common import manifest as mf
from edgedistill.common import runtime, summary
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import Built, Stage
from edgedistill.loadtests import result as loadtest_result
from edgedistill.loadtests.recorder import SAMPLES_FILE, Recorder
from edgedistill.report import plan, plots, render

from tests.conftest import ROOT

ROWS = [
    {"student": "teacher", "arch": "teacher", "dev_accuracy": 0.9, "dev_macro_f1": 0.8, "retention": 1.0},
    {"student": "cnn", "arch": "cnn", "dev_accuracy": 0.85, "dev_macro_f1": 0.6, "retention": 0.75},
]


def publish(folder, metrics=None, info=None, files=None, parents=None, hashed=None):
    with mf.stage_folder(folder) as tmp:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        base = mf.Manifest(stage=folder.name, recipe="r", recipe_hash="h", config_hash="h", metrics=metrics or {})
        update = {"info": info or {}, "parents": parents or {}, "hashed": hashed or {}}
        mf.commit(tmp, folder, base.model_copy(update=update))


def distillation_section(tmp_path, overrides: dict | None = None) -> list[str]:
    """The markdown lines of the distillation section the report writes of the run in `tmp_path`, a run of the smoke
    recipe (with `overrides`)."""
    page = render.Page("report")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)
    render._distillation(page, tmp_path, recipe, plan.stale(recipe, tmp_path))
    return page.md


def distillation_markdown(tmp_path, rows=ROWS) -> str:
    """The distillation section of a run of the smoke recipe selected on macro-F1, with the cnn's baseline, from the
    table's `rows`."""
    (tmp_path / "distill-summary.json").write_text(json.dumps(rows))
    for folder in ("teacher", "student-cnn", "baseline-cnn"):
        publish(tmp_path / folder)
    return "\n".join(distillation_section(tmp_path, {"data.metric": "macro_f1"}))


def test_distillation_section_shows_the_tables_own_columns(tmp_path):
    assert "| student | arch | dev_accuracy | dev_macro_f1 | retention |" in distillation_markdown(tmp_path)


def test_distillation_section_shows_each_row(tmp_path):
    assert "| cnn | cnn | 0.85 | 0.6 | 0.75 |" in distillation_markdown(tmp_path)


def test_distillation_section_names_a_model_that_predicts_one_label(tmp_path):
    (tmp_path / "distill-summary.json").write_text(json.dumps(ROWS))
    publish(tmp_path / "teacher")
    publish(tmp_path / "student-cnn", {"dev_confusion": [[5, 0], [4, 0]]})
    publish(tmp_path / "baseline-cnn")
    markdown = "\n".join(distillation_section(tmp_path, {"data.metric": "macro_f1"}))
    assert "one label: student-cnn predicts one label for every dev example" in markdown


def test_distillation_section_says_what_an_out_of_date_row_leaves_out(tmp_path):
    rows = [ROWS[0] | {"out_of_date": None}, ROWS[1] | {"out_of_date": "baseline"}]
    assert "out_of_date: a student or baseline built from other settings" in distillation_markdown(tmp_path, rows)


def teacher_built_again_markdown(tmp_path, rows=ROWS, written_after: bool = False) -> str:
    """The distillation section of a run whose teacher was built again after the cnn student and baseline distilled
    from it; the table (`rows`) was written before, or with `written_after` after, that."""
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    parents = {"teacher": mf.parent_of(tmp_path / "teacher")}
    for folder in ("student-cnn", "baseline-cnn"):
        publish(tmp_path / folder, parents=parents)
    summary = tmp_path / "distill-summary.json"
    if not written_after:
        summary.write_text(json.dumps(rows))
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.95})
    if written_after:
        summary.write_text(json.dumps(rows))
    return "\n".join(distillation_section(tmp_path))


def test_distillation_section_leaves_out_the_table_of_a_teacher_built_again_since(tmp_path):
    assert "| teacher | teacher | 0.9 |" not in teacher_built_again_markdown(tmp_path)


def test_distillation_section_says_why_it_leaves_out_the_table_and_what_writes_it_again(tmp_path):
    assert (
        "(student-cnn: its parent teacher was built again). edgedistill distill RECIPE.yaml --jobs 2 builds the "
        "students "
        "out of date again"
    ) in teacher_built_again_markdown(tmp_path)


def test_distillation_section_shows_a_table_written_since_that_marks_its_students_out_of_date(tmp_path):
    rows = [ROWS[0] | {"dev_accuracy": 0.95, "out_of_date": None}, ROWS[1] | {"out_of_date": "student, baseline"}]
    assert "| teacher | teacher | 0.95 |" in teacher_built_again_markdown(tmp_path, rows, written_after=True)


def redistilled_markdown(tmp_path) -> str:
    """The distillation section of a run whose cnn student was distilled again from the same teacher after the
    table was written, and the table not written again (make distill stopped on another student)."""
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    parents = {"teacher": mf.parent_of(tmp_path / "teacher")}
    for folder in ("student-cnn", "baseline-cnn"):
        publish(tmp_path / folder, metrics={"dev_accuracy": 0.85}, parents=parents)
    summary.write(tmp_path, ROWS)
    publish(tmp_path / "student-cnn", metrics={"dev_accuracy": 0.87}, parents=parents)
    return "\n".join(distillation_section(tmp_path))


def test_distillation_section_leaves_out_the_table_of_a_student_distilled_again_since(tmp_path):
    assert "| cnn | cnn | 0.85 |" not in redistilled_markdown(tmp_path)


def test_distillation_section_names_the_student_distilled_again_since_the_table(tmp_path):
    assert "(student-cnn was built again)" in redistilled_markdown(tmp_path)


def test_distillation_section_shows_the_table_of_the_artifacts_it_was_drawn_from(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    summary.write(tmp_path, ROWS)
    assert "| student | arch | dev_accuracy | dev_macro_f1 | retention |" in distillation_section(tmp_path)


def test_a_table_writes_counts_with_thousands_separators():
    page = render.Page("report")
    page.table(["student", "params"], [["cnn", 1234567]])
    assert "| cnn | 1,234,567 |" in page.md


def test_distillation_section_says_which_metric_retention_compares(tmp_path):
    assert "baseline and gain compare dev_macro_f1" in distillation_markdown(tmp_path)


def test_distillation_section_links_the_baselines_manifest(tmp_path):
    assert "[../baseline-cnn/manifest.json]" in distillation_markdown(tmp_path)


def publish_cascade(tmp_path, parents: dict | None = None, name: str = "c", settings: dict | None = None) -> None:
    """A cascade artifact `bundle-<name>` of two members, small and big, built from the `parents` given, recording the
    recipe `settings` it was built with where given."""
    members = [
        {"bundle": "small", "manifest_sha256": "a", "threshold": 0.9, "temperature": 1.5},
        {"bundle": "big", "manifest_sha256": "b", "threshold": None, "temperature": 1.0},
    ]
    info = {
        "cascade": {"name": "c", "labels": ["a", "b"], "text_inputs": ["text"], "rule": "max_prob", "members": members},
        "dev_answered_share": {"small": 0.8, "big": 0.2},
        "member_dev_accuracy": {"small": 0.85, "big": 0.9},
        "curve": [
            {"threshold": 0.5, "dev_accuracy": 0.85, "escalated": 0.0},
            {"threshold": 1.0, "dev_accuracy": 0.9, "escalated": 1.0},
        ],
    }
    metrics = {"dev_accuracy": 0.895, "dev_escalated": 0.2, "expected_escalated": 0.21, "calibration_agreement": 0.99}
    publish(tmp_path / f"bundle-{name}", metrics, info, parents=parents, hashed={"settings": settings or {}})


def cascade_page(tmp_path) -> render.Page:
    """The cascade section for a published cascade artifact of two members."""
    publish_cascade(tmp_path)
    page = render.Page("report")
    render._cascade_section(page, tmp_path, plan.stale(load_recipe(ROOT / "recipes" / "smoke.yaml"), tmp_path))
    return page


@pytest.mark.parametrize(
    "passed, title",
    [(True, "bundle-bilstm-int8"), (False, "bundle-bilstm-int8 (DIFFERENT from the bundle's own predictions)")],
)
def test_the_served_accuracy_section_says_in_its_title_whether_the_server_predicted_as_the_bundle(
    tmp_path, passed, title
):
    publish(tmp_path / "bundle-bilstm-int8")
    parents = {"bundle": mf.parent_of(tmp_path / "bundle-bilstm-int8")}
    publish(
        tmp_path / "serve-accuracy-bilstm-int8",
        {"passed": passed},
        files={"accuracy.md": "# checked\n"},
        parents=parents,
    )
    page = render.Page("report")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    render._serving(page, tmp_path, recipe, plan.stale(recipe, tmp_path))
    assert f"## Served accuracy of the deployed bundle, {title}" in page.md


def test_cascade_section_lists_each_members_threshold(tmp_path):
    assert "| small | 0.9000 | 1.50 | 80.0% | 0.8500 |" in "\n".join(cascade_page(tmp_path).md)


def test_cascade_section_draws_its_curve(tmp_path):
    assert "bundle-c.png" in cascade_page(tmp_path).figures


def stages_markdown(tmp_path, overrides: dict | None = None) -> str:
    """The stage table the report writes of the run in `tmp_path`, a run of the smoke recipe (with `overrides`)."""
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)
    render._stages(page, tmp_path, recipe, plan.stale(recipe, tmp_path))
    return "\n".join(page.md)


def test_the_stage_table_shows_the_recipes_selection_metric_beside_accuracy(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9, "dev_macro_f1": 0.8})
    assert "| teacher | 0.9000 | 0.8000 |" in stages_markdown(tmp_path, {"data.metric": "macro_f1"})


def test_the_stage_table_gives_test_figures_where_a_manifest_carries_them(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9, "test_accuracy": 0.95})
    assert "| teacher | 0.9000 | - | 0.9500 | - |" in stages_markdown(tmp_path)


def test_the_stage_table_names_its_test_columns(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9, "test_accuracy": 0.95})
    assert "| stage | dev accuracy | dev f1 | test accuracy | test f1 |" in stages_markdown(tmp_path)


def test_the_stage_table_of_a_run_without_test_figures_has_no_test_columns(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    assert "test accuracy" not in stages_markdown(tmp_path)


def older_student_stages(tmp_path) -> str:
    """The stage table of a smoke run whose bundle bilstm-int8 (dev accuracy 0.8125) was exported from student-bilstm
    before it was distilled again."""
    publish(tmp_path / "student-bilstm", metrics={"dev_accuracy": 0.8})
    parents = {"student-bilstm": mf.parent_of(tmp_path / "student-bilstm")}
    publish(tmp_path / "bundle-bilstm-int8", metrics={"dev_accuracy": 0.8125}, parents=parents)
    publish(tmp_path / "student-bilstm", metrics={"dev_accuracy": 0.85})  # distilled again
    return stages_markdown(tmp_path)


def test_the_stage_table_leaves_out_the_dev_figures_of_a_bundle_built_from_a_student_distilled_again_since(tmp_path):
    assert "| bundle-bilstm-int8 | - |" in older_student_stages(tmp_path)


def test_the_stage_table_says_why_it_leaves_out_the_dev_figures_of_a_bundle_built_from_an_older_student(tmp_path):
    assert "Dev and test figures not shown of bundle-bilstm-int8:" in older_student_stages(tmp_path)


def test_the_stage_table_shows_the_dev_figures_of_the_student_distilled_again(tmp_path):
    assert "| student-bilstm | 0.8500 |" in older_student_stages(tmp_path)


def missing_markdown(tmp_path) -> str:
    """The report section on absent stages, for a run that has only its teacher."""
    with mf.stage_folder(tmp_path / "teacher") as tmp:
        base = mf.Manifest(stage="teacher", recipe="smoke", recipe_hash="h", config_hash="h")
        mf.commit(tmp, tmp_path / "teacher", base)
    page = render.Page("report")
    render._missing(page, tmp_path, load_recipe(ROOT / "recipes" / "smoke.yaml"))
    return "\n".join(page.md)


def test_a_report_of_the_teacher_alone_names_the_absent_students(tmp_path):
    assert (
        "| student-bilstm | edgedistill distill RECIPE.yaml --jobs 2 | make distill RECIPE=RECIPE.yaml |"
        in missing_markdown(tmp_path)
    )


def test_a_report_says_its_commands_take_the_overrides_it_was_given_after_the_recipe_and_make_none(tmp_path):
    assert (
        "RECIPE.yaml stands for the run's recipe file, followed by the overrides `edgedistill report` was given "
        "(`--section.key=value`), if any, in each command that reads their section"
    ) in missing_markdown(tmp_path)


def test_a_report_given_recipe_overrides_names_no_make_command_which_would_drop_them(tmp_path):
    with mf.stage_folder(tmp_path / "teacher") as tmp:
        mf.commit(
            tmp, tmp_path / "teacher", mf.Manifest(stage="teacher", recipe="smoke", recipe_hash="h", config_hash="h")
        )
    page = render.Page("report")
    render._missing(
        page, tmp_path, load_recipe(ROOT / "recipes" / "smoke.yaml"), ["--distill.students.bilstm.optim.lr=1e-3"]
    )
    assert (
        "| student-bilstm | edgedistill distill RECIPE.yaml --jobs 2 | none: make takes no recipe overrides |"
        in "\n".join(page.md)
    )


def test_a_report_of_the_teacher_alone_names_the_deployed_bundles_absent_load_test(tmp_path):
    assert (
        "| loadtest-smoke-bilstm-int8 | edgedistill loadtest RECIPE.yaml --profile smoke "
        "| make loadtest PROFILE=smoke RECIPE=RECIPE.yaml |"
    ) in missing_markdown(tmp_path)


def test_a_report_of_the_teacher_alone_names_the_deployed_bundles_absent_serving_benchmark(tmp_path):
    assert (
        "| serve-bench-bilstm-int8 | edgedistill bench serving RECIPE.yaml | make serve-bench RECIPE=RECIPE.yaml |"
        in missing_markdown(tmp_path)
    )


def test_a_report_of_the_teacher_alone_names_the_deployed_bundles_absent_served_accuracy(tmp_path):
    assert (
        "| serve-accuracy-bilstm-int8 | edgedistill bench accuracy RECIPE.yaml --check "
        "| make serve-accuracy RECIPE=RECIPE.yaml |"
    ) in missing_markdown(tmp_path)


def test_a_report_says_why_this_machine_cannot_build_an_absent_gpu_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "missing_here", lambda name, providers: "no GPU" if name == "tensorrt" else None)
    assert "| bundle-bilstm-engine | no GPU |" in missing_markdown(tmp_path)


def test_a_report_names_no_absent_stage_as_unbuildable_where_this_machine_can_build_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "missing_here", lambda name, providers: None)
    assert "why not here" not in missing_markdown(tmp_path)


def test_a_report_of_a_run_deploying_a_cascade_asks_for_no_serving_benchmark_of_it(tmp_path):
    page = render.Page("report")
    render._missing(page, tmp_path, load_recipe(ROOT / "recipes" / "smoke.yaml", {"export.deploy": "bilstm-cascade"}))
    assert "serve-bench-bilstm-cascade" not in "\n".join(page.md)


def test_a_report_leaves_the_finished_teacher_out_of_the_absent_stages(tmp_path):
    assert "| teacher |" not in missing_markdown(tmp_path)


def absent_cascade_markdown(tmp_path, measured_cascade: str) -> str:
    """The report section on absent stages, for a smoke run with a second cascade, `cnn-cascade`, where only
    `measured_cascade` was served (`make all CASCADE=...`)."""
    recipe = load_recipe(
        ROOT / "recipes" / "smoke.yaml",
        {"export.cascades.cnn-cascade": {"members": ["cnn-int8", "teacher-fused"]}},
    )
    with mf.stage_folder(tmp_path / f"serve-cascade-{measured_cascade}") as tmp:
        base = mf.Manifest(stage="serve-cascade", recipe="smoke", recipe_hash="h", config_hash="h")
        mf.commit(tmp, tmp_path / f"serve-cascade-{measured_cascade}", base)
    page = render.Page("report")
    render._missing(page, tmp_path, recipe)
    return "\n".join(page.md)


def test_a_report_of_a_run_that_served_another_cascade_does_not_ask_for_the_default_one(tmp_path):
    assert "serve-cascade-bilstm-cascade" not in absent_cascade_markdown(tmp_path, "cnn-cascade")


def test_a_report_of_the_teacher_alone_names_the_default_cascades_absent_serving(tmp_path):
    assert (
        "| serve-cascade-bilstm-cascade | edgedistill bench cascade RECIPE.yaml "
        "| make serve-cascade RECIPE=RECIPE.yaml |" in missing_markdown(tmp_path)
    )


def bench_row(model: str, median_ms: float, timed_length: int = 64) -> dict:
    """A row of the model benchmark's bench.json with one cell, at batch 1 and 64 tokens, timed at `timed_length`
    (a bundle's max_length, where shorter: no speedup)."""
    cell = {"median_ms": median_ms, "min_ms": median_ms, "max_ms": median_ms, "calls": 5, "batch": 1, "length": 64}
    row = {"model": model, "precision": "fp32", "runtime": "torch", "size_bytes": 2**20}
    speedup = 2.0 / median_ms if timed_length == 64 else None
    cell |= {"timed_length": timed_length, "speedup": speedup, "items_per_s": 1e3 / median_ms}
    return row | {"dev_accuracy": 0.9, "dev_selected": 0.875, "cells": [cell]}


def publish_bench(
    tmp_path, bundle_hash: str | None = None, timed_length: int = 64, bundle_parents: dict | None = None, **table
) -> None:
    """A model benchmark of the run's teacher and its bundle bilstm-int8 (both published first, the bundle timed at
    `timed_length`, built from `bundle_parents`), whose bundle cnn-int8 was not built when it ran; it records
    bilstm-int8's manifest hash as `bundle_hash` where given (an earlier build), else as it is. `table` adds fields
    to its bench.json (`metric`)."""
    publish(tmp_path / "teacher")
    publish(tmp_path / "bundle-bilstm-int8", parents=bundle_parents)
    bundle = mf.parent_of(tmp_path / "bundle-bilstm-int8")
    parents = {
        "teacher": mf.parent_of(tmp_path / "teacher"),
        "bundle-bilstm-int8": bundle.model_copy(update={"manifest_sha256": bundle_hash or bundle.manifest_sha256}),
    }
    rows = [bench_row("teacher-pytorch-eager", 2.0), bench_row("bilstm-int8", 0.25, timed_length)]
    bench = {"threads": 1, "rows": rows} | table
    info = {"left_out": {}, "missing_bundles": ["cnn-int8"]}
    publish(tmp_path / "bench", info=info, files={"bench.json": json.dumps(bench)}, parents=parents)


def benchmark_markdown(tmp_path, bundle_hash: str | None = None, timed_length: int = 64, **table) -> str:
    """The benchmark section and the note on measurements of an earlier build of the run of `publish_bench`."""
    publish_bench(tmp_path, bundle_hash, timed_length, **table)
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    stale = plan.stale(recipe, tmp_path)
    render._stale(page, recipe, stale)
    render._benchmark(page, tmp_path, stale)
    return "\n".join(page.md)


def test_benchmark_section_names_a_bundle_not_built_when_it_ran(tmp_path):
    assert "| cnn-int8 | not built when the benchmark ran" in benchmark_markdown(tmp_path)


def test_benchmark_section_of_an_f1_recipe_shows_each_models_dev_f1(tmp_path):
    assert "| teacher-pytorch-eager | fp32 | 1.0 | 0.9000 | 0.8750 |" in benchmark_markdown(tmp_path, metric="f1")


def test_benchmark_figure_of_an_f1_recipe_plots_f1_against_latency(tmp_path):
    assert "F1 against latency" in benchmark_markdown(tmp_path, metric="f1")


def test_benchmark_section_shows_the_row_of_a_bundle_as_it_was_timed(tmp_path):
    assert "| bilstm-int8 | fp32 |" in benchmark_markdown(tmp_path)


def test_benchmark_section_leaves_out_the_row_of_a_bundle_built_again_since(tmp_path):
    assert "| bilstm-int8 | fp32 |" not in benchmark_markdown(tmp_path, bundle_hash="0" * 64)


def test_a_report_names_the_benchmark_row_of_a_bundle_built_again_since_with_the_command_to_time_it_again(tmp_path):
    assert (
        "| bench row bilstm-int8 | its parent bundle-bilstm-int8 was built again "
        "| edgedistill bench models RECIPE.yaml "
        "| make bench RECIPE=RECIPE.yaml |" in (benchmark_markdown(tmp_path, bundle_hash="0" * 64))
    )


def older_student_markdown(tmp_path) -> str:
    """The note on measurements, the benchmark and the serving sections of a smoke run whose deployed bundle
    (bilstm-int8), benchmarked and served, was exported from student-bilstm before it was distilled again."""
    publish(tmp_path / "student-bilstm")
    publish_bench(tmp_path, bundle_parents={"student-bilstm": mf.parent_of(tmp_path / "student-bilstm")})
    served = {"bundle": mf.parent_of(tmp_path / "bundle-bilstm-int8")}
    publish(tmp_path / "serve-bench-bilstm-int8", files={"bench.md": "the older student's.\n"}, parents=served)
    publish(tmp_path / "student-bilstm", metrics={"dev_accuracy": 0.9})  # distilled again
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    stale = plan.stale(recipe, tmp_path)
    render._stale(page, recipe, stale)
    render._benchmark(page, tmp_path, stale)
    render._serving(page, tmp_path, recipe, stale)
    return "\n".join(page.md)


def test_a_report_names_a_bundle_built_from_a_student_distilled_again_since_with_the_command_to_build_it(tmp_path):
    assert (
        "| bundle-bilstm-int8 | its parent student-bilstm was built again | edgedistill bundles RECIPE.yaml "
        "| make bundles RECIPE=RECIPE.yaml |" in (older_student_markdown(tmp_path))
    )


def test_benchmark_section_leaves_out_the_row_of_a_bundle_built_from_a_student_distilled_again_since(tmp_path):
    assert "| bilstm-int8 | fp32 |" not in older_student_markdown(tmp_path)


def test_serving_sections_leave_out_the_result_of_a_bundle_built_from_a_student_distilled_again_since(tmp_path):
    assert "the older student's." not in older_student_markdown(tmp_path)


def test_a_report_names_the_serving_benchmark_of_a_bundle_built_from_an_older_student_with_the_commands(tmp_path):
    assert "| serve-bench-bilstm-int8 | bundle-bilstm-int8: its parent student-bilstm was built again | " in (
        older_student_markdown(tmp_path)
    )


def test_benchmark_figure_leaves_out_a_bundle_built_again_since(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "pareto", lambda points, *_: drawn.extend(p["model"] for p in points) or b"")
    benchmark_markdown(tmp_path, bundle_hash="0" * 64)
    assert drawn == ["teacher-pytorch-eager"]


def test_benchmark_section_marks_a_bundle_cut_to_its_max_length_in_place_of_its_speedup(tmp_path):
    assert "| 0.25 (cut to 48) |" in benchmark_markdown(tmp_path, timed_length=48)


def test_benchmark_figure_labels_a_bundle_cut_to_its_max_length_with_the_length_it_was_timed_at(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "pareto", lambda points, *_: drawn.extend(p["model"] for p in points) or b"")
    benchmark_markdown(tmp_path, timed_length=48)
    assert drawn == ["teacher-pytorch-eager", "bilstm-int8 (48 tokens)"]


def test_benchmark_section_of_a_teacher_built_again_since_is_left_out(tmp_path):
    publish_bench(tmp_path)
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.95})
    page = render.Page("report")
    render._benchmark(page, tmp_path, plan.stale(load_recipe(ROOT / "recipes" / "smoke.yaml"), tmp_path))
    assert page.md == ["# report", ""]


def cascade_run(
    tmp_path, monkeypatch, member_rebuilt: bool = False, cascade: str = "c", settings: dict | None = None
) -> tuple[str, list[str]]:
    """The note on measurements of an earlier build with the served sections, and the accuracy-latency figure's
    points, of a smoke run with a cascade `cascade` of small and big (built with the recipe `settings` given, served
    since), whose member small was, with `member_rebuilt`, built again after it; its benchmark timed both members
    since."""
    members = ("teacher", "bundle-small", "bundle-big")
    for folder in members:
        publish(tmp_path / folder)
    publish_cascade(tmp_path, {name: mf.parent_of(tmp_path / name) for name in members}, cascade, settings)
    publish_cascade_benchmark(tmp_path, cascade)
    if member_rebuilt:
        publish(tmp_path / "bundle-small", metrics={"dev_accuracy": 0.86})
    bench = {
        "threads": 1,
        "rows": [bench_row(m, ms) for m, ms in (("teacher-pytorch-eager", 2.0), ("small", 0.25), ("big", 1.0))],
    }
    parents = {name: mf.parent_of(tmp_path / name) for name in members}
    info = {"left_out": {}, "missing_bundles": []}
    publish(tmp_path / "bench", info=info, files={"bench.json": json.dumps(bench)}, parents=parents)
    drawn = []
    monkeypatch.setattr(plots, "pareto", lambda points, *_: drawn.extend(p["model"] for p in points) or b"")
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    stale = plan.stale(recipe, tmp_path)
    render._stale(page, recipe, stale)
    render._benchmark(page, tmp_path, stale)
    render._serving(page, tmp_path, recipe, stale)
    return "\n".join(page.md), drawn


def test_benchmark_figure_draws_a_cascade_at_the_expected_latency_of_its_members(tmp_path, monkeypatch):
    assert "c (expected)" in cascade_run(tmp_path, monkeypatch, member_rebuilt=False)[1]


def test_benchmark_figure_leaves_out_a_cascade_built_before_a_member_was_built_again(tmp_path, monkeypatch):
    assert "c (expected)" not in cascade_run(tmp_path, monkeypatch, member_rebuilt=True)[1]


def test_a_report_names_the_point_of_a_cascade_built_before_a_member_was_built_again_with_the_command(
    tmp_path, monkeypatch
):
    row = (
        "| expected latency of cascade c | its parent bundle-small was built again | edgedistill bundles RECIPE.yaml "
        "| make bundles RECIPE=RECIPE.yaml |"
    )
    assert row in cascade_run(tmp_path, monkeypatch, member_rebuilt=True)[0]


CASCADE = "export.cascades.bilstm-cascade"  # the smoke recipe's cascade's settings


def other_settings_cascade_run(tmp_path, monkeypatch) -> tuple[str, list[str]]:
    """`cascade_run` of the smoke recipe's cascade bilstm-cascade built with 999 calibration sentences, 500 in the
    recipe now."""
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {f"{CASCADE}.calibration_sentences": 999})
    return cascade_run(tmp_path, monkeypatch, cascade="bilstm-cascade", settings=built.settings(CASCADE))


def test_benchmark_figure_leaves_out_a_cascade_built_with_other_settings(tmp_path, monkeypatch):
    assert "bilstm-cascade (expected)" not in other_settings_cascade_run(tmp_path, monkeypatch)[1]


def test_serving_sections_leave_out_the_benchmark_of_a_cascade_built_with_other_settings(tmp_path, monkeypatch):
    assert "## Cascade served" not in other_settings_cascade_run(tmp_path, monkeypatch)[0]


def test_a_report_names_the_benchmark_of_a_cascade_built_with_other_settings_with_the_commands(tmp_path, monkeypatch):
    row = (
        f"| serve-cascade-bilstm-cascade | bundle-bilstm-cascade: bundle-bilstm-cascade was built with other {CASCADE} "
        f"settings ({CASCADE}.calibration_sentences 999 -> 500) | edgedistill bundles RECIPE.yaml && edgedistill "
        "bench cascade RECIPE.yaml --cascade bilstm-cascade | make bundles serve-cascade CASCADE=bilstm-cascade "
        "RECIPE=RECIPE.yaml |"
    )
    assert row in other_settings_cascade_run(tmp_path, monkeypatch)[0]


SERVED_RESULTS = {  # measurement -> the file of tables it writes
    "serve-bench": "bench.md",
    "serve-accuracy": "accuracy.md",
    "serve-peers": "bench.md",
    "serve-scaling": "bench.md",
}


def publish_cascade_benchmark(tmp_path, name: str, cascade_hash: str | None = None) -> None:
    """The serving benchmark of cascade `name` against teacher-fused, its last member served alone, each bundle
    published first where it is not yet; it records the cascade's manifest hash as `cascade_hash` where given (an
    earlier build)."""
    for bundle in (f"bundle-{name}", "bundle-teacher-fused"):
        if not (tmp_path / bundle / mf.MANIFEST).is_file():
            publish(tmp_path / bundle)
    cascade = mf.parent_of(tmp_path / f"bundle-{name}")
    parents = {
        "cascade": cascade.model_copy(update={"manifest_sha256": cascade_hash or cascade.manifest_sha256}),
        "last": mf.parent_of(tmp_path / "bundle-teacher-fused"),
    }
    text = f"# Cascade {name} against teacher-fused served alone\n"
    publish(tmp_path / f"serve-cascade-{name}", files={"cascade.md": text}, parents=parents)


def serving_markdown(tmp_path) -> str:
    """The served sections of a smoke run with each measurement of its deployed bundle (bilstm-int8), of another
    bundle measured after it, and of an older release's one folder for every bundle, and the serving benchmarks of
    its cascade bilstm-cascade and of a cascade `c` no longer in the recipe."""
    publish(tmp_path / "bundle-bilstm-int8")
    deployed = {"bundle": mf.parent_of(tmp_path / "bundle-bilstm-int8")}
    for measurement, written in SERVED_RESULTS.items():
        text = f"{measurement}: the deployed bundle's.\n"
        publish(tmp_path / f"{measurement}-bilstm-int8", files={written: text}, parents=deployed)
        publish(tmp_path / f"{measurement}-cnn-int8", files={written: f"{measurement}: cnn-int8's.\n"})
        publish(tmp_path / measurement, files={written: f"{measurement}: an older release's.\n"})
    publish_cascade_benchmark(tmp_path, "bilstm-cascade")
    publish_cascade_benchmark(tmp_path, "c")
    page = render.Page("report")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    render._serving(page, tmp_path, recipe, plan.stale(recipe, tmp_path))
    return "\n".join(page.md)


@pytest.mark.parametrize("measurement", SERVED_RESULTS)
def test_serving_sections_show_the_deployed_bundles_result(tmp_path, measurement):
    assert f"{measurement}: the deployed bundle's." in serving_markdown(tmp_path)


@pytest.mark.parametrize(
    "heading",
    [
        "Serving benchmark of the deployed bundle, bundle-bilstm-int8",
        "Served accuracy of the deployed bundle, bundle-bilstm-int8",
        "Peer comparison of the deployed bundle, bundle-bilstm-int8",
        "Scaling with worker processes of the deployed bundle, bundle-bilstm-int8",
    ],
)
def test_serving_sections_name_the_deployed_bundle_whose_result_they_show(tmp_path, heading):
    assert f"\n## {heading}\n" in serving_markdown(tmp_path)


@pytest.mark.parametrize("measurement", SERVED_RESULTS)
def test_serving_sections_leave_out_the_result_of_a_bundle_not_deployed(tmp_path, measurement):
    assert f"{measurement}: cnn-int8's." not in serving_markdown(tmp_path)


@pytest.mark.parametrize("measurement", SERVED_RESULTS)
def test_serving_sections_leave_out_an_older_releases_one_result_for_every_bundle(tmp_path, measurement):
    assert f"{measurement}: an older release's." not in serving_markdown(tmp_path)


def earlier_build_markdown(tmp_path) -> str:
    """The served and load-test sections and the note on measurements of a smoke run whose deployed bundle
    (bilstm-int8) was built again after its serving benchmark and steady load test ran."""
    publish(tmp_path / "bundle-bilstm-int8")
    earlier = {"bundle": mf.Parent(path=str(tmp_path / "bundle-bilstm-int8"), manifest_sha256="0" * 64)}
    publish(tmp_path / "serve-bench-bilstm-int8", files={"bench.md": "an earlier build's.\n"}, parents=earlier)
    publish(tmp_path / "loadtest-steady-bilstm-int8", files={"summary.json": "{}"}, parents=earlier)
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    stale = plan.stale(recipe, tmp_path)
    render._stale(page, recipe, stale)
    render._serving(page, tmp_path, recipe, stale)
    render._loadtests(page, tmp_path, recipe, stale)
    return "\n".join(page.md)


def test_serving_sections_leave_out_the_result_of_an_earlier_build_of_the_deployed_bundle(tmp_path):
    assert "an earlier build's." not in earlier_build_markdown(tmp_path)


def test_load_test_sections_leave_out_the_result_of_an_earlier_build_of_the_deployed_bundle(tmp_path):
    assert "## Load test" not in earlier_build_markdown(tmp_path)


@pytest.mark.parametrize(
    "row",
    [
        "| serve-bench-bilstm-int8 | its parent bundle was built again | edgedistill bench serving RECIPE.yaml "
        "| make serve-bench RECIPE=RECIPE.yaml |",
        "| loadtest-steady-bilstm-int8 | its parent bundle was built again "
        "| edgedistill loadtest RECIPE.yaml --profile "
        "steady | make loadtest PROFILE=steady RECIPE=RECIPE.yaml |",
    ],
)
def test_a_report_names_each_measurement_of_an_earlier_build_of_the_deployed_bundle(tmp_path, row):
    assert row in earlier_build_markdown(tmp_path)


LOADTEST_STEADY = "loadtest-steady-bilstm-int8"


def publish_loadtest(
    tmp_path, checks: list[dict], calls: list[float], figures: dict | None = None, notes: list[str] = ()
) -> None:
    """A steady load test of the smoke run's deployed bundle (bilstm-int8, published first), scheduled for 5 s, with
    its SLO `checks`, and a Classify call of each latency (ms) in `calls` recorded as it returned 10 s in; its overall
    latencies 5 ms, but for the `figures` given; its `notes` (findings in words)."""
    publish(tmp_path / "bundle-bilstm-int8")
    overall = {"requests": len(calls), "failures": 0, "requests_per_s": 0.4, "error_codes": {}}
    overall |= {key: 5.0 for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "server_cpu_pct", "locust_cpu_pct")}
    overall |= figures or {}
    series = {"t_s": [0], "users": [1], "requests_per_s": [1.0], "failures_per_s": [0.0]}
    result = {
        "profile": "steady",
        "duration_s": 5.0,
        "scenarios": {"single": 1},
        "bundle": {"name": "smoke-bilstm-int8", "arch": "bilstm"},
        "machine": {"cpus": 2, "cores": 2},
        "overall": overall,
        "stages": [],
        "series": series | {key: [5.0] for key in ("p50_ms", "p95_ms", "p99_ms")},
        "capacity": None,
        "rss_growth_mb_per_10k": None,
        "notes": list(notes),
        "checks": checks,
        "passed": all(check["passed"] for check in checks),
    }
    folder = tmp_path / LOADTEST_STEADY
    with mf.stage_folder(folder) as tmp:
        loadtest_result.save(tmp, result)
        recorder = Recorder(tmp / SAMPLES_FILE)
        recorder.started = time.monotonic() - 10
        for ms in calls:
            recorder.on_request("Classify", ms)
        recorder.save()
        parents = {"bundle": mf.parent_of(tmp_path / "bundle-bilstm-int8")}
        base = mf.Manifest(stage=folder.name, recipe="r", recipe_hash="h", config_hash="h", parents=parents)
        mf.commit(tmp, folder, base)


def loadtest_page(
    tmp_path, checks: list[dict], calls: list[float] = (5.0,), figures: dict | None = None, notes: list[str] = ()
) -> render.Page:
    """The load-test section of the run of `publish_loadtest`."""
    publish_loadtest(tmp_path, checks, list(calls), figures, notes)
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    render._loadtests(page, tmp_path, recipe, plan.stale(recipe, tmp_path))
    return page


def test_load_test_section_writes_its_slo_checks_as_the_load_tests_own_summary_does(tmp_path):
    check = {"name": "p99_ms", "measured": 12.345, "limit": "<= 20", "passed": True}
    page = loadtest_page(tmp_path, [check])
    summary = (tmp_path / LOADTEST_STEADY / loadtest_result.TABLES_FILE).read_text()
    row = next(line for line in summary.splitlines() if line.startswith("| p99_ms |"))
    assert row in page.md


def test_load_test_section_writes_a_rate_of_thousands_without_an_exponent(tmp_path):
    check = {"name": "requests_per_s", "measured": 3596.0, "limit": ">= 3000", "passed": True}
    assert "e+0" not in "\n".join(loadtest_page(tmp_path, [check]).md)


def late_loadtest_page(tmp_path) -> render.Page:
    """The load-test section of a run whose p99 was 2 ms from the send and 5 ms from the due time, which missed
    its SLO of 3 ms."""
    check = {"name": "p99_ms", "measured": 5.0, "limit": "<= 3", "passed": False}
    return loadtest_page(tmp_path, [check], figures={"p99_ms": 2.0, "p99_from_due_ms": 5.0})


def overall_figures(page: render.Page) -> dict[str, str]:
    """The load-test section's table of overall figures, column -> cell."""
    header = next(i for i, line in enumerate(page.md) if line.startswith("| requests |"))
    cells = [line.strip("|").split("|") for line in (page.md[header], page.md[header + 2])]
    return {column.strip(): cell.strip() for column, cell in zip(*cells, strict=True)}


def test_load_test_section_shows_the_p99_from_the_due_time_that_the_slo_reads(tmp_path):
    assert overall_figures(late_loadtest_page(tmp_path))["p99 ms due"] == "5.00"


def test_load_test_section_shows_the_p99_from_the_send_beside_it(tmp_path):
    assert overall_figures(late_loadtest_page(tmp_path))["p99 ms"] == "2.00"


def test_load_test_section_shows_the_columns_of_the_load_tests_own_summary_in_their_order(tmp_path):
    page = loadtest_page(tmp_path, [])
    summary = (tmp_path / LOADTEST_STEADY / loadtest_result.TABLES_FILE).read_text().splitlines()
    header = [cell.strip() for cell in next(line for line in summary if line.startswith("| stage |")).split("|")]
    assert list(overall_figures(page)) == ["requests", *(cell for cell in header if cell not in ("", "stage", "users"))]


def test_load_test_section_shows_the_offered_rate_the_rate_share_is_measured_against(tmp_path):
    page = loadtest_page(tmp_path, [], figures={"offered_rate": 0.4})
    assert overall_figures(page)["offered/s"] == "0.4"


def test_load_test_section_gives_the_calls_due_that_were_never_sent(tmp_path):
    check = {"name": "rate_share", "measured": 0.9, "limit": ">= 0.95", "passed": False}
    page = loadtest_page(tmp_path, [check], figures={"unsent_calls": 12})
    assert overall_figures(page)["unsent"] == "12"


def test_load_test_section_says_its_due_figures_are_timed_from_the_due_time(tmp_path):
    assert "(due) from the due time, which the SLO reads" in "\n".join(late_loadtest_page(tmp_path).md)


def test_load_test_section_lists_the_load_tests_notes(tmp_path):
    note = "the step past capacity was generator-bound: capacity is a lower bound"
    assert f"- {note}" in loadtest_page(tmp_path, [], notes=[note]).md


def test_load_test_section_lists_failed_calls_by_status(tmp_path):
    figures = {"failures": 3, "error_codes": {"RESOURCE_EXHAUSTED": 3}}
    assert "- failed calls by status: RESOURCE_EXHAUSTED 3" in loadtest_page(tmp_path, [], figures=figures).md


def test_load_test_latency_figure_leaves_out_a_call_started_after_the_schedule(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(plots, "latency_distribution", lambda by_name, *_: drawn.update(by_name) or b"")
    loadtest_page(tmp_path, [], calls=[8000.0, 1.5])  # returned 10 s in: started 2 s in, and 10 s in, past the 5
    assert drawn["Classify"].tolist() == [8000.0]


def unkeyed_markdown(tmp_path) -> str:
    """The report's note on an older release's serving benchmark and load test, one folder each for every bundle."""
    publish(tmp_path / "serve-bench", files={"bench.md": "older\n"})
    publish(tmp_path / "loadtest-smoke")
    page = render.Page("report")
    render._unkeyed(page, tmp_path)
    return "\n".join(page.md)


def test_a_report_says_an_older_releases_serving_results_are_not_shown(tmp_path):
    assert "## Not shown: results of an older release" in unkeyed_markdown(tmp_path)


@pytest.mark.parametrize("folder", ["serve-bench", "loadtest-smoke"])
def test_a_report_names_each_folder_of_an_older_release(tmp_path, folder):
    assert f"| {folder} |" in unkeyed_markdown(tmp_path)


def test_a_report_writes_the_folder_name_pattern_of_its_note_on_older_releases_as_code(tmp_path):
    assert "(`<measurement>-<bundle id>`)" in unkeyed_markdown(tmp_path)


def test_a_report_of_a_run_without_older_folders_has_no_note_on_them(tmp_path):
    publish(tmp_path / "serve-bench-bilstm-int8", files={"bench.md": "now\n"})
    publish(tmp_path / "loadtest-smoke-echo")
    page = render.Page("report")
    render._unkeyed(page, tmp_path)
    assert page.md == ["# report", ""]


def test_the_reports_load_tests_are_the_deployed_bundles():
    assert "loadtest-steady-bilstm-int8" in plan.loadtests(load_recipe(ROOT / "recipes" / "smoke.yaml"))


def test_the_reports_load_tests_include_the_echo_servers():
    assert "loadtest-steady-echo" in plan.loadtests(load_recipe(ROOT / "recipes" / "smoke.yaml"))


@pytest.mark.parametrize("folder", ["loadtest-steady", "loadtest-steady-cnn-int8"])
def test_the_reports_load_tests_leave_out_an_older_release_and_other_bundles(folder):
    assert folder not in plan.loadtests(load_recipe(ROOT / "recipes" / "smoke.yaml"))


def test_serving_sections_show_a_cascades_benchmark_under_its_section_heading(tmp_path):
    assert "\n### Cascade bilstm-cascade against teacher-fused served alone\n" in serving_markdown(tmp_path)


def test_serving_sections_leave_out_the_benchmark_of_a_cascade_not_in_the_recipe(tmp_path):
    assert "Cascade c against" not in serving_markdown(tmp_path)


def earlier_cascade_markdown(tmp_path) -> str:
    """The served sections and the note on measurements of a smoke run whose cascade bilstm-cascade was built again
    after its serving benchmark ran."""
    publish_cascade_benchmark(tmp_path, "bilstm-cascade", cascade_hash="0" * 64)
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    stale = plan.stale(recipe, tmp_path)
    render._stale(page, recipe, stale)
    render._serving(page, tmp_path, recipe, stale)
    return "\n".join(page.md)


def test_serving_sections_leave_out_the_benchmark_of_an_earlier_build_of_a_cascade(tmp_path):
    assert "## Cascade served" not in earlier_cascade_markdown(tmp_path)


def test_a_report_names_the_benchmark_of_an_earlier_build_of_a_cascade_with_the_command_to_run_again(tmp_path):
    row = (
        "| serve-cascade-bilstm-cascade | its parent cascade was built again | edgedistill bench cascade RECIPE.yaml "
        "--cascade bilstm-cascade | make serve-cascade CASCADE=bilstm-cascade RECIPE=RECIPE.yaml |"
    )
    assert row in earlier_cascade_markdown(tmp_path)


def test_the_transfer_figure_of_a_pair_task_counts_pairs(tmp_path, monkeypatch):
    composition = {"unlabelled": 10, "train": 20, "augmented": 30}
    publish(tmp_path / "transfer", info={"composition": composition, "pairs": True})
    figures = []
    monkeypatch.setattr(plots, "png", lambda fig: figures.append(fig) or b"")
    distillation_section(tmp_path)
    assert figures[0].axes[0].get_title() == "transfer set: 60 pairs"


def per_class(page: render.Page, tmp_path) -> None:
    """The per-label section of the smoke run in `tmp_path` onto `page`."""
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    render._per_class(page, tmp_path, recipe, plan.stale(recipe, tmp_path))


def per_label_page(tmp_path) -> render.Page:
    """The per-label section of a smoke run whose teacher, cnn student and cnn baseline recorded dev confusion
    matrices, and whose bilstm student (built before they were recorded) did not."""
    publish(tmp_path / "teacher", metrics={"dev_confusion": [[3, 1], [0, 4]]})
    publish(tmp_path / "student-cnn", metrics={"dev_confusion": [[2, 2], [0, 4]]})
    publish(tmp_path / "baseline-cnn", metrics={"dev_confusion": [[4, 0], [4, 0]]})
    publish(tmp_path / "student-bilstm", metrics={"dev_accuracy": 0.5})
    page = render.Page("report")
    per_class(page, tmp_path)
    return page


def test_per_label_section_gives_each_models_f1_of_each_label(tmp_path):
    # teacher, negative: tp=3, fp=0, fn=1 -> 6/7; cnn: tp=2, fp=0, fn=2 -> 4/6; baseline: tp=4, fp=4, fn=0 -> 8/12
    assert "| negative | 4 | 0.8571 | 0.6667 | 0.6667 |" in "\n".join(per_label_page(tmp_path).md)


def test_per_label_section_gives_a_label_a_model_never_predicts_f1_0(tmp_path):
    # the baseline predicts negative only, and dev has positives
    assert "| positive | 4 | 0.8889 | 0.8000 | 0.0000 |" in "\n".join(per_label_page(tmp_path).md)


def test_per_label_section_leaves_out_a_model_without_a_confusion_matrix(tmp_path):
    assert "student-bilstm F1" not in "\n".join(per_label_page(tmp_path).md)


def test_per_label_figure_draws_the_teacher_and_students_not_the_baselines(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "png", lambda fig: figures.append(fig) or b"")
    per_label_page(tmp_path)
    assert [ax.get_title() for ax in figures[0].axes] == ["teacher", "student-cnn"]


def test_per_label_section_shows_a_label_neither_in_dev_nor_predicted_as_a_dash(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_confusion": [[4, 0], [0, 0]]})
    page = render.Page("report")
    per_class(page, tmp_path)
    assert "| positive | 0 | - |" in "\n".join(page.md)


def test_a_run_without_confusion_matrices_has_no_per_label_section(tmp_path):
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    page = render.Page("report")
    per_class(page, tmp_path)
    assert page.md == ["# report", ""]


def baselines_only_page(tmp_path) -> render.Page:
    """The per-label section of a smoke run whose teacher predates dev confusion matrices and whose cnn baseline,
    built again since, records one."""
    publish(tmp_path / "teacher", metrics={"dev_accuracy": 0.9})
    publish(tmp_path / "baseline-cnn", metrics={"dev_confusion": [[4, 0], [4, 0]]})
    page = render.Page("report")
    per_class(page, tmp_path)
    return page


def test_per_label_section_of_baselines_alone_lists_the_baseline(tmp_path):
    assert "| label | dev examples | baseline-cnn F1 |" in "\n".join(baselines_only_page(tmp_path).md)


def test_per_label_section_of_baselines_alone_draws_no_figure(tmp_path):
    assert baselines_only_page(tmp_path).figures == {}


TEACHER_SETTINGS = ("data", "model", "finetune")  # the teacher stage's (`distill.stages.teacher`)


def edited_recipe_markdown(tmp_path, monkeypatch) -> str:
    """The stage table, the note on what is not shown, the training curves and the per-label section of a smoke run
    whose teacher (dev accuracy 0.9125) was built before the recipe's finetune.optim.lr was edited."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    metrics = {"dev_accuracy": 0.9125, "dev_confusion": [[3, 1], [0, 4]]}
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {"finetune.optim.lr": 0.002})
    history = json.dumps([{"step": 10, "train_loss": 0.5, "dev_accuracy": 0.9125}])

    def build(_):
        return Built(lambda folder: (folder / "history.json").write_text(history), metrics)

    Stage("teacher", built, TEACHER_SETTINGS, build).run()
    page, recipe = render.Page("report"), load_recipe(ROOT / "recipes" / "smoke.yaml")
    root = run_dir(recipe)
    stale = plan.stale(recipe, root)
    render._stages(page, root, recipe, stale)
    render._stale(page, recipe, stale)
    render._curves(page, root, recipe, stale)
    render._per_class(page, root, recipe, stale)
    return "\n".join(page.md)


def test_a_report_names_a_teacher_built_with_other_settings_with_the_command_to_build_it(tmp_path, monkeypatch):
    row = (
        "| teacher | teacher was built with other finetune settings (finetune.optim.lr 0.002 -> 0.001) "
        "| edgedistill teacher RECIPE.yaml | make teacher RECIPE=RECIPE.yaml |"
    )
    assert row in edited_recipe_markdown(tmp_path, monkeypatch)


def test_the_stage_table_leaves_out_the_dev_figures_of_a_teacher_built_with_other_settings(tmp_path, monkeypatch):
    assert "| teacher | - |" in edited_recipe_markdown(tmp_path, monkeypatch)


def test_training_curves_leave_out_a_teacher_built_with_other_settings(tmp_path, monkeypatch):
    assert "## Training curves" not in edited_recipe_markdown(tmp_path, monkeypatch)


def test_per_label_section_leaves_out_a_teacher_built_with_other_settings(tmp_path, monkeypatch):
    assert "## Per label (dev)" not in edited_recipe_markdown(tmp_path, monkeypatch)


def test_distillation_section_leaves_out_a_table_of_a_teacher_built_with_other_settings(tmp_path, monkeypatch):
    edited_recipe_markdown(tmp_path, monkeypatch)
    summary.write(tmp_path / "smoke", ROWS)
    assert "| teacher | teacher | 0.9 |" not in "\n".join(distillation_section(tmp_path / "smoke"))


def test_a_benchmark_against_a_teacher_built_with_other_settings_is_left_out_whole(tmp_path, monkeypatch):
    edited_recipe_markdown(tmp_path, monkeypatch)
    root, recipe = tmp_path / "smoke", load_recipe(ROOT / "recipes" / "smoke.yaml")
    bench = {"threads": 1, "rows": [bench_row("teacher-pytorch-eager", 2.0)]}
    parents = {"teacher": mf.parent_of(root / "teacher")}
    info = {"left_out": {}, "missing_bundles": []}
    publish(root / "bench", info=info, files={"bench.json": json.dumps(bench)}, parents=parents)
    assert plan.stale(recipe, root)["bench"].why.startswith("teacher was built with other finetune settings")
