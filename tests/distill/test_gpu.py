"""Training and labelling on CUDA: tiny smoke stages in bf16 and fp16, resume, labelling, DDP over nccl."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from edgedistill.common import manifest as mf

from tests.conftest import PYTHON, ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU and a CUDA build of torch"),
]


def distill(*args: str, launcher: tuple[str, ...] = (PYTHON, "-m")) -> subprocess.CompletedProcess:
    command = [*launcher, "distill", *args]
    return subprocess.run(command, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=900)


def runs() -> Path:
    return Path(os.environ["EDGEDISTILL_RUNS_DIR"])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_pretrain_and_fine_tune_on_cuda(precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    name = f"cuda-{precision}"
    result = distill(
        "teacher", str(SMOKE), "--runtime.device=cuda", f"--runtime.precision={precision}", f"--name={name}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(runs() / name / "teacher")
    assert (teacher.info["device"], teacher.info["precision"]) == ("cuda:0", precision)
    assert teacher.info["peak_memory_mb"] > 0
    assert teacher.metrics["dev_accuracy"] > 0.6


def test_labelling_and_an_lstm_student_on_cuda():
    teacher = distill("teacher", str(SMOKE), "--runtime.device=cuda", "--name=cuda-label")
    assert teacher.returncode == 0, teacher.stderr[-3000:]
    result = distill(
        "distill", str(SMOKE), "--runtime.device=cuda", "--name=cuda-label", "--only=bilstm", "--no-baseline"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    labelling = mf.load(runs() / "cuda-label" / "transfer").info["labelling"]
    assert labelling["engine"] == "pytorch"
    assert labelling["device"] == "cuda:0"
    assert labelling["fp32_agreement"] >= 0.99


def test_kill_9_on_cuda_resumes_from_the_checkpoint():
    common = ["--runtime.device=cuda", "--finetune.optim.epochs=4", "--finetune.optim.checkpoint_every=20"]
    proc = subprocess.Popen(
        [PYTHON, "-m", "distill", "teacher", str(SMOKE), "--name=cuda-killed", *common],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    checkpoint = runs() / "cuda-killed" / ".work" / "teacher" / "checkpoint.pt"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not checkpoint.is_file():
        time.sleep(0.2)
    assert proc.poll() is None, "fine-tune finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = distill("finetune", str(SMOKE), "--name=cuda-killed", *common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step" in resumed.stdout


@pytest.mark.parametrize("gpus", [1, 2])
def test_ddp_over_nccl(gpus):
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    torchrun = (str(Path(PYTHON).with_name("torchrun")), "--standalone", f"--nproc_per_node={gpus}", "-m")
    result = distill("teacher", str(SMOKE), "--runtime.device=cuda", f"--name=nccl-{gpus}", launcher=torchrun)
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(runs() / f"nccl-{gpus}" / "teacher")
    assert teacher.info["world_size"] == gpus
    assert teacher.info["steps"] == 3 * 4000 // 32  # the same effective batch on any world size
