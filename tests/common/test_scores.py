import numpy as np
import pytest
from edgedistill.common.scores import label_f1, one_label, within_reach


def test_label_f1_gives_each_labels_f1_by_hand():
    # label 0: tp=1, fp=0, fn=1 -> 2/3; label 1: tp=0, fp=1, fn=0 -> 0
    assert label_f1([[1, 1, 0], [0, 0, 0], [0, 0, 0]])[0].tolist() == pytest.approx([2 / 3, 0.0, 0.0])


def test_label_f1_marks_a_label_neither_gold_nor_predicted_as_unseen():
    assert label_f1([[1, 1, 0], [0, 0, 0], [0, 0, 0]])[1].tolist() == [True, True, False]


def test_within_reach_marks_a_label_close_to_the_top():
    assert within_reach(np.array([[1.0, 0.95, -3.0]]), np.array([1]), 0.1).tolist() == [True]


def test_within_reach_leaves_out_a_label_far_below_a_near_tie():
    assert within_reach(np.array([[1.0, 0.95, -3.0]]), np.array([2]), 0.1).tolist() == [False]


def test_the_one_label_a_model_predicts_for_a_split_of_several_is_its_index():
    assert one_label([[0, 5, 0], [0, 3, 0], [0, 4, 0]]) == 1
