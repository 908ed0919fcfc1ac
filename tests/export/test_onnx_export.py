"""The example inputs that export traces and the shape checks feed: fixed per shape, masked unevenly; a student
added as docs/extending.md says exports with them."""

import re
import warnings

import numpy as np
import onnx
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.atomic import DiskFull
from edgedistill.common.config.training import StudentConfig
from edgedistill.common.runtime import open_runner
from edgedistill.distill import heads
from edgedistill.distill.students import build_student
from edgedistill.distill.tokenization import train_tokenizer
from edgedistill.export.fold import fold
from edgedistill.export.onnx_export import (
    ExportError,
    Source,
    example_inputs,
    export_onnx,
    exported_bytes,
    load_source,
)
from edgedistill.export.optimize import fuse
from edgedistill.export.validate import FP32_TOLERANCE, check_shapes, logits_runner
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BartConfig,
    BartForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    MBartConfig,
    MBartForSequenceClassification,
    MvpConfig,
    MvpForSequenceClassification,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from tests.distill import extension

NAMES = ("input_ids", "attention_mask", "token_type_ids")
TEXTS = ["a fine film about a dog", "the dog was dull", "fine acting and a dull plot"] * 20


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
    worst = check_shapes(logits_runner(open_runner(path, "onnxruntime", ["CPUExecutionProvider"])), source, "fp32", 64)
    assert max(worst.values()) < 1e-5


def tiny_roberta() -> RobertaConfig:
    """A RoBERTa of one token type, as roberta-base and xlm-roberta-base are."""
    return RobertaConfig(
        vocab_size=120,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        type_vocab_size=1,
    )


def _teacher_artifact(tmp_path, model) -> Source:
    """`model` committed as a teacher artifact, loaded back as export loads it."""
    model.save_pretrained(tmp_path / "staged")
    train_tokenizer("bert", TEXTS, 60).save_pretrained(tmp_path / "staged")
    artifact = mf.Manifest(stage="teacher", recipe="tiny", recipe_hash="h", config_hash="c")
    mf.commit(tmp_path / "staged", tmp_path / "teacher", artifact)
    return load_source(tmp_path / "teacher")


def test_a_roberta_teacher_exports_without_token_type_ids_it_has_one_type_for():
    tokenizer = train_tokenizer("bert", TEXTS, 60)  # one that gives token type ids
    assert heads.teacher_inputs(tiny_roberta(), tokenizer) == ("input_ids", "attention_mask")


def test_a_teacher_of_two_token_types_exports_with_the_token_type_ids_its_tokenizer_gives():
    assert heads.teacher_inputs(BertConfig(), train_tokenizer("bert", TEXTS, 60)) == NAMES


def test_a_teacher_of_two_token_types_exports_without_token_type_ids_its_tokenizer_never_gave():
    bert = train_tokenizer("bert", TEXTS, 60)  # BigBird's tokenizer, like DistilBERT's, gives none: trained on type 0
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bert.backend_tokenizer, pad_token="[PAD]", model_input_names=["input_ids", "attention_mask"]
    )
    assert heads.teacher_inputs(BertConfig(), tokenizer) == ("input_ids", "attention_mask")


def test_an_exported_roberta_teacher_gives_its_pytorch_logits(tmp_path):
    config = tiny_roberta()
    source = _teacher_artifact(tmp_path, RobertaForSequenceClassification(config))
    export_onnx(source, tmp_path / "model.onnx", opset=17)
    runner = logits_runner(open_runner(tmp_path / "model.onnx", "onnxruntime", ["CPUExecutionProvider"]))
    worst = check_shapes(runner, source, "fp32", 64)
    assert max(worst.values()) < 1e-5


def test_an_electra_teacher_whose_head_has_a_gelu_of_its_own_fuses_and_keeps_its_logits(tmp_path):
    config = ElectraConfig(
        vocab_size=120, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    source = _teacher_artifact(tmp_path, ElectraForSequenceClassification(config))
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    fuse(tmp_path / "plain.onnx", tmp_path / "fused.onnx", 2, 16, 1)
    runner = logits_runner(open_runner(tmp_path / "fused.onnx", "onnxruntime", ["CPUExecutionProvider"]))
    assert max(check_shapes(runner, source, "fp32", 64).values()) <= FP32_TOLERANCE


def test_an_input_the_model_never_reads_stops_the_export(tmp_path):
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, max_length=64)  # single texts: no token types
    source = Source(extension.BagOfWords(config).eval(), heads.TOKEN_INPUTS, "bag", tmp_path)
    with pytest.raises(ExportError, match=r"never reads its input\(s\) \['token_type_ids'\]"):
        export_onnx(source, tmp_path / "model.onnx", opset=17)


def test_a_forward_the_exporter_cannot_trace_stops_the_export_naming_the_model(tmp_path):
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, max_length=64)
    source = Source(extension.Packed(config).eval(), heads.TOKEN_INPUTS[:2], "packed", tmp_path)
    with pytest.raises(ExportError, match=r"^packed: PyTorch's ONNX exporter failed on it \(RuntimeError: "):
        export_onnx(source, tmp_path / "model.onnx", opset=17)


def bag_of_words(tmp_path) -> Source:
    """docs/extending.md's student of single texts, as a source to export."""
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, max_length=64)
    return Source(extension.BagOfWords(config).eval(), heads.TOKEN_INPUTS[:2], "bag", tmp_path)


def test_a_graph_over_what_one_onnx_file_holds_stops_the_export_with_its_size_and_what_to_change(tmp_path, monkeypatch):
    source = bag_of_words(tmp_path)
    monkeypatch.setattr(onnx.checker, "MAXIMUM_PROTOBUF", 1000)  # this graph's bytes, and more, are over it
    with pytest.raises(ExportError, match=r"GiB, over the 2 GiB one ONNX file holds.*a smaller teacher \(model.init"):
        export_onnx(source, tmp_path / "model.onnx", opset=17)


def folded_cnn(tmp_path, half: bool) -> Source:
    """A small CNN student folded as `fold: true` exports it, its table in fp16 where `half`."""
    cnn = build_student(StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, num_filters=4, max_length=64))
    return Source(fold(cnn.eval(), half=half), heads.TOKEN_INPUTS[:2], "cnn", tmp_path)


def test_a_folded_cnn_over_what_one_onnx_file_holds_names_precision_fp16_which_halves_its_table(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx.checker, "MAXIMUM_PROTOBUF", 1000)
    with pytest.raises(ExportError, match=r"the folded table, .* is most of it: precision: fp16 \(halves it"):
        export_onnx(folded_cnn(tmp_path, half=False), tmp_path / "model.onnx", opset=17)


def test_a_folded_cnn_whose_table_is_fp16_already_over_what_one_onnx_file_holds_names_fold_false_first(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(onnx.checker, "MAXIMUM_PROTOBUF", 1000)
    with pytest.raises(ExportError, match=r"the folded table, .* is most of it: fold: false, or a student of fewer"):
        export_onnx(folded_cnn(tmp_path, half=True), tmp_path / "model.onnx", opset=17)


def test_an_export_that_fills_the_disk_says_so_naming_the_folder_not_the_model(small_fs):
    # 20,000 x 64 fp32 embeddings: 5 MiB, over the 3 MiB device
    cnn = build_student(StudentConfig(arch="cnn", vocab_size=20_000, embed_dim=64, num_filters=4, max_length=64))
    source = Source(cnn.eval(), heads.TOKEN_INPUTS[:2], "cnn", small_fs)
    with pytest.raises(DiskFull, match=rf"no space left on the device of {re.escape(str(small_fs))} \(writing model"):
        export_onnx(source, small_fs / "model.onnx", opset=17)


def test_the_exported_size_counts_the_external_data_files_of_the_weights(tmp_path):
    source = bag_of_words(tmp_path)
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    spilled = tmp_path / "spilled.onnx"
    onnx.save(onnx.load(str(tmp_path / "plain.onnx")), str(spilled), save_as_external_data=True, location="weights")
    assert exported_bytes(spilled) == spilled.stat().st_size + (tmp_path / "weights").stat().st_size


ENCODER_DECODERS = {
    "bart": (BartConfig, BartForSequenceClassification),
    "mbart": (MBartConfig, MBartForSequenceClassification),
    "mvp": (MvpConfig, MvpForSequenceClassification),
}


def tiny_encoder_decoder(tmp_path, model_type: str = "bart") -> Source:
    """A tiny encoder-decoder classifier (`</s>` is id 2, padding id 1) committed as a teacher artifact."""
    config_class, model_class = ENCODER_DECODERS[model_type]
    config = config_class(
        vocab_size=120, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
    )  # fmt: skip
    return _teacher_artifact(tmp_path, model_class(config).eval())


def bart_rows(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """`<s> ids </s>` per row, padded on the right with BART's padding id 1."""
    length = max(len(ids) for ids in rows) + 2
    ids = torch.ones(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row) + 2] = torch.tensor([0, *row, 2])
        mask[i, : len(row) + 2] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("model_type", ENCODER_DECODERS)
def test_an_encoder_decoder_teacher_exports_and_keeps_its_logits_at_every_shape(tmp_path, model_type):
    source = tiny_encoder_decoder(tmp_path, model_type)
    export_onnx(source, tmp_path / "model.onnx", opset=17)
    runner = logits_runner(open_runner(tmp_path / "model.onnx", "onnxruntime", ["CPUExecutionProvider"]))
    assert max(check_shapes(runner, source, "fp32", 64).values()) < 1e-5


@pytest.mark.parametrize("model_type", ENCODER_DECODERS)
def test_an_exported_encoder_decoder_gives_the_logits_of_transformers_head_at_each_row_s_last_eos(tmp_path, model_type):
    source = tiny_encoder_decoder(tmp_path, model_type)
    export_onnx(source, tmp_path / "model.onnx", opset=17)
    runner = logits_runner(open_runner(tmp_path / "model.onnx", "onnxruntime", ["CPUExecutionProvider"]))
    batch = bart_rows([[7, 8, 2, 2, 9], [12, 2, 2, 13, 14, 15, 16], [17, 2, 2, 18]])  # pairs: A </s></s> B
    with torch.no_grad():
        want = source.module.model(**batch).logits.numpy()
    assert abs(runner({k: v.numpy() for k, v in batch.items()}) - want).max() < 1e-5


def test_an_exported_bart_teacher_gives_a_row_its_own_logits_beside_rows_of_more_eos(tmp_path):
    source = tiny_encoder_decoder(tmp_path)
    export_onnx(source, tmp_path / "model.onnx", opset=17)
    runner = logits_runner(open_runner(tmp_path / "model.onnx", "onnxruntime", ["CPUExecutionProvider"]))
    rows = [[7, 8, 9], [12, 2, 2, 13, 14]]
    alone = [runner({k: v.numpy() for k, v in bart_rows([row]).items()})[0] for row in rows]
    together = runner({k: v.numpy() for k, v in bart_rows(rows).items()})
    assert abs(together - np.stack(alone)).max() < 1e-5


# A tiny encoder of each model type, two layers of hidden 16: what a teacher's config would say beyond the defaults.
SIZES = {
    "vocab_size": 120,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}
ONE_TYPE = {"type_vocab_size": 1, "pad_token_id": 1}  # RoBERTa-like: positions numbered from the padding id
ENCODERS = {
    "bert": SIZES,
    "edgedistill-bert-mean": SIZES,
    "distilbert": {"vocab_size": 120, "dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32},
    "electra": SIZES | {"embedding_size": 8},
    "ernie": SIZES,
    "rembert": SIZES | {"input_embedding_size": 8, "output_embedding_size": 8},
    "big_bird": SIZES,
    "roberta": SIZES | ONE_TYPE,
    "xlm-roberta": SIZES | ONE_TYPE,
    "camembert": SIZES | ONE_TYPE,
    "data2vec-text": SIZES | ONE_TYPE,
    "roberta-prelayernorm": SIZES | ONE_TYPE,
    "xlm-roberta-xl": SIZES | ONE_TYPE,
    "deberta": SIZES | {"type_vocab_size": 0},
    "deberta-v2": SIZES | {"type_vocab_size": 0},
    "albert": SIZES | {"embedding_size": 8},
    "mpnet": SIZES | {"pad_token_id": 1},
    "megatron-bert": SIZES,
    "mobilebert": SIZES | {"embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16},
    "roformer": SIZES,
    "convbert": SIZES,
    "nystromformer": SIZES,
    "modernbert": SIZES | {"pad_token_id": 0},
    "squeezebert": SIZES | {"embedding_size": 16},
    "funnel": {"vocab_size": 120, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 32, "block_sizes": [1, 1]},
}


def fuses_completely(tmp_path, model_type: str) -> bool:
    """Whether ONNX Runtime's BERT fusions fuse a tiny teacher of `model_type`, as exported, as the bundles check."""
    config = AutoConfig.for_model(model_type, **ENCODERS[model_type])
    torch.manual_seed(0)
    source = _teacher_artifact(tmp_path, AutoModelForSequenceClassification.from_config(config))
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    try:
        fuse(tmp_path / "plain.onnx", tmp_path / "fused.onnx", source.num_heads, source.hidden_size, source.num_layers)
    except ExportError:
        return False
    return True


@pytest.mark.parametrize("model_type", ENCODERS)
def test_the_model_types_a_teacher_may_fuse_are_those_onnx_runtime_fuses_completely(tmp_path, model_type):
    assert fuses_completely(tmp_path, model_type) == (model_type in heads.FUSABLE_TYPES)


def export_warnings(source: Source, tmp_path) -> list[str]:
    """The warnings that exporting `source` shows, each time it gives one: not those of deprecation, which Python shows
    only in `__main__` (the legacy exporter is used on purpose)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", DeprecationWarning)
        export_onnx(source, tmp_path / "model.onnx", opset=17)
    return [str(warning.message) for warning in seen]


def student_source(module, tmp_path) -> Source:
    return Source(module.eval(), heads.TOKEN_INPUTS[:2], "student", tmp_path)


@pytest.mark.parametrize("arch", ["bilstm", "transformer"])
def test_a_students_export_shows_none_of_the_exporter_warnings_the_shape_checks_answer(arch, tmp_path):
    tiny = {"vocab_size": 100, "embed_dim": 16, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32}
    student = build_student(StudentConfig(arch=arch, max_length=64, **tiny))
    assert export_warnings(student_source(student, tmp_path), tmp_path) == []


def test_a_bert_teachers_export_shows_none_of_the_exporter_warnings_the_shape_checks_answer(tmp_path):
    config = BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    source = _teacher_artifact(tmp_path, BertForSequenceClassification(config))
    assert export_warnings(source, tmp_path) == []


class _Warns(torch.nn.Module):
    """Logits of the mean embedding, warning as it traces."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 2)

    def forward(self, input_ids, attention_mask):
        warnings.warn("a warning of the model's own", UserWarning, stacklevel=1)
        return (self.embed(input_ids) * attention_mask.unsqueeze(-1)).mean(1)


def test_an_export_shows_any_other_warning(tmp_path):
    assert export_warnings(student_source(_Warns(), tmp_path), tmp_path) == ["a warning of the model's own"]


class _Branches(_Warns):
    """`_Warns` without its warning, whose logits take a branch on a tensor read as a boolean."""

    def forward(self, input_ids, attention_mask):
        logits = (self.embed(input_ids) * attention_mask.unsqueeze(-1)).mean(1)
        return logits if attention_mask.sum() > 1 else -logits


def test_an_export_shows_a_tensor_read_as_a_boolean_in_a_student_of_ones_own(tmp_path):
    said = export_warnings(student_source(_Branches(), tmp_path), tmp_path)
    assert [text.startswith("Converting a tensor to a Python boolean") for text in said] == [True]
