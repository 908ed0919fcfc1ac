"""A run whose models learn one label (trained on the negative reviews alone): each stage warns of it before its
summary line, and the headline gives no retention."""

import subprocess
from pathlib import Path

import pytest
from edgedistill.common import settings
from edgedistill.common.recipe import load_recipe, parse_overrides
from edgedistill.report import headline

from tests.conftest import ROOT, environ, run_module
from tests.distill.bert_init import tiny_bert

pytestmark = pytest.mark.slow
SMOKE = ROOT / "recipes" / "smoke.yaml"
WARNING = "warning: it predicts 'negative' for all 300 dev examples, which hold 2 labels"


@pytest.fixture(scope="module")
def one_label_run(tmp_path_factory) -> tuple[list[str], Path, list[str]]:
    """What the teacher, transfer and distill (the CNN alone) stages printed, line by line, the runs folder, and the
    overrides: a tiny BERT fine-tuned on 64 negative SST-2 reviews, and a CNN student (and baseline) that learns from
    those reviews' labels alone, at a learning rate high enough that its first step already predicts the one label."""
    scratch = tmp_path_factory.mktemp("one-label")
    header, *rows = (Path(settings.defaults()["EDGEDISTILL_DATA_DIR"]) / "sst2" / "train.tsv").read_text().splitlines()
    negative = [row for row in rows if row.endswith("\t0")][:64]
    (scratch / "negative.tsv").write_text("\n".join([header, *negative]) + "\n")
    overrides = [
        "--pretrain=null",
        f"--model.init={tiny_bert(scratch / 'init', num_labels=2)}",
        f"--data.train={scratch / 'negative.tsv'}",
        f"--data.dev={Path(settings.defaults()['EDGEDISTILL_DATA_DIR']) / 'sst2' / 'dev.tsv'}",  # the task's own
        "--finetune.optim.max_steps=8",
        "--finetune.optim.lr=3e-3",
        "--transfer.max_unlabelled=300",
        "--transfer.max_augmented=300",
        "--distill.students.cnn.optim.lr=0.1",
        "--distill.students.cnn.losses.mse=0",  # its gold labels alone, every one negative
        "--distill.students.cnn.losses.ce=1",
        "--distill.students.transformer.init_from_teacher=false",  # a tiny BERT's layers are narrower than it
        "--distill.students.transformer.baseline_init_from_teacher=false",
    ]
    said = []
    for stage, extra in (("finetune", []), ("transfer", []), ("distill", ["--only", "cnn"])):
        result: subprocess.CompletedProcess = run_module(
            "distill", scratch / "runs", stage, str(SMOKE), *overrides, *extra
        )
        assert result.returncode == 0, result.stderr[-3000:]
        said += result.stdout.splitlines()
    return said, scratch / "runs", overrides


@pytest.mark.parametrize("model", ["teacher", "student-cnn", "baseline-cnn"])
def test_a_model_that_learnt_one_label_is_warned_of_right_before_its_summary_line(one_label_run, model):
    said, _, _ = one_label_run
    warned = [i for i, line in enumerate(said) if line.startswith(f"[{model}] {WARNING}")]
    assert [said[i + 1].split(" dev_f1=")[0] for i in warned] == [f"[{model}] dev_accuracy=0.4833"]


def test_the_headline_of_a_student_that_learnt_one_label_gives_no_retention(one_label_run):
    _, runs, overrides = one_label_run
    with environ({"EDGEDISTILL_RUNS_DIR": str(runs)}):
        recipe = load_recipe(SMOKE, parse_overrides([*overrides, "--distill.deploy=cnn", "--export=null"]))
        lines = headline.headline(recipe, str(SMOKE))
    assert "student cnn: dev accuracy 0.4833, dev F1 0.0000 (it predicts 'negative'" in "\n".join(lines)


def test_the_distillation_table_is_followed_by_a_note_naming_the_models_that_learnt_one_label(one_label_run):
    said, _, _ = one_label_run
    assert "one label: teacher, student-cnn, baseline-cnn predict one label for every dev example" in "\n".join(said)


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        ("teacher", "finetune.optim.max_steps"),  # the fixture's teacher trains for max_steps: epochs is not read
        ("student-cnn", "distill.students.cnn.optim.epochs"),
        ("baseline-cnn", "distill.students.cnn.optim.epochs"),
    ],
)
def test_the_one_label_warning_names_the_step_budget_its_model_trained_for(one_label_run, model, budget):
    said, _, _ = one_label_run
    warning = next(line for line in said if line.startswith(f"[{model}] {WARNING}"))
    assert f"train it longer ({budget}, " in warning
