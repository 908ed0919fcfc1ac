import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.distill import __main__ as distill_main
from edgedistill.distill import device, pipeline, stages
from edgedistill.distill.dist import CollectiveTimeout
from edgedistill.distill.students import ARCHITECTURES

from tests.conftest import ROOT, loaded_by
from tests.distill import extension
from tests.pair_task import pair_recipe, write_pair_task
from tests.roberta_init import write_roberta

KINDS = ("student", "baseline")
SMOKE = ROOT / "recipes" / "smoke.yaml"


@pytest.mark.parametrize("stage", ["transfer", "distill"])
def test_a_student_class_that_breaks_the_contract_stops_the_run_before_the_transfer_set(monkeypatch, capsys, stage):
    monkeypatch.setitem(ARCHITECTURES, "cnn", extension.TwoArguments)
    assert distill_main.main([stage, str(ROOT / "recipes" / "smoke.yaml")]) == 2
    assert "error: distill.students.cnn: TwoArguments.forward must take" in capsys.readouterr().err
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke" / "transfer").exists()


@pytest.mark.parametrize("stage", ["teacher", "pretrain", "finetune"])
def test_a_student_the_distill_stage_would_refuse_is_warned_of_before_the_teacher_trains(monkeypatch, capsys, stage):
    monkeypatch.setitem(ARCHITECTURES, "cnn", extension.TwoArguments)
    before_training = []
    monkeypatch.setattr(pipeline, "_teacher", lambda *args: before_training.append(capsys.readouterr().out))
    distill_main.main([stage, str(ROOT / "recipes" / "smoke.yaml")])
    assert "[teacher] warning: distill.students.cnn: TwoArguments.forward must take" in before_training[0]


def test_the_warning_of_a_refused_student_names_the_transfer_stage_which_stops_on_it_first(monkeypatch, capsys):
    monkeypatch.setitem(ARCHITECTURES, "cnn", extension.TwoArguments)
    monkeypatch.setattr(pipeline, "_teacher", lambda *args: None)
    distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml")])
    assert "the transfer and distill stages will stop on it" in capsys.readouterr().out


def test_a_transfer_length_past_a_scratch_teachers_positions_is_warned_of_before_it_trains(monkeypatch, capsys):
    before_training = []
    monkeypatch.setattr(pipeline, "_teacher", lambda *args: before_training.append(capsys.readouterr().out))
    distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml"), "--transfer.max_length=600"])
    assert (
        "[teacher] warning: transfer.max_length=600, but a teacher built from scratch has 512 positions"
        in (before_training[0])
    )


def test_a_transfer_length_past_the_inits_positions_is_warned_of_before_the_teacher_trains(monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "_teacher", lambda *args: None)
    init = load_recipe(ROOT / "recipes" / "sst2.yaml").model.init  # the shared MiniLM, 512 positions
    distill_main.main(
        ["teacher", str(ROOT / "recipes" / "smoke.yaml"), f"--model.init={init}", "--transfer.max_length=600"]
    )
    assert "transfer.max_length=600, but " in capsys.readouterr().out


def runtime_line_on_a_native_bf16_cpu(monkeypatch, capsys, *args: str) -> str:
    """The `[runtime]` line `python -m distill *args` prints on a CPU that computes bf16 natively, building nothing."""
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    monkeypatch.setattr(pipeline, "_transfer_and_students", lambda *_: None)
    distill_main.main([*args, "--runtime.device=cpu"])
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("[runtime] "))


def test_the_runtime_line_of_the_transfer_stage_names_the_precision_it_labels_in(monkeypatch, capsys):
    assert ", bf16, " in runtime_line_on_a_native_bf16_cpu(monkeypatch, capsys, "transfer", str(SMOKE))


def test_the_runtime_line_of_a_transfer_stage_an_fp32_labeller_labels_names_fp32(monkeypatch, capsys):
    labeller = "--transfer.labeller=teacher-fused"
    assert ", fp32, " in runtime_line_on_a_native_bf16_cpu(monkeypatch, capsys, "transfer", str(SMOKE), labeller)


def test_the_runtime_line_of_distill_names_the_precision_that_labels_the_transfer_set_beside_trainings(
    monkeypatch, capsys
):
    line = runtime_line_on_a_native_bf16_cpu(monkeypatch, capsys, "distill", str(SMOKE))
    assert ", fp32 (bf16 to label the transfer set), " in line


GAVE_UP = "rank 1 waited 5 s (runtime.collective_timeout_s) for rank 0 to evaluate, and gave up: ..."


def _gave_up(*args):
    raise CollectiveTimeout(GAVE_UP)


def test_a_rank_that_gave_up_waiting_for_rank_0_ends_the_command_with_status_2(monkeypatch):
    monkeypatch.setattr(pipeline, "_teacher", _gave_up)
    assert distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml")]) == 2


def test_a_rank_that_gave_up_waiting_for_rank_0_says_so_in_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "_teacher", _gave_up)
    distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml")])
    assert capsys.readouterr().err == f"error: {GAVE_UP}\n"


def test_an_unknown_student_given_to_only_lists_the_students(capsys):
    assert distill_main.main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--only", "cnnn"]) == 2
    assert f"--only cnnn: not in distill.students of {SMOKE} (bilstm, cnn, transformer)" in capsys.readouterr().err


def test_an_unknown_student_given_to_only_is_answered_with_the_nearest_student():
    with pytest.raises(RecipeError, match=r"\): did you mean cnn\?$"):
        stages.students(load_recipe(SMOKE), str(SMOKE), ["cnnn"], baselines=True)


def test_students_given_to_only_joined_by_a_comma_are_told_to_be_given_one_each_time():
    with pytest.raises(RecipeError, match=r"--only takes one name each time: --only cnn --only bilstmm$"):
        stages.students(load_recipe(SMOKE), str(SMOKE), ["cnn,bilstmm"], baselines=True)


def test_a_student_given_twice_to_only_trains_once(monkeypatch):
    built = []
    up_to_date = SimpleNamespace(run=lambda force=False: None, parents=())
    monkeypatch.setattr(stages, "transfer", lambda recipe: up_to_date)
    monkeypatch.setattr(pipeline.dist, "run_stage", lambda stage, force: built.append(stage.name))
    monkeypatch.setattr(pipeline.table, "write", lambda recipe, overrides: None)
    distill_main.main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--only", "cnn", "--only", "cnn", "--force"])
    assert built == ["student-cnn", "baseline-cnn"]


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_below_one_is_a_usage_error(capsys, jobs):
    with pytest.raises(SystemExit) as exited:
        distill_main.main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--jobs", jobs])
    assert exited.value.code == 2


def test_jobs_below_one_says_it_must_be_at_least_1(capsys):
    with pytest.raises(SystemExit):
        distill_main.main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--jobs", "0"])
    assert "argument --jobs: must be at least 1, got 0" in capsys.readouterr().err


def test_jobs_under_torchrun_are_refused_naming_both(monkeypatch, capsys):
    monkeypatch.setattr(pipeline.dist, "world_size", lambda: 2)  # as under torchrun --nproc_per_node=2
    assert distill_main.main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--jobs", "2"]) == 2
    assert "--jobs 2 trains students in parallel processes of one launch, and torchrun" in capsys.readouterr().err


def test_a_pair_task_whose_init_tokenizer_marks_no_boundary_between_the_texts_stops_before_pretraining(
    tmp_path, capsys
):
    paths = write_pair_task(tmp_path / "data", train=200, dev=50, unlabelled=300)
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(pair_recipe(paths))
    texts = paths["unlabelled"].read_text().splitlines()
    init = write_roberta(tmp_path / "roberta", texts, separated=False)
    assert distill_main.main(["teacher", str(recipe), f"--model.init={init}"]) == 2
    assert f"error: {init}: its tokenizer does not mark sentence B" in capsys.readouterr().err
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "pairs" / "pretrain").exists()


@pytest.mark.parametrize(
    "stage, folder, skipped", [("teacher", "pretrain", []), ("finetune", "teacher", ["--pretrain=null"])]
)
def test_a_roberta_teacher_with_fused_teacher_bundles_is_refused_before_it_trains(
    tmp_path, capsys, data_dir, stage, folder, skipped
):
    texts = (data_dir / "unlabeled" / "movie_reviews.txt").read_text(encoding="utf-8").splitlines()[:300]
    init = write_roberta(tmp_path / "roberta", texts)
    # smoke's teacher-fused, teacher-int8 and teacher-cuda-fp16 fuse (the default); teacher-onnx does not
    assert distill_main.main([stage, str(ROOT / "recipes" / "smoke.yaml"), f"--model.init={init}", *skipped]) == 2
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke" / folder).exists()


def test_a_roberta_teacher_with_fused_teacher_bundles_is_refused_naming_those_bundles_and_its_type(
    tmp_path, capsys, data_dir
):
    texts = (data_dir / "unlabeled" / "movie_reviews.txt").read_text(encoding="utf-8").splitlines()[:300]
    init = write_roberta(tmp_path / "roberta", texts)
    distill_main.main(["finetune", str(ROOT / "recipes" / "smoke.yaml"), f"--model.init={init}", "--pretrain=null"])
    assert capsys.readouterr().err.startswith(
        "error: export.bundles teacher-fused, teacher-int8, teacher-cuda-fp16: fused: true (the default), but ONNX "
        f"Runtime's BERT fusions cannot fully fuse {init}, a roberta"
    )


def test_reinit_layers_beyond_the_teachers_layers_is_refused_before_it_pretrains():
    # smoke's teacher has 2 layers and pretrains first
    assert distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml"), "--finetune.reinit_layers=3"]) == 2
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke" / "pretrain").exists()


def test_reinit_layers_refused_by_the_pretrain_stage_names_the_setting(capsys):
    distill_main.main(["pretrain", str(ROOT / "recipes" / "smoke.yaml"), "--finetune.reinit_layers=3"])
    assert "error: finetune.reinit_layers=3, but the model has 2 layers" in capsys.readouterr().err


def test_an_override_of_a_section_the_teacher_does_not_read_is_refused_naming_it(capsys):
    distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml"), "--bench.serving.threads=4"])
    assert "error: --bench.serving.threads: python -m distill teacher reads no bench.serving" in capsys.readouterr().err


def test_an_override_of_a_section_the_teacher_does_not_read_is_refused_before_it_pretrains():
    distill_main.main(["teacher", str(ROOT / "recipes" / "smoke.yaml"), "--bench.serving.threads=4"])
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke" / "pretrain").exists()


@pytest.fixture
def built_run(smoke_run, tmp_path) -> Path:
    """A copy of the smoke run (teacher, transfer set, students): a runs folder whose training stages are current."""
    shutil.copytree(smoke_run, tmp_path / "smoke")
    return tmp_path


@pytest.fixture(scope="module")
def run_on_current(smoke_run, tmp_path_factory):
    """`run_on_current(command) -> (result, modules loaded)`: `loaded_by("distill", runs, command, smoke.yaml)` on a
    copy of the smoke run of its own (as `built_run`), run once for the module's tests that read it."""
    said = {}

    def run(command: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        if command not in said:
            runs = tmp_path_factory.mktemp(f"current-{command}")
            shutil.copytree(smoke_run, runs / "smoke")
            said[command] = loaded_by("distill", runs, command, ROOT / "recipes" / "smoke.yaml")
        return said[command]

    return run


@pytest.mark.parametrize("command", ["pretrain", "finetune", "teacher", "transfer", "distill"])
def test_a_command_whose_stages_are_current_loads_neither_torch_nor_transformers(run_on_current, command):
    result, loaded = run_on_current(command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert loaded == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU honours runtime.device=cuda")
def test_a_command_whose_stages_are_current_refuses_cuda_on_a_machine_without_one(built_run):
    result, _ = loaded_by("distill", built_run, "teacher", ROOT / "recipes" / "smoke.yaml", "--runtime.device=cuda")
    assert "error: runtime.device=cuda but no CUDA device visible to PyTorch" in result.stderr


@pytest.mark.parametrize(
    ("command", "stages_said"),
    [
        ("teacher", ["pretrain", "teacher"]),
        ("transfer", ["transfer"]),
        ("distill", ["transfer", *(f"{kind}-{name}" for name in ("bilstm", "cnn", "transformer") for kind in KINDS)]),
    ],
)
def test_a_command_whose_stages_are_current_says_each_is_up_to_date(run_on_current, command, stages_said):
    result, _ = run_on_current(command)
    said = [line.split("]")[0][1:] for line in result.stdout.splitlines() if " up to date: " in line]
    assert said == stages_said


def test_distill_whose_stages_are_current_prints_the_table(run_on_current):
    result, _ = run_on_current("distill")
    assert "distillation: smoke" in result.stdout


@pytest.fixture(scope="module")
def one_stale(smoke_run, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`distill --only cnn` on a copy of the smoke run without its baseline-cnn: what it did, and the runs folder."""
    runs = tmp_path_factory.mktemp("one-stale")
    shutil.copytree(smoke_run, runs / "smoke", ignore=shutil.ignore_patterns("baseline-cnn"))
    result, _ = loaded_by("distill", runs, "distill", ROOT / "recipes" / "smoke.yaml", "--only", "cnn")
    assert result.returncode == 0, result.stderr[-3000:]
    return result, runs


def test_a_command_with_a_stage_to_build_builds_it(one_stale):
    assert (one_stale[1] / "smoke" / "baseline-cnn" / "manifest.json").is_file()


def test_a_command_with_a_stage_to_build_says_once_that_each_other_is_up_to_date(one_stale):
    assert one_stale[0].stdout.count("[student-cnn] up to date") == 1


def test_a_checkpoint_file_as_model_init_is_refused_as_no_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RecipeError, match="is a file, not a checkpoint folder"):
        pipeline._require_checkpoint(str(tmp_path / "config.json"))


def test_a_folder_without_config_as_model_init_is_refused_naming_what_it_holds(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\n")
    with pytest.raises(RecipeError, match=r"holds no checkpoint \(no config.json; it holds train.csv\)"):
        pipeline._require_checkpoint(str(tmp_path))


def test_a_folder_with_config_but_no_weights_as_model_init_is_refused_naming_the_weight_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RecipeError, match=r"holds no weights \(none of model\.safetensors, .*\), only config\.json"):
        pipeline._require_checkpoint(str(tmp_path))


@pytest.mark.parametrize("weights", pipeline.WEIGHT_FILES)
def test_a_checkpoint_folder_as_model_init_is_taken(tmp_path, weights):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / weights).write_bytes(b"")
    assert pipeline._require_checkpoint(str(tmp_path)) is None


def test_a_hub_name_as_model_init_is_left_to_the_loader():
    assert pipeline._require_checkpoint("org/no-such-folder-here") is None


def test_an_init_whose_config_cannot_be_read_is_left_to_fine_tuning_by_the_positions_warning(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")  # no model_type: transformers raises ValueError
    pipeline._warn_positions(load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(tmp_path)}))
    assert capsys.readouterr().out == ""


def test_a_cascade_without_unlabelled_lines_past_the_transfer_sets_is_warned_of_before_the_teacher(capsys):
    lines = 10**7  # past every line of the unlabelled file
    pipeline._warn_cascade_calibration(
        load_recipe(ROOT / "recipes" / "smoke.yaml", {"transfer.unlabelled_max_lines": lines})
    )
    assert (
        f"past the transfer set's {lines} (transfer.unlabelled_max_lines), and they have 0" in capsys.readouterr().out
    )


def test_a_cascade_whose_lines_past_the_transfer_sets_are_half_blank_is_warned_of_their_texts(tmp_path, capsys):
    # 10 texts the transfer set reads, then 60 each after a blank line (as WikiText writes them): 120 lines past it
    (tmp_path / "u.txt").write_text("A line of text.\n" * 10 + "\nA later line of text.\n" * 60)
    overrides = {"transfer.unlabelled_files": [str(tmp_path / "u.txt")], "transfer.unlabelled_max_lines": 10}
    pipeline._warn_cascade_calibration(load_recipe(ROOT / "recipes" / "smoke.yaml", overrides))
    assert "(transfer.unlabelled_max_lines), and they have 60" in capsys.readouterr().out


def test_a_cascade_with_unlabelled_lines_past_the_transfer_sets_is_not_warned_of(capsys):
    pipeline._warn_cascade_calibration(load_recipe(ROOT / "recipes" / "smoke.yaml"))
    assert capsys.readouterr().out == ""


def test_a_missing_model_init_is_refused_naming_the_folder_nearest_to_it(tmp_path):
    (tmp_path / "minilm-uncased").mkdir()
    with pytest.raises(RecipeError, match=rf"not found \({tmp_path} has minilm-uncased\)"):
        pipeline._require_checkpoint(str(tmp_path / "minilm-uncasd"))
