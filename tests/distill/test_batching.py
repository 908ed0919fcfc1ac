import random

import pytest
import torch
from edgedistill.distill.batching import collate, length_grouped_batches
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT


@given(st.lists(st.integers(1, 60), min_size=1, max_size=400), st.integers(1, 40), st.integers(0, 10))
def test_batches_cover_every_example_once(lengths, batch_size, seed):
    batches = length_grouped_batches(lengths, batch_size, seed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)


def test_length_grouped_batches_repeat_for_a_seed_and_differ_across_seeds():
    rng = random.Random(0)
    lengths = [rng.randint(2, 60) for _ in range(5000)]
    a = length_grouped_batches(lengths, 32, seed=1)
    assert a == length_grouped_batches(lengths, 32, seed=1)
    assert a != length_grouped_batches(lengths, 32, seed=2)


def test_length_grouping_pads_far_less_than_random_batches():
    rng = random.Random(0)
    lengths = [rng.randint(2, 60) for _ in range(5000)]
    a = length_grouped_batches(lengths, 32, seed=1)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in a)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    naive = sum(32 * max(lengths[i] for i in order[s : s + 32]) for s in range(0, len(order), 32))
    assert padded < 0.6 * naive, "length grouping should cut padding sharply"


def test_collate_pads_and_masks():
    feats = {"input_ids": [[5, 6, 7], [8]], "token_type_ids": [[0, 0, 0], [0]]}
    out = collate(feats, [1, 0], pad_id=0)
    assert out["input_ids"].tolist() == [[8, 0, 0], [5, 6, 7]]
    assert out["attention_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert out["token_type_ids"].shape == (2, 3)
    assert out["input_ids"].dtype == torch.long


def test_layer_decay_scales_learning_rates_by_depth():
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.distill.trainer import _param_groups
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(
        BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    )
    groups = _param_groups(model, OptimConfig(lr=1.0, layer_decay=0.5, weight_decay=0.1))
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert lr_of[id(params["classifier.weight"])] == 1.0
    assert lr_of[id(params["bert.encoder.layer.2.output.dense.weight"])] == 0.5
    assert lr_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.125
    assert lr_of[id(params["bert.embeddings.word_embeddings.weight"])] == 0.0625
    assert wd_of[id(params["bert.encoder.layer.0.output.LayerNorm.weight"])] == 0.0
    assert wd_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.1
    flat = _param_groups(model, OptimConfig(lr=1.0))
    assert {g["lr"] for g in flat} == {1.0}
    assert sum(len(g["params"]) for g in flat) == len(params)


def rate(lr: float) -> float:
    """A learning rate to 12 significant digits, where products in another order may differ in the last bits."""
    return float(f"{lr:.12g}")


def default_teacher_groups(recipe: str) -> list[tuple[float, float, int, str, str]]:
    """The optimizer groups of `recipe`'s teacher (the default recipe's MiniLM, its mean-pooled head), each as
    (lr to 12 digits, weight_decay, parameters, first name, last name)."""
    from edgedistill.common.recipe import load_recipe
    from edgedistill.distill import heads
    from edgedistill.distill.trainer import _param_groups
    from transformers import AutoConfig

    cfg = load_recipe(ROOT / "recipes" / recipe)
    config = AutoConfig.from_pretrained(cfg.model.init, num_labels=cfg.data.num_labels)
    model = heads.classifier_class(cfg.finetune.pooling)(config)
    names = {id(p): n for n, p in model.named_parameters()}
    return [
        (rate(g["lr"]), g["weight_decay"], len(g["params"]), names[id(g["params"][0])], names[id(g["params"][-1])])
        for g in _param_groups(model, cfg.finetune.optim)
    ]


def minilm_layer_groups(lr: float) -> list[tuple[float, float, int, str, str]]:
    """Layer i of the six: its weights, then its biases and LayerNorm weights."""
    groups = []
    for i in range(6):
        layer = f"bert.encoder.layer.{i}"
        decayed = rate(lr * 0.85 ** (6 - i))
        groups += [
            (decayed, 0.01, 6, f"{layer}.attention.self.query.weight", f"{layer}.output.dense.weight"),
            (decayed, 0.0, 10, f"{layer}.attention.self.query.bias", f"{layer}.output.LayerNorm.bias"),
        ]
    return groups


def test_the_default_teacher_s_layer_decay_groups_are_its_embeddings_each_layer_and_the_head():
    lr = 1.0e-4
    assert default_teacher_groups("sst2-llrd.yaml") == (
        [
            (
                rate(lr * 0.85**7),
                0.01,
                3,
                "bert.embeddings.word_embeddings.weight",
                "bert.embeddings.token_type_embeddings.weight",
            ),
            (rate(lr * 0.85**7), 0.0, 2, "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"),
            *minilm_layer_groups(lr),
            (lr, 0.01, 1, "classifier.weight", "classifier.weight"),
            (lr, 0.0, 1, "classifier.bias", "classifier.bias"),
        ]
    )


def test_the_default_teacher_without_layer_decay_has_one_rate_and_two_weight_decays():
    assert [group[:3] for group in default_teacher_groups("sst2.yaml")] == [(1.0e-4, 0.01, 40), (1.0e-4, 0.0, 63)]


def decayed_rates(model) -> dict[str, float]:
    """Each parameter's learning rate at lr 1, layer_decay 0.5."""
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.distill.trainer import _param_groups

    rates = {id(p): g["lr"] for g in _param_groups(model, OptimConfig(lr=1.0, layer_decay=0.5)) for p in g["params"]}
    return {name: rates[id(param)] for name, param in model.named_parameters()}


def tiny_albert():
    from transformers import AlbertConfig, AlbertForSequenceClassification

    config = AlbertConfig(
        vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=16,
    )  # fmt: skip
    return AlbertForSequenceClassification(config)


def test_albert_s_shared_layer_learns_at_its_lowest_layer_s_rate():
    rates = decayed_rates(tiny_albert())
    assert rates["albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight"] == 0.5**4


def test_albert_s_embeddings_learn_below_its_shared_layer():
    assert decayed_rates(tiny_albert())["albert.embeddings.word_embeddings.weight"] == 0.5**5


def tiny_deberta():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    config = DebertaV2Config(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16,
        relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm",
    )  # fmt: skip
    return DebertaV2ForSequenceClassification(config)


@pytest.mark.parametrize("name", ["deberta.encoder.rel_embeddings.weight", "deberta.encoder.LayerNorm.weight"])
def test_deberta_s_relative_embeddings_learn_at_its_lowest_layer_s_rate(name):
    assert decayed_rates(tiny_deberta())[name] == 0.5**3


def encoders():
    """A tiny classifier of each encoder the bert and gpt families take, and the name of its layer 1's weight."""
    from transformers import (
        DistilBertConfig,
        DistilBertForSequenceClassification,
        ElectraConfig,
        ElectraForSequenceClassification,
        GPT2Config,
        GPT2ForSequenceClassification,
        RobertaConfig,
        RobertaForSequenceClassification,
    )

    sizes = {"vocab_size": 50, "num_attention_heads": 2}
    return {
        "roberta": (
            RobertaForSequenceClassification(
                RobertaConfig(**sizes, hidden_size=16, num_hidden_layers=3, intermediate_size=16)
            ),
            "roberta.encoder.layer.1.output.dense.weight",
        ),
        "distilbert": (
            DistilBertForSequenceClassification(
                DistilBertConfig(vocab_size=50, dim=16, n_layers=3, n_heads=2, hidden_dim=16)
            ),
            "distilbert.transformer.layer.1.ffn.lin1.weight",
        ),
        "electra": (
            ElectraForSequenceClassification(
                ElectraConfig(**sizes, embedding_size=8, hidden_size=16, num_hidden_layers=3, intermediate_size=16)
            ),
            "electra.encoder.layer.1.output.dense.weight",
        ),
        "gpt2": (
            GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_embd=16, n_layer=3, n_head=2, pad_token_id=0)),
            "transformer.h.1.mlp.c_fc.weight",
        ),
    }


@pytest.mark.parametrize("arch", ["roberta", "distilbert", "electra", "gpt2"])
def test_each_encoder_s_layer_1_of_3_learns_at_two_decays_below_the_head(arch):
    model, name = encoders()[arch]
    assert decayed_rates(model)[name] == 0.5**2


def test_gpt2_s_final_norm_learns_at_the_head_s_rate():
    model, _ = encoders()["gpt2"]
    assert decayed_rates(model)["transformer.ln_f.weight"] == 1.0


def test_a_transformers_model_whose_layers_are_not_found_is_refused_layer_decay():
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.common.recipe import RecipeError
    from edgedistill.distill.trainer import _param_groups

    model = tiny_deberta()
    model.config.num_hidden_layers = 5  # no module list of 5 layers
    with pytest.raises(RecipeError, match="holds no module list of its 5 layers"):
        _param_groups(model, OptimConfig(lr=1.0, layer_decay=0.5))


def tiny_ctrl():
    """A tiny CTRL, whose word embedding is `transformer.w`: a name that says nothing of what it is."""
    from transformers import CTRLConfig, CTRLForSequenceClassification

    config = CTRLConfig(vocab_size=50, n_embd=16, n_layer=3, n_head=2, dff=16, n_positions=32, pad_token_id=0)
    return CTRLForSequenceClassification(config)


def parameters_of(model, module: str) -> list[str]:
    """The names of every parameter of `model`'s submodule `module`."""
    return [name for name, _ in model.get_submodule(module).named_parameters(prefix=module)]


def embedding_models():
    """A tiny classifier of each kind of embeddings, its number of layers and the names of all its embedding
    parameters: a BERT's embeddings module (word, position and token type embeddings, their LayerNorm), GPT-2's word
    and position embeddings beside its layers, ALBERT's and DeBERTa-v2's embeddings modules, CTRL's `w`."""
    from transformers import BertConfig, BertForSequenceClassification

    bert = BertForSequenceClassification(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    )
    albert, deberta = tiny_albert(), tiny_deberta()
    return {
        "bert": (bert, 3, parameters_of(bert, "bert.embeddings")),
        "gpt2": (encoders()["gpt2"][0], 3, ["transformer.wte.weight", "transformer.wpe.weight"]),
        "albert": (albert, 4, parameters_of(albert, "albert.embeddings")),
        "deberta-v2": (deberta, 3, parameters_of(deberta, "deberta.embeddings")),
        "ctrl": (tiny_ctrl(), 3, ["transformer.w.weight"]),
    }


@pytest.mark.parametrize("arch", ["bert", "gpt2", "albert", "deberta-v2", "ctrl"])
def test_every_embedding_parameter_learns_one_decay_below_the_lowest_layer(arch):
    model, layers, names = embedding_models()[arch]
    rates = decayed_rates(model)
    assert {name: rates[name] for name in names} == dict.fromkeys(names, 0.5 ** (layers + 1))


def test_ctrl_s_final_norm_learns_at_the_head_s_rate():
    assert decayed_rates(tiny_ctrl())["transformer.layernorm.weight"] == 1.0


def test_electra_s_embedding_projection_learns_with_its_embeddings():
    model, _ = encoders()["electra"]
    assert decayed_rates(model)["electra.embeddings_project.weight"] == 0.5**4


def test_a_pooler_registered_before_the_layers_learns_at_the_head_s_rate():
    from transformers import GteConfig, GteForSequenceClassification

    config = GteConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    model = GteForSequenceClassification(config)  # its pooler is registered between its embeddings and its layers
    assert decayed_rates(model)["gte.pooler.dense.weight"] == 1.0


def test_a_masked_lm_head_tied_to_the_word_embeddings_learns_at_the_head_s_rate():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=16)
    assert decayed_rates(BertForMaskedLM(config))["cls.predictions.transform.dense.weight"] == 1.0


def tiny_bart(encoder_layers: int, decoder_layers: int):
    """A tiny BART classifier: `shared` word embeddings tied into its encoder and decoder, each with its own
    position embeddings; the head reads the decoder's last state."""
    from transformers import BartConfig, BartForSequenceClassification

    config = BartConfig(
        vocab_size=50, d_model=16, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        max_position_embeddings=32,
    )  # fmt: skip
    return BartForSequenceClassification(config)


@pytest.mark.parametrize(("encoder_layers", "decoder_layers"), [(2, 3), (3, 3), (3, 2)])
def test_bart_s_decoder_layers_learn_below_the_head_and_its_encoder_layers_below_them(encoder_layers, decoder_layers):
    rates = decayed_rates(tiny_bart(encoder_layers, decoder_layers))
    expected = {f"model.decoder.layers.{j}.fc1.weight": 0.5 ** (decoder_layers - j) for j in range(decoder_layers)}
    expected |= {
        f"model.encoder.layers.{i}.fc1.weight": 0.5 ** (decoder_layers + encoder_layers - i)
        for i in range(encoder_layers)
    }
    assert {name: rates[name] for name in expected} == expected


@pytest.mark.parametrize(
    "name", ["model.shared.weight", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
)
def test_bart_s_embeddings_learn_one_decay_below_its_lowest_encoder_layer(name):
    assert decayed_rates(tiny_bart(2, 3))[name] == 0.5**6


def test_bart_s_classification_head_learns_at_the_head_s_rate():
    assert decayed_rates(tiny_bart(2, 3))["classification_head.dense.weight"] == 1.0


def test_an_encoder_decoder_whose_decoder_layers_are_not_found_is_refused_layer_decay():
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.common.recipe import RecipeError
    from edgedistill.distill.trainer import _param_groups

    model = tiny_bart(2, 3)
    model.config.decoder_layers = 5  # no module list of 5 decoder layers
    with pytest.raises(RecipeError, match="holds no module list of its 5 decoder layers"):
        _param_groups(model, OptimConfig(lr=1.0, layer_decay=0.5))


def student(arch: str):
    """A tiny student of `arch` in the objective the student stage trains."""
    from edgedistill.common.config.training import StudentConfig, StudentRun
    from edgedistill.distill.student_stage import DistillObjective
    from edgedistill.distill.students import build_student

    layers = 2 if arch == "transformer" else 1
    cfg = StudentConfig(
        arch=arch, vocab_size=50, embed_dim=8, hidden_size=16, num_layers=layers, num_heads=2, intermediate_size=16,
        num_filters=4,
    )  # fmt: skip
    return DistillObjective(build_student(cfg), StudentRun(model=cfg))


@pytest.mark.parametrize(
    ("name", "rate"),
    [
        ("student.bert.embeddings.word_embeddings.weight", 0.5**3),
        ("student.bert.encoder.layer.0.output.dense.weight", 0.5**2),
        ("student.bert.encoder.layer.1.output.dense.weight", 0.5),
        ("student.classifier.weight", 1.0),
    ],
)
def test_a_transformer_student_s_layers_learn_at_decayed_rates_below_its_classifier(name, rate):
    assert decayed_rates(student("transformer"))[name] == rate


@pytest.mark.parametrize("arch", ["bilstm", "cnn"])
def test_a_student_without_transformer_layers_is_refused_layer_decay(arch):
    from edgedistill.common.config.training import OptimConfig
    from edgedistill.common.recipe import RecipeError
    from edgedistill.distill.trainer import _param_groups

    with pytest.raises(RecipeError, match="DistillObjective holds no transformers model"):
        _param_groups(student(arch), OptimConfig(lr=1.0, layer_decay=0.5))


def tiny_xlm():
    """A tiny XLM, whose layers are four module lists side by side: attentions, norms, feed-forwards, norms."""
    from transformers import XLMConfig, XLMForSequenceClassification

    return XLMForSequenceClassification(XLMConfig(vocab_size=50, emb_dim=16, n_layers=3, n_heads=2))


@pytest.mark.parametrize(
    "name",
    [
        "transformer.attentions.1.q_lin.weight",
        "transformer.layer_norm1.1.weight",
        "transformer.ffns.1.lin1.weight",
        "transformer.layer_norm2.1.weight",
    ],
)
def test_each_of_xlm_s_side_by_side_layer_lists_learns_at_its_layer_s_rate(name):
    assert decayed_rates(tiny_xlm())[name] == 0.5**2
