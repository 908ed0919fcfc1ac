"""The training loop: micro-batches, gradient accumulation, checkpoints, and what a manifest records of a run."""

import contextlib
import io
import itertools
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist
from edgedistill.common.config.training import OptimConfig, RuntimeConfig
from edgedistill.common.recipe import load_recipe
from edgedistill.distill import stages
from edgedistill.distill import trainer as trainer_module
from edgedistill.distill.device import Placement, resolve
from edgedistill.distill.trainer import CHECKPOINT, CheckpointError, Trainer
from transformers import BertConfig, BertForSequenceClassification

from tests.distill.ranks import on_two_ranks

CPU = resolve(RuntimeConfig(device="cpu", precision="fp32"))
X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0])


def fit_four_batches(trainer: Trainer, scores=None):
    """`trainer` fitted on X in four 4-example batches an epoch, a squared loss; `scores`: what each evaluation gives
    (an iterator given to two fits is shared by them)."""
    scores = iter(scores or [0.0] * 20)
    return trainer.fit(
        batches_for_epoch=lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)],
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
        evaluate=lambda m: {"score": next(scores)},
        metric="score",
        on_best=lambda m, _: None,
    )


def fit_of_four_batches(tmp_path, scores=None, **optim):
    """A linear model fitted on four 4-example batches an epoch (`fit_four_batches`)."""
    cfg = OptimConfig(lr=0.1, batch_size=4, warmup_ratio=0.0, **optim)
    return fit_four_batches(Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU), scores)


def trained(tmp_path, key: str = "h", **optim) -> Trainer:
    """A linear model after one epoch of one 16-example batch, no warm-up, no decay; its work keyed `key`."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0, **optim)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, key, "test", CPU)
    trainer.fit(
        batches_for_epoch=lambda epoch: [list(range(16))],
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
        evaluate=lambda m: {"score": 0.0},
        metric="score",
        on_best=lambda m, _: None,
    )
    return trainer


def test_micro_batches_split_a_batch_without_overlap(tmp_path):
    trainer = Trainer(torch.nn.Linear(4, 1), OptimConfig(grad_accum=3), tmp_path, "h", "test", CPU)
    parts = trainer._micro_batches(list(range(10)))
    assert sorted(i for part in parts for i in part) == list(range(10))


def test_micro_batches_have_lengths_within_one(tmp_path):
    trainer = Trainer(torch.nn.Linear(4, 1), OptimConfig(grad_accum=3), tmp_path, "h", "test", CPU)
    sizes = [len(part) for part in trainer._micro_batches(list(range(10)))]
    assert max(sizes) - min(sizes) <= 1


def test_gradient_accumulation_matches_one_full_batch(tmp_path):
    whole = trained(tmp_path / "a").model.weight.detach()
    accumulated = trained(tmp_path / "b", grad_accum=4).model.weight.detach()
    torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-6)


def test_a_step_the_fp16_scaler_skips_does_not_advance_the_schedule(tmp_path):
    # fp16 autocast and its loss scaler, here on the CPU (the recipe's checks keep fp16 to GPUs)
    fp16 = Placement(torch.device("cpu"), "fp16", "cpu", 1)
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0, max_steps=2)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", fp16)
    calls = []

    def loss_fn(m, batch):  # the first step's gradients overflow
        calls.append(1)
        loss = torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1).float(), batch[1])
        return loss * float("inf") if len(calls) == 1 else loss * 1e-3  # small: fp16 gradients at the 2**15 scale

    trainer.fit(lambda epoch: [list(range(16))], lambda idx: (X[idx], Y[idx]), loss_fn, lambda m: {"score": 0.0},
                "score", lambda m, _: None)  # fmt: skip
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # one of the two linear-decay steps


def test_run_info_records_placement_and_rate(tmp_path):
    info = trained(tmp_path).run_info()
    assert info["device"] == "cpu"
    assert info["precision"] == "fp32"
    assert info["world_size"] == 1
    assert info["grad_accum"] == 1
    assert info["examples_per_s"] > 0


def test_a_run_resumed_at_its_last_step_records_the_rate_of_the_runs_that_trained(tmp_path):
    trained(tmp_path)  # its checkpoint, at the last step, left as a run killed before publishing leaves it
    assert trained(tmp_path).run_info()["examples_per_s"] > 0


def test_a_run_resumed_at_its_last_step_records_the_placement_of_the_run_that_trained(tmp_path):
    trained(tmp_path)  # in fp32
    bf16 = resolve(RuntimeConfig(device="cpu", precision="bf16"))
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0)
    again = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", bf16)
    again.fit(lambda epoch: [list(range(16))], lambda idx: (X[idx], Y[idx]),
              lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1).float(), batch[1]),
              lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    assert again.run_info()["precision"] == "fp32"


def test_a_run_resumed_at_its_last_step_records_the_grad_accum_of_the_run_that_trained(tmp_path):
    trained(tmp_path)  # one micro-batch a step
    assert trained(tmp_path, grad_accum=4).run_info()["grad_accum"] == 1


def test_a_run_resumed_at_its_last_step_after_an_earlier_release_records_no_grad_accum(tmp_path):
    trained(tmp_path)
    state = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    # its runs as an earlier release wrote them, without grad_accum
    runs = state["progress"]["trained_by"]
    state["progress"]["trained_by"] = [{k: v for k, v in run.items() if k != "grad_accum"} for run in runs]
    torch.save(state, tmp_path / CHECKPOINT)
    assert trained(tmp_path, grad_accum=4).run_info()["grad_accum"] is None


def test_a_run_resumed_part_way_records_the_steps_and_placement_of_each_run(tmp_path):
    trained(tmp_path)  # step 1 in fp32
    progress = resumed(tmp_path, resolve(RuntimeConfig(device="cpu", precision="bf16")))
    runs = [(run["first_step"], run["last_step"], run["precision"]) for run in progress.trained_by]
    assert runs == [(1, 1, "fp32"), (2, 2, "bf16")]


def test_a_run_resumed_part_way_records_the_grad_accum_of_each_run(tmp_path):
    trained(tmp_path)  # step 1, one micro-batch
    progress = resumed(tmp_path, CPU, grad_accum=2)
    assert [run["grad_accum"] for run in progress.trained_by] == [1, 2]


def test_a_checkpoint_removed_between_seeing_and_reading_it_starts_the_run_over(tmp_path, monkeypatch):
    trained(tmp_path)
    load = torch.load

    def removed_first(path, **kwargs):  # rank 0 discards another run's checkpoint as this rank reads it
        Path(path).unlink()
        return load(path, **kwargs)

    monkeypatch.setattr(torch, "load", removed_first)
    assert resumed(tmp_path, CPU).trained_by[0]["first_step"] == 1


def test_a_corrupt_checkpoint_names_the_file_and_the_way_out(tmp_path):
    (tmp_path / CHECKPOINT).write_bytes(b"not a checkpoint")
    with pytest.raises(
        CheckpointError, match=r"(?s)checkpoint.pt cannot be read .* delete it to start this stage over"
    ):
        trained(tmp_path)


@pytest.mark.parametrize("content", [b"not a checkpoint", b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01cos\nsystem\nq\x02s."])
def test_an_unreadable_checkpoint_is_not_met_with_advice_to_load_it_unsafely(tmp_path, content):
    (tmp_path / CHECKPOINT).write_bytes(content)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt cannot be read") as refused:
        trained(tmp_path)
    assert "weights_only" not in str(refused.value)


def test_a_checkpoint_holding_more_than_tensors_names_the_type_it_holds(tmp_path):
    torch.save({"config_hash": "h", "written_to": Path("runs")}, tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError, match=r"GLOBAL pathlib\.\w*Path was not an allowed global"):
        trained(tmp_path)


def test_a_checkpoint_holding_more_than_tensors_is_not_met_with_advice_to_allow_its_type(tmp_path):
    torch.save({"config_hash": "h", "written_to": Path("runs")}, tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError) as refused:
        trained(tmp_path)
    assert "add_safe_globals" not in str(refused.value)


def test_an_empty_checkpoint_names_the_error_where_torch_gives_no_reason(tmp_path):
    (tmp_path / CHECKPOINT).touch()
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt cannot be read \(EOFError\);"):
        trained(tmp_path)


def test_a_checkpoint_of_another_model_names_the_file_and_the_way_out(tmp_path):
    trained(tmp_path)
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0, epochs=2)
    wider = Trainer(torch.nn.Linear(4, 2), cfg, tmp_path, "h", "test", CPU)  # as another release's model might be
    with pytest.raises(
        CheckpointError, match=r"(?s)checkpoint.pt does not fit this run .* delete it to start this stage over"
    ):
        wider.fit(lambda epoch: [list(range(16))], lambda idx: (X[idx], Y[idx]),
                  lambda m, batch: m(batch[0]).sum(), lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip


def test_a_torch_file_that_is_no_checkpoint_names_the_file_and_the_way_out(tmp_path):
    torch.save({"weight": torch.ones(2)}, tmp_path / CHECKPOINT)
    with pytest.raises(
        CheckpointError, match=r"(?s)checkpoint.pt does not fit this run .* delete it to start this stage over"
    ):
        trained(tmp_path)


def resumed(tmp_path, placement, key: str = "h", **optim):
    """The progress of a second epoch that resumes `trained(tmp_path, key)`'s checkpoint on `placement`."""
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0, epochs=2, **optim)
    again = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, key, "test", placement)
    return again.fit(
        batches_for_epoch=lambda epoch: [list(range(16))],
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1).float(), batch[1]),
        evaluate=lambda m: {"score": 0.0},
        metric="score",
        on_best=lambda m, _: None,
    )


def test_a_checkpoint_resumes_in_another_precision(tmp_path):
    trained(tmp_path)
    progress = resumed(tmp_path, resolve(RuntimeConfig(device="cpu", precision="bf16")))
    assert progress.resumed_from == 1
    assert progress.global_step == 2


def teacher_work_key(tmp_path, **optim) -> str:
    """The work key of the teacher stage that fine-tunes a checkpoint with these `finetune.optim` settings."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("data: {train: a.tsv, dev: b.tsv, label_names: [n, p]}\nmodel: {init: some/model}\n")
    return stages.teacher(load_recipe(recipe, {f"finetune.optim.{k}": v for k, v in optim.items()})).inputs().work_key


def test_a_teacher_checkpoint_resumes_with_another_split_of_its_batches(tmp_path):
    trained(tmp_path, teacher_work_key(tmp_path))
    assert resumed(tmp_path, CPU, teacher_work_key(tmp_path, grad_accum=2), grad_accum=2).resumed_from == 1


def test_a_checkpoint_written_on_a_gpu_in_fp16_resumes_on_the_cpu(tmp_path):
    trained(tmp_path)
    state = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    state["rng"][0]["cuda"] = torch.get_rng_state()  # what a CUDA run adds: its generator's state, and its loss scale
    state["scaler"] = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
    torch.save(state, tmp_path / CHECKPOINT)
    progress = resumed(tmp_path, CPU)
    assert progress.resumed_from == 1
    assert progress.global_step == 2


def test_a_run_that_stopped_early_stays_stopped_when_resumed(tmp_path):
    scores = iter([1.0] + [0.0] * 20)  # never improves after the first evaluation

    def fit():
        return fit_of_four_batches(tmp_path, scores, epochs=5, eval_every=1, patience=2)

    stopped = fit().global_step
    assert fit().global_step == stopped == 3


def checkpoint_writes(monkeypatch) -> list[Path]:
    """The checkpoint files the trainer writes from now on, one entry a write."""
    written, write = [], trainer_module.atomic_write

    def counted(path, how):
        if path.name == CHECKPOINT:
            written.append(path)
        return write(path, how)

    monkeypatch.setattr(trainer_module, "atomic_write", counted)
    return written


ENDINGS = {
    "at_max_steps_between_evaluations": {"max_steps": 3, "eval_every": 2},
    "at_the_last_epochs_end": {"epochs": 2},
    "early": {"epochs": 5, "eval_every": 1, "patience": 2, "scores": [1.0] + [0.0] * 20},
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_fit_ending_any_way_writes_its_checkpoint_once_per_evaluation(tmp_path, monkeypatch, ending):
    written = checkpoint_writes(monkeypatch)
    evaluations = len(fit_of_four_batches(tmp_path, **ENDINGS[ending]).history)
    assert len(written) == evaluations


def test_a_finished_fit_resumed_writes_no_checkpoint(tmp_path, monkeypatch):
    fit_of_four_batches(tmp_path, epochs=1)
    written = checkpoint_writes(monkeypatch)
    fit_of_four_batches(tmp_path, epochs=1)
    assert written == []


def test_evaluation_runs_in_fp32_when_training_autocasts(tmp_path):
    seen = []
    cfg = OptimConfig(lr=0.1, batch_size=16, warmup_ratio=0.0, weight_decay=0.0)
    trainer = Trainer(
        torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", resolve(RuntimeConfig(device="cpu", precision="bf16"))
    )
    trainer.fit(
        batches_for_epoch=lambda epoch: [list(range(16))],
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1).float(), batch[1]),
        evaluate=lambda m: seen.append(m(X).dtype) or {"score": 0.0},
        metric="score",
        on_best=lambda m, _: None,
    )
    assert seen == [torch.float32]


def test_a_checkpoint_from_more_ranks_resumes_with_rank_0s_generators(tmp_path):
    trained(tmp_path)
    state = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    other = torch.Generator().manual_seed(7).get_state()
    state["rng"] = [state["rng"][0], {**state["rng"][0], "torch": other}]  # what two ranks write
    torch.save(state, tmp_path / CHECKPOINT)
    torch.manual_seed(99)
    resumed(tmp_path, CPU)  # a linear model's epoch draws nothing from the generator
    assert torch.equal(torch.get_rng_state(), state["rng"][0]["torch"])


class Crash(Exception):
    """Raised inside a step, as a killed process would stop there."""


def mse_crashing_at(crash_at: int | None):
    """A mean-squared-error loss that raises `Crash` on its `crash_at`-th call (never, for None)."""
    calls = []

    def loss_fn(m, batch):
        calls.append(1)
        if len(calls) == crash_at:
            raise Crash
        return torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    return loss_fn


def _fit_with_dropout(folder, crash_at: int | None = None) -> dict[str, list]:
    """Six steps of a dropout model on batches of 5 (3 examples on rank 0, 2 on rank 1), checkpointing every
    step; the final weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
    cfg = OptimConfig(lr=0.05, batch_size=5, warmup_ratio=0.0, weight_decay=0.0, checkpoint_every=1)
    trainer = Trainer(model, cfg, folder, "h", "test", CPU)
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    trainer.fit(lambda epoch: [list(range(i, i + 5)) for i in range(0, 30, 5)], lambda idx: (x[idx], x[idx].sum(1)),
                mse_crashing_at(crash_at), lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return {name: value.tolist() for name, value in trainer.model.state_dict().items()}  # plain values to queue


def _history(folder, crash_at: int | None = None) -> list[dict]:
    """The evaluations of three epochs of four steps of a linear model, checkpointed every step."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=4, epochs=3, warmup_ratio=0.0, checkpoint_every=1)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
    return trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]),
                       mse_crashing_at(crash_at), lambda m: {"score": 0.0}, "score", lambda m, _: None).history  # fmt: skip


def _best_after_a_kill_between_best_weights_and_checkpoint(folder, monkeypatch) -> tuple[int, str]:
    """The best step, and the step whose weights `best_path` holds, of a run evaluated at each of its 3 steps and killed
    after keeping step 2's weights (dev 0.5, then 0.9) but before checkpointing them, then resumed (0.4, 0.3)."""
    scores = iter([0.5, 0.9, 0.4, 0.3])
    save = Trainer._save_checkpoint
    saves = []

    def killed_at_the_second(self, scheduler, **kept):
        saves.append(1)
        if len(saves) == 2:
            raise Crash
        save(self, scheduler, **kept)

    def fit():
        cfg = OptimConfig(lr=0.1, batch_size=4, eval_every=1, warmup_ratio=0.0)
        trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
        progress = trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 12, 4)],
                               lambda idx: (X[idx], Y[idx]), mse_crashing_at(None), lambda m: {"score": next(scores)},
                               "score", lambda m, _: trainer.best_path.write_text(str(trainer.progress.global_step)))  # fmt: skip
        return progress.best_step, trainer.best_path.read_text()

    with monkeypatch.context() as patched, pytest.raises(Crash):
        patched.setattr(Trainer, "_save_checkpoint", killed_at_the_second)
        fit()
    return fit()


def test_the_kept_weights_are_of_the_best_step_after_a_kill_between_keeping_and_checkpointing(tmp_path, monkeypatch):
    best_step, kept = _best_after_a_kill_between_best_weights_and_checkpoint(tmp_path, monkeypatch)
    assert kept == str(best_step)


def test_a_run_resumed_between_evaluations_records_the_train_loss_of_an_uninterrupted_one(tmp_path):
    with pytest.raises(Crash):
        _history(tmp_path / "crashed", crash_at=7)  # in the second epoch, after the checkpoint of step 6
    assert _history(tmp_path / "crashed") == _history(tmp_path / "straight")


def _resume_runs(folder: str) -> tuple[dict, dict]:
    straight = _fit_with_dropout(f"{folder}/straight")
    try:
        _fit_with_dropout(f"{folder}/crashed", crash_at=4)
    except Crash:
        torch_dist.barrier()  # rank 0 has written the step-3 checkpoint
    return straight, _fit_with_dropout(f"{folder}/crashed")


def test_ddp_resume_restores_every_ranks_generators_and_ends_as_an_uninterrupted_run(tmp_path):
    straight, resumed = on_two_ranks(tmp_path, _resume_runs, str(tmp_path / "runs"))[0]
    assert resumed == straight


def _draws(folder: str) -> list[list[float]]:
    """What a loss drew from the global generator (`torch.rand(2)`) at each of three steps of batches of 4 (2 examples
    on each rank under DDP), seeded with 0 before the model was made."""
    torch.manual_seed(0)
    model, draws = torch.nn.Linear(4, 1), []

    def loss_fn(m, batch):
        draws.append(torch.rand(2).tolist())
        return torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    trainer = Trainer(model, OptimConfig(lr=0.1, batch_size=4, max_steps=3), folder, "h", "test", CPU)
    trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]), loss_fn,
                lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return draws


@pytest.fixture(scope="module")
def draws_of_two_ranks(tmp_path_factory) -> dict[int, list]:
    folder = tmp_path_factory.mktemp("draws")
    return on_two_ranks(folder, _draws, str(folder / "runs"))


def test_under_ddp_each_rank_draws_its_own_random_numbers(draws_of_two_ranks):
    assert draws_of_two_ranks[0] != draws_of_two_ranks[1]


def test_under_ddp_rank_0_draws_what_one_process_draws(tmp_path, draws_of_two_ranks):
    assert draws_of_two_ranks[0] == _draws(str(tmp_path))


def _draws_from_step_2(folder: str) -> list[list[float]]:
    """What a loss drew (`torch.rand(2)`) at steps 3 and 4 of batches of 4, resumed from the step-2 checkpoint of one
    process in `folder`."""
    model, draws = torch.nn.Linear(4, 1), []

    def loss_fn(m, batch):
        draws.append(torch.rand(2).tolist())
        return torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    cfg = OptimConfig(lr=0.1, batch_size=4, max_steps=4, checkpoint_every=1)
    trainer = Trainer(model, cfg, folder, "h", "test", CPU)
    trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]), loss_fn,
                lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return draws


def test_ranks_resumed_from_one_processs_checkpoint_draw_their_own_random_numbers(tmp_path):
    cfg = OptimConfig(lr=0.1, batch_size=4, max_steps=2, checkpoint_every=1)
    Trainer(torch.nn.Linear(4, 1), cfg, tmp_path / "run", "h", "test", CPU).fit(
        lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]),
        mse_crashing_at(None), lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    draws = on_two_ranks(tmp_path, _draws_from_step_2, str(tmp_path / "run"))
    assert draws[0] != draws[1]


def test_one_process_draws_the_stream_its_seed_gives(tmp_path):
    torch.manual_seed(0)
    torch.nn.Linear(4, 1)
    seeded = [torch.rand(2).tolist() for _ in range(3)]
    assert _draws(str(tmp_path)) == seeded


def _train_losses(folder: str) -> list[float]:
    """The train_loss of each evaluation over two epochs of a linear model on batches of 5 (3 examples on rank 0, 2
    on rank 1 under DDP), evaluated every other step and at each epoch's end."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=5, epochs=2, eval_every=2, warmup_ratio=0.0, weight_decay=0.0)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
    progress = trainer.fit(lambda epoch: [list(range(i, i + 5)) for i in range(0, 15, 5)],
                           lambda idx: (X[idx], Y[idx]),
                           lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
                           lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return [entry["train_loss"] for entry in progress.history]


def test_under_ddp_the_recorded_train_loss_is_that_of_every_rank_s_examples(tmp_path):
    two = on_two_ranks(tmp_path, _train_losses, str(tmp_path / "two"))
    # float32 losses near 30, summed over other splits of the batch: equal to a few units in the last place
    torch.testing.assert_close(two[0], _train_losses(str(tmp_path / "one")), rtol=1e-6, atol=0)


def _fit_judged_by_each_rank(folder: str) -> tuple[int, int]:
    """A run whose evaluations would differ by rank (rank 1's keep improving, rank 0's never after the first):
    the steps it took, and how many evaluations this rank ran."""
    rank, calls = torch_dist.get_rank(), []

    def evaluate(m):
        calls.append(1)
        return {"score": float(len(calls)) if rank else 0.0}

    cfg = OptimConfig(lr=0.1, batch_size=4, epochs=5, eval_every=1, patience=1, warmup_ratio=0.0)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
    progress = trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)],
                           lambda idx: (X[idx], Y[idx]),
                           lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
                           evaluate, "score", lambda m, _: None)  # fmt: skip
    return progress.global_step, len(calls)


def test_under_ddp_rank_0_evaluates_and_every_rank_stops_early_with_it(tmp_path):
    said = on_two_ranks(tmp_path, _fit_judged_by_each_rank, str(tmp_path / "run"))
    assert said == {0: (2, 2), 1: (2, 0)}


def test_gradient_accumulation_over_uneven_micro_batches_matches_one_full_batch(tmp_path):
    def weight(folder, **optim):  # three steps of 10 examples: micro-batches of 4, 3 and 3 with grad_accum 3
        torch.manual_seed(0)
        cfg = OptimConfig(lr=0.1, batch_size=10, epochs=3, warmup_ratio=0.0, weight_decay=0.0, **optim)
        trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
        trainer.fit(lambda epoch: [list(range(10))], lambda idx: (X[idx], Y[idx]),
                    lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
                    lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
        return trainer.model.weight.detach()

    torch.testing.assert_close(weight(tmp_path / "b", grad_accum=3), weight(tmp_path / "a"), rtol=1e-5, atol=1e-6)


def _fit_with_a_short_last_batch(folder: str, last: int, grad_accum: int = 1) -> tuple[int, list]:
    """Two epochs of a linear model on 10 + `last` examples in batches of 5, 5 and `last`: the steps taken and the
    final weights."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=5, epochs=2, warmup_ratio=0.0, weight_decay=0.0, grad_accum=grad_accum)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU)
    batches = [list(range(0, 5)), list(range(5, 10)), list(range(10, 10 + last))]
    progress = trainer.fit(lambda epoch: batches, lambda idx: (X[idx], Y[idx]),
                           lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
                           lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return progress.global_step, trainer.model.weight.detach().tolist()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, tuple[int, list]]:
    """By the last batch's size (1 or 2): one process's steps and weights, without accumulation."""
    return {last: _fit_with_a_short_last_batch(str(tmp_path_factory.mktemp("one")), last) for last in (1, 2)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """Two ranks on a last batch of one example: rank 1 has none of it."""
    folder = tmp_path_factory.mktemp("two")
    return on_two_ranks(folder, _fit_with_a_short_last_batch, str(folder / "run"), 1)


@pytest.fixture(scope="module")
def two_ranks_accumulating(tmp_path_factory) -> dict:
    """Two ranks of two micro-batches each on a last batch of two examples: rank 0 runs two, rank 1 none."""
    folder = tmp_path_factory.mktemp("two-accumulating")
    return on_two_ranks(folder, _fit_with_a_short_last_batch, str(folder / "run"), 2, 2)


def test_one_process_steps_on_an_epochs_last_single_example(one_process):
    assert one_process[1][0] == 6


def test_grad_accum_steps_on_a_last_batch_smaller_than_its_micro_batches(tmp_path, one_process):
    assert _fit_with_a_short_last_batch(str(tmp_path), 2, grad_accum=3)[0] == one_process[2][0]


def test_grad_accum_learns_from_a_last_batch_smaller_than_its_micro_batches(tmp_path, one_process):
    weights = _fit_with_a_short_last_batch(str(tmp_path), 2, grad_accum=3)[1]
    torch.testing.assert_close(torch.tensor(weights), torch.tensor(one_process[2][1]), rtol=1e-5, atol=1e-6)


def test_two_ranks_step_on_a_last_batch_smaller_than_the_world(two_ranks, one_process):
    assert {rank: steps for rank, (steps, _) in two_ranks.items()} == {0: one_process[1][0], 1: one_process[1][0]}


def test_two_ranks_learn_from_a_last_batch_only_one_of_them_holds(two_ranks, one_process):
    torch.testing.assert_close(torch.tensor(two_ranks[1][1]), torch.tensor(one_process[1][1]), rtol=1e-5, atol=1e-6)


def test_two_accumulating_ranks_step_on_a_last_batch_smaller_than_their_micro_batches(
    two_ranks_accumulating, one_process
):
    steps = {rank: steps for rank, (steps, _) in two_ranks_accumulating.items()}
    assert steps == {0: one_process[2][0], 1: one_process[2][0]}


def test_two_accumulating_ranks_learn_from_a_last_batch_one_of_them_holds_in_two_micro_batches(
    two_ranks_accumulating, one_process
):
    weights = torch.tensor(two_ranks_accumulating[1][1])
    torch.testing.assert_close(weights, torch.tensor(one_process[2][1]), rtol=1e-5, atol=1e-6)


def _log_of_a_resumed_run(folder: str) -> str:
    """What this rank printed over a one-epoch run and its resumption for a second epoch."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for epochs in (1, 2):
            cfg = OptimConfig(lr=0.1, batch_size=4, epochs=epochs, warmup_ratio=0.0)
            Trainer(torch.nn.Linear(4, 1), cfg, folder, "h", "test", CPU).fit(
                lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]),
                lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
                lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    return out.getvalue()


@pytest.fixture(scope="module")
def logs_of_two_ranks(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("logs")
    return on_two_ranks(folder, _log_of_a_resumed_run, str(folder / "run"))


def test_under_ddp_rank_0_prints_the_evaluations_and_the_resume(logs_of_two_ranks):
    assert logs_of_two_ranks[0].splitlines() == [
        "[test] step 4: score=0.0000 (best)",
        "[test] resumed from step 4 (epoch 0)",
        "[test] step 8: score=0.0000",
    ]


def test_under_ddp_the_other_ranks_print_nothing(logs_of_two_ranks):
    assert logs_of_two_ranks[1] == ""


def test_a_checkpoint_of_another_work_key_is_not_resumed(tmp_path, capsys):
    trained(tmp_path, max_steps=1)
    trained(tmp_path, "other", max_steps=1)
    assert "is from other settings or parent artifacts; starting over" in capsys.readouterr().out


def _kept_after_other_settings_came_between(folder, monkeypatch) -> str:
    """What the kept weights hold after a run of settings "a" checkpointed with step 1's weights kept and was killed,
    a run of settings "b" started over, kept its step 1's weights and was killed before checkpointing, and "a" ran
    again to its end."""
    scores = iter([0.9, 0.1, 0.9, 0.1, 0.1])
    save = Trainer._save_checkpoint

    def fit(key: str) -> str:
        cfg = OptimConfig(lr=0.1, batch_size=4, eval_every=1, warmup_ratio=0.0, max_steps=2)
        trainer = Trainer(torch.nn.Linear(4, 1), cfg, folder, key, "test", CPU)
        trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 16, 4)], lambda idx: (X[idx], Y[idx]),
                    mse_crashing_at(None), lambda m: {"score": next(scores)}, "score",
                    lambda m, _: trainer.best_path.write_text(key))  # fmt: skip
        return trainer.best_path.read_text()

    def killed_after(count: int):
        saves = []

        def save_then_crash(self, scheduler, **kept):
            saves.append(1)
            if len(saves) > count:
                raise Crash
            save(self, scheduler, **kept)

        return save_then_crash

    for key, checkpoints in (("a", 1), ("b", 0)):
        with monkeypatch.context() as patched, pytest.raises(Crash):
            patched.setattr(Trainer, "_save_checkpoint", killed_after(checkpoints))
            fit(key)
    return fit("a")


def test_a_run_resumed_after_a_run_of_other_settings_keeps_only_weights_of_its_own(tmp_path, monkeypatch):
    assert _kept_after_other_settings_came_between(tmp_path, monkeypatch) == "a"


def test_the_recorded_learning_rate_is_the_head_s_under_layer_decay(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)
    ids = torch.randint(1, 20, (4, 6), generator=torch.Generator().manual_seed(0))
    cfg = OptimConfig(lr=0.01, batch_size=4, max_steps=10, warmup_ratio=0.5, eval_every=5, layer_decay=0.5)
    trainer = Trainer(BertForSequenceClassification(config), cfg, tmp_path, "h", "test", CPU)
    progress = trainer.fit(lambda epoch: [[0, 1, 2, 3]] * 10, lambda idx: {"input_ids": ids[idx], "labels": torch.tensor(idx) % 2},
                           lambda m, batch: m(**batch).loss, lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    assert progress.history[0]["lr"] == pytest.approx(0.01)  # at step 5, the end of the warm-up


class LinearWithPositions(torch.nn.Linear):
    """A linear model holding an integer buffer, as a BERT holds its `position_ids`."""

    def __init__(self):
        super().__init__(4, 1)
        self.register_buffer("positions", torch.arange(64), persistent=False)


def test_the_moving_average_keeps_integer_buffers_exact(tmp_path):
    cfg = OptimConfig(lr=0.1, batch_size=4, warmup_ratio=0.0, ema_decay=0.9995)
    trainer = Trainer(LinearWithPositions(), cfg, tmp_path, "h", "test", CPU)
    fit_four_batches(trainer, itertools.repeat(0.0))
    assert torch.equal(trainer.ema.module.positions, torch.arange(64))


@pytest.mark.parametrize("unnamed", ["best", "best.safetensors"])  # a teacher's folder, a student's file
def test_a_checkpoint_of_an_earlier_release_resumes_with_its_kept_weights_named_by_their_step(tmp_path, unnamed):
    cfg = OptimConfig(lr=0.1, batch_size=4, eval_every=1, warmup_ratio=0.0, max_steps=1)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU)
    trainer.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 12, 4)], lambda idx: (X[idx], Y[idx]),
                mse_crashing_at(None), lambda m: {"score": 0.5}, "score",
                lambda m, _: trainer.best_path.write_text("kept"))  # fmt: skip
    trainer.best_path.rename(tmp_path / unnamed)  # as an earlier release named them
    resumed = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU)
    resumed.fit(lambda epoch: [list(range(i, i + 4)) for i in range(0, 12, 4)], lambda idx: (X[idx], Y[idx]),
                mse_crashing_at(None), lambda m: {"score": 0.4}, "score", lambda m, _: None)  # fmt: skip
    assert resumed.best_path.read_text() == "kept"


class Late(Exception):
    """Rank 0 leaving a run once the other rank has given up waiting for it."""


LATE_TIMEOUT_S = 5  # the collectives' timeout of a run whose rank 0 is late
WAITED_FOR = {  # where rank 0 is late -> what the other rank says it waited for
    "evaluate": "evaluate",
    "on_best": "keep its best weights and write its checkpoint",
    "checkpoint": "write its checkpoint",
}


def _fit_with_rank_0_late(folder: str, late_in: str) -> str:
    """What a run on two ranks said on this rank, where rank 0 is late in `late_in` (a key of `WAITED_FOR`,
    'checkpoint' at the first step's checkpoint): rank 0 goes on once rank 1 has given up, and then leaves."""
    gave_up = Path(folder) / "rank-1-gave-up"

    def late(*_):
        deadline = time.monotonic() + 60
        while not gave_up.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise Late

    hooks = {"evaluate": lambda m: {"score": 1.0}, "on_best": lambda m, _: None, late_in: late}
    if late_in == "checkpoint" and torch_dist.get_rank() == 0:
        trainer_module.atomic_write = late  # this rank's process alone
    cfg = OptimConfig(lr=0.1, batch_size=4, checkpoint_every=1, eval_every=None if late_in == "checkpoint" else 1)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, Path(folder) / "run", "h", "test", CPU)
    try:
        trainer.fit(lambda epoch: [[0, 1, 2, 3], [4, 5, 6, 7]], lambda idx: (X[idx], Y[idx]), mse_crashing_at(None),
                    hooks["evaluate"], "score", hooks["on_best"])  # fmt: skip
    except Late:
        return "late"
    except RuntimeError as err:
        gave_up.touch()
        return str(err)
    return "finished"


@pytest.fixture(scope="module", params=list(WAITED_FOR))
def said_with_rank_0_late(request, tmp_path_factory) -> tuple[str, dict]:
    """Where rank 0 was late, and what each rank of the run said (`_fit_with_rank_0_late`), launched as torchrun
    launches them, with a collectives' timeout of `LATE_TIMEOUT_S`."""
    folder = tmp_path_factory.mktemp("late")
    said = on_two_ranks(
        folder, _fit_with_rank_0_late, str(folder), request.param, timeout_s=LATE_TIMEOUT_S, torchrun=True
    )
    return request.param, said


@pytest.mark.serial  # ranks must reach each wait within LATE_TIMEOUT_S of each other
def test_a_rank_that_waits_for_rank_0_past_the_timeout_names_the_setting_to_raise(said_with_rank_0_late):
    _, said = said_with_rank_0_late
    assert said[1].endswith(f"raise it, e.g. --runtime.collective_timeout_s={2 * LATE_TIMEOUT_S}")


@pytest.mark.serial  # ranks must reach each wait within LATE_TIMEOUT_S of each other
def test_a_rank_that_waits_for_rank_0_past_the_timeout_says_which_rank_how_long_and_for_what(said_with_rank_0_late):
    late_in, said = said_with_rank_0_late
    waited = f"rank 1 waited {LATE_TIMEOUT_S} s (runtime.collective_timeout_s) for rank 0 to {WAITED_FOR[late_in]},"
    assert said[1].startswith(waited)


class Batches(list):
    """An epoch's batches, which a weak reference can follow."""


def test_epoch_0s_batches_are_not_held_through_the_next_epoch(tmp_path):
    drawn, held = {}, []

    def batches_for_epoch(epoch: int) -> Batches:
        batches = Batches([list(range(i, i + 4)) for i in range(0, 16, 4)])
        drawn[epoch] = weakref.ref(batches)
        return batches

    def make_batch(idx):
        if len(drawn) > 1:  # an epoch after the first
            held.append(drawn[0]() is not None)
        return X[idx], Y[idx]

    cfg = OptimConfig(lr=0.1, batch_size=4, epochs=2, warmup_ratio=0.0)
    Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU).fit(
        batches_for_epoch, make_batch, mse_crashing_at(None), lambda m: {"score": 0.0}, "score", lambda m, _: None
    )
    assert held == [False] * 4


def test_a_long_epoch_without_evaluations_checkpoints_a_progress_of_bounded_size(tmp_path):
    cfg = OptimConfig(lr=0.01, batch_size=1, warmup_ratio=0.0, checkpoint_every=100)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU)
    with pytest.raises(Crash):  # mid-epoch, after the checkpoint of step 1900, which no evaluation preceded
        trainer.fit(lambda epoch: [[i % 16] for i in range(2000)], lambda idx: (X[idx], Y[idx]),
                    mse_crashing_at(1901), lambda m: {"score": 0.0}, "score", lambda m, _: None)  # fmt: skip
    progress = torch.load(tmp_path / CHECKPOINT, weights_only=True)["progress"]
    assert len(progress["losses"]) <= 50


def as_an_earlier_release_wrote_it(checkpoint, losses: list[float]) -> None:
    """`checkpoint` rewritten as a release that kept every step's loss since the last evaluation (`losses`) did."""
    state = torch.load(checkpoint, weights_only=True)
    state["progress"] = {k: v for k, v in state["progress"].items() if k not in ("loss_sum", "loss_steps")}
    state["progress"]["losses"] = losses
    torch.save(state, checkpoint)


def test_a_checkpoint_with_every_steps_loss_resumes_to_the_train_loss_of_an_uninterrupted_run(tmp_path, monkeypatch):
    step, losses = Trainer._step, []

    def noted(self, *args):
        loss, stepped = step(self, *args)
        losses.append(loss)
        return loss, stepped

    monkeypatch.setattr(Trainer, "_step", noted)
    with pytest.raises(Crash):
        _history(tmp_path / "crashed", crash_at=7)  # in the second epoch, after the checkpoint of step 6
    as_an_earlier_release_wrote_it(tmp_path / "crashed" / CHECKPOINT, losses[4:6])  # evaluated at step 4
    assert _history(tmp_path / "crashed") == _history(tmp_path / "straight")


def _fit_in_epochs_of(tmp_path, epoch_steps: int | None):
    """The progress of two epochs (`optim.epochs`) of a linear model over 2 batches of 4, with `epoch_steps`."""
    cfg = OptimConfig(lr=0.1, batch_size=4, epochs=2, warmup_ratio=0.0)
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, tmp_path, "h", "test", CPU)
    return trainer.fit(lambda epoch: [[0, 1, 2, 3], [4, 5, 6, 7]], lambda idx: (X[idx], Y[idx]), mse_crashing_at(None),
                       lambda m: {"score": 0.0}, "score", lambda m, _: None, epoch_steps=epoch_steps)  # fmt: skip


def test_epoch_steps_set_the_end_of_epoch_evaluations_whatever_the_epochs_of_batches(tmp_path):
    assert [entry["step"] for entry in _fit_in_epochs_of(tmp_path, 3).history] == [3, 6]


def test_epoch_steps_set_the_step_budget_of_the_epochs(tmp_path):
    assert _fit_in_epochs_of(tmp_path, 3).global_step == 6


def test_without_epoch_steps_an_epoch_is_its_batches(tmp_path):
    assert [entry["step"] for entry in _fit_in_epochs_of(tmp_path, None).history] == [2, 4]


def test_epoch_steps_number_the_epochs_of_the_history_whatever_the_epochs_of_batches(tmp_path):
    assert [entry["epoch"] for entry in _fit_in_epochs_of(tmp_path, 3).history] == [1.0, 2.0]


def test_without_epoch_steps_the_history_numbers_the_epochs_of_batches(tmp_path):
    assert [entry["epoch"] for entry in _fit_in_epochs_of(tmp_path, None).history] == [1.0, 2.0]


def test_max_steps_is_the_step_budget_whatever_epochs_says():
    assert trainer_module.step_budget(OptimConfig(epochs=5.0, max_steps=50), 100) == 50


def test_the_tracked_train_loss_after_an_evaluation_is_the_mean_over_the_last_10_steps(tmp_path, monkeypatch):
    logged = {}

    class Tracker:
        def log(self, metrics, step):
            logged.setdefault(step, {}).update(metrics)

    monkeypatch.setattr(trainer_module.tracking, "active", Tracker)
    cfg = OptimConfig(lr=0.1, batch_size=1, max_steps=10, warmup_ratio=0.0)
    trainer = Trainer(torch.nn.Linear(1, 1, bias=False), cfg, tmp_path, "h", "test", CPU)
    # the loss of step s is s (the input is 0); epochs of 7 batches: an evaluation at step 7, before the point at step 10
    trainer.fit(lambda epoch: [[0]] * 7, lambda idx: torch.zeros(1, 1),
                lambda m, batch: m(batch).sum() + trainer.progress.global_step + 1, lambda m: {"score": 0.0}, "score",
                lambda m, _: None)  # fmt: skip
    assert logged[10]["train/loss"] == pytest.approx(5.5)


def test_a_rank_s_micro_batches_hold_every_example_it_runs_in_the_step(tmp_path):
    trainer = Trainer(torch.nn.Linear(4, 1), OptimConfig(grad_accum=2), tmp_path, "h", "test", CPU)
    trainer.rank, trainer.world_size = 1, 2  # rank 1 of 2: micro-batches 2 and 3 of 4
    parts = trainer._micro_batches(list(range(10)))
    assert [sorted(part.held) for part in parts] == [[2, 3, 6, 7]] * 2
