"""Static INT8: a GPT teacher's projections, exported as Gemm, are quantized with the rest; a fused BERT graph's
activations are quantized too."""

import contextlib
import logging
import sys

import numpy as np
import onnx
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.distill.students import StudentConfig, build_student
from edgedistill.distill.tokenization import train_tokenizer
from edgedistill.export import optimize, quantize
from edgedistill.export.onnx_export import ExportError, Source, example_inputs, export_onnx, load_source
from onnx import TensorProto, helper
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


class ConvThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.linear = torch.nn.Conv1d(16, 8, 3), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(self.conv(x).amax(-1))


def test_dynamic_int8_per_channel_records_that_conv_weights_keep_one_scale(tmp_path):
    """ONNX Runtime's dynamic Conv takes one weight scale per tensor; its MatMul one per output channel."""
    axes = {"x": {0: "batch", 2: "length"}}
    torch.onnx.export(
        ConvThenLinear(),
        (torch.randn(2, 16, 10),),
        tmp_path / "m.onnx",
        input_names=["x"],
        dynamic_axes=axes,
        dynamo=False,
    )
    applied = quantize.int8_dynamic(tmp_path / "m.onnx", tmp_path / "int8.onnx", per_channel=True)
    assert applied["weight_scales"] == {"per_tensor": 1, "per_channel": 1}


@pytest.mark.parametrize(
    "per_channel, scales", [(False, {"per_tensor": 5, "per_channel": 0}), (True, {"per_tensor": 1, "per_channel": 4})]
)
def test_dynamic_int8_counts_a_bilstms_weight_scales_per_direction(tmp_path, per_channel, scales):
    """An LSTM's weights have a scale per direction, or per direction and output channel; the embedding table one."""
    torch.manual_seed(0)
    student = build_student(StudentConfig(arch="bilstm", vocab_size=100, embed_dim=8, hidden_size=8)).eval()
    export_onnx(Source(student, ("input_ids", "attention_mask"), "bilstm", tmp_path), tmp_path / "plain.onnx", 17)
    applied = quantize.int8_dynamic(tmp_path / "plain.onnx", tmp_path / "int8.onnx", per_channel=per_channel)
    assert applied["weight_scales"] == scales


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


@pytest.mark.parametrize("arch", ["cnn", "bilstm"])
def test_static_int8_of_a_student_exported_at_opset_18_is_built(tmp_path, arch):
    # ONNX Runtime's symbolic shape inference cannot type opset 18's ReduceMax of the students' max pooling: only
    # graphs with fused operators are given to it
    torch.manual_seed(0)
    student = build_student(StudentConfig(arch=arch, vocab_size=100, embed_dim=8, hidden_size=8, num_filters=4)).eval()
    source = Source(student, ("input_ids", "attention_mask"), arch, tmp_path)
    export_onnx(source, tmp_path / "plain.onnx", opset=18)
    calibration = [{k: v.numpy() for k, v in example_inputs(source.inputs, 4, 12).items()}]
    applied = quantize.int8_static(
        tmp_path / "plain.onnx", tmp_path / "int8.onnx", calibration, ["MatMul", "Gemm", "Conv"]
    )
    assert applied["mode"] == "static"


def graph_of_an_unknown_fused_operator(path):
    """x -> an ONNX Runtime-domain operator no inference knows -> MatMul -> y."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["h"], domain=quantize.CONTRIB_DOMAIN),
        helper.make_node("MatMul", ["h", "w"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "unknown", [x], [y], [weight])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(quantize.CONTRIB_DOMAIN, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_a_fused_graph_static_int8_cannot_type_is_refused_naming_the_way_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = graph_of_an_unknown_fused_operator(tmp_path / "fused.onnx")
    with pytest.raises(ExportError, match="static INT8 cannot type the fused graph fused.onnx .*set fused: false"):
        quantize.int8_static(graph, tmp_path / "int8.onnx", [{"x": np.ones((2, 4), np.float32)}])


def test_a_fused_graph_static_int8_cannot_type_leaves_no_file_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = graph_of_an_unknown_fused_operator(tmp_path / "fused.onnx")
    with contextlib.suppress(ExportError):
        quantize.int8_static(graph, tmp_path / "int8.onnx", [{"x": np.ones((2, 4), np.float32)}])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fused.onnx"]


def test_int8_passes_on_no_advice_to_pre_process_the_graph(tmp_path, caplog):
    source = Source(build_student(StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, num_filters=8)).eval(),
                    ("input_ids", "attention_mask"), "cnn", tmp_path)  # fmt: skip
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    with caplog.at_level("WARNING"):
        quantize.int8_dynamic(tmp_path / "plain.onnx", tmp_path / "int8.onnx")
    assert [record.getMessage() for record in caplog.records if "pre-processing" in record.getMessage()] == []


def test_the_advice_filter_passes_other_warnings_of_the_root_logger():
    record = logging.LogRecord("root", logging.WARNING, __file__, 1, "another warning", None, None)
    assert quantize._NoAdvice().filter(record)


@pytest.mark.parametrize("arch", ["cnn", "bilstm"])
def test_fp16_of_a_student_exported_at_opset_18_says_nothing(tmp_path, capfd, caplog, arch):
    """ONNX Runtime's symbolic shape inference fails on the graph and asks for an issue to be filed: the conversion
    needs none of it."""
    student = build_student(StudentConfig(arch=arch, vocab_size=100, embed_dim=8, hidden_size=8, num_filters=4))
    export_onnx(Source(student.eval(), ("input_ids", "attention_mask"), arch, tmp_path), tmp_path / "plain.onnx", 18)
    capfd.readouterr()
    with caplog.at_level("WARNING"):
        quantize.fp16(tmp_path / "plain.onnx", tmp_path / "fp16.onnx")
    assert (tuple(capfd.readouterr()), caplog.records) == (("", ""), [])


def test_holding_back_advice_passes_on_anything_else_printed(capsys):
    with quantize._without_advice():
        print("failed in shape inference <class 'AssertionError'>")
        print("another line")
    assert capsys.readouterr().out == "another line\n"


def test_holding_back_advice_lets_a_failure_through():
    with pytest.raises(ValueError, match="a real failure"), quantize._without_advice():
        raise ValueError("a real failure")


def test_holding_back_advice_with_stdout_closed_lets_a_failure_through(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(ValueError, match="a real failure"), quantize._without_advice():
        raise ValueError("a real failure")
