"""Build the transfer set and label it with the teacher once; writes `runs/<recipe>/transfer/`.

The texts come from `transfer_texts` and are kept in the stage's work folder with the key of what they are built from;
`labelling` labels them in shards, so a killed run resumes at the first missing shard without building the texts again,
and a run that labels them otherwise (another precision, labeller or labelling setting) without building them again.

Artifact: `texts.txt` (one text per line), for pair tasks `pairs.txt` (sentence B, line by line),
`meta.npz` (`source`: 0 unlabelled, 1 train, 2 augmented; `label`: gold label or -1), `composition.json` (the
count of each source and of each drop), `logits.npy` (float16, (N, C)) and `dev_logits.npy` (the teacher's, of the
dev texts as the bundles serve them).
"""

import hashlib
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import progress
from edgedistill.common.atomic import atomic_write
from edgedistill.common.data import Examples, load_splits
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.stage import FORCED, WALL, Built, Inputs
from edgedistill.distill import device, heads
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.labelling import TEACHER, SecondPass, label_checked, labelling_info, onnx_labeller
from edgedistill.distill.metrics import task_metrics
from edgedistill.distill.stages import HELD_OUT
from edgedistill.distill.tokenization import cut_warning, encode, load_tokenizer, mask_token
from edgedistill.distill.transfer_texts import SOURCES, TransferTexts, build_texts

# The transfer settings that only labelling reads: kept texts are labelled again after a change of one, not built again.
LABELLING = (
    "max_length",
    "shard_size",
    "label_batch_size",
    "labeller",
    "relabel_margin",
    "precision_check_sentences",
    "tie_margin",
    "min_agreement",
)
TEXTS_KEY = "key"  # in the kept texts' folder: `_texts_key` of what they were built from


def _warn_of_cut_examples(tokenizer, train: Examples, dev: Examples, max_length: int) -> None:
    """Warn when `transfer.max_length` cuts many train and dev examples: the teacher labels, the students read and
    the bundles serve them at that length."""
    pairs = None if train.pairs is None else train.pairs + dev.pairs
    rows = encode(tokenizer, train.texts + dev.texts, pairs, max_length, desc="tokenize")["input_ids"]
    if cut := cut_warning(rows, "transfer.max_length", max_length, pairs is not None, "train and dev"):
        print(f"[transfer] warning: {cut}, for the students and the served bundles; raise transfer.max_length")


def _refuse_a_labeller_built_otherwise(recipe: Recipe, folder: Path) -> None:
    """Refuse (`ArtifactError`) the labeller bundle in `folder` when a setting its manifest records differs from the
    recipe's now: the transfer set would be labelled by it while its own manifest records the recipe's. The check
    `Stage.inputs` makes of a parent, by the bundle's record: as a declared parent its hash would change every
    transfer set's."""
    built = mf.load(folder, verify=False)  # verified by `onnx_labeller`
    recorded = built.hashed.get("settings", {})
    try:
        now = recipe.settings(*recorded)
    except KeyError as err:  # recorded by a release whose recipes had a setting this one's have not
        raise mf.ArtifactError(
            f"[transfer] the labeller {folder} records a setting recipes no longer have ({err.args[0]}): run "
            "`edgedistill labeller RECIPE` first (make transfer does)"
        ) from None
    if now != recorded:
        why = mf.changes(built.hashed, built.hashed | {"settings": now})
        raise mf.ArtifactError(
            f"[transfer] the labeller {folder} was built from other settings than the recipe's ({why}): run "
            "`edgedistill labeller RECIPE` first (make transfer does)"
        )


def _empty(folder: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove what `folder` holds (if it exists) but the entries named in `keep`."""
    for left in folder.iterdir() if folder.is_dir() else []:
        if left.name in keep:
            continue
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left)
        else:
            left.unlink()


def _texts_key(recipe: Recipe, mask: str | None) -> str:
    """A short hash of what `build_texts` builds the texts from: the data, every transfer setting but `LABELLING`'s,
    which texts are held out (`HELD_OUT`) and the mask token (the teacher's tokenizer's, the texts' only tie to it)."""
    read = [f"transfer.{name}" for name in type(recipe.transfer).model_fields if name not in LABELLING]
    built_from = [recipe.settings("data", *read), HELD_OUT, mask]
    return hashlib.sha256(json.dumps(built_from, sort_keys=True).encode()).hexdigest()[:16]


def _texts(recipe: Recipe, mask: str | None, kept: Path) -> TransferTexts:
    """The transfer set's texts: those an interrupted run built from the same settings (`_texts_key`) and kept in the
    folder `kept`, however it labelled them, else `build_texts`, kept there (atomically) before labelling starts, so
    that a resumed labelling does not build them again (hours for a large unlabelled dump). Without such texts, what
    else the work folder holds (label shards of texts built otherwise, or by an earlier release) goes, but for its
    stamp and a forced run's marker."""
    key = _texts_key(recipe, mask)
    if (kept / TEXTS_KEY).is_file() and (kept / TEXTS_KEY).read_text() == key:
        progress.write(f"[transfer] resuming: the texts an interrupted run built are read from {kept}")
        return TransferTexts.read(kept)
    _empty(kept.parent, keep=("config_hash", FORCED))
    built = build_texts(recipe, mask)
    atomic_write(kept, lambda tmp: (tmp.mkdir(), built.write(tmp), (tmp / TEXTS_KEY).write_text(key)))
    return built


def labelling_placement(recipe: Recipe) -> device.Placement:
    """Where, and in what precision, the stage runs the teacher in PyTorch: `device.for_labelling`'s, but fp32 where
    an fp32 labeller bundle labels (on the CPU), which leaves PyTorch only the teacher's dev figures, in fp32."""
    placement = device.for_labelling(recipe.runtime)
    name = recipe.transfer.labeller
    if name and placement.device.type == "cpu" and recipe.export.bundles[name].precision == "fp32":
        return replace(placement, precision="fp32")
    return placement


def build_stage(inputs: Inputs) -> Built:
    """The body of `distill.stages.transfer`."""
    recipe = inputs.recipe
    teacher_dir = inputs.parent("teacher")
    tokenizer = load_tokenizer(str(teacher_dir))
    mask = mask_token(tokenizer, recipe.transfer.masks)
    placement = labelling_placement(recipe)
    model = heads.load_teacher(teacher_dir).eval().to(placement.device)
    heads.require_positions(model.config, recipe.transfer.max_length, "transfer.max_length", teacher_dir)
    # written as the bundles' server writes them, as the teacher and students score them: the teacher's dev figures
    # and logits here are the served ones
    train, dev = (split.as_served(recipe.text_style) for split in load_splits(recipe.data))
    _warn_of_cut_examples(tokenizer, train, dev, recipe.transfer.max_length)
    forward = hf_logits(model)
    labeller, second_pass = {"engine": "pytorch"}, None
    if recipe.transfer.labeller and placement.device.type == "cpu":
        folder = run_dir(recipe) / f"bundle-{recipe.transfer.labeller}"
        forward, labeller = onnx_labeller(folder, teacher_dir, recipe.transfer.label_batch_size)
        _refuse_a_labeller_built_otherwise(recipe, folder)
        wanted = recipe.export.bundles[recipe.transfer.labeller].precision
        if labeller["bundle_precision"] != wanted:
            raise mf.ArtifactError(
                f"{folder} is a {labeller['bundle_precision']} bundle but the recipe makes it {wanted}: rebuild it "
                "with `edgedistill labeller RECIPE --force` (make transfer builds it)"
            )
        if labeller["bundle_precision"] == "int8":  # the texts it is unsure of are labelled again in PyTorch
            cfg = recipe.transfer
            second_pass = SecondPass(
                hf_logits(model), cfg.relabel_margin, tokenizer.pad_token_id, cfg.label_batch_size, placement
            )

    # Label shards of an interrupted run are kept only for the same work (`work_key`: settings and teacher), engine
    # (the same labeller bundle), precision and second pass; under --force, only those a forced run of them left
    # (`Inputs.resumable_work`). Its texts go by their own key (`_texts`), and with them the wall time the run kept,
    # which counts where its work key is this run's (`common.stage`).
    key = inputs.work_key + labeller["engine"] + placement.precision
    key += labeller.get("bundle_precision", "") + labeller.get("bundle_sha256", "")
    work = inputs.resumable_work(key)
    stamp = work / "config_hash"
    if not inputs.force and (not stamp.is_file() or stamp.read_text() != key):
        _empty(work, keep=("texts", WALL))
    atomic_write(stamp, key)
    built = _texts(recipe, mask, work / "texts")
    texts, pairs, composition = built.texts, built.pairs, built.composition
    started = time.perf_counter()  # shards left by a killed run count as free
    recheck = recipe.runtime.precision == "auto"
    by = f"the labeller bundle {labeller['bundle']}" if "bundle" in labeller else TEACHER
    logits, measured = label_checked(
        model, forward, tokenizer, texts, pairs, recipe.transfer, work, placement, recheck, second_pass, by
    )
    labelling = labelling_info(placement, labeller, measured | {"seconds": round(time.perf_counter() - started, 1)})
    dev_feats = encode(tokenizer, dev.texts, dev.pairs, recipe.model.max_length)
    with torch.inference_mode():  # the teacher's dev accuracy in fp32, as its manifest gives it
        dev_logits = predict_logits(hf_logits(model), dev_feats, tokenizer.pad_token_id, placement=placement)
    teacher_dev = task_metrics(dev_logits, dev.labels, recipe.data)["dev_accuracy"]
    if second_pass is not None and labelling.get("engine") == "onnxruntime":  # how INT8 and its pass label dev
        with torch.inference_mode(), placement.autocast():
            made = predict_logits(forward, dev_feats, tokenizer.pad_token_id, recipe.transfer.label_batch_size)
            made, _ = second_pass.relabel(dev_feats, made)  # not counted: the figures are the transfer set's
        labelling["second_pass"]["dev_agreement"] = float((made.argmax(-1) == dev_logits.argmax(-1)).mean())

    def write(folder: Path) -> None:
        built.write(folder)
        np.save(folder / "logits.npy", logits)
        np.save(folder / "dev_logits.npy", dev_logits.astype(np.float32))

    read = {}
    if labelling["engine"] == "onnxruntime":  # the labels are the bundle's: building it again makes them stale
        bundle = Path(labeller["bundle"])
        read[bundle.name] = mf.Parent(path=str(bundle), manifest_sha256=labeller["bundle_sha256"])
    shares = np.bincount(logits.argmax(-1), minlength=recipe.data.num_labels) / len(texts)
    parts = ", ".join(f"{k} {composition[k]}" for k in SOURCES)
    engine = f"{labelling['engine']} on {labelling['device']} ({labelling['precision']})"
    if "second_pass" in labelling:
        again = labelling["second_pass"]
        engine = (
            f"onnxruntime INT8 on {labelling['device']}, {again['relabelled_share']:.1%} again in PyTorch "
            f"({again['precision']})"
        )
    return Built(
        write,
        metrics={
            "sentences": len(texts),
            "teacher_dev_accuracy": teacher_dev,
            **{f"n_{k}": v for k, v in composition.items()},
        },
        info={
            "composition": composition,
            "teacher_label_shares": dict(zip(recipe.data.label_names, shares.round(4).tolist(), strict=True)),
            "text_style": recipe.transfer.text_style,
            "pairs": pairs is not None,
            "sources": list(SOURCES),
            "logits_dtype": "float16",
            "labelling": labelling,
        },
        line=f"{len(texts)} {'pairs' if pairs else 'sentences'} ({parts}; "
        f"{composition['removed_duplicates']} duplicates, {composition['removed_no_words']} without words and "
        f"{composition['removed_held_out_overlap']} dev or test overlaps removed), labelled by {engine} "
        f"in {labelling['seconds'] / 60:.1f} min",
        parents=read,
    )
