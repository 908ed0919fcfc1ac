"""The runtime section told without torch: which torch build is installed, and what a current command checks."""

import subprocess
import sys

import pytest
import torch
from edgedistill.common.config.training import RuntimeConfig
from edgedistill.distill import placement
from edgedistill.distill.device import DeviceError

CPU_ONLY = (
    "from typing import Optional\n__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"
)


def test_the_installed_build_is_cpu_only_exactly_where_torch_has_neither_cuda_nor_rocm():
    assert placement.torch_is_cpu_only() == (torch.version.cuda is None and torch.version.hip is None)


def test_the_installed_build_is_told_without_importing_torch():
    code = "import sys; from edgedistill.distill import placement; placement.torch_is_cpu_only(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize(
    ("text", "cpu_only"),
    [
        (CPU_ONLY, True),
        (CPU_ONLY.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"), False),
        (CPU_ONLY.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.4.43482'"), False),
        (CPU_ONLY.replace("hip: Optional[str] = None\n", ""), False),
        ("cuda = None\nhip = None\n", True),
        ("cuda: Optional[str] = (\n", False),
    ],
    ids=["cpu", "cuda", "rocm", "no-hip-line", "plain-assignments", "not-python"],
)
def test_a_version_file_says_a_cpu_only_build_only_where_cuda_and_hip_are_none(tmp_path, text, cpu_only):
    (tmp_path / "version.py").write_text(text)
    assert placement.cpu_only_build(tmp_path / "version.py") is cpu_only


def test_a_missing_version_file_is_not_taken_for_a_cpu_only_build(tmp_path):
    assert placement.cpu_only_build(tmp_path / "version.py") is False


def test_runtime_device_cpu_is_on_the_cpu_whatever_the_build(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: False)
    assert placement.on_cpu(RuntimeConfig(device="cpu"))


def test_runtime_device_auto_is_on_the_cpu_with_a_cpu_only_build(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: True)
    assert placement.on_cpu(RuntimeConfig(device="auto"))


def test_runtime_device_auto_is_not_surely_on_the_cpu_with_a_cuda_build(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: False)
    assert not placement.on_cpu(RuntimeConfig(device="auto"))


def test_runtime_device_cuda_is_not_on_the_cpu(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: True)
    assert not placement.on_cpu(RuntimeConfig(device="cuda:1"))


def test_the_check_refuses_cuda_where_pytorch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="runtime.device=cuda but no CUDA device visible to PyTorch"):
        placement.check(RuntimeConfig(device="cuda"))


def test_the_check_refuses_fp16_on_the_cpu():
    with pytest.raises(DeviceError, match="runtime.precision=fp16 needs a CUDA GPU"):
        placement.check(RuntimeConfig(device="cpu", precision="fp16"))


@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16"])
def test_the_check_passes_what_the_cpu_honours(precision):
    assert placement.check(RuntimeConfig(device="cpu", precision=precision)) is None


def test_the_check_passes_bf16_with_auto_on_a_cpu_only_build_without_resolving_it(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("resolved"))
    assert placement.check(RuntimeConfig(device="auto", precision="bf16")) is None


def test_the_check_resolves_bf16_with_auto_on_a_cuda_build(monkeypatch):
    monkeypatch.setattr(placement, "torch_is_cpu_only", lambda: False)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(True) or False)
    placement.check(RuntimeConfig(device="auto", precision="bf16"))
    assert asked
