"""Pretrain the teacher: masked-LM (BERT) or causal-LM (GPT); writes `runs/<recipe>/pretrain/`.

From scratch (`model.init: null`) a tokenizer is trained on the corpus first; otherwise training
continues from `model.init` (domain-adaptive pretraining). Held-out loss, perplexity and token
accuracy are measured before and after on a fixed, seeded masking of the eval text.
"""

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from edgedistill.common import progress
from edgedistill.common.atomic import atomic_write
from edgedistill.common.config.training import ModelConfig, PretrainConfig
from edgedistill.common.data import load_unlabelled
from edgedistill.common.recipe import RecipeError
from edgedistill.common.stage import Built, Inputs
from edgedistill.distill import device, dist, heads, tokenization
from edgedistill.distill.device import Placement
from edgedistill.distill.students import count_parameters
from edgedistill.distill.tokenization import load_tokenizer, train_tokenizer
from edgedistill.distill.trainer import MicroBatch, Trainer, save_pretrained_atomic, work_dir
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
)

EVAL_MASK_SEED = 1234


def scratch_positions(cfg: ModelConfig, seq_len: int) -> int:
    """The positions of a model built from scratch: for `seq_len` tokens of pretraining and `cfg.max_length` of
    fine-tuning, 512 at least."""
    return max(512, cfg.max_length, seq_len)


def build_model(cfg: ModelConfig, tokenizer, seq_len: int):
    """A fresh BERT (MLM head) or GPT-2 (LM head) sized from the recipe, with `scratch_positions`."""
    positions = scratch_positions(cfg, seq_len)
    if cfg.family == "bert":
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=positions,
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.dropout,
            pad_token_id=tokenizer.pad_token_id,
        )
        return BertForMaskedLM(config)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=cfg.hidden_size,
        n_layer=cfg.num_layers,
        n_head=cfg.num_heads,
        n_inner=cfg.intermediate_size,
        n_positions=positions,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def scratch_tokenizer(cfg: ModelConfig, seq_len: int, texts: list[str], folder: Path):
    """The tokenizer of a model built from scratch (its `truncation=True` cuts at the model's `scratch_positions`),
    trained on `texts` by rank 0 into `folder` unless an earlier run of these settings left it there, and read from
    there by every rank: WordPiece training breaks ties between equally frequent pairs in no fixed order, so two
    trainings on one corpus may number the vocabulary differently, and the ranks, or a run and its resumption, would
    not share the embeddings' rows. The other ranks wait however long the training takes (`dist.wait_for_main`), not
    a collective's timeout."""
    if dist.is_main() and not folder.is_dir():
        tokenizer = train_tokenizer(cfg.family, texts, cfg.vocab_size, scratch_positions(cfg, seq_len))
        atomic_write(folder, tokenizer.save_pretrained)
    dist.wait_for_main()
    return load_tokenizer(str(folder))


def word_spans(text: str, offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The character spans of `text`'s tokens with the whitespace they begin with left out. transformers' whole-word
    masking starts a word where a token starts elsewhere than the one before it ends; the SentencePiece tokenizers
    of DeBERTa-v2/v3, BigBird and RemBERT span the space before a word (`▁dull` is (1, 6) in "a dull"), which would
    join every word of a text into one."""
    return [(end - len(text[start:end].lstrip()), end) for start, end in offsets]


class Blocks(Sequence):
    """Pretraining blocks as an int32 (N, seq_len) array of token ids, with an (N, seq_len, 2) one of `word_spans`
    for whole-word masking: 4 bytes a token (12 with offsets). A block reads as the dict a collator takes
    (`input_ids`, `offset_mapping`), a slice as a list of them."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray | None):
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        block = {"input_ids": self.ids[index].tolist()}
        if self.offsets is not None:
            block["offset_mapping"] = [tuple(pair) for pair in self.offsets[index].tolist()]
        return block


def make_blocks(
    tokenizer, texts: list[str], seq_len: int, family: str, with_offsets: bool, desc: str | None = None
) -> Blocks:
    """Concatenate tokenised texts (`tokenization.ENCODE_CHUNK` at a time, counted by a progress bar named `desc`
    where given) and cut them into blocks of `seq_len` tokens.

    BERT blocks are wrapped in [CLS] ... [SEP]; GPT texts are separated by the EOS token.
    With `with_offsets`, each token's `word_spans` are kept for whole-word masking.
    """
    if family == "bert":
        inner, head, tail = seq_len - 2, [tokenizer.cls_token_id], [tokenizer.sep_token_id]
        sep_ids, sep_offsets = [], []
    else:
        inner, head, tail = seq_len, [], []
        sep_ids, sep_offsets = [tokenizer.eos_token_id], [(0, 0)]
    ids, offsets = [np.zeros(0, dtype=np.int32)], [np.zeros((0, 2), dtype=np.int32)]
    bar = progress.bar(len(texts), desc=desc or "", unit="text", enabled=desc is not None)
    for start in range(0, len(texts), tokenization.ENCODE_CHUNK):
        chunk = texts[start : start + tokenization.ENCODE_CHUNK]
        enc = tokenizer(chunk, add_special_tokens=False, return_offsets_mapping=with_offsets)
        ids.append(np.fromiter((i for row in enc["input_ids"] for i in row + sep_ids), dtype=np.int32))
        if with_offsets:
            rows = zip(chunk, enc["offset_mapping"], strict=True)
            pairs = [pair for text, row in rows for pair in word_spans(text, row) + sep_offsets]
            offsets.append(np.array(pairs, dtype=np.int32).reshape(-1, 2))
        bar.update(len(chunk))
    bar.close()
    flat = np.concatenate(ids)
    count = len(flat) // inner
    body = flat[: count * inner].reshape(count, inner)
    blocks = np.hstack([np.full((count, len(head)), head, np.int32), body, np.full((count, len(tail)), tail, np.int32)])
    if not with_offsets:
        return Blocks(blocks, None)
    spans = np.concatenate(offsets)[: count * inner].reshape(count, inner, 2)
    edges = [np.zeros((count, len(side), 2), np.int32) for side in (head, tail)]
    return Blocks(blocks, np.concatenate([edges[0], spans, edges[1]], axis=1))


class LanguageModelObjective(torch.nn.Module):
    """Wraps an LM so `forward(batch)` returns (loss, logits, labels) over the predicted tokens only.

    For a BERT MLM the vocabulary projection runs on the ~15% masked positions instead of all of them,
    which is most of the step's cost at a 30k vocabulary; any other masked LM (RoBERTa, ELECTRA, DeBERTa, ALBERT,
    ...) names its encoder and head otherwise, so it runs whole and its logits are taken at those positions.
    Logits (N, V), labels (N,). A batch with no predicted token has a loss of 0 that moves no weight.
    """

    def __init__(self, lm, causal: bool):
        super().__init__()
        self.lm, self.causal = lm, causal

    def forward(self, input_ids, attention_mask, labels, **rest):
        if self.causal:
            logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
            # Every real next token is a target: the collator's labels leave out the pad id, which is the EOS
            # between texts when a checkpoint's tokenizer pads with its EOS.
            labels = input_ids.masked_fill(attention_mask == 0, -100)[:, 1:]
            mask = labels != -100
            logits, labels = logits[mask], labels[mask]
        elif isinstance(self.lm, BertForMaskedLM):
            hidden = self.lm.bert(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
            mask = labels != -100
            logits, labels = self.lm.cls(hidden[mask]), labels[mask]
        else:
            mask = labels != -100
            logits = self.lm(input_ids=input_ids, attention_mask=attention_mask, **rest).logits[mask]
            labels = labels[mask]
        if not len(labels):  # a batch with no masked position: the mean over no targets would be NaN
            return logits.sum() * 0, logits, labels
        return F.cross_entropy(logits, labels), logits, labels


class MaskedBatches:
    """`make_batch` of the pretraining's `Trainer.fit`: each step's whole batch of blocks masked at once (the draws one
    process without grad_accum makes), dealt into its micro-batches, each with the divisor of its summed loss
    (`scaled_loss`): the step's predicted tokens times the micro-batch's share of the batch's examples. The
    micro-batches' losses, weighted by that share (`Trainer.fit`), then add up to the mean over the step's predicted
    tokens however the batch is split (grad_accum, ranks); a mean over each one's own tokens weighed a token of a
    micro-batch with few of them more. Each rank masks the whole batch with draws of its own and predicts the tokens
    of the blocks it holds (`MicroBatch.held`): the step's predicted tokens are their sum over the ranks, added up
    on `device` (a collective, once a step)."""

    def __init__(self, collator, blocks: Blocks, causal: bool, device: torch.device | str = "cpu"):
        self.collator, self.blocks, self.causal, self.device = collator, blocks, causal, device
        self.batch: list[int] | None = None  # held: its masks serve each of its micro-batches
        self.masked: dict[str, torch.Tensor] = {}
        self.rows: dict[int, int] = {}  # a block's row in `masked`
        self.targets = 0

    def __call__(self, part: MicroBatch) -> tuple[dict[str, torch.Tensor], float]:
        if part.batch is not self.batch:
            self.batch, self.masked = part.batch, dict(self.collator([self.blocks[i] for i in part.batch]))
            self.rows = {index: row for row, index in enumerate(part.batch)}
            # as `LanguageModelObjective` counts them: a causal LM predicts every real token but a block's first
            mask = self.masked["attention_mask"][:, 1:] if self.causal else self.masked["labels"] != -100
            held = int(mask[torch.tensor([self.rows[i] for i in part.held], dtype=torch.long)].sum())
            # every rank's: their mean over the ranks, times the ranks
            self.targets = round(dist.mean_over_ranks(held, 1, self.device) * dist.world_size())
        rows = torch.tensor([self.rows[i] for i in part])
        inputs = {key: value[rows] for key, value in self.masked.items()}
        return inputs, max(self.targets, 1) * len(part) / len(part.batch)


def scaled_loss(model, batch: tuple[dict[str, torch.Tensor], float]) -> torch.Tensor:
    """The loss of a micro-batch from `MaskedBatches`: its mean over its predicted tokens, times their count over its
    divisor (1 where the micro-batch is its whole batch)."""
    inputs, divisor = batch
    loss, _, labels = model(**inputs)
    return loss * (len(labels) / divisor)


def lm_metrics(objective: LanguageModelObjective, batches: list[dict], placement: Placement) -> dict[str, float]:
    """Held-out loss, perplexity and accuracy over the predicted (label != -100) tokens."""
    total_loss, total_tokens, correct = 0.0, 0, 0
    with torch.no_grad():
        for batch in batches:
            loss, logits, labels = objective(**placement.move(batch))
            total_loss += loss.item() * len(labels)
            total_tokens += len(labels)
            correct += int((logits.argmax(-1) == labels).sum())
    loss = total_loss / max(1, total_tokens)
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50)), "token_accuracy": correct / max(1, total_tokens)}


def trained_lm_metrics(metrics: dict[str, float], lr: float) -> dict[str, float]:
    """`metrics` of the model in training, or `RecipeError` where its held-out loss is NaN or infinite: pretraining
    diverged, and its token accuracy (0) would be kept as the best so far on a first evaluation."""
    if not math.isfinite(loss := metrics["eval_loss"]):
        raise RecipeError(f"pretrain: training diverged, its held-out loss is {loss}; lower pretrain.optim.lr ({lr:g})")
    return metrics


def require_blocks(cfg: PretrainConfig, train: int, held_out: int) -> None:
    """`RecipeError` where the training or the evaluation text, cut into `train` and `held_out` blocks, holds fewer
    tokens than one block of `pretrain.seq_len`, naming the settings that give it more."""
    short = f"fewer tokens than one block of pretrain.seq_len={cfg.seq_len}"
    if not train:
        more = "add lines" + (" or raise pretrain.train_max_lines" if cfg.train_max_lines else "")
        raise RecipeError(f"pretrain.train_files: the training text holds {short}; {more}, or lower seq_len")
    if held_out:
        return
    if cfg.eval_files:
        more = "add lines" + (" or raise pretrain.eval_max_lines" if cfg.eval_max_lines else "")
        raise RecipeError(f"pretrain.eval_files: the evaluation text holds {short}; {more}, or lower seq_len")
    raise RecipeError(
        f"pretrain.eval_holdout_lines={cfg.eval_holdout_lines}: the lines held out of pretrain.train_files for "
        f"evaluation hold {short}; raise eval_holdout_lines, name pretrain.eval_files, or lower seq_len"
    )


def build_stage(inputs: Inputs) -> Built | None:
    """The body of `distill.stages.pretrain`."""
    recipe = inputs.recipe
    cfg, model_cfg = recipe.pretrain, recipe.model
    shown = dist.is_main()  # the ranks' bars would say the same
    texts = load_unlabelled(cfg.train_files, cfg.train_max_lines, "pretrain read" if shown else None)
    if cfg.eval_files:
        eval_texts = load_unlabelled(cfg.eval_files, cfg.eval_max_lines, "pretrain read eval" if shown else None)
    else:
        if len(texts) <= 2 * cfg.eval_holdout_lines:
            cut = len(texts) == cfg.train_max_lines  # the files may hold more
            raise RecipeError(
                f"pretrain.train_files: {len(texts)} non-empty lines{' read' if cut else ''} are too few to hold out "
                f"pretrain.eval_holdout_lines={cfg.eval_holdout_lines} for evaluation and train on at least as many; "
                + (
                    "lower eval_holdout_lines, name pretrain.eval_files, or raise pretrain.train_max_lines"
                    if cut
                    else "lower eval_holdout_lines, or name pretrain.eval_files"
                )
            )
        texts, eval_texts = texts[: -cfg.eval_holdout_lines], texts[-cfg.eval_holdout_lines :]
    work = work_dir(inputs)
    torch.manual_seed(cfg.optim.seed)
    if model_cfg.init:
        tokenizer = load_tokenizer(model_cfg.init)
        config = AutoConfig.from_pretrained(model_cfg.init)
        heads.require_family(config, model_cfg.family, model_cfg.init)
        # fine-tuning would refuse these after this stage has trained
        heads.require_pooling(config, recipe.finetune.pooling, model_cfg.init)
        heads.require_classifier_dropout(config, recipe.finetune.classifier_dropout, model_cfg.init)
        heads.require_fusable(config, recipe, model_cfg.init)
        auto = AutoModelForMaskedLM if model_cfg.family == "bert" else AutoModelForCausalLM
        model = device.load_trainable(auto, model_cfg.init)
    else:
        tokenizer = scratch_tokenizer(model_cfg, cfg.seq_len, texts, work / f"tokenizer-{inputs.config_hash}")
        model = build_model(model_cfg, tokenizer, cfg.seq_len)
    for tokens, setting in ((cfg.seq_len, "pretrain.seq_len"), (model_cfg.max_length, "model.max_length")):
        heads.require_positions(model.config, tokens, setting, model_cfg.init or "the model")
    # fine-tuning would refuse it after this stage has trained
    heads.require_reinit(model.config, recipe.finetune.reinit_layers, model_cfg.init or "the model")
    mlm = model_cfg.family == "bert"
    wwm = mlm and cfg.whole_word_mask
    # transformers' whole-word masking replaces every chosen word by [MASK] (no random or kept words).
    masking = {"mlm": mlm, "mlm_probability": cfg.mlm_probability, "whole_word_mask": wwm}
    if wwm:
        masking |= {"mask_replace_prob": 1.0, "random_replace_prob": 0.0}
    collator = DataCollatorForLanguageModeling(tokenizer, **masking)
    eval_collator = DataCollatorForLanguageModeling(tokenizer, **masking, seed=EVAL_MASK_SEED)
    blocks = make_blocks(tokenizer, texts, cfg.seq_len, model_cfg.family, wwm, "pretrain blocks" if shown else None)
    eval_blocks = make_blocks(tokenizer, eval_texts, cfg.seq_len, model_cfg.family, wwm)
    del texts, eval_texts  # the blocks hold what training reads: the corpus (GBs of a large dump) is not held
    require_blocks(cfg, len(blocks), len(eval_blocks))
    bs = cfg.optim.batch_size
    eval_batches = [eval_collator(eval_blocks[i : i + bs]) for i in range(0, len(eval_blocks), bs)]
    placement = device.for_process(recipe.runtime)
    objective = LanguageModelObjective(model, causal=not mlm).to(placement.device).eval()
    before = lm_metrics(objective, eval_batches, placement)  # in fp32, as the trainer's evaluations after it

    trainer = Trainer(objective, cfg.optim, work, inputs.work_key, "pretrain", placement)

    def batches_for_epoch(epoch: int) -> list[list[int]]:
        order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(cfg.optim.seed + epoch)).tolist()
        return [order[i : i + bs] for i in range(0, len(order), bs)]

    progress = trainer.fit(
        batches_for_epoch=batches_for_epoch,
        make_batch=MaskedBatches(collator, blocks, causal=not mlm, device=placement.device),
        loss_fn=scaled_loss,
        evaluate=lambda m: trained_lm_metrics(lm_metrics(m, eval_batches, placement), cfg.optim.lr),
        metric="token_accuracy",
        on_best=lambda m, _: save_pretrained_atomic(m.lm, tokenizer, trainer.best_path),
    )
    if not dist.is_main():
        return None
    after = progress.best_entry

    objective_name = "mlm" if mlm else "clm"
    return Built(
        lambda folder: shutil.copytree(trainer.best_path, folder, dirs_exist_ok=True),
        metrics={f"{k}_before": v for k, v in before.items()}
        | {f"{k}_after": after[k] for k in before}
        | {"params": count_parameters(model)},
        info={
            "objective": objective_name,
            "init": model_cfg.init or "scratch",
            "train_blocks": len(blocks),
            "eval_blocks": len(eval_blocks),
            "history": progress.history,
        }
        | trainer.run_info(),
        line=f"{objective_name} token_accuracy {before['token_accuracy']:.3f} -> {after['token_accuracy']:.3f}, "
        f"perplexity {before['perplexity']:.1f} -> {after['perplexity']:.1f}",
        size_of="model.safetensors",
    )
