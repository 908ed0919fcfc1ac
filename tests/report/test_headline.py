import io
import json
import re

import pytest
from edgedistill.bench import slo
from edgedistill.bench.records import ServingResult, Spread
from edgedistill.common import manifest as mf
from edgedistill.common import summary
from edgedistill.common.recipe import load_recipe, parse_overrides, run_dir
from edgedistill.common.stage import Built, Stage
from edgedistill.distill import stages
from edgedistill.report import __main__ as report_main
from edgedistill.report import headline
from rich.console import Console

from tests.conftest import ROOT

SMOKE = str(ROOT / "recipes" / "smoke.yaml")
LR = "--distill.students.bilstm.optim.lr=0.002"  # the smoke recipe's student bilstm learns at 0.003


def publish(folder, metrics, parents=None, built_as: Stage | None = None):
    """An artifact in `folder` with `metrics`, recording what the stage `built_as` hashes where given."""
    hashed = {"config_hash": built_as.config_hash, "hashed": built_as.hashed} if built_as else {"config_hash": "c"}
    with mf.stage_folder(folder) as tmp:
        (tmp / "result.json").write_text("{}")
        base = mf.Manifest(stage=folder.name, recipe="smoke", recipe_hash="h", metrics=metrics, **hashed)
        mf.commit(tmp, folder, base.model_copy(update={"parents": parents or {}}))


def tabled(recipe, out_of_date: dict[str, str] | None = None) -> None:
    """The distillation table as make distill writes it from the run's teacher and students now, marking each
    student's kinds `out_of_date` (name -> "student, baseline") as given."""
    root = run_dir(recipe)
    names = sorted(folder.name.removeprefix("student-") for folder in root.glob("student-*"))
    marks = out_of_date or {}
    summary.write(root, [{"student": "teacher"}, *({"student": n, "out_of_date": marks.get(n)} for n in names)])


@pytest.fixture(autouse=True)
def at_the_checkouts_top(monkeypatch):
    """Where make runs: the make lines name relative paths as given there (`report.plan.for_make`)."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    return load_recipe(ROOT / "recipes" / "smoke.yaml")


def test_headline_names_the_baseline_gain_when_there_is_one(recipe):
    root = run_dir(recipe)
    name = recipe.distill.deploy
    publish(root / "teacher", {"dev_accuracy": 0.9})
    publish(root / f"student-{name}", {"dev_accuracy": 0.88, "retention": 0.88 / 0.9})
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.8})
    tabled(recipe)
    lines = headline.headline(recipe, "recipes/smoke.yaml")
    assert lines[0] == "teacher: dev accuracy 0.9000"
    assert (
        lines[1] == f"student {name}: dev accuracy 0.8800 (97.8% of the teacher), +0.0800 over its label-only baseline"
    )


def test_headline_gives_retention_and_gain_in_the_selection_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--data.metric=macro_f1"]))
    root, name = run_dir(recipe), recipe.distill.deploy
    publish(root / f"student-{name}", {"dev_accuracy": 0.88, "dev_macro_f1": 0.8, "retention": 0.8 / 0.85})
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.86, "dev_macro_f1": 0.7})
    tabled(recipe)
    assert headline.headline(recipe, "recipes/smoke.yaml") == [
        f"student {name}: dev accuracy 0.8800, dev macro-F1 0.8000 (94.1% of the teacher's macro-F1), "
        "+0.1000 macro-F1 over its label-only baseline"
    ]


def unmeasured_baseline_lines(tmp_path, monkeypatch) -> list[str]:
    """The headline of a smoke run selected on macro-F1 whose student bilstm's baseline, of an older release, records
    accuracy alone, its table current."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--data.metric=macro_f1"]))
    root, name = run_dir(recipe), recipe.distill.deploy
    publish(root / f"student-{name}", {"dev_accuracy": 0.88, "dev_macro_f1": 0.8, "retention": 0.8 / 0.85})
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.86})
    tabled(recipe)
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_headline_gives_no_gain_over_a_baseline_without_the_selection_metric(tmp_path, monkeypatch):
    assert "over its label-only baseline" not in unmeasured_baseline_lines(tmp_path, monkeypatch)[0]


def test_headline_says_the_gain_it_leaves_out_is_over_a_baseline_that_records_no_selection_metric(
    tmp_path, monkeypatch
):
    lines = unmeasured_baseline_lines(tmp_path, monkeypatch)
    assert lines[1] == "not shown: student bilstm's gain, baseline-bilstm records no dev_macro_f1"


def test_the_headlines_stage_table_shows_a_dev_figure_of_none_as_a_dash(recipe):
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": None, "params": 1_000_000})
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(headline.stage_table(recipe))
    assert re.search(r"teacher\s+│\s+-\s+│\s+1\.00M", console.export_text())


def test_headline_beside_test_figures_says_retention_and_gain_are_on_dev_and_gives_the_test_share(recipe):
    root = run_dir(recipe)
    name = recipe.distill.deploy
    publish(root / "teacher", {"dev_accuracy": 0.9, "test_accuracy": 0.95})
    publish(root / f"student-{name}", {"dev_accuracy": 0.88, "test_accuracy": 0.93, "retention": 0.88 / 0.9})
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.8, "test_accuracy": 0.9})
    tabled(recipe)
    assert headline.headline(recipe, "recipes/smoke.yaml")[1] == (
        f"student {name}: dev accuracy 0.8800, test accuracy 0.9300 (97.8% of the teacher on dev, 97.9% on test), "
        "+0.0800 over its label-only baseline on dev"
    )


def test_headline_without_a_baseline_or_later_stages(recipe):
    """A student trained without its baseline (`--no-baseline`) and nothing exported yet."""
    name = recipe.distill.deploy
    publish(run_dir(recipe) / f"student-{name}", {"dev_accuracy": 0.88, "retention": 0.98})
    tabled(recipe)
    assert headline.headline(recipe, "recipes/smoke.yaml") == [
        f"student {name}: dev accuracy 0.8800 (98.0% of the teacher)"
    ]
    table = headline.stage_table(recipe)
    assert table.row_count == 1


ONE_LABEL = {"dev_accuracy": 0.5, "dev_confusion": [[5, 0], [5, 0]]}  # 'negative' for all 10 dev examples


def one_label_lines(recipe, teacher: dict, student: dict) -> list[str]:
    root, name = run_dir(recipe), recipe.distill.deploy
    publish(root / "teacher", teacher)
    publish(root / f"student-{name}", student)
    tabled(recipe)
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_headline_says_the_teacher_predicts_one_label_for_every_dev_example(recipe):
    lines = one_label_lines(recipe, ONE_LABEL, {"dev_accuracy": 0.88, "retention": 1.76})
    assert lines[0] == "teacher: dev accuracy 0.5000 (it predicts 'negative' for every dev example)"


def test_headline_gives_no_retention_or_gain_of_a_student_predicting_one_label(recipe):
    publish(run_dir(recipe) / f"baseline-{recipe.distill.deploy}", {"dev_accuracy": 0.4})
    lines = one_label_lines(recipe, {"dev_accuracy": 0.9}, ONE_LABEL | {"retention": 0.5 / 0.9})
    assert lines[1] == (
        f"student {recipe.distill.deploy}: dev accuracy 0.5000 "
        "(it predicts 'negative' for every dev example: no retention or gain shown)"
    )


def test_headline_gives_no_retention_of_a_teacher_predicting_one_label(recipe):
    lines = one_label_lines(recipe, ONE_LABEL, {"dev_accuracy": 0.88, "retention": 1.76})
    assert lines[1] == (
        f"student {recipe.distill.deploy}: dev accuracy 0.8800 "
        "(the teacher predicts one label for every dev example: no retention shown)"
    )


def older_student_stage_table(recipe) -> str:
    """The stage table of the headline of a smoke run whose bundle bilstm-int8 (dev accuracy 0.8125) was exported
    from student-bilstm before it was distilled again."""
    root = run_dir(recipe)
    publish(root / "student-bilstm", {"dev_accuracy": 0.8})
    parents = {"student-bilstm": mf.parent_of(root / "student-bilstm")}
    publish(root / "bundle-bilstm-int8", {"dev_accuracy": 0.8125}, parents)
    publish(root / "student-bilstm", {"dev_accuracy": 0.85})  # distilled again
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(headline.stage_table(recipe))
    return console.export_text()


def test_the_headlines_stage_table_names_its_columns_by_what_their_cells_show(recipe):
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9, "params": 10**6, "size_bytes": 2**20})
    header = [column.header for column in headline.stage_table(recipe).columns]
    assert header == ["stage", "dev_accuracy", "params", "size", "wall", "folder"]


def test_the_headlines_stage_table_leaves_out_the_dev_accuracy_of_a_bundle_built_from_an_older_student(recipe):
    assert "0.8125" not in older_student_stage_table(recipe)


def test_the_headlines_stage_table_shows_the_dev_accuracy_of_the_student_distilled_again(recipe):
    assert "0.8500" in older_student_stage_table(recipe)


def left_out_lines(recipe, out_of_date: dict[str, str] | None = None, table: bool = True) -> list[str]:
    """The headline of a run whose deployed student and its baseline were distilled from its teacher, with the
    distillation table written from them (marking `out_of_date` kinds), or with `table` False none."""
    root, name = run_dir(recipe), recipe.distill.deploy
    publish(root / "teacher", {"dev_accuracy": 0.9})
    parents = {"teacher": mf.parent_of(root / "teacher")}
    publish(root / f"student-{name}", {"dev_accuracy": 0.88, "retention": 0.88 / 0.9}, parents)
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.8}, parents)
    if table:
        tabled(recipe, out_of_date)
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_headline_gives_no_gain_over_a_baseline_built_from_another_teacher(recipe):
    root, name = run_dir(recipe), recipe.distill.deploy
    publish(root / "teacher", {"dev_accuracy": 0.9})
    earlier = {"teacher": mf.Parent(path=str(root / "teacher"), manifest_sha256="0" * 64)}
    publish(
        root / f"student-{name}",
        {"dev_accuracy": 0.88, "retention": 0.88 / 0.9},
        {"teacher": mf.parent_of(root / "teacher")},
    )
    publish(root / f"baseline-{name}", {"dev_accuracy": 0.8}, earlier)
    tabled(recipe)
    assert "over its label-only baseline" not in "\n".join(headline.headline(recipe, "recipes/smoke.yaml"))


def test_headline_gives_no_gain_over_a_baseline_the_table_marks_out_of_date(recipe):
    lines = left_out_lines(recipe, {recipe.distill.deploy: "baseline"})
    assert "over its label-only baseline" not in "\n".join(lines)


def test_headline_keeps_the_retention_of_a_student_whose_baseline_alone_is_out_of_date(recipe):
    lines = left_out_lines(recipe, {recipe.distill.deploy: "baseline"})
    assert lines[1] == f"student {recipe.distill.deploy}: dev accuracy 0.8800 (97.8% of the teacher)"


def test_headline_names_the_gain_it_leaves_out_with_the_command_that_builds_it_again(recipe):
    name = recipe.distill.deploy
    assert left_out_lines(recipe, {name: "baseline"})[2] == (
        f"not shown: student {name}'s gain, baseline-{name} out of date "
        "(edgedistill distill recipes/smoke.yaml --jobs 2 builds what is out of date and writes the table again; in a "
        "checkout, make distill RECIPE=recipes/smoke.yaml)"
    )


def test_headline_gives_no_retention_of_a_student_the_table_marks_out_of_date(recipe):
    lines = left_out_lines(recipe, {recipe.distill.deploy: "student, baseline"})
    assert lines[1] == f"student {recipe.distill.deploy}: dev accuracy 0.8800"


def test_headline_gives_no_retention_against_a_teacher_built_again_since_the_table(recipe):
    left_out_lines(recipe)
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.95})
    assert headline.headline(recipe, "recipes/smoke.yaml")[1] == f"student {recipe.distill.deploy}: dev accuracy 0.8800"


def test_headline_says_why_it_leaves_out_retention_and_gain_without_a_distillation_table(recipe):
    name = recipe.distill.deploy
    assert left_out_lines(recipe, table=False)[2].startswith(
        f"not shown: student {name}'s retention and gain, no distillation table was written"
    )


def smoke_with(tmp_path, monkeypatch, *overrides: str):
    """The smoke recipe with `overrides`, its runs folder under `tmp_path`."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    return load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(list(overrides)))


@pytest.mark.parametrize("bundle", ["cnn-int8", "cnn-cascade"])
def test_headline_reports_the_student_the_served_bundle_or_cascades_first_member_is_built_from(
    tmp_path, monkeypatch, bundle
):
    cascade = "--export.cascades.cnn-cascade.members=[cnn-int8,teacher-fused]"
    recipe = smoke_with(tmp_path, monkeypatch, f"--export.deploy={bundle}", cascade)
    for name, accuracy in (("bilstm", 0.8), ("cnn", 0.85)):
        publish(run_dir(recipe) / f"student-{name}", {"dev_accuracy": accuracy, "retention": accuracy / 0.9})
    tabled(recipe)
    assert headline.headline(recipe, "recipes/smoke.yaml") == [
        "student cnn: dev accuracy 0.8500 (94.4% of the teacher)"
    ]


def test_headline_of_a_served_teacher_bundle_says_no_student_is_served(tmp_path, monkeypatch):
    recipe = smoke_with(tmp_path, monkeypatch, "--export.deploy=teacher-int8")
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9})
    publish(run_dir(recipe) / f"student-{recipe.distill.deploy}", {"dev_accuracy": 0.88, "retention": 0.88 / 0.9})
    assert headline.headline(recipe, "recipes/smoke.yaml") == [
        "teacher: dev accuracy 0.9000",
        "student: none served, the deployed bundle teacher-int8 is the teacher's",
    ]


def test_load_test_lines_give_p99_or_for_a_step_test_its_capacity(recipe):
    root = run_dir(recipe)
    overall = {"requests": 1000, "failures": 0, "p99_ms": 2.5, "p99_from_due_ms": 2.6}
    runs = {
        "steady-bilstm-int8": {"profile": "steady", "overall": overall, "passed": True},
        "steady-echo": {"profile": "steady", "echo": True, "overall": overall, "passed": True},
        "step-bilstm-int8": {
            "profile": "step",
            "overall": overall,
            "capacity": {"requests_per_s": 399.6},
            "passed": True,
        },
    }
    for name, result in runs.items():
        (root / f"loadtest-{name}").mkdir(parents=True)
        (root / f"loadtest-{name}" / "summary.json").write_text(json.dumps(result))
    assert headline.headline(recipe, "recipes/smoke.yaml") == [
        "load test steady: 1000 calls, p99 2.60 ms from the due time (2.50 from the send), 0 failures, SLO passed",
        "load test steady against the echo server: 1000 calls, p99 2.60 ms from the due time (2.50 from the send), "
        "0 failures, SLO passed",
        "load test step: 1000 calls, capacity within the SLO 400 calls/s, 0 failures, SLO passed",
    ]
    runs["step-bilstm-int8"] |= {"capacity": None, "passed": False}
    (root / "loadtest-step-bilstm-int8" / "summary.json").write_text(json.dumps(runs["step-bilstm-int8"]))
    assert headline.headline(recipe, "recipes/smoke.yaml")[-1] == (
        "load test step: 1000 calls, capacity within the SLO none, 0 failures, SLO MISSED"
    )


CHECKED = {
    "classify_accuracy": 0.81,
    "kserve_accuracy": 0.81,
    "bundle_dev_accuracy": 0.81,
    "classify_differing": 0,
    "kserve_differing": 0,
    "passed": True,
}


@pytest.mark.parametrize(
    "passed, verdict",
    [(True, "the same predictions as the bundle's own"), (False, "DIFFERENT from the bundle's own (edgedistill")],
)
def test_the_served_accuracy_line_gives_the_checks_verdict(recipe, passed, verdict):
    bundle = run_dir(recipe) / "bundle-bilstm-int8"
    publish(bundle, {})
    publish(
        run_dir(recipe) / "serve-accuracy-bilstm-int8", CHECKED | {"passed": passed}, {"bundle": mf.parent_of(bundle)}
    )
    [line] = [line for line in headline.headline(recipe, "recipes/smoke.yaml") if line.startswith("served accuracy")]
    assert line.startswith(f"served accuracy: Classify 0.8100, KServe 0.8100 (bundle 0.8100), {verdict}")


def test_the_served_accuracy_line_of_a_passed_check_counts_the_near_ties_each_api_answered_otherwise():
    metrics = CHECKED | {"classify_differing": 1, "kserve_differing": 2}
    [line] = headline.served_accuracy(metrics, "recipes/smoke.yaml")
    assert line.endswith(
        "the same predictions as the bundle's own but near-ties (Classify 1, KServe 2 answered otherwise)"
    )


def test_the_served_accuracy_line_of_a_failed_check_names_the_command_with_the_overrides_it_reads():
    [line] = headline.served_accuracy(CHECKED | {"passed": False}, SMOKE, ["--export.tie_margin=0.2"])
    assert f"(edgedistill bench accuracy {SMOKE} --check --export.tie_margin=0.2 says how)" in line


def test_a_load_test_line_gives_the_p99_its_slo_verdict_reads(recipe):
    overall = {"requests": 1000, "failures": 0, "p99_ms": 2.77, "p99_from_due_ms": 3.4}
    folder = run_dir(recipe) / "loadtest-steady-bilstm-int8"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"profile": "steady", "overall": overall, "passed": False}))
    assert "p99 3.40 ms from the due time" in headline.headline(recipe, "recipes/smoke.yaml")[0]


def test_a_load_test_line_of_no_call_sent_that_succeeded_gives_the_p99_from_the_due_time_alone(recipe):
    """Every call sent failed (a hung server), and calls left unsent at the end count from their due time."""
    overall = {"requests": 3, "failures": 3, "p99_ms": None, "p99_from_due_ms": 800.0}
    folder = run_dir(recipe) / "loadtest-steady-bilstm-int8"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"profile": "steady", "overall": overall, "passed": False}))
    assert "p99 800.00 ms from the due time (- from the send)" in headline.headline(recipe, "recipes/smoke.yaml")[0]


def test_a_load_test_line_of_a_result_written_before_calls_were_timed_from_their_due_time_gives_a_dash(recipe):
    overall = {"requests": 1000, "failures": 0, "p99_ms": 2.77}
    folder = run_dir(recipe) / "loadtest-steady-bilstm-int8"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"profile": "steady", "overall": overall, "passed": True}))
    assert "1000 calls, p99 - ms, 0 failures" in headline.headline(recipe, "recipes/smoke.yaml")[0]


@pytest.mark.parametrize("folder", ["loadtest-steady-cnn-int8", "loadtest-steady"])
def test_no_load_test_line_comes_from_a_bundle_not_deployed_or_an_older_releases_folder(recipe, folder):
    result = {"profile": "steady", "overall": {"requests": 10, "failures": 0, "p99_ms": 2.5}, "passed": True}
    (run_dir(recipe) / folder).mkdir(parents=True)
    (run_dir(recipe) / folder / "summary.json").write_text(json.dumps(result))
    assert headline.headline(recipe, "recipes/smoke.yaml") == []


def test_command_prints_the_headline_and_refuses_a_missing_recipe(recipe, capsys):
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9})
    assert headline.main([str(ROOT / "recipes" / "smoke.yaml")]) == 0
    assert "teacher: dev accuracy 0.9000" in capsys.readouterr().out
    assert headline.main(["recipes/no-such.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        headline.main([])
    assert exit_info.value.code == 2


def test_call_lines_of_a_single_text_task_send_one_text(recipe):
    publish(run_dir(recipe) / f"bundle-{recipe.export.deploy}", {})
    assert 'call it:   edgedistill call "<text>"' in headline.headline(recipe, "recipes/smoke.yaml")


def test_the_serve_line_gives_the_installed_command_and_make_only_for_a_checkout(recipe):
    bundle = run_dir(recipe) / f"bundle-{recipe.export.deploy}"
    publish(bundle, {})
    assert (
        f"serve it:  edgedistill serve --bundle {bundle}   (in a checkout: make serve BUNDLE={bundle})"
        in headline.headline(recipe, "recipes/smoke.yaml")
    )


def test_the_container_line_says_it_needs_a_checkout(recipe):
    publish(run_dir(recipe) / f"bundle-{recipe.export.deploy}", {})
    assert headline.headline(recipe, "recipes/smoke.yaml")[-1].endswith("(in a checkout)")


def deployed_by_override_lines(tmp_path, monkeypatch) -> list[str]:
    """The headline, given an override of the deployed bundle, of a smoke run where that bundle is built."""
    deploy = "--export.deploy=cnn-int8"  # the smoke recipe deploys bilstm-int8
    recipe = smoke_with(tmp_path, monkeypatch, deploy)
    publish(run_dir(recipe) / "bundle-cnn-int8", {})
    return headline.headline(recipe, SMOKE, [deploy])


def test_the_serve_line_given_an_override_of_the_deployed_bundle_makes_that_bundle(tmp_path, monkeypatch):
    bundle = tmp_path / "smoke" / "bundle-cnn-int8"
    assert f"(in a checkout: make serve BUNDLE={bundle})" in deployed_by_override_lines(tmp_path, monkeypatch)[-4]


def test_the_container_line_given_an_override_of_the_deployed_bundle_bakes_that_bundle(tmp_path, monkeypatch):
    bundle = tmp_path / "smoke" / "bundle-cnn-int8"
    assert deployed_by_override_lines(tmp_path, monkeypatch)[-1] == (
        f"container: make image BAKE=1 BUNDLE={bundle}   (in a checkout)"
    )


def test_the_serve_line_run_outside_the_checkouts_top_folder_makes_the_bundle_by_its_absolute_path(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    recipe = smoke_with(tmp_path, monkeypatch)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", "runs")  # as the default: relative to the working directory
    publish(run_dir(recipe) / f"bundle-{recipe.export.deploy}", {})
    bundle = tmp_path / "runs" / "smoke" / f"bundle-{recipe.export.deploy}"
    assert f"(in a checkout: make serve BUNDLE={bundle})" in headline.headline(recipe, SMOKE)[-4]


def test_call_lines_of_a_pair_task_send_a_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    pairs = load_recipe(ROOT / "recipes" / "smoke.yaml", {"data.text_pair_column": "sentence2"})
    publish(run_dir(pairs) / f"bundle-{pairs.export.deploy}", {})
    assert (
        '           grpcurl -plaintext -d \'{"texts": ["<text>"], "text_pairs": ["<second text>"]}\' '
        "localhost:50051 edgedistill.v1.Classifier/Classify"
    ) in headline.headline(pairs, "recipes/smoke.yaml")


def test_the_headline_of_a_run_with_nothing_finished_is_an_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    assert headline.main([str(ROOT / "recipes" / "smoke.yaml")]) == 2
    assert "holds no finished stage of recipe 'smoke' yet" in capsys.readouterr().err


def test_the_report_of_a_run_with_nothing_finished_is_an_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    assert report_main.main([str(ROOT / "recipes" / "smoke.yaml")]) == 2
    assert "holds no finished stage of recipe 'smoke' yet" in capsys.readouterr().err


def test_an_override_of_a_section_the_headline_does_not_read_is_refused_naming_it(capsys):
    headline.main([str(ROOT / "recipes" / "smoke.yaml"), "--bench.serving.threads=4"])
    assert "error: --bench.serving.threads: edgedistill headline reads no bench.serving" in capsys.readouterr().err


def publish_bench(
    recipe,
    model: str,
    bundle_hash: str | None = None,
    timed_length: int = 64,
    bundle_parents: dict | None = None,
    lengths: tuple[int, ...] = (64,),
) -> None:
    """A one-thread model benchmark of bundle `model` alone at batch 1 and each of `lengths` tokens (length / 32 ms),
    timed at `timed_length` where shorter (its max_length: no speedup), it (built from `bundle_parents`) and the
    teacher published first; it records the bundle's manifest hash as `bundle_hash` where given (an earlier build),
    else as it is."""
    root = run_dir(recipe)
    publish(root / "teacher", {"dev_accuracy": 0.9})
    publish(root / f"bundle-{model}", {}, bundle_parents)
    bundle = mf.parent_of(root / f"bundle-{model}")
    parents = {
        "teacher": mf.parent_of(root / "teacher"),
        f"bundle-{model}": bundle.model_copy(update={"manifest_sha256": bundle_hash or bundle.manifest_sha256}),
    }
    cells = []
    for length in lengths:
        ms, timed = length / 32, min(length, timed_length)
        cells.append(
            {"median_ms": ms, "min_ms": ms, "max_ms": ms, "calls": 5, "batch": 1, "length": length}
            | {"timed_length": timed, "speedup": 3.0 if timed == length else None, "items_per_s": 1e3 / ms}
        )
    row = {"model": model, "precision": "int8", "runtime": "onnxruntime", "size_bytes": 2**20}
    bench = {"threads": 1, "rows": [row | {"dev_accuracy": 0.9, "cells": cells}]}
    folder = root / "bench"
    with mf.stage_folder(folder) as tmp:
        (tmp / "bench.json").write_text(json.dumps(bench))
        base = mf.Manifest(stage="bench", recipe="smoke", recipe_hash="h", config_hash="c", parents=parents)
        mf.commit(tmp, folder, base)


def bench_lines(recipe) -> list[str]:
    return [line for line in headline.headline(recipe, "recipes/smoke.yaml") if line.startswith("bench ")]


def test_the_bench_line_of_a_one_thread_benchmark_says_thread_in_the_singular(recipe):
    publish_bench(recipe, recipe.export.deploy)
    assert bench_lines(recipe)[0].endswith("= 3.0x teacher PyTorch eager (1 thread)")


def test_the_bench_line_quotes_the_cell_of_the_reports_accuracy_latency_figure(recipe):
    publish_bench(recipe, recipe.export.deploy, lengths=(16, 32))
    assert bench_lines(recipe)[0].startswith("bench bilstm-int8: 1.00 ms at batch 1, 32 tokens = ")


def test_no_bench_line_comes_from_an_earlier_build_of_the_deployed_bundle(recipe):
    publish_bench(recipe, recipe.export.deploy, bundle_hash="0" * 64)
    assert bench_lines(recipe) == []


def test_a_bench_row_of_an_earlier_build_of_the_deployed_bundle_is_named_with_the_command_to_time_it_again(recipe):
    publish_bench(recipe, recipe.export.deploy, bundle_hash="0" * 64)
    assert (
        "not shown: bench row bilstm-int8, its parent bundle-bilstm-int8 was built again "
        "(measure it again: edgedistill bench models recipes/smoke.yaml; in a checkout, make bench "
        "RECIPE=recipes/smoke.yaml)"
    ) in headline.headline(recipe, "recipes/smoke.yaml")


def benchmarked_before_its_student_was_distilled_again(recipe) -> list[str]:
    """The headline of a run whose deployed bundle, benchmarked, was exported from a student distilled again since."""
    student = run_dir(recipe) / "student-bilstm"
    publish(student, {"dev_accuracy": 0.8})
    publish_bench(recipe, recipe.export.deploy, bundle_parents={student.name: mf.parent_of(student)})
    publish(student, {"dev_accuracy": 0.85})
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_no_bench_line_comes_from_a_bundle_built_from_a_student_distilled_again_since(recipe):
    assert not [
        line for line in benchmarked_before_its_student_was_distilled_again(recipe) if line.startswith("bench ")
    ]


def test_a_bundle_built_from_a_student_distilled_again_since_is_named_with_the_command_to_build_it(recipe):
    assert (
        "not shown: bundle-bilstm-int8, its parent student-bilstm was built again "
        "(build it again: edgedistill bundles recipes/smoke.yaml; in a checkout, make bundles "
        "RECIPE=recipes/smoke.yaml)"
    ) in benchmarked_before_its_student_was_distilled_again(recipe)


def test_no_bench_line_comes_from_a_benchmark_of_an_earlier_build_of_the_teacher(recipe):
    publish_bench(recipe, recipe.export.deploy)
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.95})
    assert bench_lines(recipe) == []


def test_a_deployed_teacher_int8_has_one_bench_line(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--export.deploy=teacher-int8"]))
    publish_bench(recipe, "teacher-int8")
    assert bench_lines(recipe) == [
        "bench teacher-int8: 2.00 ms at batch 1, 64 tokens = 3.0x teacher PyTorch eager (1 thread)"
    ]


def test_the_bench_line_of_a_bundle_cut_to_its_max_length_gives_the_length_timed_and_no_speedup(recipe):
    publish_bench(recipe, recipe.export.deploy, timed_length=48)
    assert bench_lines(recipe) == [
        "bench bilstm-int8: 2.00 ms at batch 1, 48 tokens (its max_length, cut from 64: no speedup against the "
        "teacher at 64) (1 thread)"
    ]


def test_headline_gives_test_figures_after_dev_where_the_recipe_has_a_test_split(recipe):
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9, "test_accuracy": 0.95})
    assert headline.headline(recipe, "recipes/smoke.yaml")[0] == "teacher: dev accuracy 0.9000, test accuracy 0.9500"


def test_headline_gives_the_test_selection_metric_of_a_macro_f1_task(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", parse_overrides(["--data.metric=macro_f1"]))
    metrics = {"dev_accuracy": 0.9, "dev_macro_f1": 0.8, "test_accuracy": 0.95, "test_macro_f1": 0.85}
    publish(run_dir(recipe) / "teacher", metrics)
    assert headline.headline(recipe, "recipes/smoke.yaml")[0] == (
        "teacher: dev accuracy 0.9000, dev macro-F1 0.8000, test accuracy 0.9500, test macro-F1 0.8500"
    )


def test_headline_gives_the_f1_of_a_binary_task_selected_on_accuracy(recipe):
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9, "dev_macro_f1": 0.85, "dev_f1": 0.8})
    assert headline.headline(recipe, "recipes/smoke.yaml")[0] == "teacher: dev accuracy 0.9000, dev F1 0.8000"


def test_headline_gives_the_macro_f1_of_the_shipped_trec_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", "data")
    recipe = load_recipe(ROOT / "recipes" / "trec.yaml")
    publish(run_dir(recipe) / "teacher", {"dev_accuracy": 0.9, "dev_macro_f1": 0.8})
    assert headline.headline(recipe, "recipes/trec.yaml")[0] == "teacher: dev accuracy 0.9000, dev macro-F1 0.8000"


def publish_serving(folder, failures: int, targets: list[dict] = (), texts_file: str | None = None) -> None:
    """A serving benchmark's artifact of the run's bundle-bilstm-int8 (published with it) whose capacity phase failed
    `failures` calls, with the verdicts `targets`, on the dev split or `texts_file` (`--texts`)."""
    bundle = folder.parent / "bundle-bilstm-int8"
    publish(bundle, {})
    result = ServingResult(
        bundle={},
        settings={},
        options={"rate": 200},
        texts={"source": texts_file or "dev.tsv", "count": 3, "pairs": False},
        machine={},
        runs={"paced": [{"failures": 0}], "capacity": [{"failures": failures}]},
        summary={
            "paced": {"p99_ms": Spread.of([2.5]), "p99_from_due_ms": Spread.of([2.75])},
            "capacity": {"texts_per_s": Spread.of([1500])},
        },
        ratios={"capacity_vs_echo": 0.5, "capacity_vs_bare": 0.9},
        targets=list(targets),
        passed=all(target["passed"] for target in targets),
    )
    with mf.stage_folder(folder) as tmp:
        result.save(tmp, "")
        parents = {"bundle": mf.parent_of(bundle)}
        base = mf.Manifest(stage=folder.name, recipe="smoke", recipe_hash="h", config_hash="c", parents=parents)
        hashed = {"settings": {}, "extra": {"texts": texts_file and "sha256:0", "pairs": None}, "parents": {}}
        mf.commit(tmp, folder, base.model_copy(update={"hashed": hashed}))


def serving_line(recipe) -> str:
    return next(line for line in headline.headline(recipe, "recipes/smoke.yaml") if line.startswith("serving:"))


def test_the_serving_line_says_how_many_calls_of_the_benchmark_failed(recipe):
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=4)
    assert serving_line(recipe).endswith("; 4 calls failed")


def test_the_serving_line_gives_the_paced_p99_its_targets_read_from_the_due_time(recipe):
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=0)
    assert serving_line(recipe).startswith("serving: p99 2.75 ms from the due time at 200 calls/s; ")


def test_the_serving_line_of_a_benchmark_on_a_texts_file_names_it(recipe):
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=0, texts_file="short.txt")
    assert serving_line(recipe).endswith("; on 3 texts of short.txt, not the dev split")


def test_the_serving_line_of_a_benchmark_on_the_dev_split_names_no_texts(recipe):
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=0)
    assert "dev split" not in serving_line(recipe)


def test_the_serving_line_of_a_benchmark_without_failed_calls_names_none(recipe):
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=0)
    assert "failed" not in serving_line(recipe)


def test_the_serving_line_names_the_targets_the_benchmark_missed(recipe):
    targets = [
        slo.verdict("paced 200/s: p99_from_due_ms", 2.5, "<= 2", False),
        slo.verdict("capacity", 0.5, ">= 0.4", True),
    ]
    publish_serving(run_dir(recipe) / "serve-bench-bilstm-int8", failures=0, targets=targets)
    assert serving_line(recipe).endswith("; missed paced 200/s: p99_from_due_ms")


def publish_cascade_serving(recipe, failures: int = 0, earlier: bool = False) -> None:
    """The cascade benchmark of the run's bundle-bilstm-cascade (published with it) whose paced phase failed
    `failures` calls, measured on an `earlier` build of the cascade where asked."""
    root = run_dir(recipe)
    cascade = root / "bundle-bilstm-cascade"
    publish(cascade, {})
    spread = {"median": 1.0, "min": 1.0, "max": 1.0}
    result = {
        "names": {"cascade": "bilstm-cascade", "last": "teacher-fused"},
        "runs": {"cascade": {"capacity": [{"failures": 0}], "paced": [{"failures": failures}]}},
        "summary": {
            "cascade": {
                "capacity": {"texts_per_s": spread | {"median": 587.0}},
                "paced": {"p99_ms": spread | {"median": 4.5}, "p99_from_due_ms": spread | {"median": 4.69}},
            }
        },
        "capacity_ratio": 0.65,
        "options": {"rate": 200.0},
    }
    folder = root / "serve-cascade-bilstm-cascade"
    with mf.stage_folder(folder) as tmp:
        (tmp / headline.CASCADE_RESULT).write_text(json.dumps(result))
        parent = mf.parent_of(cascade)
        if earlier:
            parent = parent.model_copy(update={"manifest_sha256": "0" * 64})
        base = mf.Manifest(stage=folder.name, recipe="smoke", recipe_hash="h", config_hash="c")
        mf.commit(tmp, folder, base.model_copy(update={"parents": {"cascade": parent}}))


def deployed_cascade(tmp_path, monkeypatch):
    """The smoke recipe deploying its cascade bilstm-cascade, its runs folder under `tmp_path`."""
    return smoke_with(tmp_path, monkeypatch, "--export.deploy=bilstm-cascade")


def test_the_serving_line_of_a_deployed_cascade_gives_its_cascade_benchmarks_p99_and_capacity(tmp_path, monkeypatch):
    recipe = deployed_cascade(tmp_path, monkeypatch)
    publish_cascade_serving(recipe)
    assert serving_line(recipe) == (
        "serving: cascade bilstm-cascade, p99 4.69 ms from the due time at 200 calls/s; capacity 587 calls/s = 0.65 "
        "of its last member, teacher-fused, served alone"
    )


def test_the_serving_line_of_a_deployed_cascade_says_how_many_calls_of_its_benchmark_failed(tmp_path, monkeypatch):
    recipe = deployed_cascade(tmp_path, monkeypatch)
    publish_cascade_serving(recipe, failures=3)
    assert serving_line(recipe).endswith("; 3 calls failed")


def test_no_serving_line_comes_from_a_benchmark_of_an_earlier_build_of_the_deployed_cascade(tmp_path, monkeypatch):
    recipe = deployed_cascade(tmp_path, monkeypatch)
    publish_cascade_serving(recipe, earlier=True)
    assert not [line for line in headline.headline(recipe, "recipes/smoke.yaml") if line.startswith("serving")]


def test_a_benchmark_of_an_earlier_build_of_the_deployed_cascade_is_named_with_the_command_to_run_again(
    tmp_path, monkeypatch
):
    recipe = deployed_cascade(tmp_path, monkeypatch)
    publish_cascade_serving(recipe, earlier=True)
    assert (
        "not shown: serve-cascade-bilstm-cascade, its parent cascade was built again (measure it again: edgedistill "
        "bench cascade recipes/smoke.yaml --cascade bilstm-cascade; in a checkout, make serve-cascade "
        "CASCADE=bilstm-cascade RECIPE=recipes/smoke.yaml)"
    ) in headline.headline(recipe, "recipes/smoke.yaml")


@pytest.mark.parametrize("folder", ["serve-bench-cnn-int8", "serve-bench"])
def test_no_serving_line_comes_from_a_bundle_not_deployed_or_an_older_releases_folder(recipe, folder):
    publish_serving(run_dir(recipe) / folder, failures=0)
    assert not [line for line in headline.headline(recipe, "recipes/smoke.yaml") if line.startswith("serving")]


def measured_on_another_build(recipe) -> list[str]:
    """The headline of a run whose deployed bundle was built again after its steady load test passed."""
    root = run_dir(recipe)
    bundle = root / f"bundle-{recipe.export.deploy}"
    publish(bundle, {})
    folder = root / f"loadtest-steady-{recipe.export.deploy}"
    with mf.stage_folder(folder) as tmp:
        result = {"profile": "steady", "overall": {"requests": 10, "failures": 0, "p99_ms": 2.5}, "passed": True}
        (tmp / "summary.json").write_text(json.dumps(result))
        earlier = mf.Parent(path=str(bundle), manifest_sha256="0" * 64)
        base = mf.Manifest(
            stage=folder.name, recipe="smoke", recipe_hash="h", config_hash="c", parents={"bundle": earlier}
        )
        mf.commit(tmp, folder, base)
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_no_load_test_line_comes_from_an_earlier_build_of_the_deployed_bundle(recipe):
    assert not [line for line in measured_on_another_build(recipe) if line.startswith("load test steady")]


def test_a_load_test_of_an_earlier_build_of_the_deployed_bundle_is_named_with_the_command_to_run_again(recipe):
    assert (
        "not shown: loadtest-steady-bilstm-int8, its parent bundle was built again "
        "(measure it again: edgedistill loadtest recipes/smoke.yaml --profile steady; in a checkout, make loadtest "
        "PROFILE=steady RECIPE=recipes/smoke.yaml)"
    ) in measured_on_another_build(recipe)


TEACHER_SETTINGS = ("data", "model", "finetune")  # the teacher stage's (`distill.stages.teacher`)


def edited_recipe_headline(recipe) -> list[str]:
    """The headline of a smoke run whose teacher (dev accuracy 0.9125) and deployed student were built before the
    recipe's finetune.optim.lr was edited."""
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {"finetune.optim.lr": 0.002})
    metrics = {"dev_accuracy": 0.9125}
    Stage("teacher", built, TEACHER_SETTINGS, lambda _: Built(lambda f: (f / "w").write_text("w"), metrics)).run()
    root = run_dir(recipe)
    parents = {"teacher": mf.parent_of(root / "teacher")}
    publish(root / f"student-{recipe.distill.deploy}", {"dev_accuracy": 0.88, "retention": 0.88 / 0.9125}, parents)
    return headline.headline(recipe, "recipes/smoke.yaml")


def test_headline_gives_no_figures_of_a_teacher_built_with_other_settings(recipe):
    assert not any(line.startswith("teacher:") for line in edited_recipe_headline(recipe))


def test_headline_gives_no_figures_of_a_student_built_from_a_teacher_of_other_settings(recipe):
    assert not any(line.startswith("student ") for line in edited_recipe_headline(recipe))


def test_headline_names_a_teacher_built_with_other_settings_with_the_command_to_build_it(recipe):
    assert (
        "not shown: teacher, teacher was built with other finetune settings (finetune.optim.lr 0.002 -> 0.001) "
        "(build it again: edgedistill teacher recipes/smoke.yaml; in a checkout, make teacher "
        "RECIPE=recipes/smoke.yaml)"
    ) in edited_recipe_headline(recipe)


def edited_student_headline(recipe) -> list[str]:
    """The headline of a smoke run whose deployed student (dev accuracy 0.88) was distilled before the recipe's
    `distill.students.<it>.optim.lr` was edited from 0.002."""
    name = recipe.distill.deploy
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {f"distill.students.{name}.optim.lr": 0.002})
    stage = stages.student(built, name)
    publish(stage.folder, {"dev_accuracy": 0.88, "retention": 0.88 / 0.9}, built_as=stage)
    tabled(recipe)
    return headline.headline(recipe, "recipes/smoke.yaml")


def overridden_student_headline(tmp_path, monkeypatch) -> list[str]:
    """The headline, given `LR`, of a smoke run whose deployed student was distilled with the recipe's settings."""
    recipe = smoke_with(tmp_path, monkeypatch)
    stage = stages.student(recipe, recipe.distill.deploy)
    publish(stage.folder, {"dev_accuracy": 0.88, "retention": 0.88 / 0.9}, built_as=stage)
    return headline.headline(smoke_with(tmp_path, monkeypatch, LR), SMOKE, [LR])


def test_headline_given_overrides_names_the_command_that_builds_a_student_again_with_them(tmp_path, monkeypatch):
    [line] = [line for line in overridden_student_headline(tmp_path, monkeypatch) if "student-bilstm," in line]
    assert f"(build it again: edgedistill distill {SMOKE} --jobs 2 {LR}; " in line


def test_headline_given_overrides_gives_no_make_line_which_would_drop_them(tmp_path, monkeypatch):
    [line] = [line for line in overridden_student_headline(tmp_path, monkeypatch) if "student-bilstm," in line]
    assert line.endswith("; the same in a checkout, where make takes no recipe overrides)")


def test_headline_command_passes_its_overrides_to_the_commands_it_names(tmp_path, monkeypatch, capsys):
    overridden_student_headline(tmp_path, monkeypatch)
    headline.main([SMOKE, LR])
    assert f"edgedistill distill {SMOKE} --jobs 2 {LR};" in capsys.readouterr().out


def test_headline_gives_no_figures_of_a_student_distilled_before_its_settings_were_edited(recipe):
    assert not any(line.startswith("student ") for line in edited_student_headline(recipe))


def test_headline_names_a_student_distilled_before_its_settings_were_edited_with_the_command_to_distil_it(recipe):
    assert (
        "not shown: student-bilstm, student-bilstm was built with other optim settings (optim.lr 0.002 -> 0.003) "
        "(build it again: edgedistill distill recipes/smoke.yaml --jobs 2; in a checkout, make distill "
        "RECIPE=recipes/smoke.yaml)"
    ) in edited_student_headline(recipe)


def test_headline_names_a_teacher_whose_data_file_is_gone_with_the_file(recipe, tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood\t1\n")
    smoke = load_recipe(ROOT / "recipes" / "smoke.yaml")
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {"data.train": str(train), "data.dev": smoke.data.dev})
    Stage("teacher", built, TEACHER_SETTINGS, lambda _: Built(lambda f: (f / "w").write_text("w"), {})).run()
    train.unlink()
    teacher_lines = [line for line in headline.headline(built, "x.yaml") if line.startswith("not shown: teacher,")]
    assert f"data.train: {train} not found" in teacher_lines[0]


def test_headline_given_the_settings_a_teacher_was_built_with_shows_its_figures(recipe, capsys):
    edited_recipe_headline(recipe)
    headline.main([str(ROOT / "recipes" / "smoke.yaml"), "--finetune.optim.lr=0.002"])
    assert "teacher: dev accuracy 0.9125" in capsys.readouterr().out


def test_headline_reads_no_labels_of_a_teacher_built_with_other_settings(recipe):
    """A teacher of three labels that predicts the third for every dev example, built before the recipe's labels
    were cut to two."""
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {"data.label_names": ["negative", "positive", "mixed"]})
    metrics = {"dev_accuracy": 0.5, "dev_confusion": [[0, 0, 5], [0, 0, 5], [0, 0, 0]]}
    Stage("teacher", built, TEACHER_SETTINGS, lambda _: Built(lambda f: (f / "w").write_text("w"), metrics)).run()
    publish(run_dir(recipe) / f"student-{recipe.distill.deploy}", {"dev_accuracy": 0.88, "retention": 1.76})
    tabled(recipe)
    assert headline.headline(recipe, "recipes/smoke.yaml")[0].startswith(f"student {recipe.distill.deploy}:")
