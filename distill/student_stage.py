"""Train a student: distilled from the cached teacher logits, or the label-only baseline.

Writes `runs/<recipe>/student-<name>/` (or `baseline-<name>/`) in the Hub's layout: `config.json` and
`model.safetensors` from the student's `save_pretrained` (`Student.from_pretrained(folder)` loads it
without this module), the teacher's tokenizer files truncating at the student's max length
(`AutoTokenizer.from_pretrained(folder)` loads them), and `history.json`.
Both kinds get the same architecture, optimizer settings and step budget; the baseline starts from
random weights unless `baseline_init_from_teacher` is set, so their gap is everything the teacher gives.
"""

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.atomic import atomic_write
from edgedistill.common.bundle import CONFIG, TOKENIZER, TOKENIZER_CONFIG, tokenizer_config, tokenizer_json
from edgedistill.common.config.training import StudentConfig, StudentRun
from edgedistill.common.data import load_splits, load_test
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.common.stage import Built, Inputs
from edgedistill.distill import device, dist, heads, pretrain, stages
from edgedistill.distill.batching import collate, length_grouped_batches
from edgedistill.distill.finetune import predict_logits, test_metrics
from edgedistill.distill.losses import attention_kl, combine, hard_ce, hidden_mse, kd_kl, layer_map, logit_mse
from edgedistill.distill.metrics import EVAL_KEYS, finite, one_class, retention, task_metrics
from edgedistill.distill.students import (
    Student,
    StudentError,
    TransformerClassifier,
    build_student,
    check_student,
    count_parameters,
    init_from_teacher,
    teacher_misfits,
)
from edgedistill.distill.tokenization import encode, load_tokenizer, pair_segments
from edgedistill.distill.trainer import MicroBatch, Trainer, work_dir
from edgedistill.distill.transfer_texts import TransferTexts
from huggingface_hub.constants import SAFETENSORS_SINGLE_FILE
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, BertConfig

PROBE_VOCAB = 100  # tokens of the students `check_students` builds, before the teacher's tokenizer may exist
UNLABELLED = -100  # the label of a transfer-set example without one: `hard_ce` skips it


@dataclass(frozen=True)
class Divisors:
    """What a micro-batch's averaged terms divide by: its share of its whole batch's labelled rows and real tokens
    (`distill_batch`); None, the micro-batch's own count."""

    labelled: float | None = None
    tokens: float | None = None


class Frozen(list):
    """Holds the frozen teacher out of parameters and state_dict; a copy (the weights' moving average) shares it
    instead of holding a second teacher in memory."""

    def __deepcopy__(self, memo):
        return self


class DistillObjective(nn.Module):
    """The student plus what its intermediate losses train (hidden-state projections); returns the loss.

    With `derived_segments` the batch's token_type_ids are the pair students' segment ids made from sequence ids
    (`pair_segments`), which the teacher never took (RoBERTa's one token type): it reads the batch without them."""

    def __init__(self, student: nn.Module, run: StudentRun, teacher=None, derived_segments: bool = False):
        super().__init__()
        self.student, self.run = student, run
        self.teacher = Frozen([teacher])
        self.derived_segments = derived_segments
        self.intermediate = teacher is not None and bool(run.losses.layered)
        if self.intermediate:
            t_width, s_width = teacher.config.hidden_size, run.model.hidden_size
            self.pairs = layer_map(run.model.num_layers, teacher.config.num_hidden_layers)
            # only the hidden-state term reads the projection: made without it, it would get no gradient (DDP refuses)
            widths_differ = s_width != t_width and run.losses.hidden > 0
            self.projection = nn.Linear(s_width, t_width) if widths_differ else None
        if self.intermediate and run.losses.attention > 0:
            student.keep_attention_rows()  # the KL compares probability rows: dropped ones sum to less than 1

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        teacher_logits: torch.Tensor,
        labels: torch.Tensor,
        divisors: Divisors = Divisors(),
    ):
        """The weighted loss; its averaged terms divide by `divisors` (`distill_batch`), by default by the labelled
        rows and real tokens here."""
        w = self.run.losses
        mask = batch["attention_mask"]
        segments = batch.get("token_type_ids")
        if self.intermediate:
            logits, s_hidden, s_attn = self.student(batch["input_ids"], mask, segments, return_internals=True)
        else:
            logits = self.student(batch["input_ids"], mask, segments)
        terms = {"mse": logit_mse(logits, teacher_logits), "ce": hard_ce(logits, labels, divisors.labelled)}
        if w.kd:
            terms["kd"] = kd_kl(logits, teacher_logits, self.run.temperature)
        if self.intermediate:
            own = {k: v for k, v in batch.items() if k != "token_type_ids"} if self.derived_segments else batch
            with torch.no_grad():
                out = self.teacher[0](**own, output_hidden_states=True, output_attentions=True)
            if w.hidden:
                terms["hidden"] = sum(
                    hidden_mse(s_hidden[s], out.hidden_states[t], mask, self.projection, divisors.tokens)
                    for s, t in self.pairs
                ) / len(self.pairs)
            if w.attention:
                terms["attention"] = sum(
                    attention_kl(s_attn[s - 1], out.attentions[t - 1], mask, divisors.tokens) for s, t in self.pairs
                ) / len(self.pairs)
        return combine(terms, w.model_dump())


def is_student(folder: Path) -> bool:
    """Whether `folder` holds a student or baseline artifact (its manifest's stage says so)."""
    return mf.load(folder, verify=False).stage.startswith(("student-", "baseline-"))


def load_student(folder) -> tuple[Student, StudentConfig]:
    """Rebuild a student from its artifact folder (verified), in eval mode."""
    mf.load(folder)
    student = Student.from_pretrained(folder)
    return student, student.config


def _transfer_data(transfer_dir: Path, tokenizer, max_length: int, desc: str | None = None):
    """Token ids of the transfer set (pairs too, when it has them; tokenized under a progress bar named `desc`), the
    teacher's logits (float16, as stored: a batch takes them as float32), and gold labels or `UNLABELLED`."""
    texts = TransferTexts.read(transfer_dir)
    logits = torch.from_numpy(np.load(transfer_dir / "logits.npy"))
    labels = torch.from_numpy(np.where(texts.labels >= 0, texts.labels, UNLABELLED))
    return encode(tokenizer, texts.texts, texts.pairs, max_length, student_segments=True, desc=desc), logits, labels


def distill_batch(features, teacher_logits: torch.Tensor, labels: torch.Tensor, pad_id: int, part: MicroBatch):
    """The `DistillObjective` inputs of micro-batch `part`: its collated features, teacher logits (float32) and
    labels, and what its averaged terms divide by: the labelled rows (at least 1) and the real tokens of its whole
    batch, each times its share of that batch's examples, so that the terms mean the same whatever the split
    (`Trainer.fit`)."""
    labelled = max(int((labels[part.batch] != UNLABELLED).sum()), 1)
    tokens = sum(len(features["input_ids"][i]) for i in part.batch)
    divisors = Divisors(labelled * len(part) / len(part.batch), tokens * len(part) / len(part.batch))
    return collate(features, part, pad_id), teacher_logits[part].float(), labels[part], divisors


def student_logits(student: nn.Module, features, pad_id: int, placement=None) -> np.ndarray:
    """A student's logits over tokenized examples (pairs carry their token_type_ids), in eval order; in eval mode
    (dropout off), whatever mode training left it in."""
    student.eval()
    return predict_logits(
        lambda b: student(b["input_ids"], b["attention_mask"], b.get("token_type_ids")),
        features,
        pad_id,
        256,
        placement=placement,
    )


def dev_metrics(
    student: nn.Module, features, labels: list[int], recipe: Recipe, name: str, pad_id: int, placement=None
) -> dict:
    """`task_metrics` of `distill.students.<name>`'s `student` on the tokenized dev examples; `RecipeError` where a
    logit is NaN or infinite: its training diverged, and an argmax over such logits would pass for a figure."""
    logits = student_logits(student, features, pad_id, placement)
    section = f"distill.students.{name}"
    return task_metrics(finite(logits, section, recipe.distill.students[name].optim.lr), labels, recipe.data)


def student_config(recipe: Recipe, spec: StudentRun, vocab_size: int, pad_token_id: int) -> StudentConfig:
    """`spec.model` with what the data and the teacher's tokenizer set (`STUDENT_FROM_DATA`)."""
    return StudentConfig.model_validate(
        spec.model.model_dump()
        | {
            "vocab_size": vocab_size,
            "num_labels": recipe.data.num_labels,
            "pad_token_id": pad_token_id,
            "max_length": recipe.transfer.max_length,
            "pairs": recipe.data.pairs,
        }
    )


def teacher_config(recipe: Recipe):
    """The transformers config of the teacher's architecture: its init checkpoint's (pretraining continues it),
    else a BERT's from the recipe's sizes; where the init cannot be read (a folder gone, a Hub name not cached
    offline), the built teacher's."""
    if recipe.model.init is None:
        cfg = recipe.model
        return BertConfig(
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=pretrain.scratch_positions(cfg, recipe.pretrain.seq_len),
        )
    try:
        return AutoConfig.from_pretrained(recipe.model.init)
    except (OSError, ValueError) as err:
        built = stages.teacher(recipe).folder
        if (built / CONFIG).is_file():
            return AutoConfig.from_pretrained(built)
        raise RecipeError(
            f"{recipe.model.init}: cannot read its config ({err}); model.init must name a checkpoint"
        ) from err


def check_students(recipe: Recipe, names: list[str]) -> None:
    """Build each named student at a small vocabulary and check it keeps the student contract (`check_student`),
    that a transformer that starts from the teacher can copy its layers, and that one that copies or matches the
    teacher's layers has no more of them, and that a cross-entropy term has gold labels to read, before the transfer
    set or any training: `RecipeError` names the student and what it breaks."""
    for name in names:
        spec = recipe.distill.students[name]
        if spec.losses.ce and not recipe.transfer.include_train:
            raise RecipeError(
                f"distill.students.{name}.losses.ce is {spec.losses.ce:g}, a cross-entropy on the gold labels of the "
                "transfer set, which holds none with transfer.include_train: false; set it true, or losses.ce to 0"
            )
        from_teacher = spec.init_from_teacher or spec.baseline_init_from_teacher
        try:
            student = build_student(student_config(recipe, spec, PROBE_VOCAB, 0))
            check_student(student, from_teacher)
        except StudentError as err:
            raise RecipeError(f"distill.students.{name}: {err}") from err
        except Exception as err:  # a student class of one's own whose construction or forward fails
            raise RecipeError(
                f"distill.students.{name}: built at a small vocabulary and run on two texts, "
                f"{spec.model.arch} raised {type(err).__name__}: {err}"
            ) from err
        teacher = teacher_config(recipe)
        copies = from_teacher and isinstance(student, TransformerClassifier)
        if copies and (misfits := teacher_misfits(student.bert.config, teacher)):
            raise RecipeError(
                f"distill.students.{name} starts from the teacher's layers, which it cannot copy: {misfits[0]}; "
                f"set distill.students.{name}.init_from_teacher: false (and baseline_init_from_teacher: false), "
                "or size it as the teacher"
            )
        layered = spec.losses.layered
        if layered and getattr(teacher, "is_encoder_decoder", False):
            raise RecipeError(
                f"distill.students.{name}.losses.{layered[0]} matches the student's layers to a stack of the "
                f"teacher's, but {recipe.model.init} is an encoder-decoder ({teacher.model_type}), whose head reads "
                f"its decoder through cross-attention to its encoder; set distill.students.{name}."
                f"{' and '.join(f'losses.{term}' for term in layered)} to 0"
            )
        if (copies or layered) and spec.model.num_layers > teacher.num_hidden_layers:
            uses = f"losses.{layered[0]} matches" if layered else "init_from_teacher copies"
            raise RecipeError(
                f"distill.students.{name}.model.num_layers is {spec.model.num_layers}, but the teacher has "
                f"{teacher.num_hidden_layers} layers, and its {uses} each student layer to one of the teacher's; set "
                f"distill.students.{name}.model.num_layers to at most {teacher.num_hidden_layers}"
            )


def teacher_in_training(student: nn.Module, teacher_dir: Path, copied: bool, matched: bool):
    """The teacher's encoder where training matches its layers (`matched`: a hidden or attention term), else None,
    having started `student` from it where `copied`: one only copied from is let go before training, so it takes
    neither device memory nor a share of `peak_memory_mb`."""
    if not (copied or matched):
        return None
    teacher = heads.load_encoder(teacher_dir, attn_implementation="eager").eval()
    if copied:
        init_from_teacher(student, teacher)
    return teacher if matched else None


def write_tokenizer(teacher_dir: Path, folder: Path, max_length: int) -> None:
    """The teacher's tokenizer files into `folder`, truncating at the student's `max_length`: as saved, they carry
    the teacher's."""
    for name, fitted in ((TOKENIZER, tokenizer_json), (TOKENIZER_CONFIG, tokenizer_config)):
        data = fitted(json.loads((teacher_dir / name).read_text(encoding="utf-8")), max_length)
        (folder / name).write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")


def build_stage(inputs: Inputs, name: str, baseline: bool, bar_position: int | None) -> Built | None:
    """The body of `distill.stages.student`."""
    recipe = inputs.recipe
    spec = recipe.distill.students[name]
    stage_name = f"{'baseline' if baseline else 'student'}-{name}"
    teacher_dir, transfer_dir = inputs.parent("teacher"), inputs.parent("transfer")
    teacher_manifest = inputs.manifests["teacher"]
    tokenizer = load_tokenizer(str(teacher_dir))
    pad = tokenizer.pad_token_id
    max_length = recipe.transfer.max_length
    # written as the server writes a text for the bundle, so that the recorded figures are the served ones
    train, dev = (split.as_served(recipe.text_style) for split in load_splits(recipe.data))
    test = None if (test := load_test(recipe.data)) is None else test.as_served(recipe.text_style)
    dev_feats = encode(tokenizer, dev.texts, dev.pairs, max_length, student_segments=True)

    tokenizing = f"{stage_name} tokenize" if dist.is_main() else None  # the ranks' bars would say the same
    if baseline:
        feats = encode(tokenizer, train.texts, train.pairs, max_length, student_segments=True, desc=tokenizing)
        teacher_logits = torch.zeros(len(train), recipe.data.num_labels)
        labels = torch.tensor(train.labels)
        # the distilled student's epoch: its batches of the transfer set, the last one short
        epoch_steps = math.ceil(inputs.manifests["transfer"].metrics["sentences"] / spec.optim.batch_size)
    else:
        feats, teacher_logits, labels = _transfer_data(transfer_dir, tokenizer, max_length, tokenizing)
        epoch_steps = None

    # how a pair's segment ids are made, where not from the tokenizer's token types (the model card shows it)
    derived = recipe.data.pairs and pair_segments(tokenizer, str(teacher_dir)) == "sequence_ids"
    cfg = student_config(recipe, spec, len(tokenizer), pad)
    torch.manual_seed(spec.optim.seed)
    student = build_student(cfg, recipe.data.label_names)
    from_teacher = spec.baseline_init_from_teacher if baseline else spec.init_from_teacher
    matched = not baseline and bool(spec.losses.layered)
    teacher_bert = teacher_in_training(student, teacher_dir, from_teacher, matched)
    if baseline:
        labels_only = dict.fromkeys(type(spec.losses).model_fields, 0.0) | {"ce": 1.0}  # every term, a new one too
        run_spec = spec.model_copy(update={"losses": spec.losses.model_copy(update=labels_only)})
        objective = DistillObjective(student, run_spec)
    else:
        objective = DistillObjective(student, spec, teacher_bert, derived)

    lengths = feats["input_ids"].lengths().tolist()
    placement = device.for_process(recipe.runtime)
    if teacher_bert is not None:  # held outside the objective's parameters, so moved here
        teacher_bert.to(placement.device)
    work = work_dir(inputs)
    trainer = Trainer(objective, spec.optim, work, inputs.work_key, stage_name, placement, bar_position)

    def on_best(module, _):
        weights = {k: v.detach().cpu().contiguous() for k, v in module.student.state_dict().items()}
        atomic_write(trainer.best_path, lambda tmp: save_file(weights, tmp))

    progress = trainer.fit(
        batches_for_epoch=lambda epoch: length_grouped_batches(lengths, spec.optim.batch_size, spec.optim.seed + epoch),
        make_batch=partial(distill_batch, feats, teacher_logits, labels, pad),
        loss_fn=lambda m, batch: m(*batch),
        evaluate=lambda m: dev_metrics(m.student, dev_feats, dev.labels, recipe, name, pad, placement),
        metric=recipe.data.selection_key,
        on_best=on_best,
        epoch_steps=epoch_steps,
    )
    if not dist.is_main():
        return None
    student.load_state_dict(load_file(trainer.best_path))
    best = progress.best_entry
    if unlearnt := one_class(
        best.get("dev_confusion"), recipe.data.label_names, f"distill.students.{name}", spec.optim
    ):
        print(f"[{stage_name}] warning: {unlearnt}")
    key = recipe.data.selection_key
    kept = retention(best[key], teacher_manifest.metrics[key])
    tested = test_metrics(
        test,
        lambda split: student_logits(
            student, encode(tokenizer, split.texts, split.pairs, max_length, student_segments=True), pad, placement
        ),
        recipe.data,
    )

    def write(folder: Path) -> None:
        student.cpu().save_pretrained(folder)  # cuDNN keeps an LSTM's weights in one buffer, which safetensors refuses
        write_tokenizer(teacher_dir, folder, max_length)
        (folder / "history.json").write_text(json.dumps(progress.history, indent=1))

    params = count_parameters(student)
    segments = {"pair_segments": "sequence_ids"} if derived else {}
    return Built(
        write,
        metrics={k: best[k] for k in EVAL_KEYS if k in best}
        | tested
        | {"params": params}
        | ({} if kept is None else {"retention": kept}),
        info={
            "arch": cfg.arch,
            "kind": "baseline" if baseline else "distilled",
            "train_examples": len(lengths),
            "losses": (run_spec if baseline else spec).losses.model_dump(),
            "init_from_teacher": from_teacher,
        }
        | ({} if baseline else {"temperature": spec.temperature})
        | segments
        | trainer.run_info(),
        line=" ".join(f"{k}={best[k]:.4f}" for k in recipe.data.dev_keys)
        + (f" retention={kept:.3f} (of the teacher's {key})" if kept is not None else f" (the teacher's {key} is 0)")
        + (f" test_accuracy={tested['test_accuracy']:.4f}" if tested else "")
        + f" params={params / 1e6:.2f}M "
        f"steps={progress.global_step}",
        size_of=SAFETENSORS_SINGLE_FILE,
    )
