"""Static INT8: a GPT teacher's projections, exported as Gemm, are quantized with the rest; a fused BERT graph's
activations are quantized too."""

import onnx
import torch
from edgedistill.common import manifest as mf
from edgedistill.distill.tokenization import train_tokenizer
from edgedistill.export import optimize, quantize
from edgedistill.export.onnx_export import example_inputs, export_onnx, load_source
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification


def teacher(folder, family: str, model) -> None:
    """`model` and a fresh `family` tokenizer, committed as a teacher artifact in `folder`."""
    model.save_pretrained(folder.with_name("staged"))
    train_tokenizer(family, ["a fine film about a dog", "the dog was dull"] * 20, 300).save_pretrained(
        folder.with_name("staged")
    )
    artifact = mf.Manifest(stage="teacher", recipe="tiny", recipe_hash="h", config_hash="c")
    mf.commit(folder.with_name("staged"), folder, artifact)


def exported(folder, family: str, model):
    """`model` as a teacher artifact under `folder`, exported to `folder/plain.onnx`: its source and one
    calibration batch of 4 rows of 12 tokens."""
    teacher(folder / "teacher", family, model)
    source = load_source(folder / "teacher")
    export_onnx(source, folder / "plain.onnx", opset=17)
    return source, [{k: v.numpy() for k, v in example_inputs(source.inputs, 4, 12).items()}]


def test_static_int8_quantizes_a_gpt_teachers_projection_weights(tmp_path):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=120, n_embd=16, n_layer=2, n_head=2, n_positions=64, pad_token_id=0)
    source, calibration = exported(tmp_path, "gpt", GPT2ForSequenceClassification(config))
    quantize.int8_static(tmp_path / "plain.onnx", tmp_path / "int8.onnx", calibration, quantize.static_ops(source.arch))
    graph = onnx.load(str(tmp_path / "int8.onnx")).graph
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    weights = [made_by.get(node.input[1]) for node in graph.node if node.op_type == "Gemm"]
    assert weights == ["DequantizeLinear"] * 8  # query-key-value, projection and two feed-forward per layer


def test_static_int8_of_a_fused_graph_quantizes_its_activations(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    calibration = exported(tmp_path, "bert", BertForSequenceClassification(config))[1]
    optimize.fuse(tmp_path / "plain.onnx", tmp_path / "fused.onnx", 2, 16, 1)
    quantize.int8_static(tmp_path / "fused.onnx", tmp_path / "int8.onnx", calibration)
    # ONNX's shape inference types no output of the fused Attention, SkipLayerNormalization and BiasGelu kernels
    # that feed the feed-forward MatMuls: unless typed, none of their activations is quantized.
    ops = [node.op_type for node in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert ops.count("QuantizeLinear") > 0


def test_static_int8_records_how_many_activations_it_quantized(tmp_path):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=120, n_embd=16, n_layer=1, n_head=2, n_positions=64, pad_token_id=0)
    calibration = exported(tmp_path, "gpt", GPT2ForSequenceClassification(config))[1]
    applied = quantize.int8_static(tmp_path / "plain.onnx", tmp_path / "int8.onnx", calibration, ["Gemm"])
    ops = [node.op_type for node in onnx.load(str(tmp_path / "int8.onnx")).graph.node]
    assert applied["activations_quantized"] == ops.count("QuantizeLinear")
