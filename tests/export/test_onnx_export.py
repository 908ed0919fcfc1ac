"""The example inputs that export traces and the shape checks feed: fixed per shape, masked unevenly; a student
added as docs/extending.md says exports with them."""

import pytest
import torch
from edgedistill.common.config.training import StudentConfig
from edgedistill.common.runtime import open_runner
from edgedistill.distill import heads
from edgedistill.export.onnx_export import Source, example_inputs, export_onnx
from edgedistill.export.validate import check_shapes, logits_runner

from tests.distill import extension

NAMES = ("input_ids", "attention_mask", "token_type_ids")


def test_the_same_shape_gets_the_same_ids_so_a_shape_check_repeats():
    assert torch.equal(example_inputs(NAMES, 3, 17)["input_ids"], example_inputs(NAMES, 3, 17)["input_ids"])


def test_the_first_row_is_padded_so_the_masking_paths_are_traced():
    assert example_inputs(NAMES, 2, 10)["attention_mask"][0].tolist() == [1] * 5 + [0] * 5


def test_padded_positions_hold_the_padding_id_zero():
    inputs = example_inputs(NAMES, 2, 10)
    assert inputs["input_ids"][0, 5:].tolist() == [0] * 5


@pytest.mark.parametrize("pairs", [False, True])
def test_a_student_added_as_the_docs_say_exports_with_every_input_and_passes_the_shape_checks(tmp_path, pairs):
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, pairs=pairs, max_length=64)
    inputs = heads.TOKEN_INPUTS if pairs else heads.TOKEN_INPUTS[:2]  # as load_source gives a student's
    source = Source(extension.BagOfWords(config).eval(), inputs, "bag", tmp_path)
    path = tmp_path / "model.onnx"
    graph = export_onnx(source, path, opset=17)
    assert [i.name for i in graph.graph.input] == list(inputs)
    worst = check_shapes(logits_runner(open_runner(path, "onnxruntime", ["CPUExecutionProvider"])), source, True, 64)
    assert max(worst.values()) < 1e-5
