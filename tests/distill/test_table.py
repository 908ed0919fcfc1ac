"""The distillation table on the recipe's metric, from manifests published into a temporary EDGEDISTILL_RUNS_DIR."""

import json

import pytest
from edgedistill.common import manifest as mf
from edgedistill.common import summary
from edgedistill.common.recipe import load_recipe, parse_overrides, run_dir
from edgedistill.distill import stages, table

RECIPE = """
data: {train: a.tsv, dev: b.tsv, label_names: [ABBR, DESC, ENTY, HUM, LOC, NUM]%s}
model: {init: some/model}
transfer: {unlabelled_files: [u.txt]}
distill:
  deploy: cnn
  students:
    cnn: {model: {arch: cnn}}
    bilstm: {model: {arch: bilstm}}
"""
SIZES = {"params": 1000, "size_bytes": 2**20, "wall_seconds": 60.0}


def publish(stage, metrics=None, info=None, config_hash=None):
    """`stage`'s artifact as its build would publish it, from its parents now (under `config_hash`, when given,
    instead of the stage's own)."""
    with mf.stage_folder(stage.folder) as tmp:
        (tmp / "result.json").write_text("{}")
        base = mf.Manifest(
            stage=stage.name,
            recipe="trec",
            recipe_hash="h",
            config_hash=config_hash or stage.config_hash,
            hashed=stage.hashed,
            parents={name: mf.parent_of(folder) for name, folder in stage.parent_folders.items()},
            metrics=metrics or {},
        )
        mf.commit(tmp, stage.folder, base.model_copy(update={"info": info or {}}))


def publish_teacher(recipe, accuracy=0.9, macro_f1=0.8):
    publish(stages.teacher(recipe), SIZES | {"dev_accuracy": accuracy, "dev_macro_f1": macro_f1})


@pytest.fixture
def trec(tmp_path):
    """A six-label recipe selecting on `data` (the text after the label names), with a finished teacher, transfer
    set, cnn student and its baseline (the bilstm has not run), each current."""

    def make(data: str = "", test: bool = False):
        path = tmp_path / "trec.yaml"
        path.write_text(RECIPE % data)
        recipe = load_recipe(path)
        publish_teacher(recipe)
        publish(stages.transfer(recipe))
        for baseline, (accuracy, macro_f1) in ((False, (0.85, 0.6)), (True, (0.8, 0.4))):
            metrics = SIZES | {"dev_accuracy": accuracy, "dev_macro_f1": macro_f1}
            if test:
                metrics |= {"test_accuracy": accuracy - 0.1, "test_macro_f1": macro_f1 - 0.1}
            publish(stages.student(recipe, "cnn", baseline), metrics, {"arch": "cnn"})
        return recipe

    return make


def test_an_accuracy_recipe_of_six_labels_shows_dev_accuracy_and_macro_f1(trec):
    columns = list(table.rows(trec())[0])
    assert columns == [
        "student",
        "arch",
        "params",
        "size_MiB",
        "dev_accuracy",
        "dev_macro_f1",
        "retention",
        "baseline",
        "baseline_from",
        "gain",
        "wall_min",
    ]


def test_baseline_from_says_where_the_baseline_started(trec):
    assert table.rows(trec())[1]["baseline_from"] == "scratch"


def test_macro_f1_recipe_adds_its_column(trec):
    assert "dev_macro_f1" in table.rows(trec(", metric: macro_f1"))[0]


def test_retention_compares_the_selection_metric(trec):
    assert table.rows(trec(", metric: macro_f1"))[1]["retention"] == pytest.approx(0.6 / 0.8, abs=1e-4)


def test_gain_compares_the_selection_metric(trec):
    assert table.rows(trec(", metric: macro_f1"))[1]["gain"] == pytest.approx(0.2, abs=1e-4)


def test_baseline_is_the_selection_metric(trec):
    assert table.rows(trec(", metric: macro_f1"))[1]["baseline"] == pytest.approx(0.4)


def test_accuracy_recipe_compares_accuracy(trec):
    assert table.rows(trec())[1]["gain"] == pytest.approx(0.05, abs=1e-4)


def test_a_test_column_appears_when_manifests_carry_test_metrics(trec):
    assert table.rows(trec(test=True))[1]["test_accuracy"] == pytest.approx(0.75)


def test_test_columns_follow_the_selection_metric(trec):
    assert table.rows(trec(", metric: macro_f1", test=True))[1]["test_macro_f1"] == pytest.approx(0.5)


def test_no_test_column_without_test_metrics(trec):
    assert "test_accuracy" not in table.rows(trec())[0]


def test_students_that_have_not_run_are_left_out(trec):
    assert [row["student"] for row in table.rows(trec())] == ["teacher", "cnn"]


def test_the_markdown_names_the_selection_metric(trec):
    recipe = trec(", metric: macro_f1")
    table.write(recipe)
    text = (run_dir(recipe) / "distill-summary.md").read_text()
    assert "Checkpoints are selected on dev_macro_f1; retention, baseline and gain compare dev_macro_f1." in text


def test_the_printed_title_names_the_recipe_and_the_selection_metric(trec, capsys):
    table.write(trec(", metric: macro_f1"))
    assert "distillation: trec (selected on dev_macro_f1)" in capsys.readouterr().out


def test_the_json_rows_keep_the_column_order(trec):
    recipe = trec(", metric: macro_f1", test=True)
    table.write(recipe)
    rows = json.loads((run_dir(recipe) / "distill-summary.json").read_text())
    assert list(rows[0])[4:8] == ["dev_accuracy", "dev_macro_f1", "test_accuracy", "test_macro_f1"]


def test_the_table_of_unchanged_stages_leaves_its_files_as_they_are(trec):
    recipe = trec()
    table.write(recipe)
    summary = run_dir(recipe) / "distill-summary.md"
    before = summary.stat().st_ino
    table.write(recipe)
    assert summary.stat().st_ino == before


def test_a_baseline_built_from_other_settings_is_not_reported(trec):
    recipe = trec()
    publish(stages.student(recipe, "cnn", baseline=True), SIZES | {"dev_accuracy": 0.8}, config_hash="older")
    assert table.rows(recipe)[1]["baseline"] is None


def test_no_gain_is_reported_against_a_baseline_built_from_other_settings(trec):
    recipe = trec()
    publish(stages.student(recipe, "cnn", baseline=True), SIZES | {"dev_accuracy": 0.8}, config_hash="older")
    assert table.rows(recipe)[1]["gain"] is None


def test_a_baseline_built_from_other_settings_is_marked_out_of_date(trec):
    recipe = trec()
    publish(stages.student(recipe, "cnn", baseline=True), SIZES | {"dev_accuracy": 0.8}, config_hash="older")
    assert table.rows(recipe)[1]["out_of_date"] == "baseline"


def test_no_retention_is_reported_for_a_student_of_a_teacher_built_again(trec):
    recipe = trec()
    publish_teacher(recipe, accuracy=0.95)
    assert table.rows(recipe)[1]["retention"] is None


def test_a_student_of_a_teacher_built_again_is_marked_out_of_date(trec):
    recipe = trec()
    publish_teacher(recipe, accuracy=0.95)
    assert table.rows(recipe)[1]["out_of_date"] == "student, baseline"


def test_a_table_of_current_stages_has_no_out_of_date_column(trec):
    assert "out_of_date" not in table.rows(trec())[0]


def test_the_markdown_says_which_command_rebuilds_what_is_out_of_date(trec):
    recipe = trec()
    publish_teacher(recipe, accuracy=0.95)
    table.write(recipe)
    assert "`edgedistill distill RECIPE --only cnn` rebuilds" in (run_dir(recipe) / "distill-summary.md").read_text()


def test_the_command_rebuilding_what_is_out_of_date_carries_the_overrides_the_table_was_written_with(trec, tmp_path):
    trec()  # its student and baseline built without the override: a student built with it leaves the baseline stale
    given = ["--distill.students.cnn.optim.max_steps=6"]
    recipe = load_recipe(tmp_path / "trec.yaml", parse_overrides(given))
    publish(stages.student(recipe, "cnn", baseline=False), SIZES | {"dev_accuracy": 0.85}, {"arch": "cnn"})
    table.write(recipe, given)
    expected = "`edgedistill distill RECIPE --only cnn --distill.students.cnn.optim.max_steps=6` rebuilds"
    assert expected in (run_dir(recipe) / "distill-summary.md").read_text()


def test_the_json_records_the_teachers_manifest_its_row_was_drawn_from(trec):
    recipe = trec()
    table.write(recipe)
    folder = run_dir(recipe)
    rows = json.loads((folder / summary.FILE).read_text())
    assert rows[0][summary.DRAWN_FROM] == {"teacher": mf.sha256_file(folder / "teacher" / mf.MANIFEST)}
