import pytest
import torch
from edgedistill.common.recipe import load_recipe
from edgedistill.distill.students import StudentConfig, build_student
from edgedistill.export.fold import FoldedCNN, fold
from edgedistill.export.onnx_export import ExportError
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT

VOCAB = 40


def cnn(kernel_sizes: list[int], seed: int = 0):
    torch.manual_seed(seed)
    cfg = StudentConfig(arch="cnn", vocab_size=VOCAB, embed_dim=12, num_filters=5, kernel_sizes=kernel_sizes)
    model = build_student(cfg).eval()
    with torch.no_grad():
        for conv in model.convs:
            conv.bias.normal_()  # a bias of zero would hide windows counted in or out by mistake
        model.embed.weight[cfg.pad_token_id].normal_()  # masking, not a zero padding row, must keep padding out
    return model


@settings(max_examples=40, deadline=None)
@given(
    kernel_sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_folded_cnn_gives_the_cnn_logits(kernel_sizes, lengths, extra, seed):
    model = cnn(kernel_sizes, seed)
    width = max(lengths) + extra
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(lengths), width), generator=generator)  # padded positions hold real ids too
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
    with torch.no_grad():
        torch.testing.assert_close(FoldedCNN(model)(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)


def test_half_table_is_float16_and_sums_in_float32():
    model = cnn([3, 5])
    folded = fold(model, half=True)
    ids = torch.randint(0, VOCAB, (3, 9))
    mask = (torch.arange(9) < torch.tensor([[9], [4], [1]])).long()
    with torch.no_grad():
        logits = folded(ids, mask)
        torch.testing.assert_close(logits, model(ids, mask), atol=1e-2, rtol=1e-2)
    assert folded.table.dtype == torch.float16
    assert logits.dtype == torch.float32


def test_folded_table_rows_for_positions_outside_the_text():
    model = cnn([2, 4])
    folded = fold(model)
    rows = folded.table.view(VOCAB + 2, folded.width, -1)
    assert folded.width == 4
    assert rows.shape[-1] == 10
    assert not rows[VOCAB].any()  # before the text: zeros
    assert not rows[:VOCAB, 2:, :5].any()  # the width-2 filters have no taps at offsets 2 and 3
    # past the end: only at each filter's oldest offset, and below minus its bias
    after = rows[VOCAB + 1].clone()
    biases = torch.cat([conv.bias for conv in model.convs]).detach()
    oldest = torch.tensor([1] * 5 + [3] * 5)
    assert (after[oldest, torch.arange(10)] < -biases.clamp(min=0)).all()
    after[oldest, torch.arange(10)] = 0
    assert not after.any()


def test_fold_refuses_other_architectures():
    bilstm = build_student(StudentConfig(arch="bilstm", vocab_size=VOCAB, embed_dim=8, hidden_size=8))
    with pytest.raises(ExportError, match="needs a CNN student"):
        fold(bilstm)


@pytest.mark.parametrize("source", ["teacher", "bilstm"])
def test_recipe_refuses_fold_without_a_cnn_source(source):
    with pytest.raises(ValueError, match="fold: true needs a CNN student"):
        load_recipe(ROOT / "recipes" / "smoke.yaml", {"export.bundles.cnn-folded.source": source})


def test_folded_pair_cnn_gives_the_pair_cnn_logits():
    torch.manual_seed(5)
    model = build_student(
        StudentConfig(arch="cnn", vocab_size=VOCAB, embed_dim=12, num_filters=5, kernel_sizes=[2, 3], pairs=True)
    ).eval()
    ids = torch.randint(0, VOCAB, (3, 10))
    mask = (torch.arange(10) < torch.tensor([[5], [9], [4]])).long()
    types = ((torch.arange(10) >= torch.tensor([[3], [4], [2]])) & mask.bool()).long()
    with torch.no_grad():
        torch.testing.assert_close(FoldedCNN(model)(ids, mask, types), model(ids, mask, types), atol=1e-5, rtol=1e-5)
