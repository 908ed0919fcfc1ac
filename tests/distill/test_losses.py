import math

import pytest
import torch
import torch.nn.functional as F
from edgedistill.distill.losses import attention_kl, combine, hard_ce, hidden_mse, kd_kl, layer_map, logit_mse
from torch import nn


def _softmax(row: list[float], temperature: float) -> list[float]:
    exps = [math.exp(x / temperature) for x in row]
    return [e / sum(exps) for e in exps]


def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


STUDENT = [[1.0, 2.0], [0.5, -0.5]]
TEACHER = [[3.0, 0.0], [0.0, 1.0]]


def test_kd_kl_matches_hand_computed_value_at_t1():
    expected = sum(_kl(_softmax(t, 1.0), _softmax(s, 1.0)) for s, t in zip(STUDENT, TEACHER, strict=True)) / 2
    assert kd_kl(torch.tensor(STUDENT), torch.tensor(TEACHER), 1.0).item() == pytest.approx(expected, rel=1e-5)


def test_kd_kl_scales_by_temperature_squared():
    unscaled = sum(_kl(_softmax(t, 2.0), _softmax(s, 2.0)) for s, t in zip(STUDENT, TEACHER, strict=True)) / 2
    loss = kd_kl(torch.tensor(STUDENT), torch.tensor(TEACHER), 2.0)
    assert loss.item() == pytest.approx(4 * unscaled, rel=1e-5)


def test_kd_kl_is_zero_for_identical_logits_and_has_gradient():
    logits = torch.randn(4, 3, requires_grad=True)
    loss = kd_kl(logits, logits.detach().clone(), 3.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    assert logits.grad is not None


def test_logit_mse_hand_computed_and_zero_when_equal():
    # squared differences: 4, 4, 0.25, 2.25 -> mean 2.625
    assert logit_mse(torch.tensor(STUDENT), torch.tensor(TEACHER)).item() == pytest.approx(2.625)
    assert logit_mse(torch.tensor(STUDENT), torch.tensor(STUDENT)).item() == 0.0


def test_hard_ce_skips_unlabelled_rows_and_matches_torch_on_labelled_ones():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]])
    labels = torch.tensor([0, -100, 1])
    expected = F.cross_entropy(logits[[0, 2]], torch.tensor([0, 1]))
    assert hard_ce(logits, labels).item() == pytest.approx(expected.item())
    by_hand = (-math.log(math.exp(2) / (math.exp(2) + 1)) - math.log(math.exp(-5) / (math.exp(5) + math.exp(-5)))) / 2
    assert hard_ce(logits, labels).item() == pytest.approx(by_hand, rel=1e-5)


def test_hard_ce_divides_the_labelled_rows_sum_by_the_count_it_is_given():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]])
    labels = torch.tensor([0, -100, 1])
    summed = F.cross_entropy(logits[[0, 2]], torch.tensor([0, 1]), reduction="sum")
    assert hard_ce(logits, labels, labelled=1.5).item() == pytest.approx(summed.item() / 1.5)


def test_hard_ce_custom_ignore_index():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    assert hard_ce(logits, torch.tensor([0, -1]), ignore_index=-1).item() == pytest.approx(
        F.cross_entropy(logits[:1], torch.tensor([0])).item()
    )


def test_hard_ce_without_labels_is_a_differentiable_zero():
    logits = torch.randn(3, 2, requires_grad=True)
    loss = hard_ce(logits, torch.full((3,), -100))
    assert loss.item() == 0.0
    assert loss.grad_fn is not None
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros(3, 2))


def test_hidden_mse_hand_computed_over_real_positions_only():
    student = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
    teacher = torch.tensor([[[1.0, 0.0], [0.0, 4.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # real positions contribute 0 + 4 + 9 + 0 over 2 positions * 2 units
    assert hidden_mse(student, teacher, mask).item() == pytest.approx(13 / 4)


def test_hidden_mse_ignores_what_sits_at_padded_positions():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 4, generator=generator), torch.randn(2, 5, 4, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    changed_student, changed_teacher = student.clone(), teacher.clone()
    changed_student[0, 3:] = 100.0
    changed_teacher[0, 3:] = -7.0
    assert hidden_mse(changed_student, changed_teacher, mask).item() == pytest.approx(
        hidden_mse(student, teacher, mask).item()
    )
    assert hidden_mse(teacher, teacher, mask).item() == 0.0


def test_hidden_mse_projects_a_narrower_student():
    projection = nn.Linear(3, 4)
    student, teacher = torch.randn(2, 5, 3), torch.randn(2, 5, 4)
    mask = torch.ones(2, 5, dtype=torch.long)
    expected = F.mse_loss(projection(student), teacher)
    loss = hidden_mse(student, teacher, mask, projection)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert projection.weight.grad is not None


def test_hidden_mse_of_a_narrower_student_without_a_projection_is_refused():
    student, teacher = torch.randn(2, 5, 3), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="projection"):
        hidden_mse(student, teacher, torch.ones(2, 5, dtype=torch.long))


def test_attention_kl_hand_computed():
    teacher = torch.tensor([[[[0.5, 0.5], [1.0, 0.0]]]])  # (B=1, heads=1, T=2, T=2)
    student = torch.tensor([[[[0.25, 0.75], [0.5, 0.5]]]])
    mask = torch.tensor([[1, 1]])
    row0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    row1 = math.log(1.0 / 0.5)
    assert attention_kl(student, teacher, mask).item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    # a padded query row is left out of the mean
    assert attention_kl(student, teacher, torch.tensor([[1, 0]])).item() == pytest.approx(row0, rel=1e-5)


def _random_attention(batch: int, heads: int, length: int, seed: int) -> torch.Tensor:
    scores = torch.randn(batch, heads, length, length, generator=torch.Generator().manual_seed(seed))
    return scores.softmax(-1)


def test_attention_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    teacher = _random_attention(2, 3, 4, seed=0)
    assert attention_kl(teacher.clone(), teacher, mask).item() == pytest.approx(0.0, abs=1e-7)
    assert attention_kl(_random_attention(2, 3, 4, seed=1), teacher, mask).item() > 0


def test_attention_kl_averages_heads_first_when_head_counts_differ():
    mask = torch.ones(1, 3, dtype=torch.long)
    teacher = _random_attention(1, 4, 3, seed=2)
    student = _random_attention(1, 2, 3, seed=3)
    expected = attention_kl(student.mean(1, keepdim=True), teacher.mean(1, keepdim=True), mask)
    assert attention_kl(student, teacher, mask).item() == pytest.approx(expected.item())
    assert attention_kl(teacher.mean(1, keepdim=True).expand(1, 2, 3, 3), teacher, mask).item() == pytest.approx(
        0.0, abs=1e-7
    )


@pytest.mark.parametrize(
    ("student", "teacher", "expected"),
    [
        (3, 6, [(1, 2), (2, 4), (3, 6)]),
        (6, 12, [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10), (6, 12)]),
        (4, 6, [(1, 1), (2, 3), (3, 4), (4, 6)]),
        (1, 4, [(1, 4)]),
        (2, 2, [(1, 1), (2, 2)]),
    ],
)
def test_layer_map_examples(student, teacher, expected):
    assert layer_map(student, teacher) == expected


@pytest.mark.parametrize(("student", "teacher"), [(0, 4), (5, 4)])
def test_layer_map_rejects_impossible_depths(student, teacher):
    with pytest.raises(ValueError, match="student layers"):
        layer_map(student, teacher)


def test_combine_weights_terms_and_skips_zero_weights():
    terms = {"kd": torch.tensor(2.0), "ce": torch.tensor(3.0), "hidden": torch.tensor(float("nan"))}
    assert combine(terms, {"kd": 0.9, "ce": 0.1, "hidden": 0.0}).item() == pytest.approx(0.9 * 2 + 0.1 * 3)
    assert combine({"kd": torch.tensor(2.0)}, {"kd": 1.0, "attention": 0.0}).item() == 2.0


def test_combine_missing_term_names_it():
    with pytest.raises(KeyError, match="attention"):
        combine({"kd": torch.tensor(1.0)}, {"kd": 1.0, "attention": 0.5})


def test_combine_needs_a_nonzero_weight():
    with pytest.raises(ValueError, match="nonzero"):
        combine({"kd": torch.tensor(1.0)}, {"kd": 0.0})
