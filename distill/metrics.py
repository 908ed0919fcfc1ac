"""Classification metrics from logits: accuracy, F1 and the confusion matrix."""

import numpy as np

# What a classification evaluation reports, and a training manifest keeps of its best one.
EVAL_KEYS = ("dev_accuracy", "dev_f1", "confusion")


def classification_metrics(logits: np.ndarray, labels: list[int], num_labels: int) -> dict:
    """Accuracy, F1 (positive class when binary, macro otherwise) and confusion[true][pred]. `logits` (N, C)."""
    pred = np.asarray(logits).argmax(-1)
    gold = np.asarray(labels)
    confusion = np.zeros((num_labels, num_labels), dtype=int)
    np.add.at(confusion, (gold, pred), 1)
    f1s = []
    for c in range(num_labels):
        tp = confusion[c, c]
        precision = tp / max(1, confusion[:, c].sum())
        recall = tp / max(1, confusion[c, :].sum())
        f1s.append(0.0 if tp == 0 else 2 * precision * recall / (precision + recall))
    return {
        "dev_accuracy": float((pred == gold).mean()),
        "dev_f1": float(f1s[1] if num_labels == 2 else np.mean(f1s)),
        "confusion": confusion.tolist(),
    }
