"""Build the transfer set and label it with the teacher once; writes `runs/<recipe>/transfer/`.

Examples come from unlabelled text (split into sentences; adjacent sentences for pair tasks), the
labelled train inputs, and Tang et al. augmentations of those inputs, all written in the recipe's
`transfer.text_style`. They are deduplicated and any that overlaps a dev text is dropped. Labelling
runs in shards, each written atomically to the work folder, so a killed run resumes at the first
missing shard.

Artifact: `texts.txt` (one text per line), for pair tasks `pairs.txt` (sentence B, line by line),
`meta.npz` (`source`: 0 unlabelled, 1 train, 2 augmented; `label`: gold label or -1), `logits.npy`
(float16, (N, C)) and `dev_logits.npy`.
"""

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import progress
from edgedistill.common.atomic import atomic_write
from edgedistill.common.bundle import load_bundle
from edgedistill.common.data import load_splits, load_unlabelled
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.runtime import open_bundle
from edgedistill.common.stage import Built, Inputs, Stage
from edgedistill.distill import device, finetune, heads
from edgedistill.distill.augment import augment_examples, normalise, split_sentences, styled, vocab_replacer
from edgedistill.distill.device import Placement
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.metrics import task_metrics
from edgedistill.distill.tokenization import encode, load_tokenizer

SOURCES = ("unlabelled", "train", "augmented")
LEAK_NGRAM = 8
MIN_CONTAINED = 5


def leak_filter(dev_texts: list[str]):
    """A predicate: True for text equal to a dev sentence, containing a whole dev sentence of 5 to 7
    words, or sharing 8 words in a row with a longer one (compared on `normalise`d words)."""
    keys = {normalise(t) for t in dev_texts}
    grams = set()
    for key in keys:
        words = tuple(key.split())
        if MIN_CONTAINED <= len(words) < LEAK_NGRAM:
            grams.add(words)
        grams.update(words[i : i + LEAK_NGRAM] for i in range(len(words) - LEAK_NGRAM + 1))

    def leaks(text: str) -> bool:
        key = normalise(text)
        if key in keys:
            return True
        words = tuple(key.split())
        return any(
            words[i : i + n] in grams for n in range(MIN_CONTAINED, LEAK_NGRAM + 1) for i in range(len(words) - n + 1)
        )

    return leaks


@dataclass(frozen=True)
class TransferTexts:
    """The transfer set's inputs, before labelling: texts, their pairs (pair tasks), where each came from, gold
    labels (train examples) or -1, and the composition counts."""

    texts: list[str]
    pairs: list[str] | None
    sources: np.ndarray
    labels: np.ndarray
    composition: dict


def _adjacent(sentences: list[str]) -> list[tuple[str, str]]:
    """Unlabelled pairs: each sentence of a text with the next one."""
    return list(zip(sentences, sentences[1:], strict=False))


def build_texts(recipe: Recipe, mask_token: str) -> TransferTexts:
    """The transfer set's inputs, deterministic for the recipe's seed, every text in `transfer.text_style`.

    Pair tasks get pairs from every source: the train pairs, augmented pairs (each side augmented on its own)
    and, from unlabelled text, adjacent sentences of the same line. Duplicates are found on both sides, and a
    pair is dropped when either side overlaps a dev text.
    """
    cfg = recipe.transfer
    rng = random.Random(cfg.seed)
    train, dev = load_splits(recipe.data)
    raw = load_unlabelled(cfg.unlabelled_files, cfg.unlabelled_max_lines)
    split = [split_sentences(line, cfg.text_style) for line in raw]
    columns = [train.texts] + ([train.pairs] if train.pairs is not None else [])
    train_examples = list(zip(*([styled(t, cfg.text_style) for t in column] for column in columns), strict=True))
    if train.pairs is not None:
        unlabelled = [pair for sentences in split for pair in _adjacent(sentences)]
    else:
        unlabelled = [(sentence,) for sentences in split for sentence in sentences]
    rng.shuffle(unlabelled)
    # Unigram sampling over the train words stands in for Tang et al.'s same-POS unigram sampling.
    words = [w for example in train_examples for side in example for w in side.split()]
    augmented = augment_examples(
        train_examples,
        cfg.n_iter,
        rng,
        p_mask=cfg.p_mask,
        p_replace=cfg.p_replace,
        p_ngram=cfg.p_ngram,
        mask_token=mask_token,
        replace=vocab_replacer(words),
    )
    rng.shuffle(augmented)
    candidates = [(t, 1, y) for t, y in zip(train_examples, train.labels, strict=True)] if cfg.include_train else []
    if cfg.max_unlabelled:  # twice the cap leaves room for the duplicates dropped below
        unlabelled = unlabelled[: 2 * cfg.max_unlabelled]
    candidates += [(t, 0, -1) for t in unlabelled]
    candidates += [(t, 2, -1) for t in augmented[: cfg.max_augmented]]
    leaks = leak_filter(dev.texts + (dev.pairs or []))
    seen, inputs, sources, labels = set(), [], [], []
    counts = dict.fromkeys(SOURCES, 0)
    removed = {"duplicates": 0, "dev_overlap": 0}
    for sides, source, label in candidates:
        key = tuple(normalise(side) for side in sides)
        if source == 0 and cfg.max_unlabelled and counts["unlabelled"] >= cfg.max_unlabelled:
            continue
        if not all(key) or key in seen:
            removed["duplicates"] += 1
            continue
        if any(leaks(side) for side in sides):
            removed["dev_overlap"] += 1
            continue
        seen.add(key)
        counts[SOURCES[source]] += 1
        inputs.append(sides)
        sources.append(source)
        labels.append(label)
    composition = {**counts, **{f"removed_{k}": v for k, v in removed.items()}, "total": len(inputs)}
    return TransferTexts(
        [sides[0] for sides in inputs],
        [sides[1] for sides in inputs] if train.pairs is not None else None,
        np.array(sources, dtype=np.int8),
        np.array(labels, dtype=np.int64),
        composition,
    )


def _kept_shard(path: Path, rows: int) -> np.ndarray | None:
    """A finished shard of `rows` logits, or None when it is missing or unreadable (then it is labelled again)."""
    if not path.is_file():
        return None
    try:
        logits = np.load(path)
    except (OSError, ValueError) as err:  # numpy raises these for a truncated or foreign file
        progress.write(f"[transfer] {path} is unreadable ({err}); labelling its sentences again")
        return None
    if logits.ndim != 2 or len(logits) != rows:
        progress.write(f"[transfer] {path} holds {logits.shape}, not {rows} rows; labelling its sentences again")
        return None
    return logits


def top_two_gap(logits: np.ndarray) -> np.ndarray:
    """Per row, the gap between the two highest logits: how sure the labeller is of its label."""
    top = np.sort(logits, -1)
    return top[:, -1] - top[:, -2]


class SecondPass:
    """Labels again with `forward` (the teacher in PyTorch) every text an INT8 labeller is unsure of: its margin,
    the gap between its two highest logits, below `margin`. Counts the texts it sees and those it labels again."""

    def __init__(self, forward, margin: float, pad_id: int, batch_size: int, placement: Placement):
        self.forward, self.margin, self.pad_id = forward, margin, pad_id
        self.batch_size, self.placement = batch_size, placement
        self.seen = self.relabelled = 0

    def __call__(self, features: dict[str, list[list[int]]], logits: np.ndarray) -> np.ndarray:
        """`relabel`, counted in the figures."""
        made, relabelled = self.relabel(features, logits)
        self.seen += len(logits)
        self.relabelled += relabelled
        return made

    def relabel(self, features: dict[str, list[list[int]]], logits: np.ndarray) -> tuple[np.ndarray, int]:
        """`logits` with the rows below the margin made again by `forward` (a new array), and how many were."""
        unsure = np.flatnonzero(top_two_gap(logits) < self.margin)
        if len(unsure):
            subset = {key: [rows[i] for i in unsure] for key, rows in features.items()}
            logits = logits.copy()
            logits[unsure] = predict_logits(self.forward, subset, self.pad_id, self.batch_size, None, self.placement)
        return logits, len(unsure)

    def figures(self) -> dict:
        """What the manifest records: the margin, the precision, and the share labelled again (of the texts
        labelled in this run: shards kept from an interrupted one are not counted)."""
        share = self.relabelled / self.seen if self.seen else 0.0
        return {
            "margin": self.margin,
            "precision": self.placement.precision,
            "texts": self.seen,
            "relabelled": self.relabelled,
            "relabelled_share": round(share, 4),
        }


def label_shards(
    forward,
    tokenizer,
    texts: list[str],
    pairs: list[str] | None,
    cfg,
    work: Path,
    placement: Placement,
    second_pass: SecondPass | None = None,
) -> np.ndarray:
    """Teacher logits (`forward(batch) -> logits`, then `second_pass` where given) for `texts` (with their
    `pairs`), batched by length on `placement`, one atomically written float16 shard at a time; finished shards
    are kept, damaged ones labelled again."""
    starts = range(0, len(texts), cfg.shard_size)
    paths = [work / f"logits-{index:05d}.npy" for index in range(len(starts))]
    sizes = [min(cfg.shard_size, len(texts) - start) for start in starts]
    shards = [_kept_shard(path, size) for path, size in zip(paths, sizes, strict=True)]
    done = sum(size for shard, size in zip(shards, sizes, strict=True) if shard is not None)
    bar = progress.bar(len(texts), desc="label", unit="sent", initial=done)
    if done:
        progress.write(f"[transfer] resuming labelling: {done} of {len(texts)} sentences already labelled")
    for index, start in enumerate(starts):
        if shards[index] is not None:
            continue
        end = start + cfg.shard_size
        feats = encode(tokenizer, texts[start:end], pairs[start:end] if pairs else None, cfg.max_length)
        logits = predict_logits(forward, feats, tokenizer.pad_token_id, cfg.label_batch_size, bar, placement)
        if second_pass is not None:
            logits = second_pass(feats, logits)
        shards[index] = logits.astype(np.float16)
        atomic_write(paths[index], lambda tmp, shard=shards[index]: np.save(tmp, shard))
    bar.close()
    return np.concatenate(shards)


def label_checked(
    model,
    forward,
    tokenizer,
    texts: list[str],
    pairs: list[str] | None,
    cfg,
    work: Path,
    placement: Placement,
    recheck: bool,
    second_pass: SecondPass | None = None,
) -> tuple[np.ndarray, dict]:
    """`label_shards` in `placement`'s precision (an INT8 labeller's `forward` with its `second_pass`), and the
    figures for the manifest. Labels made in bf16/fp16 or by INT8 are compared with fp32 ones (`precision_check`);
    labels that agree on fewer than `cfg.min_agreement` of the checked sentences (near-ties aside) are made again by
    the teacher in fp32, their figures kept under `rejected`: always for INT8's labels (a labeller the recipe names
    is gated), and with `recheck` (precision auto) for PyTorch's; an explicit bf16/fp16 keeps its labels, with a
    warning and the figures."""
    with torch.inference_mode(), placement.autocast():
        logits = label_shards(forward, tokenizer, texts, pairs, cfg, work, placement, second_pass)
    made = {"precision": placement.precision}
    if second_pass is not None:
        made |= {"second_pass": second_pass.figures()}
    if placement.precision == "fp32" and second_pass is None:
        return logits, made
    check = precision_check(model, tokenizer, texts, pairs, logits, cfg, placement)
    if check["fp32_agreement_beyond_ties"] >= cfg.min_agreement:
        return logits, made | check
    what = "INT8 (with its second pass)" if second_pass is not None else placement.precision
    below = (
        f"[transfer] {what} labels agree with fp32 on {check['fp32_agreement_beyond_ties']:.2%} of "
        f"{check['fp32_check_sentences']} sentences (near-ties aside), below transfer.min_agreement "
        f"{cfg.min_agreement:.2%}"
    )
    if not recheck and second_pass is None:
        progress.write(f"{below}: kept, as runtime.precision={placement.precision} asks (figures in the manifest)")
        return logits, made | check
    progress.write(f"{below}: labelling again in fp32")
    (work / "fp32").mkdir(exist_ok=True)
    with torch.inference_mode():
        logits = label_shards(hf_logits(model), tokenizer, texts, pairs, cfg, work / "fp32", placement)
    return logits, {"precision": "fp32", "engine": "pytorch", "rejected": made | check}


def check_sample(total: int, count: int) -> np.ndarray:
    """`count` indices evenly spaced over `total` texts (all of them when there are fewer), so the check sees every
    source of the transfer set in its share."""
    return np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(int))


def precision_check(
    model, tokenizer, texts: list[str], pairs: list[str] | None, logits: np.ndarray, cfg, placement: Placement
) -> dict:
    """How labels made in reduced precision compare with fp32 ones on `check_sample` of the texts. A text whose
    fp32 top two logits are within `cfg.tie_margin` is a near-tie: a differing label there is a tie flip, which
    `fp32_agreement_beyond_ties` (what the gate reads) does not count against the labels."""
    sample = check_sample(len(texts), cfg.precision_check_sentences)
    with torch.inference_mode():
        feats = encode(
            tokenizer, [texts[i] for i in sample], [pairs[i] for i in sample] if pairs else None, cfg.max_length
        )
        reference = predict_logits(
            hf_logits(model), feats, tokenizer.pad_token_id, cfg.label_batch_size, None, placement
        )
    reduced = logits[sample].astype(np.float32)
    tie = top_two_gap(reference) < cfg.tie_margin
    differ = reduced.argmax(-1) != reference.argmax(-1)
    return {
        "fp32_check_sentences": len(sample),
        "fp32_agreement": float(1 - differ.mean()),
        "fp32_agreement_beyond_ties": float(1 - (differ & ~tie).mean()),
        "fp32_tie_flips": int((differ & tie).sum()),
        "fp32_max_abs_diff": float(np.abs(reduced - reference).max()),
    }


def onnx_labeller(folder: Path, teacher_dir: Path) -> tuple[Callable, dict]:
    """`forward(batch) -> logits` of the teacher's fp32 or INT8 ONNX bundle `folder`, on the CPU with this
    process's threads, and its parity figures (`bundle_precision` says which). The bundle is verified and must be
    an export of the teacher in `teacher_dir` (its recorded parent), so its labels are that teacher's within its
    gate."""
    if not (folder / mf.MANIFEST).is_file():
        raise mf.ArtifactError(
            f"transfer.labeller: {folder} is not built: run `edgedistill labeller RECIPE` first (make transfer "
            "does), or label in PyTorch with --transfer.labeller=null"
        )
    bundle = load_bundle(folder)
    exported_from = bundle.manifest.parents.get("teacher")
    if exported_from is None or exported_from.manifest_sha256 != mf.sha256_file(teacher_dir / mf.MANIFEST):
        raise mf.ArtifactError(
            f"{folder} was not exported from the teacher in {teacher_dir} (rebuilt since?): "
            "rebuild it with `edgedistill labeller RECIPE` (make transfer does)"
        )
    if bundle.spec.precision not in ("fp32", "int8"):
        raise mf.ArtifactError(f"{folder} is a {bundle.spec.precision} bundle: the labeller must be fp32 or INT8")
    runner = open_bundle(bundle, threads=torch.get_num_threads())

    def forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"].numpy()
        feed = {name: batch[name].numpy() if name in batch else np.zeros_like(ids) for name in bundle.spec.input_names}
        return torch.from_numpy(runner.infer(feed)["logits"])

    figures = {key: bundle.manifest.metrics[key] for key in ("agreement", "max_abs_diff", "dev_accuracy")}
    return forward, {
        "engine": "onnxruntime",
        "bundle": str(folder),
        "bundle_precision": bundle.spec.precision,
        "bundle_sha256": bundle.manifest_sha256,
    } | figures


def stage(recipe: Recipe) -> Stage:
    """`runs/<recipe>/transfer/`: the transfer set, labelled by the teacher (through the labeller bundle the
    recipe names, whose export settings count too)."""
    name = recipe.transfer.labeller if recipe.transfer else None
    labeller = {"labeller": recipe.export.bundles[name].model_dump(mode="json")} if name else None
    return Stage("transfer", recipe, ("data", "transfer"), _build, (finetune.stage(recipe),), extra=labeller)


def _build(inputs: Inputs) -> Built:
    recipe = inputs.recipe
    teacher_dir = inputs.parent("teacher")
    tokenizer = load_tokenizer(str(teacher_dir))
    placement = device.for_labelling(recipe.runtime)
    model = heads.load_teacher(teacher_dir).eval().to(placement.device)
    forward = hf_logits(model)
    figures, second_pass = {"engine": "pytorch"}, None
    if recipe.transfer.labeller and placement.device.type == "cpu":
        folder = run_dir(recipe) / f"bundle-{recipe.transfer.labeller}"
        forward, figures = onnx_labeller(folder, teacher_dir)
        wanted = recipe.export.bundles[recipe.transfer.labeller].precision
        if figures["bundle_precision"] != wanted:
            raise mf.ArtifactError(
                f"{folder} is a {figures['bundle_precision']} bundle but the recipe makes it {wanted}: rebuild it "
                "with `edgedistill labeller RECIPE --force` (make transfer builds it)"
            )
        if figures["bundle_precision"] == "fp32":
            placement = replace(placement, precision="fp32")  # an fp32 graph labels; nothing runs in PyTorch
        else:  # INT8 labels; the texts it is unsure of are labelled again in PyTorch, in the labelling precision
            cfg = recipe.transfer
            second_pass = SecondPass(
                hf_logits(model), cfg.relabel_margin, tokenizer.pad_token_id, cfg.label_batch_size, placement
            )
    labelling = placement.describe() | figures

    work = inputs.work
    stamp = work / "config_hash"
    # Label shards of an interrupted run are kept only for the same teacher, engine (the same labeller bundle),
    # precision and second pass.
    key = inputs.config_hash + mf.sha256_file(teacher_dir / mf.MANIFEST) + labelling["engine"] + placement.precision
    key += figures.get("bundle_precision", "") + figures.get("bundle_sha256", "")
    if inputs.force or not stamp.is_file() or stamp.read_text() != key:
        shutil.rmtree(work, ignore_errors=True)
        atomic_write(stamp, key)
    built = build_texts(recipe, tokenizer.mask_token or tokenizer.unk_token)
    texts, pairs, composition = built.texts, built.pairs, built.composition
    started = time.perf_counter()  # shards left by a killed run count as free
    recheck = recipe.runtime.precision == "auto"
    logits, figures = label_checked(
        model, forward, tokenizer, texts, pairs, recipe.transfer, work, placement, recheck, second_pass
    )
    labelling |= figures | {"seconds": round(time.perf_counter() - started, 1)}
    _, dev = load_splits(recipe.data)
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
        (folder / "texts.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        if pairs is not None:
            (folder / "pairs.txt").write_text("".join(t + "\n" for t in pairs), encoding="utf-8")
        np.savez(folder / "meta.npz", source=built.sources, label=built.labels)
        np.save(folder / "logits.npy", logits)
        np.save(folder / "dev_logits.npy", dev_logits.astype(np.float32))
        (folder / "composition.json").write_text(json.dumps(composition, indent=1))

    shares = np.bincount(logits.astype(np.float32).argmax(-1), minlength=recipe.data.num_labels) / len(texts)
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
        line=f"{len(texts)} {'pairs' if pairs else 'sentences'} ({parts}; {composition['removed_duplicates']} duplicates and "
        f"{composition['removed_dev_overlap']} dev overlaps removed), labelled by {engine} "
        f"in {labelling['seconds'] / 60:.1f} min",
    )
