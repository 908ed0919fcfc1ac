"""The report's figures, each a PNG drawn from artifacts of one run folder (matplotlib, no display)."""

import io
import itertools
import json
from collections import Counter
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def written(name: str) -> str:
    """`name` (a label, a model) as matplotlib draws it as written: each `$` escaped, since a pair would open maths
    (`x$^$y` fails to parse, `price $5-$10` turns italic)."""
    return name.replace("$", r"\$")


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def training_curves(histories: dict[str, list[dict]], key: str) -> bytes:
    """Train loss and the dev metric `key` against the step, one line per model; a model whose history has no `key`
    (evaluated on another selection metric) has no line of it."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, history in histories.items():
        if any("train_loss" in h for h in history):
            loss_ax.plot(
                [h["step"] for h in history if "train_loss" in h],
                [h["train_loss"] for h in history if "train_loss" in h],
                marker=".",  # a model evaluated once has a single point: no line to see without it
                label=written(name),
            )
        if evaluated := [h for h in history if key in h]:
            acc_ax.plot([h["step"] for h in evaluated], [h[key] for h in evaluated], marker=".", label=written(name))
    loss_ax.set(title="training loss (each model's own objective)", xlabel="step", yscale="log")
    acc_ax.set(title=key.replace("_", " "), xlabel="step")
    for ax in (loss_ax, acc_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # none: no model has a line here
            ax.legend(fontsize=8)
    return png(fig)


LABEL_OFFSETS = (6, -10, 16, -20, 26)  # points above (+) or below (-) the marker


def pareto(points: list[dict], cell: str, metric: str) -> bytes:
    """A dev figure (`metric`, each point's "dev") against latency (log scale) at one benchmark cell; marker area
    follows model size."""
    fig, ax = plt.subplots(figsize=(8, 5))
    same_figure = Counter()
    for p in sorted(points, key=lambda p: p["latency_ms"]):
        ax.scatter(p["latency_ms"], p["dev"], s=20 + 3 * p["size_mib"], alpha=0.6)
        value = round(p["dev"], 4)
        nth, same_figure[value] = same_figure[value], same_figure[value] + 1
        ax.annotate(  # models of equal figures (export variants) get their labels stacked, not overprinted
            written(p["model"]),
            (p["latency_ms"], p["dev"]),
            fontsize=8,
            xytext=(4, LABEL_OFFSETS[nth % len(LABEL_OFFSETS)]),
            textcoords="offset points",
        )
    ax.set(
        xscale="log",
        xlabel=f"latency ms ({cell}, median)",
        ylabel=f"dev {metric}",
        title=f"{metric} vs latency (marker size = model size)",
    )
    ax.grid(alpha=0.3, which="both")
    return png(fig)


# Each source of the transfer set in its own colour, whichever others are absent.
SOURCE_COLOURS = {"unlabelled": "#4c72b0", "train": "#55a868", "augmented": "#c44e52"}


def composition(counts: dict[str, int], unit: str) -> bytes:
    """The transfer set by source; `unit` names its examples (sentences, or pairs for a pair task)."""
    parts = {k: counts[k] for k in SOURCE_COLOURS if counts.get(k)}
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(list(parts), list(parts.values()), color=[SOURCE_COLOURS[k] for k in parts])
    for i, value in enumerate(parts.values()):
        ax.text(value, i, f" {value:,}", va="center", fontsize=9)
    ax.set(title=f"transfer set: {sum(parts.values()):,} {unit}", xlabel=unit)
    return png(fig)


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def latency_distribution(by_name: dict[str, np.ndarray], profile: str) -> bytes:
    """Histogram of successful calls' latencies (log scale), one series per request name."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    everything = np.concatenate(list(by_name.values()))
    bins = np.geomspace(max(everything.min(), 0.05), everything.max() * 1.01, 60)
    for name, ms in by_name.items():
        ax.hist(ms, bins=bins, histtype="step", linewidth=1.4, label=f"{written(name)} ({len(ms):,})")
    ax.set(xscale="log", xlabel="latency ms", ylabel="calls", title=f"load test {profile}: latency distribution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def load_over_time(series: dict[str, list], profile: str) -> bytes:
    """Requests/s, failures/s and p99 per second of a load test; users on a second axis."""
    fig, (rate_ax, p99_ax) = plt.subplots(1, 2, figsize=(11, 3.6))
    t = series["t_s"]
    rate_ax.plot(t, series["requests_per_s"], label="requests/s")
    rate_ax.plot(t, series["failures_per_s"], label="failures/s", color="#c44e52")
    users_ax = rate_ax.twinx()
    users_ax.step(t, series["users"], where="post", color="#999", linestyle="--", label="users")
    users_ax.set(ylabel="users", ylim=(0, max(series["users"], default=1) * 1.25))
    rate_ax.set(title=f"load test {profile}: throughput", xlabel="s", ylabel="per second")
    lines = rate_ax.get_lines() + users_ax.get_lines()  # the twin axis's line in the same legend
    rate_ax.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="upper left")
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        p99_ax.plot(t, [np.nan if v is None else v for v in series[key]], label=key.removesuffix("_ms"))
    p99_ax.set(title="latency per second", xlabel="s", ylabel="ms")
    p99_ax.legend(fontsize=8)
    for ax in (rate_ax, p99_ax):
        ax.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.35)
    return png(fig)


def cascade_curve(name: str, curve: list[dict], chosen: dict, members: dict[str, float]) -> bytes:
    """A cascade's dev accuracy against the share of texts it escalates, the chosen threshold marked, each member's
    own dev accuracy as a line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p["escalated"] for p in curve], [p["dev_accuracy"] for p in curve], marker=".", label="cascade")
    ax.scatter([chosen["escalated"]], [chosen["dev_accuracy"]], s=80, color="#c44e52", zorder=3, label="chosen")
    for (member, accuracy), style in zip(members.items(), itertools.cycle(("--", ":", "-."))):
        ax.axhline(accuracy, linestyle=style, color="grey", alpha=0.8, label=f"{written(member)} alone")
    ax.set(
        xlabel="share of dev texts escalated", ylabel="dev accuracy", title=f"{written(name)}: accuracy vs escalation"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def confusion(matrices: dict[str, np.ndarray], labels: list[str]) -> bytes:
    """Each model's dev confusion matrix, rows (gold labels) as shares, one panel per model; counts in the cells
    while they stay readable."""
    side = max(3.4, 0.14 * len(labels))  # inches per panel: a 50-label task keeps its ticks apart
    fig, axes = plt.subplots(1, len(matrices), figsize=(0.6 + side * len(matrices), side + 0.2), squeeze=False)
    size = max(6, 10 - len(labels) // 4)
    for ax, (name, counts) in zip(axes[0], matrices.items(), strict=True):
        totals = counts.sum(1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
        ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        if len(labels) <= 10:
            for (row, column), count in np.ndenumerate(counts):
                colour = "white" if shares[row, column] > 0.6 else "black"
                ax.text(column, row, f"{count:,}", ha="center", va="center", fontsize=size, color=colour)
        ticks, names = range(len(labels)), [written(label) for label in labels]
        ax.set_xticks(ticks, names, rotation=90, fontsize=size)
        ax.set_yticks(ticks, names if ax is axes[0][0] else [], fontsize=size)
        ax.set(title=written(name), xlabel="predicted")
    axes[0][0].set_ylabel("gold")
    return png(fig)
