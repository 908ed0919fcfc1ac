"""The report's figures, inspected before they are drawn to PNG."""

from edgedistill.report import plots


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
