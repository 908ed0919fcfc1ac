"""Training and labelling on CUDA: tiny smoke stages in bf16 and fp16, resume, labelling, pair students, the trainer's
accumulation, moving average and checkpoints across devices, the INT8 labeller's second pass, DDP over nccl."""

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.config.training import OptimConfig, RuntimeConfig, StudentConfig
from edgedistill.distill.device import gpu_bf16, resolve
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.labelling import SecondPass
from edgedistill.distill.students import BiLSTMClassifier
from edgedistill.distill.trainer import Trainer
from transformers import BertConfig, BertForSequenceClassification

from tests.conftest import PYTHON, ROOT
from tests.pair_task import pair_recipe, write_pair_task

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


@pytest.mark.parametrize(("precision", "grad_accum"), [("bf16", 1), ("fp16", 2)])
def test_pretrain_and_fine_tune_on_cuda(precision, grad_accum):
    if precision == "bf16" and not gpu_bf16(torch.device("cuda", 0)):
        pytest.skip("this GPU has no bf16")
    name = f"cuda-{precision}"
    result = distill(
        "teacher",
        str(SMOKE),
        "--runtime.device=cuda",
        f"--runtime.precision={precision}",
        f"--finetune.optim.grad_accum={grad_accum}",
        f"--name={name}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(runs() / name / "teacher")
    assert teacher.info["device"] == "cuda:0"
    assert teacher.info["precision"] == precision
    assert teacher.info["grad_accum"] == grad_accum
    assert teacher.info["peak_memory_mb"] > 0
    assert teacher.metrics["dev_accuracy"] > 0.6


def test_labelling_and_an_lstm_student_on_cuda():
    teacher = distill("teacher", str(SMOKE), "--runtime.device=cuda", "--name=cuda-label")
    assert teacher.returncode == 0, teacher.stderr[-3000:]
    # the recipe's INT8 labeller is for the CPU: on a GPU the teacher labels in PyTorch, and no bundle is needed
    labeller = ["--transfer.labeller=teacher-int8", "--transfer.relabel_margin=1.0"]
    result = distill(
        "distill", str(SMOKE), "--runtime.device=cuda", "--name=cuda-label", "--only=bilstm", "--no-baseline", *labeller
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


def test_every_pair_student_trains_on_cuda(tmp_path):
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(pair_recipe(write_pair_task(tmp_path / "data")))
    for stage in ("teacher", "distill"):
        result = distill(
            stage, str(recipe), "--runtime.device=cuda", *(["--no-baseline"] if stage == "distill" else [])
        )
        assert result.returncode == 0, result.stderr[-3000:]
    students = {name: mf.load(runs() / "pairs" / f"student-{name}") for name in ("bilstm", "cnn", "transformer")}
    assert {name: m.info["device"] for name, m in students.items()} == dict.fromkeys(students, "cuda:0")
    assert min(m.metrics["dev_accuracy"] for m in students.values()) > 0.75  # the task is balanced: 0.5 by chance


X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0])


class LinearWithPositions(torch.nn.Linear):
    """A linear model holding an integer buffer, as a BERT holds its `position_ids`."""

    def __init__(self):
        super().__init__(4, 1)
        self.register_buffer("positions", torch.arange(64), persistent=False)


def fit(folder, placement, epochs: int = 1, **optim) -> Trainer:
    """A `LinearWithPositions` trained on `placement` for `epochs` of four batches of 4 (resuming what `folder`
    holds)."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=4, warmup_ratio=0.0, weight_decay=0.0, epochs=epochs, **optim)
    trainer = Trainer(LinearWithPositions(), cfg, folder, "h", "test", placement)
    trainer.fit(
        batches_for_epoch=lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)],
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1).float(), batch[1]),
        evaluate=lambda m: {"score": 0.0},
        metric="score",
        on_best=lambda m, _: None,
    )
    return trainer


def cuda(precision: str = "fp32"):
    """GPU 0 in `precision` (auto: bf16 where it has bf16 kernels, else fp16)."""
    return resolve(RuntimeConfig(device="cuda", precision=precision))


CPU = resolve(RuntimeConfig(device="cpu", precision="fp32"))


def test_gradient_accumulation_on_cuda_matches_one_full_batch(tmp_path):
    whole = fit(tmp_path / "a", cuda()).model.weight.detach()
    accumulated = fit(tmp_path / "b", cuda(), grad_accum=4).model.weight.detach()
    torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-5)


def test_the_moving_average_on_cuda_keeps_integer_buffers_exact(tmp_path):
    trainer = fit(tmp_path, cuda("auto"), ema_decay=0.9995)
    assert torch.equal(trainer.ema.module.positions.cpu(), torch.arange(64))


@pytest.mark.parametrize(("first", "then"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_across_devices_with_its_moving_average(tmp_path, first, then):
    placements = {"cuda": cuda("fp16"), "cpu": CPU}
    fit(tmp_path, placements[first], ema_decay=0.99)
    resumed = fit(tmp_path, placements[then], epochs=2, ema_decay=0.99)
    assert resumed.progress.resumed_from == 4
    assert resumed.progress.global_step == 8


def test_an_int8_labellers_second_pass_relabels_on_cuda_what_it_is_unsure_of():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=2
    )
    placement = cuda("auto")  # the second pass runs in the labelling precision; the reference below in fp32
    model = BertForSequenceClassification(config).eval().to(placement.device)
    rows = [[2, 5 + i, 7, 3][: 2 + i % 3] for i in range(12)]
    features = {"input_ids": rows}
    labelled = np.tile(np.array([[4.0, 0.0]], dtype=np.float32), (12, 1))
    labelled[::3] = [0.2, 0.0]  # unsure: below the margin of 1
    with torch.inference_mode(), placement.autocast():
        relabelled, count = SecondPass(hf_logits(model), 1.0, 0, 4, placement).relabel(features, labelled)
    reference = predict_logits(hf_logits(model), {"input_ids": rows[::3]}, 0, placement=placement)
    assert count == 4
    np.testing.assert_allclose(relabelled[::3], reference, atol=0.05)


def test_the_lstm_student_runs_its_lstm_in_fp32_under_bf16_autocast():
    """CUDA autocast casts cuDNN's LSTM to fp16 whatever its dtype, which a bf16 run, without a loss scaler, must not
    get: the student's LSTM states come out in fp32."""
    if not gpu_bf16(torch.device("cuda", 0)):
        pytest.skip("this GPU has no bf16 kernels")
    config = StudentConfig(arch="bilstm", vocab_size=50, embed_dim=8, hidden_size=8, num_labels=2, pad_token_id=0)
    model = BiLSTMClassifier(config).cuda()
    ids = torch.tensor([[2, 5, 7, 3], [2, 6, 3, 0]], device="cuda")
    with cuda("bf16").autocast():
        states = model.encode(ids, (ids != 0).long())
    assert states.dtype == torch.float32
