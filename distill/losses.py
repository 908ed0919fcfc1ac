"""Distillation losses: small pure functions, tensors in, a scalar out.

Conventions: logits are (B, C); hidden states (B, T, H); attention probabilities (B, heads, T, T),
each query row summing to 1; `attention_mask` is (B, T) with 1 for real tokens and 0 for padding.
Every loss is a mean, so its size does not depend on the batch size. KL terms are KL(teacher || student).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EPS = 1e-12  # keeps log() finite where an attention probability is exactly 0


def kd_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """KL(softmax(teacher/T) || softmax(student/T)) summed over classes, mean over the batch, times T**2. (B, C).

    The T**2 factor (Hinton et al. 2015) keeps the gradient size independent of T, so the weight of this
    term against the hard-label loss need not change with the temperature.
    """
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * temperature**2


def logit_mse(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """Mean squared error between raw logits, mean over all B * C elements (Tang et al. 2019). (B, C)."""
    return F.mse_loss(student_logits.float(), teacher_logits.float())


def hard_ce(student_logits: Tensor, labels: Tensor, labelled: float | None = None, ignore_index: int = -100) -> Tensor:
    """Cross-entropy with gold labels summed over the labelled rows, divided by `labelled` (positive): by default
    their number here (at least 1), giving their mean. Logits (B, C), labels (B,).

    A micro-batch passes its share of its whole batch's labelled rows, so that its term, weighted by its share of
    the batch's examples, adds up to the mean over the batch's labelled rows whatever its split. Rows labelled
    `ignore_index` (transfer-set examples have no label) are skipped; with no labelled row the result is a zero
    that stays connected to the logits, so `backward()` still works.
    """
    total = F.cross_entropy(student_logits.float(), labels, ignore_index=ignore_index, reduction="sum")
    return total / ((labels != ignore_index).sum().clamp(min=1) if labelled is None else labelled)


def hidden_mse(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    attention_mask: Tensor,
    projection: nn.Module | None = None,
    tokens: float | None = None,
) -> Tensor:
    """MSE between hidden states, mean over real positions and the teacher's H_t units.

    `student_hidden` (B, T, H_s) goes through `projection` (e.g. nn.Linear(H_s, H_t)) first when given;
    `teacher_hidden` is (B, T, H_t). Padded positions (mask 0) count neither in the sum nor in the mean.
    `tokens` (positive), when given, stands for the number of real positions, as `hard_ce`'s `labelled` does.
    """
    if projection is not None:
        student_hidden = projection(student_hidden)
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(
            f"hidden shapes differ: student {tuple(student_hidden.shape)} vs teacher {tuple(teacher_hidden.shape)}; "
            "pass a projection to the teacher's width"
        )
    valid = attention_mask.bool().unsqueeze(-1)  # (B, T, 1)
    squared = (student_hidden.float() - teacher_hidden.float()).pow(2)
    total = torch.where(valid, squared, 0.0).sum()
    units = teacher_hidden.shape[-1]
    return total / ((valid.sum() * units).clamp(min=1) if tokens is None else tokens * units)


def attention_kl(
    student_attn: Tensor, teacher_attn: Tensor, attention_mask: Tensor, tokens: float | None = None
) -> Tensor:
    """KL(teacher || student) per attention row, mean over heads and over real query positions.

    Attentions are (B, heads, T, T) probabilities; rows of padded queries (mask 0) are left out. When the
    head counts differ, each model's attention is first averaged over its heads, giving one (B, T, T)
    distribution per model (still rows summing to 1), and the KL is taken between those. `tokens` (positive),
    when given, stands for the number of real query positions, as `hard_ce`'s `labelled` does.
    """
    student_attn, teacher_attn = student_attn.float(), teacher_attn.float()
    if student_attn.shape[1] != teacher_attn.shape[1]:
        student_attn = student_attn.mean(1, keepdim=True)
        teacher_attn = teacher_attn.mean(1, keepdim=True)
    kl = (teacher_attn * ((teacher_attn + EPS).log() - (student_attn + EPS).log())).sum(-1)  # (B, heads, T)
    valid = attention_mask.bool().unsqueeze(1)  # (B, 1, T)
    per_query = torch.where(valid, kl, 0.0).mean(1)  # (B, T)
    return per_query.sum() / (valid.sum().clamp(min=1) if tokens is None else tokens)


def layer_map(num_student_layers: int, num_teacher_layers: int) -> list[tuple[int, int]]:
    """Uniform (student layer, teacher layer) pairs, 1-based: layer i is the output of block i.

    Student layer i maps to teacher layer i * N_t // N_s, so the last layers always pair up:
    3 student, 6 teacher -> [(1, 2), (2, 4), (3, 6)]. The numbers index `hidden_states` directly
    (index 0 is the embedding output); for `attentions`, which has no embedding entry, subtract 1.
    """
    if not 1 <= num_student_layers <= num_teacher_layers:
        raise ValueError(
            f"need 1 <= student layers <= teacher layers, got {num_student_layers} and {num_teacher_layers}"
        )
    return [(i, i * num_teacher_layers // num_student_layers) for i in range(1, num_student_layers + 1)]


def combine(terms: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """Sum of weights[name] * terms[name]; a zero weight skips its term, which then need not be computed.

    Terms without a weight are ignored (they may be there only to be logged). A nonzero weight whose term
    is missing raises KeyError; no nonzero weight at all raises ValueError.
    """
    used = {name: weight for name, weight in weights.items() if weight != 0}
    missing = sorted(set(used) - set(terms))
    if missing:
        raise KeyError(f"loss terms {missing} have nonzero weights but were not computed; got {sorted(terms)}")
    if not used:
        raise ValueError(f"no loss term has a nonzero weight: {weights}")
    return sum(weight * terms[name] for name, weight in used.items())
