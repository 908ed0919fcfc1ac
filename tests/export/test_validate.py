"""The shape checks and the dev check of `export.validate`: a non-finite logit, or an fp32 graph off by more than
the tolerance at a shape or on dev, misses the gate; a figure exactly at its gate passes it, and one missed by one or two
predictions names the ways out; a bundle longer than the shapes is checked at its length."""

import numpy as np
import pytest
import torch
from edgedistill.common.config.training import DataConfig, StudentConfig
from edgedistill.distill import heads
from edgedistill.export.onnx_export import Source
from edgedistill.export.validate import FP32_TOLERANCE, ExportGateError, check_shapes, gate, parity, require_finite

from tests.distill import extension


@pytest.fixture
def source(tmp_path) -> Source:
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, max_length=64)
    return Source(extension.BagOfWords(config).eval(), heads.TOKEN_INPUTS[:2], "bag", tmp_path)


def runner(source: Source, change):
    """`run(feeds)`: PyTorch's logits for `feeds`, passed through `change(logits, batch, length)`."""

    def run(feeds):
        with torch.no_grad():
            logits = source.module(*(torch.from_numpy(feeds[name]) for name in source.inputs)).numpy()
        return change(logits, *feeds["input_ids"].shape)

    return run


def nan_at_batch_3(logits: np.ndarray, batch: int, length: int) -> np.ndarray:
    if batch == 3:
        logits[1, 0] = np.nan
    return logits


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_a_nan_logit_at_one_shape_misses_the_gate_naming_the_shape(source, precision):
    with pytest.raises(ExportGateError, match=rf"at batch 3, length 17: the {precision} graph gives 1 NaN"):
        check_shapes(runner(source, nan_at_batch_3), source, precision, 64)


def test_an_infinite_dev_logit_misses_the_gate():
    with pytest.raises(ExportGateError, match="the fp16 graph gives 1 NaN or infinite logits of 4"):
        require_finite(np.array([[0.5, np.inf], [0.1, 0.2]]), "bundle on dev", "fp16")


def test_an_fp32_graph_off_by_more_than_the_tolerance_misses_the_gate(source):
    def off(logits, batch, length):
        return logits + 2 * FP32_TOLERANCE

    with pytest.raises(ExportGateError, match=r"max \|Δlogit\| 2.00e-03 against PyTorch at batch 1, length 1"):
        check_shapes(runner(source, off), source, "fp32", 64)


def test_an_fp32_fused_graph_off_by_more_than_the_tolerance_names_fused_false(source):
    with pytest.raises(ExportGateError, match=r"over the fp32 tolerance 0.001 \(fused: false builds a Transformer"):
        check_shapes(runner(source, lambda logits, batch, length: logits + 1), source, "fp32", 64, fused=True)


def test_an_fp32_graph_without_fused_kernels_off_by_more_than_the_tolerance_names_no_fused_false(source):
    with pytest.raises(ExportGateError) as missed:
        check_shapes(runner(source, lambda logits, batch, length: logits + 1), source, "fp32", 64)
    assert "fused: false" not in str(missed.value)


def test_a_bundle_longer_than_every_shape_is_checked_at_its_max_length(source):
    worst = check_shapes(runner(source, lambda logits, batch, length: logits), source, "fp32", 192)
    assert "b3_t192" in worst


def test_a_bundle_within_the_shapes_is_checked_at_no_further_length(source):
    worst = check_shapes(runner(source, lambda logits, batch, length: logits), source, "fp32", 128)
    assert "b3_t128" not in worst


def dev_figures_off_by(difference: float) -> dict[str, float]:
    """Parity figures of a bundle whose dev logits are all `difference` above PyTorch's, with the same answers."""
    torch_logits = np.array([[1.0, 0.0], [0.0, 1.0]])
    data = DataConfig(train="unused", dev="unused", label_names=["negative", "positive"])
    return parity(torch_logits + difference, torch_logits, [0, 1], data, 0.1)


def test_an_fp32_bundle_off_pytorch_on_dev_by_more_than_the_tolerance_misses_the_gate():
    with pytest.raises(ExportGateError, match=r"max \|Δlogit\| 2.00e-03 against PyTorch on dev, over the fp32"):
        gate(dev_figures_off_by(2 * FP32_TOLERANCE), "fp32", 0.999, 0.005)


def test_an_fp16_bundle_off_pytorch_on_dev_by_the_same_passes_its_gate():
    assert gate(dev_figures_off_by(2 * FP32_TOLERANCE), "fp16", 0.995, 0.005, "x") is None


def int8_figures(torch_right: int, int8_right: int, texts: int = 1000) -> dict[str, float]:
    """Gate figures of an INT8 bundle that gets `int8_right` of `texts` dev texts right where PyTorch gets
    `torch_right`, its answers otherwise PyTorch's."""
    return {
        "dev_accuracy": int8_right / texts,
        "torch_dev_accuracy": torch_right / texts,
        "agreement_beyond_ties": 1.0,
        "tie_flips": 0,
        "max_abs_diff": 0.1,
    }


def test_an_int8_bundle_losing_exactly_the_allowed_drop_passes_its_gate():
    # 0.9 - 0.895 is 0.005000000000000004 in floats
    assert gate(int8_figures(900, 895), "int8", 0.97, 0.005) is None


def test_an_int8_bundle_losing_one_text_more_than_the_allowed_drop_misses_its_gate():
    with pytest.raises(ExportGateError, match=r"INT8 loses 0\.0060 dev accuracy"):
        gate(int8_figures(900, 894), "int8", 0.97, 0.005)


def differing_answers(texts: int, differ: int) -> dict[str, float]:
    """Parity figures of a bundle whose answers differ from PyTorch's, far from a near-tie, on `differ` of `texts`."""
    torch_logits = np.tile([1.0, 0.0], (texts, 1))
    exported = torch_logits.copy()
    exported[:differ] = [0.0, 1.0]
    data = DataConfig(train="unused", dev="unused", label_names=["negative", "positive"])
    return parity(exported, torch_logits, [0] * texts, data, 0.1)


def test_a_bundle_agreeing_exactly_as_often_as_its_gate_asks_passes_it():
    # 8 of 125 differ: 1 - 0.064 is 0.9359999999999999 in floats
    assert gate(differing_answers(125, 8), "fp16", 0.936, 0.005) is None


def test_a_bundle_agreeing_one_text_less_often_than_its_gate_asks_misses_it():
    with pytest.raises(ExportGateError, match=r"fp16 predictions agree with PyTorch on 92\.8000% of dev"):
        gate(differing_answers(125, 9), "fp16", 0.936, 0.005)


def test_a_bundle_missing_its_agreement_gate_says_how_many_of_how_many_predictions_differ():
    with pytest.raises(ExportGateError, match=r"2 of 60 predictions differ"):
        gate(differing_answers(60, 2), "int8", 0.97, 0.05)


def test_an_int8_bundle_two_predictions_short_of_its_gate_names_the_gate_and_a_larger_dev_split():
    ways_out = r"lower export\.min_int8_agreement, or score on a larger dev split \(data\.dev_limit"
    with pytest.raises(ExportGateError, match=ways_out):
        gate(differing_answers(60, 2), "int8", 0.97, 0.05)


def test_a_bundle_three_predictions_short_of_its_gate_is_not_told_its_dev_split_is_small():
    with pytest.raises(ExportGateError) as missed:
        gate(differing_answers(60, 3), "int8", 0.97, 0.05)
    assert "this small" not in str(missed.value)


def test_an_fp32_bundle_one_prediction_short_of_its_gate_is_not_told_to_lower_it():
    with pytest.raises(ExportGateError) as missed:
        gate(differing_answers(60, 1), "fp32", 0.999, 0.05)
    assert "lower export.min_agreement" not in str(missed.value)
