"""Static INT8 of a GPT teacher's graph: its projections, exported as Gemm, are quantized with the rest."""

import onnx
import torch
from edgedistill.common import manifest as mf
from edgedistill.distill.tokenization import train_tokenizer
from edgedistill.export import quantize
from edgedistill.export.onnx_export import example_inputs, export_onnx, load_source
from transformers import GPT2Config, GPT2ForSequenceClassification


def test_static_int8_quantizes_a_gpt_teachers_projection_weights(tmp_path):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=120, n_embd=16, n_layer=2, n_head=2, n_positions=64, pad_token_id=0)
    GPT2ForSequenceClassification(config).save_pretrained(tmp_path / "staged")
    train_tokenizer("gpt", ["a fine film about a dog", "the dog was dull"] * 20, 300).save_pretrained(
        tmp_path / "staged"
    )
    artifact = mf.Manifest(stage="teacher", recipe="tiny", recipe_hash="h", config_hash="c")
    mf.commit(tmp_path / "staged", tmp_path / "teacher", artifact)
    source = load_source(tmp_path / "teacher")
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    calibration = [{k: v.numpy() for k, v in example_inputs(source.inputs, 4, 12).items()}]
    quantize.int8_static(tmp_path / "plain.onnx", tmp_path / "int8.onnx", calibration, quantize.static_ops(source.arch))
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    weights = [made_by.get(node.input[1]) for node in graph.node if node.op_type == "Gemm"]
    assert weights == ["DequantizeLinear"] * 8  # query-key-value, projection and two feed-forward per layer
