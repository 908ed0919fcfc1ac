"""The training loop every stage shares: AdamW, warm-up/decay, clipping, evaluation, resume, DDP.

Resumable: `checkpoint.pt` in the work folder holds model, optimizer, scheduler, RNG states and
the data position (epoch and step within it); batches are a pure function of (seed, epoch), so a
rerun after `kill -9` skips exactly the batches already seen.
"""

import contextlib
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from edgedistill.common import progress, tracking
from edgedistill.common.atomic import atomic_write
from edgedistill.common.config.training import OptimConfig
from edgedistill.common.recipe import RecipeError
from edgedistill.common.stage import Inputs
from edgedistill.distill import dist
from edgedistill.distill.device import Placement
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import PreTrainedModel, get_linear_schedule_with_warmup

CHECKPOINT = "checkpoint.pt"
BEST = "best"  # the kept weights in the work folder, as `best-<step>` (`Trainer.best_path`)
LOG_EVERY = 10  # steps between points of the tracked training curves
RECENT = 50  # steps whose losses the bar averages, across evaluations (the tracked curve, the last LOG_EVERY of them)


def step_budget(cfg: OptimConfig, batches_per_epoch: int) -> int:
    """The optimizer steps training takes: `cfg.max_steps`, else `cfg.epochs` passes over `batches_per_epoch` batches
    (one step at least)."""
    return cfg.max_steps or max(1, math.ceil(cfg.epochs * batches_per_epoch))


def ema_update(decay: float):
    """The moving average's `multi_avg_fn`: floating-point weights and buffers average with `decay`; integer buffers
    (a BERT's `position_ids`, a norm's batch count) are copied, since torch's EMA would round their averages down
    (3 * 0.9995 + 3 * 0.0005 is 2.9999998 in float32, stored as 2)."""
    average = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], count: torch.Tensor) -> None:
        # `AveragedModel` calls this once per (device, dtype) group of tensors
        if averaged[0].is_floating_point() or averaged[0].is_complex():
            average(averaged, current, count)
            return
        for mine, theirs in zip(averaged, current, strict=True):
            mine.copy_(theirs)

    return update


class MicroBatch(list):
    """The example indices of a micro-batch, and `batch`, the whole global batch of its step they were dealt from
    (the same on every rank): what a loss averaged over some of the examples (the labelled ones) or over tokens
    counts them in; `held`, the examples of `batch` this rank runs in all its micro-batches of the step (by default
    the whole batch, as one process runs it): its share of a count each rank makes of its own draws (pretraining's
    masked tokens), to add up over the ranks."""

    def __init__(self, indices: list[int], batch: list[int], held: list[int] | None = None):
        super().__init__(indices)
        self.batch = batch
        self.held = batch if held is None else held


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read: the message names the file and the way out."""


@dataclass
class Progress:
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    best: float = -math.inf
    best_step: int = -1
    evals_without_gain: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # the last RECENT steps', across evaluations
    # every step's since the last evaluation, added in step order: with loss_steps, train_loss (as `sum` of every
    # step's loss gave it on Python 3.11, which the images run; 3.12's `sum` compensates rounding, last bits apart)
    loss_sum: float = 0.0
    loss_steps: int = 0
    resumed_from: int | None = None
    # the examples trained on and the seconds they took, over every run of the stage: the manifest's examples_per_s,
    # also where a run resumed at its last step trains none itself
    examples: int = 0
    train_seconds: float = 0.0
    trained_by: list[dict[str, Any]] = field(default_factory=list)
    """Each run of the stage that trained steps: its first and last step, world size, grad_accum and placement
    (`Placement.describe`); the manifest's are the last one's, also where a run resumed at its last step trains none
    itself."""

    @property
    def best_entry(self) -> dict[str, Any]:
        """The evaluation that was kept: the history entry of the best step."""
        return next(entry for entry in self.history if entry["step"] == self.best_step)


def _current_progress(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's progress as `Progress` takes it: one of an earlier release, which kept every step's loss since
    the last evaluation, gets their sum, added in step order as training adds them, and their count."""
    if "loss_steps" in saved:
        return saved
    total = 0.0
    for loss in saved["losses"]:
        total += loss
    return saved | {"losses": saved["losses"][-RECENT:], "loss_sum": total, "loss_steps": len(saved["losses"])}


@dataclass(frozen=True)
class LayerStack:
    """A stack of Transformer layers: the module lists `lists` (one, or several side by side, as XLM's attentions and
    feed-forwards), whose entry i serves layers i * per_entry to (i + 1) * per_entry - 1 of `count`, and `holder`, the
    module that holds them."""

    lists: tuple[torch.nn.ModuleList, ...]
    holder: torch.nn.Module
    count: int
    per_entry: int


def find_layers(within: torch.nn.Module, count: int, groups: int) -> LayerStack | None:
    """The stack of `count` layers in `within`, found by structure, not by names: the first module list that holds
    them, or, where layers share weights (ALBERT's `num_hidden_groups`), one entry per group, with the lists of as
    many entries beside it; None where there is none."""
    for name, sub in within.named_modules():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) == groups and count % groups == 0:
            holder = within.get_submodule(name.rpartition(".")[0])
            lists = tuple(m for m in holder.children() if isinstance(m, torch.nn.ModuleList) and len(m) == groups)
            return LayerStack(lists, holder, count, count // groups)
    return None


def _stack(model: PreTrainedModel, within: torch.nn.Module, count: int, groups: int, kind: str = "") -> LayerStack:
    """`find_layers` for `optim.layer_decay`, of `model`'s layers of `kind` ("decoder "). None is a `RecipeError`: the
    layers would silently all learn at the head's rate."""
    if (stack := find_layers(within, count, groups)) is not None:
        return stack
    raise RecipeError(
        f"optim.layer_decay: {type(model).__name__} holds no module list of its {count} {kind}layers (or of its "
        f"{groups} layer groups) to scale the learning rates of; leave layer_decay unset for it"
    )


def _transformers_models(model: torch.nn.Module) -> list[PreTrainedModel]:
    """The outermost transformers models in `model`: itself, or a student's encoder."""
    found: dict[str, PreTrainedModel] = {}
    for name, module in model.named_modules():
        inside = any(outer == "" or name.startswith(outer + ".") for outer in found)
        if isinstance(module, PreTrainedModel) and not inside:
            found[name] = module
    return list(found.values())


def _holds(module: torch.nn.Module, stacks: list[LayerStack]) -> bool:
    return any(sub is layers for sub in module.modules() for stack in stacks for layers in stack.lists)


def _embeddings(model: PreTrainedModel, stacks: list[LayerStack]) -> list[torch.nn.Parameter]:
    """`model`'s embeddings, found by structure: every module that holds its input embedding's weight (tied
    copies too) and, beside each, the module that owns it when that holds no layers (a BERT's embeddings: position
    and token type embeddings, LayerNorm), else the embeddings the owner holds directly (GPT-2's positions); then,
    where the embeddings are narrower or wider than the layers, the linear maps the base model holds directly that
    take the embeddings' width: nothing else has it (ELECTRA's projection of the embeddings)."""
    words = model.get_input_embeddings().weight
    found = []
    for name, module in model.named_modules(remove_duplicate=False):
        if not (isinstance(module, torch.nn.Embedding) and module.weight is words):
            continue
        owner = model.get_submodule(name.rpartition(".")[0])
        if _holds(owner, stacks):
            found += [p for sub in owner.children() if isinstance(sub, torch.nn.Embedding) for p in sub.parameters()]
        else:
            found += owner.parameters()
    width = words.shape[1]
    if width != getattr(model.config, "hidden_size", width):
        for child in model.base_model.children():
            if isinstance(child, torch.nn.Linear) and child.in_features == width:
                found += child.parameters()
    return found


def _model_depths(model: PreTrainedModel) -> dict[int, int]:
    """How far below the head each parameter of the transformers `model` sits, by the parameter's id: layer i of
    L, L - i; what several layers share (an ALBERT group, and what an encoder holds beside its layers, as DeBERTa's
    relative embeddings), its lowest layer's L; the embeddings L + 1; the head and what follows the layers (a
    pooler, GPT-2's final norm) are absent, at 0. An encoder-decoder's head reads its decoder: decoder layer j of D
    is at D - j, encoder layer i of E at D + E - i, what the decoder holds beside its layers at D, what the encoder
    holds at D + E, and the embeddings, which both read, at D + E + 1."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None)
    if not layers:
        raise RecipeError(
            f"optim.layer_decay: {type(model).__name__}'s config gives no num_hidden_layers, so its layers cannot be "
            "found; leave layer_decay unset for it"
        )
    if config.is_encoder_decoder:
        decoder_layers = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None)
        if not decoder_layers:
            raise RecipeError(
                f"optim.layer_decay: {type(model).__name__}'s config gives no decoder_layers, so its decoder's "
                "layers cannot be found; leave layer_decay unset for it"
            )
        stacks = [
            _stack(model, model.get_decoder(), decoder_layers, decoder_layers, "decoder "),
            _stack(model, model.get_encoder(), layers, layers, "encoder "),
        ]
    else:
        stacks = [_stack(model, model.base_model, layers, getattr(config, "num_hidden_groups", layers))]
    depths: dict[int, int] = {}
    shared: dict[int, int] = {}
    below = 0
    for stack in stacks:  # from the head down
        for layer_list in stack.lists:
            for entry, block in enumerate(layer_list):
                for param in block.parameters():
                    depths.setdefault(id(param), below + stack.count - entry * stack.per_entry)
        if stack.holder is not model.base_model:
            for param in stack.holder.parameters():
                shared.setdefault(id(param), below + stack.count)
        below += stack.count
    for param in _embeddings(model, stacks):
        depths.setdefault(id(param), below + 1)
    return shared | depths


def _depths(model: torch.nn.Module) -> dict[int, int]:
    """How far below the head each parameter of every transformers model in `model` sits, by the parameter's id;
    a parameter outside them (a student's classifier) is absent, at the head's 0. A `model` without one (a BiLSTM
    student) is a `RecipeError`: it has no Transformer layers, and every parameter would learn at the head's rate."""
    models = _transformers_models(model)
    if not models:
        raise RecipeError(
            f"optim.layer_decay: {type(model).__name__} holds no transformers model, so no Transformer layers to "
            "scale the learning rates of; leave layer_decay unset for it"
        )
    depths: dict[int, int] = {}
    for found in models:
        depths |= _model_depths(found)
    return depths


def _param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict]:
    """AdamW groups: no weight decay on biases and LayerNorm weights (the usual BERT recipe); with
    `layer_decay`, each Transformer layer's learning rate is that factor times the one above it."""
    depths = _depths(model) if cfg.layer_decay else {}
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = 0.0 if param.ndim < 2 or "LayerNorm" in name or "norm" in name else cfg.weight_decay
        lr = cfg.lr * (cfg.layer_decay ** depths.get(id(param), 0) if cfg.layer_decay else 1.0)
        groups.setdefault((lr, decay), []).append(param)
    return [{"params": params, "lr": lr, "weight_decay": decay} for (lr, decay), params in groups.items()]


def _lr(scheduler) -> float:
    """The learning rate the schedule is at: the head's, the highest (`layer_decay` scales the layers' below it down)."""
    return max(scheduler.get_last_lr())


def save_pretrained_atomic(model, tokenizer, folder: Path) -> None:
    """Replace `folder` with a `save_pretrained` of model and tokenizer, never leaving it half written."""

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    atomic_write(folder, save)


def work_dir(inputs: Inputs) -> Path:
    """The stage's scratch folder for checkpoints (`Inputs.resumable_work`: a forced run starts it afresh once, and
    goes on from it when run again), made ready by rank 0 while the others wait."""
    if dist.is_main():
        inputs.resumable_work()
    with dist.waiting_for_main("make the stage's work folder ready"):
        dist.barrier()
    return inputs.work


def _load_problem(err: Exception) -> str:
    """What `torch.load` found wrong, as `Type: reason` (the type alone where it gives no reason), without its advice
    to load the file with `weights_only=False`, which would run whatever code a damaged or foreign file holds, or to
    allow the type it refused. A weights-only load wraps that advice around its unpickler's error (the type it
    refused), which it keeps as the context of the error it raises."""
    text = str(err).strip()
    if text.startswith("Weights only load failed"):
        refused = str(err.__context__ or "").partition(" Please use")[0].strip()
        text = "it holds more than tensors and plain values" + (f": {refused}" if refused else "")
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


class Trainer:
    """Runs `loss_fn` over batches with periodic `evaluate`; `on_best` keeps the best weights (at `best_path`).

    Batches are global: `batch_size` examples per optimizer step whatever the world size. Each step's batch
    is dealt out to `world_size * grad_accum` micro-batches (interleaved, so their lengths match); each rank
    runs its `grad_accum` of them (fewer where an epoch's last batch has too few examples) and DDP averages the
    gradients, so a recipe trains the same model, in the same number of steps, on one process or eight.
    Placement, autocast and the fp16 loss scaler come from `placement`. A checkpoint resumes only for the same
    `work_key` (the stage's `Inputs.work_key`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: OptimConfig,
        work_dir: Path,
        work_key: str,
        desc: str,
        placement: Placement,
        bar_position: int | None = None,
    ):
        self.cfg, self.desc, self.work_key, self.placement = cfg, desc, work_key, placement
        self.bar_position = bar_position  # the progress bar's terminal line when several jobs share a terminal
        self.model = model.to(placement.device)
        placement.reset_peak_memory()
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = dist.rank(), dist.world_size()
        if self.rank:  # each rank draws its own dropout and masks; rank 0 goes on with the stream one process draws
            torch.manual_seed(cfg.seed + self.rank)  # the GPUs' generators too
            random.seed(cfg.seed + self.rank)
        # fused: one kernel for all the tensors instead of a loop over them; on the CPU that step is 4-9x faster
        # for 6-23 M parameters, about two fifths of a small student's step time (docs/benchmarks.md).
        self.optimizer = torch.optim.AdamW(_param_groups(self.model, cfg), lr=cfg.lr, fused=True)
        self.scaler = placement.scaler()
        self.progress = Progress()
        self._entry: dict[str, Any] | None = None  # this run's in `progress.trained_by`, from its first step
        self.ema = (
            AveragedModel(self.model, multi_avg_fn=ema_update(cfg.ema_decay), use_buffers=True)
            if cfg.ema_decay
            else None
        )

    @property
    def best_path(self) -> Path:
        """Where `on_best` writes the kept weights, and the stage reads them: named by their step, so that whenever a
        run is killed, its checkpoint's best step names weights of that step."""
        return self.work_dir / f"{BEST}-{self.progress.best_step}"

    @property
    def evaluated(self) -> torch.nn.Module:
        """The weights that are evaluated and kept: the moving average when there is one."""
        return self.ema.module if self.ema else self.model

    def run_info(self) -> dict[str, Any]:
        """What every training manifest records about the run that made it; world size, grad_accum and placement are
        the last training run's (`Progress.trained_by`), grad_accum None where that run was of an earlier release,
        which did not record it."""
        p = self.progress
        last = p.trained_by[-1] if p.trained_by else self._this_run()
        info = {
            "steps": p.global_step,
            "best_step": p.best_step,
            "world_size": last["world_size"],
            "resumed_from_step": p.resumed_from,
            "batch_size": self.cfg.batch_size,
            "grad_accum": last.get("grad_accum"),
            "examples_per_s": round(p.examples / p.train_seconds, 1) if p.train_seconds else None,
            **{key: value for key, value in last.items() if key not in ("first_step", "last_step")},
            "trained_by": p.trained_by,
        }
        return info

    def _this_run(self) -> dict[str, Any]:
        """This run's world size, grad_accum and placement, as `Progress.trained_by` records them."""
        return {"world_size": self.world_size, "grad_accum": self.cfg.grad_accum, **self.placement.describe()}

    def _rng_state(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.placement.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.placement.device)
        return rng

    def _save_checkpoint(self, scheduler, kept: bool = False) -> None:
        """Write the checkpoint from rank 0 while the other ranks wait; `kept`: rank 0 has just kept new best weights
        (`on_best`), and removes the earlier ones only once the checkpoint names the new: till then, a resume reads
        the earlier."""
        doing = "keep its best weights and write its checkpoint" if kept else "write its checkpoint"
        if self._entry is not None and (peak := self.placement.peak_memory_mb()) is not None:
            self._entry["peak_memory_mb"] = peak  # this run's so far, kept for the manifest of a run resumed after it
        with dist.waiting_for_main(doing):
            # every rank's generators: each draws its own dropout masks, for micro-batches of its own shapes
            rng = dist.gather(self._rng_state())
            if dist.is_main():
                state = {
                    "config_hash": self.work_key,  # `Inputs.work_key`, under the name earlier releases gave it
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "ema": self.ema.state_dict() if self.ema else None,
                    "progress": asdict(self.progress),
                    "rng": rng,
                }
                atomic_write(self.work_dir / CHECKPOINT, lambda tmp: torch.save(state, tmp))
                if kept:
                    self._remove_earlier_best()
            dist.barrier()

    def _try_resume(self, scheduler) -> None:
        path = self.work_dir / CHECKPOINT
        if not path.is_file():
            return
        way_out = "delete it to start this stage over"  # a forced run of the same settings would resume it too
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:  # gone since seen: under torchrun, rank 0 discarded another run's
            return
        except Exception as err:  # torch raises several types for a damaged or foreign file
            raise CheckpointError(f"{path} cannot be read ({_load_problem(err)}); {way_out}") from err
        try:
            if state["config_hash"] != self.work_key:
                self._say(
                    f"[{self.desc}] checkpoint in {path} is from other settings or parent artifacts; starting over"
                )
                self._discard_other_work(path)
                return
            self._restore(state, scheduler)
        except (KeyError, TypeError, ValueError, RuntimeError) as err:  # another file, or another release's model
            raise CheckpointError(f"{path} does not fit this run ({type(err).__name__}: {err}); {way_out}") from err
        # kept by an earlier release, which did not name the weights by their step: a folder (teacher, pretraining)
        # or a file (students)
        for unnamed in (self.work_dir / BEST, self.work_dir / f"{BEST}.safetensors"):
            if dist.is_main() and unnamed.exists() and not self.best_path.exists():
                unnamed.rename(self.best_path)
        self._say(f"[{self.desc}] resumed from step {self.progress.global_step} (epoch {self.progress.epoch})")

    def _restore(self, state: dict[str, Any], scheduler) -> None:
        """Model, optimizer, schedule, loss scale, moving average, progress and generators as `state` has them."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state["scaler"] and self.scaler.is_enabled():  # fp16 continues with its scale; other precisions have none
            self.scaler.load_state_dict(state["scaler"])
        if self.ema:
            self.ema.load_state_dict(state["ema"])
        self.progress = Progress(**_current_progress(state["progress"]))
        self.progress.resumed_from = self.progress.global_step
        self._restore_rng(state["rng"])

    def _restore_rng(self, ranks: list[dict] | dict) -> None:
        """This rank's generators as the checkpoint has them; on another world size each rank takes those of
        the rank its number maps to (the batches are global, so only the random draws differ from an
        uninterrupted run)."""
        ranks = [ranks] if isinstance(ranks, dict) else ranks  # a checkpoint from before per-rank states
        if len(ranks) != self.world_size:
            self._say(f"[{self.desc}] checkpoint written by {len(ranks)} ranks, resumed on {self.world_size}")
        rng = ranks[self.rank % len(ranks)]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and self.placement.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.placement.device)
        if self.rank and (self.rank >= len(ranks) or torch.equal(rng["torch"], ranks[0]["torch"])):
            # no stream of its own: written by fewer ranks, or by an earlier release, whose ranks all drew alike
            seed = self.cfg.seed + self.rank + 1_000_003 * self.progress.global_step
            torch.manual_seed(seed)
            random.seed(seed)

    def _micro_batches(self, batch: list[int]) -> list[MicroBatch]:
        """This rank's shares of a global batch: `grad_accum` of them, fewer (none at all) where the batch has fewer
        examples than `world_size * grad_accum`, as an epoch's last batch may."""
        parts = self.world_size * self.cfg.grad_accum
        first = self.rank * self.cfg.grad_accum
        mine = [i for i in range(first, first + self.cfg.grad_accum) if i < len(batch)]
        held = [index for i in mine for index in batch[i::parts]]
        return [MicroBatch(batch[i::parts], batch, held) for i in mine]

    def _step(self, model, batch: list[int], make_batch, loss_fn) -> tuple[float, bool]:
        """One optimizer step over this rank's micro-batches of `batch`: the mean loss per example of the whole batch
        (every rank's), and whether the optimizer stepped (fp16's loss scaler skips a step whose gradients
        overflowed, and lowers its scale)."""
        parts = self._micro_batches(batch)
        mine = sum(len(part) for part in parts)
        # a rank the batch leaves without examples still runs one pass, weighted 0: DDP's all-reduce needs every rank
        runs = [(part, len(part)) for part in parts] or [(MicroBatch(batch[:1], batch, []), 0)]
        total = 0.0
        scale = self.scaler.get_scale()
        for i, (part, examples) in enumerate(runs):
            sync = i == len(runs) - 1 or not isinstance(model, DistributedDataParallel)
            with contextlib.nullcontext() if sync else model.no_sync():
                with self.placement.autocast():
                    loss = loss_fn(model, self.placement.move(make_batch(part)))
                # each micro-batch's mean loss weighs by its share of the batch's examples (DDP then averages
                # over the ranks, hence the world size), so uneven micro-batches add up to the whole batch's mean
                weight = examples * self.world_size / len(batch)
                self.scaler.scale(loss * weight).backward()
            if examples:
                total += loss.item() * examples / mine
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return dist.mean_over_ranks(total, mine, self.placement.device), self.scaler.get_scale() >= scale

    def fit(
        self,
        batches_for_epoch: Callable[[int], list[list[int]]],
        make_batch: Callable[[MicroBatch], Any],
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        evaluate: Callable[[torch.nn.Module], dict[str, float]],
        metric: str,
        on_best: Callable[[torch.nn.Module, dict[str, float]], None],
        epoch_steps: int | None = None,
    ) -> Progress:
        """Train until the step budget or early stopping; returns the progress with its history.

        `batches_for_epoch(epoch)` gives the epoch's batches of example indices (the same on every rank),
        `make_batch(indices)` a micro-batch's tensors (on the CPU; moved here), `loss_fn(model, tensors)` their mean
        loss. The indices are a `MicroBatch`, which holds its whole batch too: a term averaged over some of the
        examples divides by their count in the whole batch, times the micro-batch's share of its examples, so
        that the micro-batches, weighted by that share, add up to the term's mean over the batch.
        `evaluate(model)` runs on rank 0, which shares its figures with the other ranks.
        `epoch_steps`: the steps that count as an epoch, for the step budget (`epochs`), the evaluation at each
        epoch's end and the history's `epoch`; by default the batches of `batches_for_epoch` (a baseline counts its
        student's, so that the two train as long and evaluate, and so stop early, at the same steps and epochs).
        """
        cfg = self.cfg
        first = batches_for_epoch(0)
        total = step_budget(cfg, epoch_steps or len(first))
        self._epoch_steps = epoch_steps
        scheduler = get_linear_schedule_with_warmup(self.optimizer, int(cfg.warmup_ratio * total), total)
        self._try_resume(scheduler)
        p = self.progress
        model = self.model
        if dist.initialized():
            cuda = self.placement.device.type == "cuda"
            model = DistributedDataParallel(self.model, device_ids=[self.placement.device.index] if cuda else None)
        bar = progress.bar(
            total,
            desc=self.desc,
            unit="step",
            initial=p.global_step,
            enabled=dist.is_main(),
            position=self.bar_position,
        )
        stop = p.global_step >= total or self._patience_spent()
        while not stop:
            batches = first if p.epoch == 0 else batches_for_epoch(p.epoch)
            first = None  # not held through the later epochs: a large set's batches take GBs
            self._epoch_len = len(batches)
            for batch in batches[p.step_in_epoch :]:
                model.train()
                tick = time.perf_counter()
                loss, stepped = self._step(model, batch, make_batch, loss_fn)
                p.losses.append(loss)
                del p.losses[:-RECENT]
                p.loss_sum += loss
                p.loss_steps += 1
                if stepped:  # a skipped fp16 step moves neither the schedule nor the average
                    scheduler.step()
                    if self.ema:
                        self.ema.update_parameters(self.model)
                self.optimizer.zero_grad(set_to_none=True)
                p.train_seconds += time.perf_counter() - tick
                p.examples += len(batch)
                p.step_in_epoch += 1
                p.global_step += 1
                if self._entry is None:
                    self._entry = {"first_step": p.global_step, **self._this_run()}
                    p.trained_by.append(self._entry)
                self._entry["last_step"] = p.global_step
                rate = p.examples / p.train_seconds
                bar.set_postfix(loss=f"{sum(p.losses) / len(p.losses):.4f}", ex_s=f"{rate:.0f}", refresh=False)
                bar.update()
                if p.global_step % LOG_EVERY == 0:
                    recent = p.losses[-LOG_EVERY:]
                    curves = {
                        "loss": sum(recent) / len(recent),
                        "lr": _lr(scheduler),
                        "examples_per_s": rate,
                    }
                    tracking.active().log({f"train/{key}": value for key, value in curves.items()}, p.global_step)
                end_of_epoch = p.global_step % epoch_steps == 0 if epoch_steps else p.step_in_epoch == len(batches)
                due = (cfg.eval_every and p.global_step % cfg.eval_every == 0) or end_of_epoch or p.global_step >= total
                if due:
                    stop = self._evaluate(evaluate, metric, on_best, scheduler) or p.global_step >= total
                elif p.global_step % cfg.checkpoint_every == 0:
                    self._save_checkpoint(scheduler)
                if stop:
                    break
            else:
                p.epoch += 1
                p.step_in_epoch = 0
        bar.close()  # the loop ends after an evaluation, which wrote the checkpoint, or without a step
        return p

    def _evaluate(self, evaluate, metric, on_best, scheduler) -> bool:
        """Evaluate, keep the best, checkpoint; True when early stopping says to stop."""
        p = self.progress
        target = self.evaluated.eval()
        # in fp32, as the model is exported and served: selection by the served accuracy
        with torch.no_grad(), dist.waiting_for_main("evaluate"):
            # rank 0 evaluates and every rank follows its figures, so all keep, stop and checkpoint alike
            metrics = dist.broadcast(evaluate(target) if dist.is_main() else None)
        epoch = p.global_step / self._epoch_steps if self._epoch_steps else p.epoch + p.step_in_epoch / self._epoch_len
        entry = {"step": p.global_step, "epoch": round(epoch, 3)}
        if p.loss_steps:
            entry["train_loss"] = p.loss_sum / p.loss_steps
        p.loss_sum, p.loss_steps = 0.0, 0
        entry["lr"] = _lr(scheduler)
        entry.update(metrics)
        p.history.append(entry)
        improved = metrics[metric] > p.best
        if improved:
            p.best, p.best_step, p.evals_without_gain = metrics[metric], p.global_step, 0
            if dist.is_main():
                on_best(target, metrics)
        else:
            p.evals_without_gain += 1
        tracking.active().log({f"eval/{key}": value for key, value in metrics.items()}, p.global_step)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        self._say(f"[{self.desc}] step {p.global_step}: {shown}{' (best)' if improved else ''}")
        self._save_checkpoint(scheduler, kept=improved)
        return self._patience_spent()

    def _discard_other_work(self, checkpoint: Path) -> None:
        """The checkpoint of other settings and the weights it kept go, so that a run of those settings killed before
        its first checkpoint leaves no `best-<step>` for a run resumed from the old checkpoint to take as its own."""
        if dist.is_main():
            checkpoint.unlink(missing_ok=True)
            for kept in self.work_dir.glob(f"{BEST}*"):
                _remove(kept)

    def _remove_earlier_best(self) -> None:
        for path in self.work_dir.glob(f"{BEST}-*"):
            if path != self.best_path:
                _remove(path)

    @staticmethod
    def _say(line: str) -> None:
        """A line of the run's log (an evaluation, a resume note), from rank 0 alone: the ranks' are the same."""
        if dist.is_main():
            progress.write(line)

    def _patience_spent(self) -> bool:
        """Early stopping's verdict, kept in the checkpoint, so a resumed run that had stopped stays stopped."""
        return bool(self.cfg.patience and self.progress.evals_without_gain >= self.cfg.patience)


def _remove(path: Path) -> None:
    """Kept weights: a folder (teacher, pretraining) or a file (students)."""
    shutil.rmtree(path) if path.is_dir() else path.unlink()
