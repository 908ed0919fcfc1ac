"""Fine-tune the teacher for sequence classification; writes `runs/<recipe>/teacher/`.

The folder is a Hugging Face `save_pretrained` checkpoint of the best dev evaluation, so
`AutoModelForSequenceClassification.from_pretrained(folder)` loads it as it is (with `finetune.pooling: mean`,
once `edgedistill.distill.heads` is imported).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import Examples, limits_note, load_splits, load_test
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.common.stage import Built, Inputs
from edgedistill.distill import device, dist, heads
from edgedistill.distill.batching import collate, length_grouped_batches
from edgedistill.distill.device import Placement
from edgedistill.distill.metrics import EVAL_KEYS, finite, one_class, task_metrics
from edgedistill.distill.students import count_parameters
from edgedistill.distill.tokenization import cut_warning, encode, load_tokenizer, pair_segments
from edgedistill.distill.trainer import Trainer, find_layers, save_pretrained_atomic, work_dir
from transformers import AutoConfig


@torch.no_grad()
def predict_logits(
    forward,
    features: dict[str, list[list[int]]],
    pad_id: int,
    batch_size: int = 128,
    bar=None,
    placement: Placement | None = None,
) -> np.ndarray:
    """`forward(batch) -> logits` over every example, batched by length, in the original order. (N, C), float32.

    Batches go to `placement`'s device (default: stay on the CPU); `bar` (`common.progress.bar`) advances by the
    examples of each batch.
    """
    lengths = [len(ids) for ids in features["input_ids"]]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    out = [None] * len(order)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = collate(features, chunk, pad_id)
        logits = forward(placement.move(batch) if placement else batch).float().cpu().numpy()
        for i, row in zip(chunk, logits, strict=True):
            out[i] = row
        if bar is not None:
            bar.update(len(chunk))
    return np.stack(out)


def test_metrics(test: Examples | None, logits_of, data: DataConfig) -> dict:
    """`test_accuracy`, `test_f1`, ... of `logits_of(split) -> logits` on the test split; {} without one."""
    if test is None:
        return {}
    return task_metrics(logits_of(test), test.labels, data, prefix="test")


def hf_logits(model):
    """The `forward` for `predict_logits` of a Hugging Face classifier."""
    return lambda batch: model(**batch).logits


def reinit_top_layers(model, count: int) -> None:
    """Draw the top `count` Transformer layers (found as `optim.layer_decay` finds them) and the pooler, wherever
    the model holds one (a BERT's encoder, DeBERTa's classifier), afresh, as a new model's are: their pretrained
    weights suit the pretraining objective more than a small task (Zhang et al. 2021)."""
    if count == 0:
        return
    model_name = type(model).__name__
    heads.require_reinit(model.config, count, model_name)
    total = model.config.num_hidden_layers
    stack = find_layers(model.base_model, total, total)  # one layer an entry: `require_reinit` refuses shared ones
    if stack is None:
        raise RecipeError(f"finetune.reinit_layers: no list of {total} layers in {model_name}")
    poolers = [module for name, module in model.named_modules() if name.rpartition(".")[2] == "pooler"]
    with torch.no_grad():
        for module in [*(block for layers in stack.lists for block in layers[total - count :]), *poolers]:
            for name, param in module.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif param.ndim >= 2:
                    param.normal_(0.0, model.config.initializer_range)
                else:  # a LayerNorm's scale
                    param.fill_(1.0)


def classifier_from(folder: str, recipe: Recipe, pad_id: int):
    """Checkpoint `folder` as a classifier of `data.label_names` with `finetune.pooling`'s head, and
    `from_pretrained`'s loading info: `missing_keys` and `mismatched_keys` (a head for other labels) drawn afresh."""
    cfg, data = recipe.finetune, recipe.data
    extra = {"classifier_dropout": cfg.classifier_dropout} if cfg.classifier_dropout is not None else {}
    return device.load_trainable(
        heads.classifier_class(cfg.pooling),
        folder,
        num_labels=data.num_labels,
        id2label=dict(enumerate(data.label_names)),
        label2id={name: i for i, name in enumerate(data.label_names)},
        pad_token_id=pad_id,
        ignore_mismatched_sizes=True,  # a head for other labels (an MNLI checkpoint's three) is drawn afresh
        output_loading_info=True,
        **extra,
    )


def start_teacher(recipe: Recipe, folder: str, pad_id: int):
    """The teacher before its first step, from checkpoint `folder`, and the keys of `model.init`'s head for other
    labels, drawn afresh. The pretrain stage's folder holds no pooler or classification head (language-model
    training has none): after pretraining continued from `model.init`, those of `model.init` are kept, as without
    pretraining, where it can still be read (else they start afresh, with a warning)."""
    model, loaded = classifier_from(folder, recipe, pad_id)
    if recipe.pretrain is None or not recipe.model.init:
        return model, loaded["mismatched_keys"]
    try:
        with torch.random.fork_rng(devices=[]):  # the teacher's training draws as it would without this load
            init_model, init_loaded = classifier_from(recipe.model.init, recipe, pad_id)
    except OSError as err:  # a Hub name no longer cached, offline; a folder moved since the pretraining read it
        if dist.is_main():
            print(
                f"[teacher] warning: model.init {recipe.model.init} cannot be read now "
                f"({str(err).strip().splitlines()[0]}): the pooler and classification head start afresh, as "
                "continued pretraining trains none"
            )
        return model, loaded["mismatched_keys"]
    mismatched = init_loaded["mismatched_keys"]
    drawn = {*init_loaded["missing_keys"], *(key for key, *_ in mismatched)}
    if kept := sorted(set(loaded["missing_keys"]) - drawn):
        weights = init_model.state_dict()
        model.load_state_dict({key: weights[key] for key in kept}, strict=False)
        if dist.is_main():
            print(
                f"[teacher] {', '.join(kept)} kept from model.init {recipe.model.init}: continued pretraining "
                "trains no pooler or classification head"
            )
    return model, mismatched


def build_stage(inputs: Inputs) -> Built | None:
    """The body of `distill.stages.teacher`."""
    recipe = inputs.recipe
    cfg, data = recipe.finetune, recipe.data
    train, dev = load_splits(data)
    test = load_test(data)  # read now: a bad test file fails before training, not after it
    if (limited := limits_note(data, train, dev)) and dist.is_main():
        print(f"[teacher] {limited}")
    if (absent := train.absent(data.label_names)) and dist.is_main():
        print(f"[teacher] warning: no train example is labelled {absent} (data.label_names); the model never learns it")
    if (unscored := dev.f1_warning(data)) and dist.is_main():
        print(f"[teacher] warning: {unscored}")
    for name, split in (("dev", dev), ("test", test)):
        if split is not None and (shared := split.shared_with(train)) and dist.is_main():
            print(
                f"[teacher] warning: {shared} of the {len(split)} {name} examples are train examples too "
                f"(data.train, data.{name}): the {name} figures overstate the models"
            )
    # scored as its bundle's server writes them, as the students are: retention compares figures on one text
    dev = dev.as_served(recipe.text_style)
    test = None if test is None else test.as_served(recipe.text_style)
    init = str(inputs.parent("pretrain")) if recipe.pretrain is not None else recipe.model.init
    tokenizer = load_tokenizer(init)
    if data.pairs:
        pair_segments(tokenizer, init)
    config = AutoConfig.from_pretrained(init)
    heads.require_family(config, recipe.model.family, init)
    heads.require_pooling(config, cfg.pooling, init)
    heads.require_classifier_dropout(config, cfg.classifier_dropout, init)
    heads.require_fusable(config, recipe, init)
    torch.manual_seed(cfg.optim.seed)  # the fresh head's initialisation must not depend on earlier stages
    model, mismatched = start_teacher(recipe, init, tokenizer.pad_token_id)
    if mismatched and dist.is_main():
        print(
            f"[teacher] warning: model.init {recipe.model.init} has a classification head for {config.num_labels} "
            f"labels and data.label_names {data.num_labels}: {', '.join(sorted(key for key, *_ in mismatched))} "
            "drawn afresh, the rest of the checkpoint kept"
        )
    heads.require_positions(model.config, recipe.model.max_length, "model.max_length", init)
    reinit_top_layers(model, cfg.reinit_layers)
    tokenizing = "teacher tokenize" if dist.is_main() else None  # the ranks' bars would say the same
    train_feats = encode(tokenizer, train.texts, train.pairs, recipe.model.max_length, desc=tokenizing)
    dev_feats = encode(tokenizer, dev.texts, dev.pairs, recipe.model.max_length)
    cut = cut_warning(train_feats["input_ids"], "model.max_length", recipe.model.max_length, data.pairs, "train")
    if cut and dist.is_main():
        print(f"[teacher] warning: {cut}; raise model.max_length, and transfer.max_length for the students")
    lengths = [len(ids) for ids in train_feats["input_ids"]]
    labels = torch.tensor(train.labels)
    pad = tokenizer.pad_token_id

    placement = device.for_process(recipe.runtime)
    work = work_dir(inputs)
    trainer = Trainer(model, cfg.optim, work, inputs.work_key, "teacher", placement)
    progress = trainer.fit(
        batches_for_epoch=lambda epoch: length_grouped_batches(lengths, cfg.optim.batch_size, cfg.optim.seed + epoch),
        make_batch=lambda idx: collate(train_feats, idx, pad) | {"labels": labels[idx]},
        loss_fn=lambda m, batch: m(**batch).loss,
        evaluate=lambda m: task_metrics(
            finite(predict_logits(hf_logits(m), dev_feats, pad, placement=placement), "finetune", cfg.optim.lr),
            dev.labels,
            data,
        ),
        metric=data.selection_key,
        on_best=lambda m, _: save_pretrained_atomic(m, tokenizer, trainer.best_path),
    )
    if not dist.is_main():
        return None
    best = progress.best_entry
    if unlearnt := one_class(best.get("dev_confusion"), data.label_names, "finetune", cfg.optim):
        print(f"[teacher] warning: {unlearnt}")

    def kept_logits(split) -> np.ndarray:
        kept = heads.load_teacher(trainer.best_path).eval().to(placement.device)
        feats = encode(tokenizer, split.texts, split.pairs, recipe.model.max_length)
        return predict_logits(hf_logits(kept), feats, pad, placement=placement)

    tested = test_metrics(test, kept_logits, data)

    def write(folder: Path) -> None:
        shutil.copytree(trainer.best_path, folder, dirs_exist_ok=True)
        (folder / "history.json").write_text(json.dumps(progress.history, indent=1))

    params = count_parameters(model)
    return Built(
        write,
        metrics={key: best[key] for key in EVAL_KEYS if key in best} | tested | {"params": params},
        info={
            "init": init,
            "family": recipe.model.family,
            "train_examples": len(train),
            "dev_examples": len(dev),
            "text_style": recipe.text_style,
        }
        | ({"test_examples": len(test)} if test is not None else {})
        | trainer.run_info(),
        line=" ".join(f"{key}={best[key]:.4f}" for key in data.dev_keys)
        + (f" test_accuracy={tested['test_accuracy']:.4f}" if tested else "")
        + f" params={params / 1e6:.1f}M "
        f"best_step={progress.best_step}/{progress.global_step}",
        size_of="model.safetensors",
    )
