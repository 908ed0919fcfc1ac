"""The report's figures, each a PNG drawn from artifacts of one run folder (matplotlib, no display)."""

import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def training_curves(histories: dict[str, list[dict]]) -> bytes:
    """Train loss and dev accuracy against the step, one line per model."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, history in histories.items():
        steps = [h["step"] for h in history]
        if any("train_loss" in h for h in history):
            loss_ax.plot(
                [h["step"] for h in history if "train_loss" in h],
                [h["train_loss"] for h in history if "train_loss" in h],
                label=name,
            )
        acc_ax.plot(steps, [h["dev_accuracy"] for h in history], marker=".", label=name)
    loss_ax.set(title="training loss", xlabel="step", yscale="log")
    acc_ax.set(title="dev accuracy", xlabel="step")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return png(fig)


def pareto(points: list[dict], cell: str) -> bytes:
    """Dev accuracy against latency (log scale) at one benchmark cell; marker area follows model size."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for p in points:
        ax.scatter(p["latency_ms"], p["dev_accuracy"], s=20 + 3 * p["size_mib"], alpha=0.6)
        ax.annotate(
            p["model"], (p["latency_ms"], p["dev_accuracy"]), fontsize=8, xytext=(4, 4), textcoords="offset points"
        )
    ax.set(
        xscale="log",
        xlabel=f"latency ms ({cell}, median)",
        ylabel="dev accuracy",
        title="accuracy vs latency (marker size = model size)",
    )
    ax.grid(alpha=0.3, which="both")
    return png(fig)


def composition(counts: dict[str, int]) -> bytes:
    """The transfer set by source."""
    parts = {k: counts[k] for k in ("unlabelled", "train", "augmented") if counts.get(k)}
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(list(parts), list(parts.values()), color=["#4c72b0", "#55a868", "#c44e52"][: len(parts)])
    for i, value in enumerate(parts.values()):
        ax.text(value, i, f" {value:,}", va="center", fontsize=9)
    ax.set(title=f"transfer set: {sum(parts.values()):,} sentences", xlabel="sentences")
    return png(fig)


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))
