"""The mean-pooled BERT teacher: what it reads, how it saves and loads, and that it exports and fuses."""

import onnxruntime as ort
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.distill import heads
from edgedistill.distill.tokenization import train_tokenizer
from edgedistill.export.onnx_export import export_onnx, load_source
from edgedistill.export.optimize import fuse
from edgedistill.export.validate import FP32_TOLERANCE, check_shapes
from transformers import (
    AlbertConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    BartConfig,
    BertConfig,
    BertModel,
    DebertaV2Config,
    DistilBertConfig,
    GPT2Config,
    LlamaConfig,
    RobertaConfig,
)

from tests.conftest import ROOT

SIZES = {
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


def tiny_mean_pooled() -> heads.MeanPooledBertForSequenceClassification:
    torch.manual_seed(0)
    return heads.MeanPooledBertForSequenceClassification(heads.MeanPooledBertConfig(num_labels=3, **SIZES)).eval()


IDS = torch.tensor([[2, 5, 7, 9, 3]])
MASK = torch.ones_like(IDS)


def test_logits_ignore_padding():
    model = tiny_mean_pooled()
    padded = torch.cat([IDS, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.long)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, mask).logits, model(IDS, MASK).logits)


def test_classifier_reads_the_mean_of_the_final_states():
    model = tiny_mean_pooled()
    with torch.no_grad():
        mean = model.bert(input_ids=IDS, attention_mask=MASK).last_hidden_state.mean(1)
        torch.testing.assert_close(model(IDS, MASK).logits, model.classifier(mean))


def test_hidden_states_asked_for_are_returned_one_per_layer_and_the_embeddings():
    with torch.no_grad():
        out = tiny_mean_pooled()(IDS, MASK, output_hidden_states=True)
    assert len(out.hidden_states) == SIZES["num_hidden_layers"] + 1


def test_attentions_asked_for_are_returned_one_per_layer():
    model = tiny_mean_pooled()
    model.set_attn_implementation("eager")  # SDPA computes no attention weights to return
    with torch.no_grad():
        out = model(IDS, MASK, output_attentions=True)
    assert len(out.attentions) == SIZES["num_hidden_layers"]


def test_loss_is_cross_entropy_of_the_labels():
    model = tiny_mean_pooled()
    out = model(IDS, MASK, labels=torch.tensor([2]))
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([2])))


def test_auto_classes_load_the_saved_teacher(tmp_path):
    model = tiny_mean_pooled()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS, MASK).logits, model(IDS, MASK).logits)


def test_auto_model_loads_the_encoder_as_a_bert_model(tmp_path):
    tiny_mean_pooled().save_pretrained(tmp_path)
    assert isinstance(AutoModel.from_pretrained(tmp_path), BertModel)


def test_built_from_a_plain_bert_checkpoint_keeps_its_encoder(tmp_path):
    plain = BertModel(BertConfig(**SIZES))
    plain.save_pretrained(tmp_path)
    built = heads.classifier_class("mean").from_pretrained(tmp_path, num_labels=2)
    torch.testing.assert_close(
        built.bert.encoder.layer[1].output.dense.weight, plain.encoder.layer[1].output.dense.weight
    )


@pytest.mark.slow
def test_exported_and_fused_graph_matches_pytorch(tmp_path):
    tiny_mean_pooled().save_pretrained(tmp_path / "staged")
    train_tokenizer("bert", ["a fine film about a dog", "the dog was dull"] * 20, 60).save_pretrained(
        tmp_path / "staged"
    )
    artifact = mf.Manifest(stage="teacher", recipe="tiny", recipe_hash="h", config_hash="c")
    mf.commit(tmp_path / "staged", tmp_path / "teacher", artifact)
    source = load_source(tmp_path / "teacher")
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    fuse(tmp_path / "plain.onnx", tmp_path / "fused.onnx", 2, 16, 2)
    session = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    worst = check_shapes(lambda feeds: session.run(["logits"], feeds)[0], source, precision="fp32", max_length=64)
    assert max(worst.values()) <= FP32_TOLERANCE


def test_a_roberta_reads_two_tokens_fewer_than_its_position_embeddings():
    config = RobertaConfig(max_position_embeddings=514, pad_token_id=1)
    assert heads.usable_positions(config) == 512


def test_a_max_length_that_only_a_roberta_s_padding_offset_puts_past_its_positions_is_refused():
    config = RobertaConfig(max_position_embeddings=514, pad_token_id=1)
    with pytest.raises(RecipeError, match="model.max_length=513, but roberta-init has 512 positions"):
        heads.require_positions(config, 513, "model.max_length", "roberta-init")


def test_a_bert_reads_as_many_tokens_as_its_position_embeddings():
    assert heads.usable_positions(BertConfig(max_position_embeddings=512)) == 512


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_a_llama_init_is_refused_by_either_family_with_no_other_family_to_set(family):
    with pytest.raises(RecipeError, match="is a llama; no model.family takes it"):
        heads.require_family(LlamaConfig(), family, "llama-init")


def test_a_roberta_init_under_model_family_gpt_is_sent_to_the_bert_family():
    with pytest.raises(RecipeError, match="is a roberta; set model.family: bert"):
        heads.require_family(RobertaConfig(), "gpt", "roberta-init")


def test_mean_pooling_of_a_roberta_init_is_refused_as_it_would_load_none_of_its_weights():
    with pytest.raises(RecipeError, match="finetune.pooling=mean builds a BERT encoder, but roberta-init is a roberta"):
        heads.require_pooling(RobertaConfig(), "mean", "roberta-init")


def test_cls_pooling_of_a_mean_pooled_init_is_refused_as_its_own_head_is_the_mean_pooled_one():
    with pytest.raises(RecipeError, match="finetune.pooling=cls, but mean-init is a mean-pooled teacher"):
        heads.require_pooling(heads.MeanPooledBertConfig(), "cls", "mean-init")


SMOKE = ROOT / "recipes" / "smoke.yaml"
# smoke's teacher bundles that fuse (the default): all but teacher-onnx
UNFUSED = {f"export.bundles.{bundle}.fused": False for bundle in ("teacher-fused", "teacher-int8", "teacher-cuda-fp16")}


@pytest.mark.parametrize("config", [RobertaConfig(), DebertaV2Config(), AlbertConfig()], ids=lambda c: c.model_type)
def test_fused_teacher_bundles_of_an_encoder_the_fusions_cannot_fuse_fully_are_refused(config):
    with pytest.raises(RecipeError, match=f"cannot fully fuse init, a {config.model_type} .* set fused: false"):
        heads.require_fusable(config, load_recipe(SMOKE), "init")


def test_the_labeller_among_the_refused_teacher_bundles_is_named_as_such():
    recipe = load_recipe(SMOKE, {"transfer.labeller": "teacher-fused"})
    with pytest.raises(RecipeError, match=r"teacher-fused \(transfer.labeller\), teacher-int8, teacher-cuda-fp16:"):
        heads.require_fusable(RobertaConfig(), recipe, "init")


def test_an_encoder_the_fusions_cannot_fuse_fully_passes_with_its_teacher_bundles_unfused():
    assert heads.require_fusable(RobertaConfig(), load_recipe(SMOKE, UNFUSED), "init") is None


@pytest.mark.parametrize("config", [BertConfig(), GPT2Config(), BartConfig()], ids=lambda c: c.model_type)
def test_a_teacher_the_fusions_fuse_fully_or_leave_alone_passes_with_fused_bundles(config):
    assert heads.require_fusable(config, load_recipe(SMOKE), "init") is None


@pytest.mark.parametrize("config", [GPT2Config(), BartConfig()], ids=lambda c: c.model_type)
@pytest.mark.parametrize("key, value", [("attention", "MultiHeadAttention"), ("skip_layer_norm", False)])
def test_a_fusion_choice_for_a_teacher_the_fusions_leave_alone_is_refused_naming_it(config, key, value):
    recipe = load_recipe(SMOKE, {f"export.bundles.teacher-fused.{key}": value})
    with pytest.raises(RecipeError, match=rf"export\.bundles\.teacher-fused\.{key} would not apply: .* init, a "):
        heads.require_fusable(config, recipe, "init")


def test_a_fusion_choice_for_a_teacher_the_fusions_fuse_fully_passes():
    recipe = load_recipe(SMOKE, {"export.bundles.teacher-fused.attention": "MultiHeadAttention"})
    assert heads.require_fusable(BertConfig(), recipe, "init") is None


def test_reinit_layers_of_an_encoder_decoder_is_refused_from_its_config_naming_the_checkpoint():
    with pytest.raises(RecipeError, match="reinit_layers draws an encoder's top layers afresh, but init is an encoder"):
        heads.require_reinit(BartConfig(), 1, "init")


def test_reinit_layers_of_an_albert_sharing_its_layers_is_refused_from_its_config():
    config = AlbertConfig(num_hidden_layers=4, num_hidden_groups=1)
    with pytest.raises(RecipeError, match=r"init shares weights between its layers \(num_hidden_groups=1 for num_hid"):
        heads.require_reinit(config, 2, "init")


def test_reinit_layers_of_an_albert_with_a_group_per_layer_passes():
    assert heads.require_reinit(AlbertConfig(num_hidden_layers=4, num_hidden_groups=4), 2, "init") is None


@pytest.mark.parametrize(
    "config", [DistilBertConfig(), DebertaV2Config(), AlbertConfig()], ids=lambda config: config.model_type
)
def test_classifier_dropout_for_an_init_whose_config_has_no_such_field_is_refused(config):
    with pytest.raises(RecipeError, match=f"classifier_dropout=0.2, but init is a {config.model_type}, whose config"):
        heads.require_classifier_dropout(config, 0.2, "init")


@pytest.mark.parametrize("config", [BertConfig(), RobertaConfig()], ids=lambda config: config.model_type)
def test_classifier_dropout_for_an_init_whose_config_has_the_field_passes(config):
    assert heads.require_classifier_dropout(config, 0.2, "init") is None
