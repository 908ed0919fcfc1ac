"""Scores read off a [true][pred] confusion matrix, for training's metrics and the report alike, and how sure a model
is of its labels."""

import numpy as np


def label_f1(confusion) -> tuple[np.ndarray, np.ndarray]:
    """Each label's F1 from a [true][pred] confusion matrix, and which labels occur as gold or prediction (the
    others' F1 is 0, and means nothing)."""
    confusion = np.asarray(confusion)
    counted = confusion.sum(0) + confusion.sum(1)
    seen = counted > 0
    return np.divide(2 * np.diag(confusion), counted, out=np.zeros(len(confusion)), where=seen), seen


def one_label(confusion: list[list[int]] | None) -> int | None:
    """The label a model predicts for every example of a split that holds several (its `confusion`, [true][pred]);
    else None, and for no confusion (an evaluation resumed from an earlier release's checkpoint may lack it)."""
    if confusion is None:
        return None
    matrix = np.asarray(confusion)
    predicted = np.flatnonzero(matrix.sum(axis=0))
    held = np.count_nonzero(matrix.sum(axis=1))  # the labels the split holds
    return int(predicted[0]) if len(predicted) == 1 and held >= 2 else None


def top_two_gap(logits: np.ndarray) -> np.ndarray:
    """Per row of (N, C) logits, the gap between the two highest: how sure the model is of its label."""
    top = np.sort(logits, -1)
    return top[:, -1] - top[:, -2]


def within_reach(logits: np.ndarray, labels: np.ndarray, margin: float) -> np.ndarray:
    """(N,) whether each row's label in `labels` has a logit within `margin` of the top of its row of (N, C) `logits`:
    a label that another run of the same model (another padding, precision or runtime) may answer the row by. A
    prediction that differs from `logits`' own by such a label is a near-tie flip."""
    return logits.max(-1) - logits[np.arange(len(labels)), labels] < margin
