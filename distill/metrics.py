"""Classification metrics from logits: accuracy, macro-F1, the positive class's F1 and the confusion matrix."""

import numpy as np
from edgedistill.common.config.training import DataConfig, OptimConfig
from edgedistill.common.recipe import RecipeError
from edgedistill.common.scores import label_f1, one_label

# What a dev evaluation reports (`dev_f1` only where the task has a positive class), and what a training
# manifest keeps of its best one.
EVAL_KEYS = ("dev_accuracy", "dev_macro_f1", "dev_f1", "dev_confusion")


def classification_metrics(
    logits: np.ndarray, labels: list[int], num_labels: int, positive: int | None, prefix: str = "dev"
) -> dict:
    """`{prefix}_accuracy`, `{prefix}_macro_f1`, `{prefix}_f1` and `{prefix}_confusion` ([true][pred]). `logits` (N, C).

    macro_f1 averages the F1 of the labels that occur in `labels` or in the predictions (as scikit-learn
    does). f1 is the F1 of label `positive` (`DataConfig.positive_index`); None reports no f1. ValueError for an
    empty split, a label that is not an integer in 0..num_labels-1, or logits that are not one row of num_labels per
    label.
    """
    if positive is not None and not 0 <= positive < num_labels:
        raise ValueError(f"positive label {positive} is outside 0..{num_labels - 1}")
    gold = np.asarray(labels)
    if not gold.size:
        raise ValueError(f"no {prefix} examples to score: the split is empty")
    if not np.issubdtype(gold.dtype, np.integer):
        raise ValueError(f"{prefix} labels must be label indices (integers), got {gold.dtype}")
    if (outside := np.unique(gold[(gold < 0) | (gold >= num_labels)])).size:
        raise ValueError(f"{prefix} labels {outside.tolist()} are outside 0..{num_labels - 1}")
    scores = np.asarray(logits)
    if scores.shape != (gold.size, num_labels):
        raise ValueError(
            f"{prefix} logits have shape {scores.shape}, expected ({gold.size}, {num_labels}): one row of scores per label"
        )
    pred = scores.argmax(-1)
    confusion = np.zeros((num_labels, num_labels), dtype=int)
    np.add.at(confusion, (gold, pred), 1)
    f1, seen = label_f1(confusion)
    out = {
        f"{prefix}_accuracy": float((pred == gold).mean()),
        f"{prefix}_macro_f1": float(f1[seen].mean()),
    }
    if positive is not None:
        out[f"{prefix}_f1"] = float(f1[positive])
    out[f"{prefix}_confusion"] = confusion.tolist()
    return out


def one_class(
    confusion: list[list[int]] | None, label_names: list[str], trained_by: str, optim: OptimConfig
) -> str | None:
    """What to tell a user whose model, trained by section `trained_by` (`finetune`, `distill.students.cnn`) under
    `optim`, predicts one label for every dev example (`one_label`): it learnt the majority class at most, and its
    figures say little; else None. It names the step budget training read: `max_steps` where set, else `epochs`."""
    if (label := one_label(confusion)) is None:
        return None
    matrix = np.asarray(confusion)
    budget = "max_steps" if "epochs" in optim.unread() else "epochs"
    return (
        f"it predicts {label_names[label]!r} for all {int(matrix.sum())} dev examples, which hold "
        f"{np.count_nonzero(matrix.sum(axis=1))} labels: it learnt no more than the majority class; train it longer "
        f"({trained_by}.optim.{budget}, {trained_by}.optim.lr) or on more data"
    )


def retention(score: float | None, teacher_score: float | None) -> float | None:
    """A student's figure as a share of the teacher's; None when either is missing or the teacher's is 0 (a teacher
    that never predicts the class an F1 counts leaves nothing to retain)."""
    return None if score is None or not teacher_score else score / teacher_score


def task_metrics(logits: np.ndarray, labels: list[int], data: DataConfig, prefix: str = "dev") -> dict:
    """`classification_metrics` for the recipe's task: its labels and its positive class."""
    return classification_metrics(logits, labels, data.num_labels, data.positive_index, prefix)


def finite(logits: np.ndarray, trained_by: str, lr: float) -> np.ndarray:
    """`logits`, or `RecipeError` where one is NaN or infinite: the training set in `trained_by` (`finetune`,
    `distill.students.cnn`) diverged, and an argmax over such logits would pass for a figure (a constant guess)."""
    if not (ok := np.isfinite(logits)).all():
        raise RecipeError(
            f"{trained_by}: training diverged, {ok.size - ok.sum()} of its {ok.size} dev logits are NaN or infinite; "
            f"lower {trained_by}.optim.lr ({lr:g})"
        )
    return logits
