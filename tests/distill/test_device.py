"""Device and precision: resolved against the machine, refused early when it cannot honour them."""

import contextlib

import pytest
import torch
from edgedistill.common.config.training import RuntimeConfig
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.distill import device
from edgedistill.distill.device import DeviceError, Placement, for_labelling, for_process, load_trainable, resolve
from transformers import AutoModelForSequenceClassification, BatchEncoding, BertConfig, BertForMaskedLM

from tests.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@no_cuda
def test_auto_is_the_cpu_in_fp32_without_a_gpu():
    placement = resolve(RuntimeConfig())
    assert placement.device.type == "cpu"
    assert placement.precision == "fp32"


@pytest.mark.parametrize(("native", "precision"), [(True, "bf16"), (False, "fp32")])
def test_auto_labels_in_bf16_on_a_cpu_that_computes_it_natively(monkeypatch, native, precision):
    monkeypatch.setattr(device, "native_bf16", lambda: native)
    assert for_labelling(RuntimeConfig(device="cpu")).precision == precision


def test_auto_trains_in_fp32_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    assert for_process(RuntimeConfig(device="cpu")).precision == "fp32"


def test_explicit_fp32_labels_in_fp32_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    assert for_labelling(RuntimeConfig(device="cpu", precision="fp32")).precision == "fp32"


def test_bf16_on_a_cpu_that_emulates_it_is_warned_of_naming_the_setting(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: False)
    placement = resolve(RuntimeConfig(device="cpu", precision="bf16"))
    assert "runtime.precision=bf16" in device.emulation_warning(placement)


def test_bf16_on_a_cpu_that_computes_it_natively_is_not_warned_of(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: True)
    assert device.emulation_warning(resolve(RuntimeConfig(device="cpu", precision="bf16"))) is None


def test_fp32_on_a_cpu_without_native_bf16_is_not_warned_of(monkeypatch):
    monkeypatch.setattr(device, "native_bf16", lambda: False)
    assert device.emulation_warning(resolve(RuntimeConfig(device="cpu"))) is None


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_names_the_setting_and_the_machine(device):
    with pytest.raises(DeviceError, match=rf"runtime.device={device} but no CUDA device visible to PyTorch"):
        resolve(RuntimeConfig(device=device))


def test_fp16_on_the_cpu_is_refused():
    with pytest.raises(DeviceError, match="runtime.precision=fp16 needs a CUDA GPU"):
        resolve(RuntimeConfig(device="cpu", precision="fp16"))


def test_fp16_on_the_cpu_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PRECISION", "fp16")
    with pytest.raises(DeviceError, match=r"runtime.precision=fp16 \(from EDGEDISTILL_PRECISION=fp16\) needs a CUDA"):
        resolve(RuntimeConfig(device="cpu", precision="fp16"))


@no_cuda
def test_cuda_without_a_gpu_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cuda")
    with pytest.raises(DeviceError, match=r"runtime.device=cuda \(from EDGEDISTILL_DEVICE=cuda\) but no CUDA"):
        resolve(RuntimeConfig(device="cuda"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_is_trained_in_fp32_weights(tmp_path, dtype):
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertForMaskedLM(config).to(dtype).save_pretrained(tmp_path)
    model = load_trainable(AutoModelForSequenceClassification, tmp_path, num_labels=2)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_bf16_on_the_cpu_autocasts_matmuls():
    placement = resolve(RuntimeConfig(device="cpu", precision="bf16"))
    with placement.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.bfloat16


def test_fp32_does_not_autocast():
    with resolve(RuntimeConfig(device="cpu")).autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_the_loss_scaler_is_off_outside_fp16():
    assert not resolve(RuntimeConfig(device="cpu", precision="bf16")).scaler().is_enabled()


def test_an_unknown_device_is_a_recipe_error():
    with pytest.raises(RecipeError, match="runtime.device"):
        load_recipe(SMOKE, {"runtime.device": "tpu"})


def test_the_environment_sets_the_device(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    assert load_recipe(SMOKE).runtime.device == "cpu"


def test_the_environment_sets_the_precision(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PRECISION", "bf16")
    assert load_recipe(SMOKE).runtime.precision == "bf16"


def test_a_value_from_the_environment_that_fails_validation_names_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PRECISION", "fp8")
    with pytest.raises(RecipeError, match=r"runtime\.precision: .* \(from EDGEDISTILL_PRECISION=fp8\)"):
        load_recipe(SMOKE)


def test_the_command_line_beats_the_environment(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    assert load_recipe(SMOKE, {"runtime.device": "cuda:0"}).runtime.device == "cuda:0"


def test_the_runtime_section_changes_no_hash():
    assert load_recipe(SMOKE).hash == load_recipe(SMOKE, {"runtime.precision": "bf16"}).hash


def test_move_places_nested_batches():
    placement = resolve(RuntimeConfig(device="cpu"))
    moved = placement.move(({"ids": torch.ones(1)}, [torch.zeros(1)], "kept"))
    assert moved[2] == "kept"
    assert moved[0]["ids"].device.type == "cpu"


def test_move_takes_a_collators_batch_encoding_to_the_device():
    placement = Placement(torch.device("meta"), "fp32", "meta", 1)
    moved = placement.move(BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)}))
    assert moved["input_ids"].device.type == "meta"


def test_describe_names_device_precision_and_threads():
    assert resolve(RuntimeConfig(device="cpu", precision="bf16")).describe() == {
        "device": "cpu",
        "device_name": "cpu",
        "device_count": 1,
        "precision": "bf16",
        "threads": torch.get_num_threads(),
    }


@pytest.fixture
def pre_ampere_gpu(monkeypatch):
    """The machine as PyTorch would show one V100 (compute capability 7.0: bf16 only emulated)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    # as on a V100: bf16 tensors work (emulated), bf16 kernels do not exist
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)


def test_auto_on_a_gpu_without_bf16_kernels_is_fp16(pre_ampere_gpu):
    assert resolve(RuntimeConfig()).precision == "fp16"


def test_bf16_on_a_gpu_without_bf16_kernels_is_refused_naming_its_capability(pre_ampere_gpu):
    with pytest.raises(DeviceError, match=r"V100.*compute capability 7\.0.*use fp16 or fp32"):
        resolve(RuntimeConfig(precision="bf16"))


def test_device_count_is_the_gpus_the_run_uses_one_per_process(pre_ampere_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve(RuntimeConfig(), local_rank=1, local_world_size=2, world_size=2).count == 2


def test_one_gpu_under_torchrun_from_the_environment_names_the_variable(pre_ampere_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cuda:1")
    with pytest.raises(DeviceError, match=r"runtime.device=cuda:1 \(from EDGEDISTILL_DEVICE=cuda:1\) names one GPU"):
        resolve(RuntimeConfig(device="cuda:1"), local_rank=0, local_world_size=2, world_size=2)


def test_more_ranks_on_a_node_than_its_gpus_names_nproc_per_node(pre_ampere_gpu):
    with pytest.raises(DeviceError, match=r"lower --nproc_per_node \(make NPROC=\) to at most 1$"):
        resolve(RuntimeConfig(device="cuda"), local_rank=1, local_world_size=2, world_size=2)


def test_more_ranks_on_a_node_than_its_gpus_blames_no_setting(pre_ampere_gpu):
    with pytest.raises(DeviceError) as refused:
        resolve(RuntimeConfig(device="cuda"), local_rank=1, local_world_size=2, world_size=2)
    assert "runtime.device" not in str(refused.value)


@pytest.fixture
def node_of_two_one_process_each(pre_ampere_gpu, monkeypatch):
    """The second node of a torchrun over two nodes with one process each, as torchrun sets its environment, on a
    node with two GPUs."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)


def test_one_gpu_named_on_each_node_of_one_process_is_taken(node_of_two_one_process_each):
    assert for_process(RuntimeConfig(device="cuda:1")).device == torch.device("cuda", 1)


def test_device_count_across_nodes_is_the_processes_of_the_whole_run(node_of_two_one_process_each):
    assert for_process(RuntimeConfig(device="cuda:1")).count == 2


@gpu
@needs_gpu
def test_auto_on_a_gpu_is_cuda_in_reduced_precision():
    placement = resolve(RuntimeConfig())
    assert placement.device == torch.device("cuda", 0)
    assert placement.precision == ("bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16")


def test_fp16_on_the_cpu_the_environment_chose_names_the_device_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
    with pytest.raises(DeviceError, match=r"and runtime.device=cpu \(from EDGEDISTILL_DEVICE=cpu\) trains on the CPU"):
        resolve(RuntimeConfig(device="cpu", precision="fp16"))


def test_a_gpu_index_past_the_count_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "a GPU")
    monkeypatch.setenv("EDGEDISTILL_DEVICE", "cuda:1")
    with pytest.raises(
        DeviceError, match=r"cuda:1 \(from EDGEDISTILL_DEVICE=cuda:1\) asks for GPU 1 \(rank 0\), but 1 CUDA"
    ):
        resolve(RuntimeConfig(device="cuda:1"))


def test_bf16_on_a_gpu_without_it_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "a V100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 0))
    monkeypatch.setattr(device, "gpu_bf16", lambda gpu: False)
    monkeypatch.setenv("EDGEDISTILL_PRECISION", "bf16")
    with pytest.raises(
        DeviceError, match=r"bf16 \(from EDGEDISTILL_PRECISION=bf16\) but a V100 \(compute capability 7\.0\)"
    ):
        resolve(RuntimeConfig(device="cuda", precision="bf16"))


@gpu
@needs_gpu
def test_gpu_bf16_is_native_bf16_from_ampere_on():
    assert device.gpu_bf16(torch.device("cuda", 0)) == (torch.cuda.get_device_capability(0) >= (8, 0))


@gpu
@needs_gpu
def test_a_gpu_index_past_the_count_is_refused():
    with pytest.raises(DeviceError, match="asks for GPU"):
        resolve(RuntimeConfig(device=f"cuda:{torch.cuda.device_count()}"))
