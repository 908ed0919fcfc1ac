"""Length-grouped batches and dynamic padding: SST-2 phrases are short, so padding dominates cost."""

import random

import torch
from edgedistill.common.bundle import pad_value


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Index batches of similar length, the pools and the batch order drawn from `seed`.

    Examples are shuffled, cut into pools of 50 batches, each pool sorted by length and split into
    batches, then the batches are shuffled: close to sorted padding, still random order.
    """
    order = list(range(len(lengths)))
    rng = random.Random(seed)
    rng.shuffle(order)
    pool = batch_size * 50
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    return batches


def collate(features: dict[str, list[list[int]]], indices: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad the chosen examples to their longest; adds `attention_mask`. Shapes (B, T)."""
    ids = features["input_ids"]
    width = max(len(ids[i]) for i in indices)
    out = {}
    for key, rows in features.items():
        fill = pad_value(key, pad_id)
        out[key] = torch.tensor([rows[i] + [fill] * (width - len(rows[i])) for i in indices], dtype=torch.long)
    out["attention_mask"] = torch.tensor(
        [[1] * len(ids[i]) + [0] * (width - len(ids[i])) for i in indices], dtype=torch.long
    )
    return out
