"""`python -m export`: a failure of the recipe, the artifacts or the machine is a message and exit status 2; a missed
gate is a message and exit status 1; bundles all current are said so without loading what building takes."""

from pathlib import Path

import pytest
import torch
from edgedistill.common.data import DataError
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.export import __main__ as export_main
from edgedistill.export import bundle_stage, stages
from edgedistill.export import cascade as export_cascade
from edgedistill.export.validate import ExportGateError

from tests.conftest import ROOT, loaded_by

SMOKE = ROOT / "recipes" / "smoke.yaml"


@pytest.mark.parametrize("failure", export_main.failures(), ids=lambda kind: kind.__name__)
def test_a_build_failure_is_an_error_line_and_status_2(monkeypatch, capsys, failure):
    def fail(*args, **kwargs):
        raise failure("the reason")

    monkeypatch.setattr(bundle_stage, "build", fail)
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "bilstm-int8"]) == 2
    assert capsys.readouterr().err == "error: the reason\n"


def test_a_data_file_the_build_cannot_read_is_an_error_line_and_status_2(monkeypatch, capsys):
    def unreadable(*args, **kwargs):
        raise DataError("data.train: nodata/sst2/train.tsv: file not found")

    monkeypatch.setattr(bundle_stage, "build", unreadable)
    assert export_main.main(["bundles", str(SMOKE), "--only", "bilstm-int8"]) == 2
    assert capsys.readouterr().err == "error: data.train: nodata/sst2/train.tsv: file not found\n"


def test_a_missed_gate_is_an_error_line_and_status_1(monkeypatch, capsys):
    def miss(*args, **kwargs):
        raise ExportGateError("bundle x: agrees on 90% (gate 99%)")

    monkeypatch.setattr(bundle_stage, "build", miss)
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "bilstm-int8"]) == 1
    assert capsys.readouterr().err == "error: bundle x: agrees on 90% (gate 99%)\n"


def forced_bundles(monkeypatch, tmp_path, *flags) -> dict:
    """What `bundles --force` with `flags` asks the bundle stage for, on the smoke recipe with teacher-onnx as its
    labeller (the builds recorded, not run)."""
    recipe = tmp_path / "labelled.yaml"
    recipe.write_text("extends: smoke\ntransfer: {labeller: teacher-onnx}\n")
    asked = {}
    monkeypatch.setattr(bundle_stage, "build", lambda recipe, ids, force, keep: asked.update(force=force, keep=keep))
    monkeypatch.setattr(export_cascade, "build", lambda *args, **kwargs: [])
    assert export_main.main(["bundles", str(recipe), "--force", *flags]) == 0
    return asked


def test_bundles_force_builds_the_labeller_only_where_stale(monkeypatch, tmp_path):
    assert forced_bundles(monkeypatch, tmp_path)["keep"] == {"teacher-onnx"}


def test_bundles_force_says_why_the_labeller_is_not_forced(monkeypatch, tmp_path, capsys):
    forced_bundles(monkeypatch, tmp_path)
    assert "[bundle-teacher-onnx] not forced: it labels the transfer set" in capsys.readouterr().out


def test_bundles_force_only_the_labeller_forces_it(monkeypatch, tmp_path):
    assert forced_bundles(monkeypatch, tmp_path, "--only", "teacher-onnx")["keep"] == set()


def test_an_unknown_bundle_given_to_only_lists_the_bundles_and_cascades(capsys):
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "cnn-int9"]) == 2
    assert "(teacher-onnx, teacher-fused, " in capsys.readouterr().err


def test_an_unknown_bundle_given_to_only_is_answered_with_the_nearest_bundle():
    with pytest.raises(RecipeError, match=r"^--only cnn-int9: not in export\.bundles .*\): did you mean cnn-int8\?$"):
        stages.of_command(load_recipe(SMOKE), "smoke", ["cnn-int9"])


def test_a_bundle_given_to_only_twice_is_built_once():
    bundles, _ = stages.of_command(load_recipe(SMOKE), "smoke", ["bilstm-int8", "teacher-onnx", "bilstm-int8"])
    assert bundles == ["bilstm-int8", "teacher-onnx"]


def test_a_cascade_given_to_only_twice_is_built_once():
    _, cascades = stages.of_command(load_recipe(SMOKE), "smoke", ["bilstm-cascade", "bilstm-cascade"])
    assert cascades == ["bilstm-cascade"]


def test_an_override_of_a_section_the_bundles_do_not_read_is_refused_naming_it(capsys):
    export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--runtime.device=cuda"])
    assert "error: --runtime.device: python -m export bundles reads no runtime setting" in capsys.readouterr().err


@pytest.fixture
def built_bundles(smoke_bundles_copy) -> Path:
    """A copy of the smoke run with every bundle this machine builds: a runs folder whose bundles are current."""
    return smoke_bundles_copy.parent


def test_bundles_all_current_load_neither_torch_nor_transformers_nor_onnx(built_bundles):
    result, loaded = loaded_by("export", built_bundles, "bundles", SMOKE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert loaded == []


def test_bundles_all_current_say_each_is_up_to_date_in_the_recipes_order(built_bundles):
    recipe = load_recipe(SMOKE)
    here = [name for name in recipe.export.bundles if stages.missing_for(recipe, name) is None]
    result, _ = loaded_by("export", built_bundles, "bundles", SMOKE)
    said = [line.split("]")[0][1:] for line in result.stdout.splitlines() if " up to date: " in line]
    assert said == [f"bundle-{name}" for name in (*here, *recipe.export.cascades)]


def test_bundles_all_current_name_each_bundle_left_out_once(built_bundles):
    result, _ = loaded_by("export", built_bundles, "bundles", SMOKE)
    assert result.stdout.count("[bundle-bilstm-engine] not built here") == 1


def test_a_current_labeller_is_said_so_without_torch_on_a_cpu(built_bundles):
    cpu = ["--transfer.labeller=teacher-fused", "--runtime.device=cpu"]  # auto: a CUDA build of torch imports it
    result, loaded = loaded_by("export", built_bundles, "labeller", SMOKE, *cpu)
    assert result.stdout.startswith("[bundle-teacher-fused] up to date: "), result.stderr[-3000:]
    assert loaded == []


def test_a_recipe_without_a_labeller_needs_none(tmp_path):
    result, _ = loaded_by("export", tmp_path, "labeller", SMOKE)
    assert result.stdout == (
        "[labeller] none needed: the recipe names no transfer.labeller; the transfer set is labelled in PyTorch\n"
    )


def test_a_recipe_without_a_labeller_loads_no_torch(tmp_path):
    assert loaded_by("export", tmp_path, "labeller", SMOKE)[1] == []


def test_a_recipe_without_a_labeller_still_refuses_a_device_this_machine_lacks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert export_main.main(["labeller", str(SMOKE), "--runtime.device=cuda"]) == 2


@pytest.fixture
def labeller_on_a_gpu(monkeypatch, capsys) -> tuple[int, str]:
    """`labeller` with a labeller named and `runtime.device=cuda` on a GPU (PyTorch's answers faked): its status and
    output."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a GPU")
    gpu = ["--transfer.labeller=teacher-fused", "--runtime.device=cuda", "--runtime.precision=fp32"]
    status = export_main.main(["labeller", str(SMOKE), *gpu])
    return status, capsys.readouterr().out


def test_a_labeller_on_a_gpu_is_said_none_needed_as_pytorch_labels_there(labeller_on_a_gpu):
    assert labeller_on_a_gpu[1] == "[labeller] none needed: the transfer set is labelled in PyTorch on cuda:0\n"


def test_a_labeller_on_a_gpu_exits_0(labeller_on_a_gpu):
    assert labeller_on_a_gpu[0] == 0
