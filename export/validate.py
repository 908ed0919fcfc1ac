"""Every export checks itself: the exported model (ONNX Runtime or TensorRT) against PyTorch on the dev set and on odd
shapes."""

import numpy as np
import torch
from edgedistill.common.config.export import AGREEMENT_KEYS
from edgedistill.common.config.training import DataConfig
from edgedistill.common.runtime import Runner
from edgedistill.distill.finetune import predict_logits
from edgedistill.distill.labelling import agreement
from edgedistill.distill.metrics import task_metrics
from edgedistill.export.onnx_export import ExportError, Source, example_inputs

SHAPES = [(1, 1), (1, 64), (3, 17), (32, 9), (32, 128)]
# Rows of the shape at a bundle's max length, where that is longer than every length of SHAPES.
LONGEST_BATCH = 3
# Rows per call of the dev-set pass; with SHAPES, the largest batch a bundle's checks run.
DEV_BATCH = 64
FP32_TOLERANCE = 1e-3
# Slack of a gate's comparison of dev figures: float rounding puts a figure exactly at its gate on either side of it
# (0.9 - 0.895 > 0.005); far below one dev text's share.
GATE_SLACK = 1e-9
# Predictions differing from PyTorch's, near-ties aside, few enough to miss an agreement gate only on a small dev
# split: the error then names the gate's key and a larger split as ways out.
SMALL_DEV_DIFFER = 2


class ExportGateError(ExportError):
    """A bundle that works but misses its parity or accuracy gate; the message has the figures."""


def logits_runner(runner: Runner):
    """`run(feeds) -> logits` for a model opened with `common.runtime`; feeds the model does not take are ignored."""
    return lambda feeds: runner.infer(feeds)["logits"]


def as_forward(run):
    """A `predict_logits` forward from a numpy runner: torch batch in, torch logits out."""
    return lambda batch: torch.from_numpy(np.asarray(run({k: v.numpy() for k, v in batch.items()}), dtype=np.float32))


def torch_forward(source: Source):
    return lambda batch: source.module(*(batch[n] for n in source.inputs))


def shape_cases(max_length: int) -> list[tuple[int, int]]:
    """The (batch, length) shapes `check_shapes` runs: those of `SHAPES` within `max_length`, and `LONGEST_BATCH`
    rows of `max_length` where it is longer than all of them."""
    cases = {(batch, min(length, max_length)) for batch, length in SHAPES}
    if max_length > max(length for _, length in SHAPES):
        cases.add((LONGEST_BATCH, max_length))
    return sorted(cases)


def check_shapes(run, source: Source, precision: str, max_length: int, fused: bool = False) -> dict[str, float]:
    """Run batch sizes 1, 3, 32 at several lengths up to `max_length` (a graph with a hard-coded batch or
    length fails here); an fp32 graph's logits must also be within `FP32_TOLERANCE` of PyTorch's, and where they are
    not, the error of a graph with ONNX Runtime's fused Transformer kernels (`fused`) names the way out."""
    worst = {}
    for batch, length in shape_cases(max_length):
        inputs = example_inputs(source.inputs, batch, length)
        try:
            got = run({k: v.numpy() for k, v in inputs.items()})
        except Exception as err:  # noqa: BLE001 - ONNX Runtime and TensorRT raise their own exception types
            raise ExportError(f"{source.arch}: exported model fails at batch {batch}, length {length}: {err}") from err
        with torch.no_grad():
            want = source.module(*inputs.values()).numpy()
        if got.shape != want.shape:
            raise ExportError(
                f"{source.arch}: output shape {got.shape} at batch {batch}, length {length}; want {want.shape}"
            )
        require_finite(got, f"{source.arch} at batch {batch}, length {length}", precision)
        diff = float(np.abs(got - want).max())
        if precision == "fp32" and not diff <= FP32_TOLERANCE:
            unfused = " (fused: false builds a Transformer without ONNX Runtime's fused kernels)" if fused else ""
            raise ExportGateError(
                f"{source.arch}: max |Δlogit| {diff:.2e} against PyTorch at batch {batch}, length {length}, over the "
                f"fp32 tolerance {FP32_TOLERANCE}{unfused}"
            )
        worst[f"b{batch}_t{length}"] = diff
    return worst


def require_finite(logits: np.ndarray, where: str, precision: str) -> None:
    """Raise `ExportGateError` when exported `logits` hold a NaN or an infinity, which no precision's gate accepts."""
    finite = np.isfinite(logits)
    if not finite.all():
        overflow = " (half precision overflows: build it with precision: fp32)" if precision == "fp16" else ""
        raise ExportGateError(
            f"{where}: the {precision} graph gives {finite.size - finite.sum()} NaN or infinite logits of "
            f"{finite.size}{overflow}"
        )


def parity(
    ort_logits: np.ndarray, torch_logits: np.ndarray, labels: list[int], data: DataConfig, tie_margin: float
) -> dict[str, float]:
    """Agreement of predictions, max |Δlogit|, the dev examples, both accuracies on them, the exported model's
    `dev_macro_f1` and (for a task with a positive class) `dev_f1`, so that its selection metric is there too, and
    PyTorch's figure of that metric (`torch_dev_<metric>`) for the INT8 gate. An example whose PyTorch top two logits
    are within `tie_margin` is a near-tie: a prediction that differs there by a label whose PyTorch logit is within
    `tie_margin` of the top is a tie flip (`tie_flips`), which `agreement_beyond_ties` (what the gate reads) does not
    count."""
    gold = np.asarray(labels)
    task = task_metrics(ort_logits, labels, data)
    figures = agreement(ort_logits, torch_logits, tie_margin) | {
        "dev_examples": len(gold),
        "dev_accuracy": float((ort_logits.argmax(-1) == gold).mean()),
        "torch_dev_accuracy": float((torch_logits.argmax(-1) == gold).mean()),
        **{key: task[key] for key in ("dev_macro_f1", "dev_f1") if key in task},
    }
    if data.metric != "accuracy":
        selected = f"dev_{data.metric}"
        figures[f"torch_{selected}"] = task_metrics(torch_logits, labels, data)[selected]
    return figures


def gate(
    figures: dict[str, float],
    precision: str,
    min_agreement: float,
    max_int8_drop: float,
    metric: str = "accuracy",
) -> None:
    """Raise `ExportGateError` with the figures when the bundle misses its gate: its predictions agree with PyTorch's
    on at least `min_agreement` of dev, near-tie flips aside, an INT8 bundle loses at most `max_int8_drop` of the
    task's dev `metric` (`data.metric`), and an fp32 bundle's logits are within `FP32_TOLERANCE` of PyTorch's on dev
    too, where the texts have the special tokens and padding id that the shape checks' random ids lack. A figure
    exactly at its gate passes (`GATE_SLACK`)."""
    if precision == "int8":
        ours, theirs = figures[f"dev_{metric}"], figures[f"torch_dev_{metric}"]
        if theirs - ours > max_int8_drop + GATE_SLACK:
            raise ExportGateError(
                f"INT8 loses {theirs - ours:.4f} dev {metric} (data.metric) ({theirs:.4f} -> {ours:.4f}); "
                f"the gate allows {max_int8_drop} (export.max_int8_drop)"
            )
    if figures["agreement_beyond_ties"] < min_agreement - GATE_SLACK:
        raise disagreement(figures, precision, min_agreement)
    if precision == "fp32" and not figures["max_abs_diff"] <= FP32_TOLERANCE:
        raise ExportGateError(
            f"max |Δlogit| {figures['max_abs_diff']:.2e} against PyTorch on dev, over the fp32 tolerance "
            f"{FP32_TOLERANCE} (an fp32 graph computes what PyTorch does up to float rounding; a fused Transformer "
            "that misses it builds with fused: false, without ONNX Runtime's fused kernels)"
        )


def disagreement(figures: dict[str, float], precision: str, min_agreement: float) -> ExportGateError:
    """The error of a bundle whose predictions agree with PyTorch's on less than `min_agreement` of dev: the figures,
    and, where only one or two predictions differ (`SMALL_DEV_DIFFER`), what lets a small dev split pass."""
    texts = figures["dev_examples"]
    differ = round((1 - figures["agreement_beyond_ties"]) * texts)
    key = f"export.{AGREEMENT_KEYS[precision]}"
    # An fp32 prediction that differs beyond a near-tie is a graph off by more than its tolerance, on any split.
    small = (
        f"; on a dev split this small one or two predictions decide the gate: lower {key}, or score on a larger dev "
        "split (data.dev_limit where it cut the split, or a larger data.dev file)"
        if differ <= SMALL_DEV_DIFFER and precision != "fp32"
        else ""
    )
    return ExportGateError(
        f"{precision} predictions agree with PyTorch on {figures['agreement_beyond_ties']:.4%} of dev (gate "
        f"{min_agreement:.2%}, {key}), near-tie flips aside ({figures['tie_flips']}, export.tie_margin): {differ} of "
        f"{texts} predictions differ, max |Δlogit| {figures['max_abs_diff']:.3e}{small}"
    )


def dev_logits(forward, features, pad_id: int) -> np.ndarray:
    with torch.no_grad():
        return predict_logits(forward, features, pad_id, batch_size=DEV_BATCH)
