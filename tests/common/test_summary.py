"""The distillation table's file: its rows, and whether they are still of the artifacts in the run."""

import json

from edgedistill.common import manifest as mf
from edgedistill.common import summary

ROWS = [{"student": "teacher", "dev_accuracy": 0.9}, {"student": "cnn", "dev_accuracy": 0.85}]


def publish(folder, accuracy: float = 0.85, confusion: list[list[int]] | None = None) -> None:
    with mf.stage_folder(folder) as tmp:
        metrics = {"dev_accuracy": accuracy} | ({"dev_confusion": confusion} if confusion else {})
        mf.commit(
            tmp, folder, mf.Manifest(stage=folder.name, recipe="r", recipe_hash="h", config_hash="h", metrics=metrics)
        )


def written(tmp_path, *folders: str):
    """The run folder `tmp_path` with the artifacts `folders`, the table of ROWS written from them."""
    for folder in folders:
        publish(tmp_path / folder)
    summary.write(tmp_path, ROWS)
    return tmp_path


def test_the_file_records_each_rows_manifests_and_none_where_a_folder_has_none(tmp_path):
    root = written(tmp_path, "teacher", "student-cnn")
    recorded = json.loads((root / summary.FILE).read_text())[1][summary.DRAWN_FROM]
    assert recorded == {"student-cnn": mf.sha256_file(root / "student-cnn" / mf.MANIFEST), "baseline-cnn": None}


def test_the_rows_load_as_written_without_their_manifests(tmp_path):
    assert summary.load(written(tmp_path, "teacher", "student-cnn")) == ROWS


def test_a_run_without_a_table_loads_none(tmp_path):
    assert summary.load(tmp_path) is None


def test_a_table_of_the_artifacts_now_in_the_run_is_current(tmp_path):
    assert summary.change(written(tmp_path, "teacher", "student-cnn")) is None


def test_a_table_older_than_a_student_built_again_names_it(tmp_path):
    root = written(tmp_path, "teacher", "student-cnn")
    publish(root / "student-cnn", accuracy=0.87)
    assert summary.change(root) == "student-cnn was built again"


def test_a_table_older_than_the_teacher_built_again_names_it(tmp_path):
    root = written(tmp_path, "teacher", "student-cnn")
    publish(root / "teacher", accuracy=0.95)
    assert summary.change(root) == "teacher was built again"


def test_a_table_older_than_a_baseline_built_since_names_it(tmp_path):
    root = written(tmp_path, "teacher", "student-cnn")
    publish(root / "baseline-cnn")
    assert summary.change(root) == "baseline-cnn was built since"


def test_a_table_of_a_student_gone_since_names_it(tmp_path):
    root = written(tmp_path, "teacher", "student-cnn")
    (root / "student-cnn" / mf.MANIFEST).unlink()
    assert summary.change(root) == "student-cnn is gone"


def test_a_rows_out_of_date_kinds_are_those_it_marks():
    assert summary.out_of_date({"student": "cnn", "out_of_date": "student, baseline"}) == ["student", "baseline"]


ONE_LABEL = [[5, 0], [4, 0]]  # the first label for all 9 dev examples
TWO_LABELS = [[5, 0], [1, 3]]


def test_the_one_label_note_names_the_models_that_predict_one_label(tmp_path):
    publish(tmp_path / "teacher", confusion=ONE_LABEL)
    publish(tmp_path / "student-cnn", confusion=TWO_LABELS)
    publish(tmp_path / "baseline-cnn", confusion=ONE_LABEL)
    assert summary.one_label_note(tmp_path, ROWS).startswith(
        "one label: teacher, baseline-cnn predict one label for every dev example"
    )


def test_no_one_label_note_where_every_model_predicts_several(tmp_path):
    publish(tmp_path / "teacher", confusion=TWO_LABELS)
    publish(tmp_path / "student-cnn", confusion=TWO_LABELS)
    assert summary.one_label_note(tmp_path, ROWS) is None


def test_the_one_label_note_leaves_out_a_model_the_table_marks_out_of_date(tmp_path):
    publish(tmp_path / "teacher", confusion=TWO_LABELS)
    publish(tmp_path / "student-cnn", confusion=ONE_LABEL)
    rows = [ROWS[0], ROWS[1] | {"out_of_date": "student"}]
    assert summary.one_label_note(tmp_path, rows) is None
