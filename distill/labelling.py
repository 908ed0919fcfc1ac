"""Labelling the transfer set with the teacher: in shards that survive a killed run, in PyTorch or through an ONNX
labeller bundle (INT8 with a second pass over the texts it is unsure of), checked against fp32 labels.

Each shard is written atomically to the work folder, so a killed run resumes at the first missing shard; a second
pass's counts are written beside each shard, after it, so its figures cover every shard, kept ones too.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import progress
from edgedistill.common.atomic import atomic_write
from edgedistill.common.bundle import read_bundle
from edgedistill.common.recipe import RecipeError
from edgedistill.common.runtime import open_bundle
from edgedistill.common.scores import top_two_gap, within_reach
from edgedistill.distill.device import Placement
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.tokenization import encode

TEACHER = "the teacher in PyTorch"  # what labels, where no labeller bundle does


def _finished(path: Path, rows: int) -> bool:
    """Whether `path` is a finished shard of `rows` logits (a missing or unreadable one is labelled again); its
    header and size are checked, its logits left on disk."""
    if not path.is_file():
        return False
    try:
        logits = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as err:  # numpy raises these for a truncated, empty or foreign file
        progress.write(f"[transfer] {path} is unreadable ({err}); labelling its sentences again")
        return False
    if logits.ndim != 2 or len(logits) != rows:
        progress.write(f"[transfer] {path} holds {logits.shape}, not {rows} rows; labelling its sentences again")
        return False
    return True


def _record(shard: Path) -> Path:
    """Where the second pass's counts of `shard` are kept: beside it."""
    return shard.with_suffix(".json")


def _counted(shard: Path) -> dict | None:
    """The second pass's counts of `shard` ({texts, relabelled}), None where its record is missing or unreadable (a
    run killed between writing the shard and its record): the shard is then labelled again."""
    try:
        return json.loads(_record(shard).read_text())
    except (OSError, ValueError):
        return None


def _refuse_non_finite(shard: np.ndarray, name: str, made_by: str) -> None:
    """`RecipeError` where a row of `shard` (float16, (N, C), as it is stored) is NaN or infinite: stored, such labels
    pass the fp32 check (a NaN row's argmax is 0) and make every student diverge."""
    if bad := int((~np.isfinite(shard)).any(-1).sum()):
        raise RecipeError(
            f"[transfer] {bad} of the {len(shard)} texts of shard {name} got logits from {made_by} that are NaN or "
            "infinite as float16, which shards hold, and would pass for labels: the shard is not written. Label in "
            "fp32 in PyTorch (--runtime.precision=fp32 --transfer.labeller=null, with --transfer.relabel_margin=null "
            "where the recipe sets a margin); where the teacher gives them in fp32 too, build it again "
            "(`edgedistill teacher RECIPE --force`)"
        )


def agreement(logits: np.ndarray, reference: np.ndarray, tie_margin: float) -> dict:
    """How the predictions of `logits` agree with those of `reference`, both (N, C): the share equal; the share equal
    but for tie flips, a label whose `reference` logit is within `tie_margin` of its top (a near-tie); the tie flips;
    and the largest |Δlogit|."""
    predicted = logits.argmax(-1)
    tie = within_reach(reference, predicted, tie_margin)
    differ = predicted != reference.argmax(-1)
    return {
        "agreement": float(1 - differ.mean()),
        "agreement_beyond_ties": float(1 - (differ & ~tie).mean()),
        "tie_flips": int((differ & tie).sum()),
        "max_abs_diff": float(np.abs(logits - reference).max()),
    }


class SecondPass:
    """Labels again with `forward` (the teacher in PyTorch) every text an INT8 labeller is unsure of: its margin,
    the gap between its two highest logits, below `margin`. Its figures sum the counts of every shard (`count`)."""

    def __init__(self, forward, margin: float, pad_id: int, batch_size: int, placement: Placement):
        self.forward, self.margin, self.pad_id = forward, margin, pad_id
        self.batch_size, self.placement = batch_size, placement
        self.seen = self.relabelled = 0

    def count(self, shards: list[dict]) -> None:
        """Take the figures from every shard's counts ({texts, relabelled}), shards kept from an interrupted run
        too."""
        self.seen = sum(shard["texts"] for shard in shards)
        self.relabelled = sum(shard["relabelled"] for shard in shards)

    def relabel(self, features: dict[str, list[list[int]]], logits: np.ndarray) -> tuple[np.ndarray, int]:
        """`logits` with the rows below the margin (or without one: a NaN) made again by `forward` (a new array), and
        how many were."""
        unsure = np.flatnonzero(~(top_two_gap(logits) >= self.margin))
        if len(unsure):
            subset = {key: [rows[i] for i in unsure] for key, rows in features.items()}
            logits = logits.copy()
            logits[unsure] = predict_logits(self.forward, subset, self.pad_id, self.batch_size, None, self.placement)
        return logits, len(unsure)

    def figures(self) -> dict:
        """What the manifest records: the margin, the precision, and the share of the whole set labelled again."""
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
    made_by: str = f"{TEACHER} (fp32)",
) -> np.ndarray:
    """Teacher logits (`forward(batch) -> logits`, then `second_pass` where given) for `texts` (with their
    `pairs`), batched by length on `placement`, one atomically written float16 shard at a time, then the second
    pass's counts of it; finished shards are kept (with a second pass, only those with their counts), damaged ones
    labelled again. A shard with a NaN or infinite logit is refused, naming what labelled it (`made_by`), before
    anything of it is written."""
    starts = range(0, len(texts), cfg.shard_size)
    paths = [work / f"logits-{index:05d}.npy" for index in range(len(starts))]
    sizes = [min(cfg.shard_size, len(texts) - start) for start in starts]
    kept = [_finished(path, size) for path, size in zip(paths, sizes, strict=True)]
    if second_pass is not None:
        counts = [_counted(path) if held else None for path, held in zip(paths, kept, strict=True)]
        kept = [shard is not None for shard in counts]
    done = sum(size for held, size in zip(kept, sizes, strict=True) if held)
    bar = progress.bar(len(texts), desc="label", unit="sent", initial=done)
    if done:
        progress.write(f"[transfer] resuming labelling: {done} of {len(texts)} sentences already labelled")
    for index, start in enumerate(starts):
        if kept[index]:
            continue
        end = start + cfg.shard_size
        feats = encode(tokenizer, texts[start:end], pairs[start:end] if pairs else None, cfg.max_length)
        logits = predict_logits(forward, feats, tokenizer.pad_token_id, cfg.label_batch_size, bar, placement)
        if second_pass is not None:
            logits, relabelled = second_pass.relabel(feats, logits)
            counts[index] = {"texts": len(logits), "relabelled": relabelled}
        shard = logits.astype(np.float16)
        _refuse_non_finite(shard, paths[index].name, made_by)
        atomic_write(paths[index], lambda tmp, shard=shard: np.save(tmp, shard))
        if second_pass is not None:
            atomic_write(_record(paths[index]), json.dumps(counts[index]))
    bar.close()
    if second_pass is not None:
        second_pass.count(counts)
    joined = None  # the shards, read back one at a time into one array: never all held, nor joined twice
    for start, path in zip(starts, paths, strict=True):
        shard = np.load(path)
        if joined is None:
            joined = np.empty((len(texts), shard.shape[1]), dtype=np.float16)
        joined[start : start + len(shard)] = shard
    return joined


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
    labeller: str = TEACHER,
) -> tuple[np.ndarray, dict]:
    """`label_shards` by `forward`, which `labeller` names in errors, in `placement`'s precision (an INT8 labeller's
    `forward` with its `second_pass`), and the figures for the manifest. Labels made in bf16/fp16 or by INT8 are
    compared with fp32 ones (`precision_check`); labels that agree on fewer than `cfg.min_agreement` of the checked
    sentences (near-ties aside) are made again by the teacher in fp32, their figures kept under `rejected`: always for
    INT8's labels (a labeller the recipe names is gated), and with `recheck` (precision auto) for PyTorch's; an
    explicit bf16/fp16 keeps its labels, with a warning and the figures."""
    made_by = f"{labeller} ({placement.precision})"
    if second_pass is not None:
        made_by = f"{labeller} (INT8) with its second pass in PyTorch ({placement.precision})"
    with torch.inference_mode(), placement.autocast():
        logits = label_shards(forward, tokenizer, texts, pairs, cfg, work, placement, second_pass, made_by)
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


def labelling_info(placement: Placement, labeller: dict, made: dict) -> dict:
    """`info.labelling`: where labelling ran (`placement`), the labeller (`labeller`: its engine and, for an ONNX
    bundle, the bundle and its parity figures) and what `label_checked` measured (`made`). Labels made again in fp32
    keep the labeller under `rejected`, with the figures that rejected it: the top names only what labelled."""
    if "rejected" in made:
        return placement.describe() | made | {"rejected": labeller | made["rejected"]}
    return placement.describe() | labeller | made


def check_sample(total: int, count: int) -> np.ndarray:
    """`count` indices evenly spaced over `total` texts (all of them when there are fewer), so the check sees every
    source of the transfer set in its share."""
    return np.unique(np.linspace(0, total - 1, min(count, total)).round().astype(int))


def precision_check(
    model, tokenizer, texts: list[str], pairs: list[str] | None, logits: np.ndarray, cfg, placement: Placement
) -> dict:
    """How labels made in reduced precision compare with fp32 ones on `check_sample` of the texts (`agreement`): a
    differing label whose fp32 logit is within `cfg.tie_margin` of fp32's highest is a tie flip, which
    `fp32_agreement_beyond_ties` (what the gate reads) does not count against the labels."""
    sample = check_sample(len(texts), cfg.precision_check_sentences)
    with torch.inference_mode():
        feats = encode(
            tokenizer, [texts[i] for i in sample], [pairs[i] for i in sample] if pairs else None, cfg.max_length
        )
        reference = predict_logits(
            hf_logits(model), feats, tokenizer.pad_token_id, cfg.label_batch_size, None, placement
        )
    figures = agreement(logits[sample].astype(np.float32), reference, cfg.tie_margin)
    return {"fp32_check_sentences": len(sample)} | {f"fp32_{key}": value for key, value in figures.items()}


def onnx_labeller(folder: Path, teacher_dir: Path, max_batch: int) -> tuple[Callable, dict]:
    """`forward(batch) -> logits` of the teacher's fp32 or INT8 ONNX bundle `folder`, on the CPU with this
    process's threads, for batches of up to `max_batch` rows, and its parity figures (`bundle_precision` says which). The bundle is verified and must be
    an export of the teacher in `teacher_dir` (its recorded parent), so its labels are that teacher's within its
    gate."""
    if not (folder / mf.MANIFEST).is_file():
        raise mf.ArtifactError(
            f"transfer.labeller: {folder} is not built: run `edgedistill labeller RECIPE` first (make transfer "
            "does), or label in PyTorch with --transfer.labeller=null (and --transfer.relabel_margin=null where the "
            "recipe sets a margin, as recipes/sst2.yaml does)"
        )
    bundle, files = read_bundle(folder)  # the model is opened from the bytes verified here
    exported_from = bundle.manifest.parents.get("teacher")
    if exported_from is None or exported_from.manifest_sha256 != mf.sha256_file(teacher_dir / mf.MANIFEST):
        raise mf.ArtifactError(
            f"{folder} was not exported from the teacher in {teacher_dir} (rebuilt since?): "
            "rebuild it with `edgedistill labeller RECIPE` (make transfer does)"
        )
    if bundle.spec.precision not in ("fp32", "int8"):
        raise mf.ArtifactError(f"{folder} is a {bundle.spec.precision} bundle: the labeller must be fp32 or INT8")
    runner = open_bundle(bundle, model=files.model, threads=torch.get_num_threads(), max_batch=max_batch)

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
