import numpy as np
import pytest
from edgedistill.common.config.training import DataConfig, OptimConfig
from edgedistill.common.recipe import RecipeError
from edgedistill.distill.metrics import EVAL_KEYS, classification_metrics, finite, one_class, retention, task_metrics

# Binary: predictions 1, 0, 1, 0, 1 against gold 1, 1, 0, 0, 1.
BINARY_LOGITS = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
BINARY_GOLD = [1, 1, 0, 0, 1]
# Three labels: predictions 0, 1, 2, 2 against gold 0, 1, 2, 1.
THREE_LOGITS = np.eye(3)[[0, 1, 2, 2]]
THREE_GOLD = [0, 1, 2, 1]


def data(**fields) -> DataConfig:
    return DataConfig(train="unused", dev="unused", **fields)


def test_binary_accuracy_by_hand():
    assert classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 1)["dev_accuracy"] == pytest.approx(3 / 5)


def test_a_binary_tasks_f1_is_its_second_labels():
    # label 1: tp=2, fp=1, fn=1 -> precision 2/3, recall 2/3
    binary = data(label_names=["negative", "positive"])
    assert task_metrics(BINARY_LOGITS, BINARY_GOLD, binary)["dev_f1"] == pytest.approx(2 / 3)


def test_binary_f1_of_the_first_label_when_it_is_the_positive_one():
    # label 0: tp=1, fp=1, fn=1
    assert classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 0)["dev_f1"] == pytest.approx(1 / 2)


def test_binary_macro_f1_averages_both_labels():
    assert classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 1)["dev_macro_f1"] == pytest.approx(
        (1 / 2 + 2 / 3) / 2
    )


def test_confusion_is_true_by_predicted():
    assert classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 1)["dev_confusion"] == [[1, 1], [1, 2]]


def test_multiclass_macro_f1_by_hand():
    assert classification_metrics(THREE_LOGITS, THREE_GOLD, 3, None)["dev_macro_f1"] == pytest.approx(
        (1 + 2 / 3 + 2 / 3) / 3
    )


def test_multiclass_without_a_positive_label_reports_no_f1():
    assert "dev_f1" not in classification_metrics(THREE_LOGITS, THREE_GOLD, 3, None)


def test_multiclass_f1_of_the_named_positive_label():
    # label 2: tp=1, fp=1, fn=0
    assert classification_metrics(THREE_LOGITS, THREE_GOLD, 3, 2)["dev_f1"] == pytest.approx(2 / 3)


def test_macro_f1_leaves_out_labels_neither_in_gold_nor_predicted():
    """A dev slice without any example of a label does not count that label as an F1 of 0."""
    assert classification_metrics(np.eye(4)[[0, 1, 2, 2]], THREE_GOLD, 4, None)["dev_macro_f1"] == pytest.approx(
        (1 + 2 / 3 + 2 / 3) / 3
    )


def test_positive_label_outside_the_labels_is_refused():
    with pytest.raises(ValueError, match=r"positive label 3 is outside 0\.\.2"):
        classification_metrics(THREE_LOGITS, THREE_GOLD, 3, 3)


def test_a_gold_label_below_zero_is_refused_naming_it_not_counted_as_the_last_label():
    with pytest.raises(ValueError, match=r"^dev labels \[-1\] are outside 0\.\.1$"):
        classification_metrics(np.eye(2)[[0, 1]], [-1, 1], 2, 1)


def test_gold_labels_past_the_last_are_refused_naming_each_once():
    with pytest.raises(ValueError, match=r"^dev labels \[3, 5\] are outside 0\.\.2$"):
        classification_metrics(THREE_LOGITS, [5, 3, 5, 0], 3, None)


def test_a_gold_label_that_is_not_an_integer_is_refused():
    with pytest.raises(ValueError, match=r"^dev labels must be label indices \(integers\), got float64$"):
        classification_metrics(BINARY_LOGITS, [1.0, 1.0, 0.0, 0.0, 1.0], 2, 1)


def test_one_row_of_logits_for_many_labels_is_refused_not_broadcast():
    with pytest.raises(ValueError, match=r"^dev logits have shape \(1, 2\), expected \(5, 2\)"):
        classification_metrics(BINARY_LOGITS[:1], BINARY_GOLD, 2, 1)


def test_logits_with_more_columns_than_labels_are_refused():
    with pytest.raises(ValueError, match=r"^dev logits have shape \(4, 3\), expected \(4, 2\)"):
        classification_metrics(THREE_LOGITS, [0, 1, 1, 0], 2, 1)


def test_an_empty_split_is_refused_saying_so():
    with pytest.raises(ValueError, match=r"^no dev examples to score: the split is empty$"):
        classification_metrics(np.zeros((0, 2)), [], 2, 1)


def test_prefix_names_a_test_split():
    assert set(classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 1, prefix="test")) == {
        "test_accuracy",
        "test_macro_f1",
        "test_f1",
        "test_confusion",
    }


def test_eval_keys_are_what_a_binary_dev_evaluation_reports():
    assert set(classification_metrics(BINARY_LOGITS, BINARY_GOLD, 2, 1)) == set(EVAL_KEYS)


def test_the_data_configs_positive_index_feeds_f1():
    cfg = data(label_names=["ABBR", "DESC", "HUM"], positive_label="HUM")
    assert classification_metrics(THREE_LOGITS, THREE_GOLD, cfg.num_labels, cfg.positive_index)["dev_f1"] == (
        pytest.approx(2 / 3)
    )


def test_retention_is_the_students_share_of_the_teachers_figure():
    assert retention(0.45, 0.9) == 0.5


def test_retention_of_a_teacher_scoring_zero_is_none_not_a_division_error():
    assert retention(0.3, 0.0) is None


def test_retention_without_a_student_figure_is_none():
    assert retention(None, 0.9) is None


def test_finite_logits_pass_as_they_are():
    assert finite(BINARY_LOGITS, "finetune", 1e-3) is BINARY_LOGITS


def test_a_nan_logit_is_a_diverged_training_naming_its_learning_rate():
    logits = np.array([[0.0, np.nan], [np.inf, 1.0]])
    with pytest.raises(
        RecipeError, match=r"^finetune: training diverged, 2 of its 4 dev logits .* lower finetune.optim.lr \(0.001\)$"
    ):
        finite(logits, "finetune", 1e-3)


NAMES = ["neg", "neu", "pos"]
BY_EPOCHS, BY_STEPS = OptimConfig(), OptimConfig(max_steps=100)


def test_a_model_predicting_one_label_for_a_split_of_several_is_named_with_that_label():
    confusion = [[5, 0, 0], [3, 0, 0], [4, 0, 0]]
    assert one_class(confusion, NAMES, "finetune", BY_EPOCHS).startswith(
        "it predicts 'neg' for all 12 dev examples, which hold 3 labels"
    )


def test_a_model_predicting_two_labels_is_not_warned_of():
    assert one_class([[5, 0, 0], [3, 0, 0], [3, 0, 1]], NAMES, "finetune", BY_EPOCHS) is None


def test_a_split_of_one_label_predicted_as_it_is_not_warned_of():
    assert one_class([[0, 0, 0], [0, 7, 0], [0, 0, 0]], NAMES, "finetune", BY_EPOCHS) is None


def test_an_evaluation_without_its_confusion_is_not_warned_of():
    assert one_class(None, NAMES, "finetune", BY_EPOCHS) is None


def test_the_one_label_warning_names_the_settings_of_the_section_that_trained_it():
    warned = one_class([[5, 0], [3, 0]], ["no", "yes"], "distill.students.cnn", BY_EPOCHS)
    assert "train it longer (distill.students.cnn.optim.epochs, distill.students.cnn.optim.lr)" in warned


def test_the_one_label_warning_of_a_model_trained_for_max_steps_names_max_steps():
    warned = one_class([[5, 0], [3, 0]], ["no", "yes"], "finetune", BY_STEPS)
    assert "train it longer (finetune.optim.max_steps, finetune.optim.lr)" in warned
