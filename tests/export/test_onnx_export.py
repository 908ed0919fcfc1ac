"""The example inputs that export traces and the shape checks feed: fixed per shape, masked unevenly."""

import torch
from edgedistill.export.onnx_export import example_inputs

NAMES = ("input_ids", "attention_mask", "token_type_ids")


def test_the_same_shape_gets_the_same_ids_so_a_shape_check_repeats():
    assert torch.equal(example_inputs(NAMES, 3, 17)["input_ids"], example_inputs(NAMES, 3, 17)["input_ids"])


def test_the_first_row_is_padded_so_the_masking_paths_are_traced():
    assert example_inputs(NAMES, 2, 10)["attention_mask"][0].tolist() == [1] * 5 + [0] * 5


def test_padded_positions_hold_the_padding_id_zero():
    inputs = example_inputs(NAMES, 2, 10)
    assert inputs["input_ids"][0, 5:].tolist() == [0] * 5
