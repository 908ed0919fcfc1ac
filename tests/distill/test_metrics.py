import numpy as np
import pytest

from distill.metrics import classification_metrics


def test_binary_metrics_by_hand():
    logits = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    labels = [1, 1, 0, 0, 1]  # predictions 1, 0, 1, 0, 1
    m = classification_metrics(logits, labels, 2)
    assert m["dev_accuracy"] == pytest.approx(3 / 5)
    # positive class: tp=2, fp=1, fn=1 -> precision 2/3, recall 2/3
    assert m["dev_f1"] == pytest.approx(2 / 3)
    assert m["confusion"] == [[1, 1], [1, 2]]


def test_multiclass_macro_f1():
    logits = np.eye(3)[[0, 1, 2, 2]]
    m = classification_metrics(logits, [0, 1, 2, 1], 3)
    assert m["dev_accuracy"] == pytest.approx(0.75)
    assert m["dev_f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
