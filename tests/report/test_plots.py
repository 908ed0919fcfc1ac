"""The report's figures, inspected before they are drawn to PNG."""

import numpy as np
from edgedistill.report import plots
from matplotlib.colors import to_hex


def drawn(monkeypatch, draw, *args):
    """The matplotlib figure `draw(*args)` saves."""
    figures = []
    monkeypatch.setattr(plots, "png", figures.append)
    draw(*args)
    return figures[0]


def test_a_model_evaluated_once_shows_its_training_loss_as_a_marker(monkeypatch):
    history = {"student-transformer": [{"step": 140, "train_loss": 3.1, "dev_accuracy": 0.69}]}
    loss_ax = drawn(monkeypatch, plots.training_curves, history, "dev_accuracy").axes[0]
    assert loss_ax.lines[0].get_marker() == "."


def test_the_load_test_throughput_legend_names_the_users_line(monkeypatch):
    series = {"t_s": [0, 1], "requests_per_s": [20, 20], "failures_per_s": [0, 0], "users": [2, 2]}
    series |= {key: [5.0, 4.0] for key in ("p50_ms", "p95_ms", "p99_ms")}
    rate_ax = drawn(monkeypatch, plots.load_over_time, series, "smoke").axes[0]
    assert "users" in [text.get_text() for text in rate_ax.get_legend().get_texts()]


def test_a_confusion_figure_of_few_labels_writes_the_counts_in_its_cells(monkeypatch):
    ax = drawn(monkeypatch, plots.confusion, {"teacher": np.array([[3, 1], [0, 4]])}, ["negative", "positive"]).axes[0]
    assert [text.get_text() for text in ax.texts] == ["3", "1", "0", "4"]


def test_a_confusion_figure_of_many_labels_leaves_its_cells_unwritten(monkeypatch):
    labels = [f"label-{i}" for i in range(20)]
    ax = drawn(monkeypatch, plots.confusion, {"teacher": np.eye(20, dtype=int)}, labels).axes[0]
    assert len(ax.texts) == 0


def test_a_cascade_figure_draws_every_members_line_past_the_third(monkeypatch):
    curve = [{"escalated": 0.0, "dev_accuracy": 0.8}, {"escalated": 1.0, "dev_accuracy": 0.9}]
    members = {"a": 0.8, "b": 0.85, "c": 0.88, "d": 0.9}
    chosen = {"escalated": 0.5, "dev_accuracy": 0.87}
    ax = drawn(monkeypatch, plots.cascade_curve, "c", curve, chosen, members).axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert [label for label in legend if label.endswith(" alone")] == ["a alone", "b alone", "c alone", "d alone"]


def test_a_confusion_figure_draws_a_label_holding_a_pair_of_dollar_signs():
    assert plots.confusion({"teacher": np.eye(2, dtype=int)}, ["x$^$y", "b"]).startswith(b"\x89PNG")


def test_a_confusion_figure_writes_a_label_holding_dollar_signs_as_written(monkeypatch):
    label = "price $5-$10"
    fig = drawn(monkeypatch, plots.confusion, {"teacher": np.eye(2, dtype=int)}, [label, "b"])
    fig.canvas.draw()
    tick = fig.axes[0].get_yticklabels()[0]
    plain = fig.text(0, 0, label, fontproperties=tick.get_fontproperties(), parse_math=False)
    fig.canvas.draw()
    assert tick.get_window_extent().width == plain.get_window_extent().width


def test_training_curves_of_a_history_without_the_selection_metric_are_drawn():
    history = {"teacher": [{"step": 10, "train_loss": 0.5, "dev_accuracy": 0.9}]}
    assert plots.training_curves(history, "dev_macro_f1").startswith(b"\x89PNG")


def test_training_curves_leave_out_the_metric_line_of_a_history_without_it(monkeypatch):
    histories = {
        "teacher": [{"step": 10, "train_loss": 0.5, "dev_accuracy": 0.9}],
        "student-cnn": [{"step": 10, "train_loss": 0.7, "dev_accuracy": 0.8, "dev_macro_f1": 0.75}],
    }
    acc_ax = drawn(monkeypatch, plots.training_curves, histories, "dev_macro_f1").axes[1]
    assert [line.get_label() for line in acc_ax.lines] == ["student-cnn"]


def test_a_transfer_set_without_unlabelled_text_draws_each_source_in_its_own_colour(monkeypatch):
    ax = drawn(monkeypatch, plots.composition, {"unlabelled": 0, "train": 20, "augmented": 30}, "sentences").axes[0]
    assert [to_hex(bar.get_facecolor()) for bar in ax.patches] == [
        plots.SOURCE_COLOURS["train"],
        plots.SOURCE_COLOURS["augmented"],
    ]
