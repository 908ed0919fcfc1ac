"""A BERT classifier that reads the mean of its final states over real tokens instead of the [CLS] pooler.

Sentence-embedding checkpoints (all-MiniLM and the other sentence-transformers models) were trained through
mean pooling and ship no trained pooler, so a head on their [CLS] state starts further from what they learned.
The classes are registered with the transformers Auto classes: once this module is imported,
`AutoModelForSequenceClassification.from_pretrained(folder)` loads such a teacher, `AutoModel` its encoder and
`AutoModelForMaskedLM` its encoder with a masked-LM head.
"""

import torch
from edgedistill.common import guide
from edgedistill.common.bundle import TOKEN_INPUTS
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.distill.students import BERT_TYPES
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertModel,
)
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.models.bert.modeling_bert import BertPreTrainedModel


class MeanPooledBertConfig(BertConfig):
    model_type = BERT_TYPES[1]


class MeanPooledBertModel(BertModel):
    """The encoder of a mean-pooled teacher (a `BertModel`), for `AutoModel`."""

    config_class = MeanPooledBertConfig

    def __init__(self, config: MeanPooledBertConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer)


class MeanPooledBertForMaskedLM(BertForMaskedLM):
    """A mean-pooled teacher's encoder with a masked-LM head, for `AutoModelForMaskedLM`: pretraining continued from
    such a teacher keeps its model type, and so its head."""

    config_class = MeanPooledBertConfig


class MeanPooledBertForSequenceClassification(BertPreTrainedModel):
    """`BertModel` (no pooler) -> mean of the final states over `attention_mask` -> dropout -> logits."""

    config_class = MeanPooledBertConfig

    def __init__(self, config: MeanPooledBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        encoded = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs)
        states = encoded.last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions
        )


def teacher_inputs(config, tokenizer) -> tuple[str, ...]:
    """The inputs a teacher with this transformers `config` takes, in order, as training fed it: token type ids only
    where it has two or more (`type_vocab_size`) and its `tokenizer` gives them; GPT-2 and DistilBERT have none,
    RoBERTa and XLM-RoBERTa one, which a 1 would index past, DeBERTa-v2 by default none (it ignores them), and
    BigBird's tokenizer gives none, so its teacher learnt with type 0 throughout."""
    segments = getattr(config, "type_vocab_size", 0) > 1 and "token_type_ids" in tokenizer.model_input_names
    return TOKEN_INPUTS if segments else TOKEN_INPUTS[:2]


def _family_of(config) -> str | None:
    """The `model.family` that takes a checkpoint of this transformers `config`: gpt for a GPT-2, bert for a
    masked-LM encoder (BERT, RoBERTa, DistilBERT, ELECTRA, DeBERTa, ALBERT, ...) or an encoder-decoder transformers
    lists among masked LMs (BART, mBART, MVP); None for any other model (a Llama, a Qwen, T5), which neither
    family's pretraining, head and export are written for."""
    if config.model_type == "gpt2":
        return "gpt"
    masked = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES or config.model_type in BERT_TYPES
    return "bert" if masked else None


def require_family(config, family: str, name) -> None:
    """Refuse a checkpoint `name` that is not of `model.family`: a GPT is a GPT-2 (`model_type` gpt2), which the
    causal-LM pretraining, the export and the pair and student checks take it for; a BERT is a masked-LM encoder,
    which the MLM pretraining and the classifier's [CLS] or mean pooling take it for."""
    found = _family_of(config)
    if found == family:
        return
    want = "a GPT-2 checkpoint (model_type gpt2)" if family == "gpt" else "a BERT-style encoder"
    if found is None:
        way_out = "no model.family takes it: name a GPT-2 or a masked-LM encoder (BERT, RoBERTa, ...) in model.init"
    else:
        way_out = f"set model.family: {found}, or name such a checkpoint in model.init"
    raise RecipeError(f"model.family={family} wants {want}, but {name} is a {config.model_type}; {way_out}")


def require_pooling(config, pooling: str, name) -> None:
    """Refuse `finetune.pooling: mean` for a checkpoint `name` that is not a BERT: the mean-pooled head is built on
    `BertModel`, which would load none of another encoder's weights and start from random ones; and `cls` for a
    mean-pooled teacher, whose own head, the one the Auto class builds, is the mean-pooled one."""
    if pooling == "mean" and config.model_type not in BERT_TYPES:
        raise RecipeError(
            f"finetune.pooling=mean builds a BERT encoder, but {name} is a {config.model_type}, whose weights it "
            "would not load; use finetune.pooling: cls (the model's own head)"
        )
    if pooling == "cls" and config.model_type == MeanPooledBertConfig.model_type:
        raise RecipeError(
            f"finetune.pooling=cls, but {name} is a mean-pooled teacher ({config.model_type}), whose own head reads "
            "the mean of its final states; use finetune.pooling: mean"
        )


def require_classifier_dropout(config, dropout: float | None, name) -> None:
    """Refuse `finetune.classifier_dropout` for a checkpoint `name` whose transformers `config` has no
    `classifier_dropout` field (DistilBERT, DeBERTa-v2, ALBERT, XLM name their head's dropout otherwise, and their
    classifiers take no such argument): known from the config, so the pretrain stage refuses it too, before it
    trains."""
    if dropout is not None and not hasattr(config, "classifier_dropout"):
        raise RecipeError(
            f"finetune.classifier_dropout={dropout:g}, but {name} is a {config.model_type}, whose config has no "
            "classifier_dropout field to set (its head's dropout is named otherwise); leave classifier_dropout unset "
            "for it"
        )


def require_reinit(config, count: int, name) -> None:
    """Refuse `finetune.reinit_layers` of `count` top layers where a model of transformers `config` (named `name`)
    cannot have them drawn afresh: an encoder-decoder, whose head reads its decoder's layers; a config without the
    `initializer_range` to draw from (BART's and XLM's give `init_std`); layers that share weights (ALBERT's
    `num_hidden_groups`), where a top layer drawn afresh would draw lower ones with it; fewer layers than `count`.
    Known from the config, so the pretrain stage refuses it too, before it trains."""
    if count == 0:
        return
    if config.is_encoder_decoder:
        raise RecipeError(
            f"finetune.reinit_layers draws an encoder's top layers afresh, but {name} is an encoder-decoder, whose "
            "head reads its decoder's layers; leave reinit_layers at 0 for it"
        )
    if getattr(config, "initializer_range", None) is None:
        raise RecipeError(
            f"finetune.reinit_layers: {name}'s config gives no initializer_range to draw the fresh weights from; "
            "leave reinit_layers at 0 for it"
        )
    layers = config.num_hidden_layers
    if (groups := getattr(config, "num_hidden_groups", layers)) != layers:
        raise RecipeError(
            f"finetune.reinit_layers draws the top layers afresh, but {name} shares weights between its layers "
            f"(num_hidden_groups={groups} for num_hidden_layers={layers}), so a top layer drawn afresh would draw "
            "lower ones with it; leave reinit_layers at 0 for it"
        )
    if count > layers:
        raise RecipeError(f"finetune.reinit_layers={count}, but the model has {layers} layers")


# The teachers whose exported graph ONNX Runtime's BERT fusions fuse completely: an attention node per layer, the
# embeddings' EmbedLayerNormalization, two SkipLayerNormalizations and a GELU per layer, as export.optimize checks.
# Measured on tiny models of each type (docs/export.md#fusion-by-model-type): RoBERTa-like embeddings (positions
# numbered from the padding id), DeBERTa's disentangled attention, ALBERT's shared layers, MPNet's relative
# attention bias and others leave part of the graph unfused.
FUSABLE_TYPES = frozenset({*BERT_TYPES, "distilbert", "electra", "ernie", "rembert", "big_bird"})


def fusion_applies(config) -> bool:
    """Whether ONNX Runtime's BERT fusions apply to a teacher of transformers `config` at all: not to a GPT-2 or an
    encoder-decoder (its decoder's self- and cross-attention), whose graphs ship unfused whatever `fused` says."""
    return config.model_type != "gpt2" and not config.is_encoder_decoder


def require_fusable(config, recipe: Recipe, name) -> None:
    """Refuse a recipe whose teacher bundles (ONNX Runtime ones, the `transfer.labeller` among them) ask for
    `fused: true` when the checkpoint `name` of transformers `config` is an encoder the fusions take but cannot fuse
    completely, or set a fusion choice (`attention`, `skip_layer_norm`) when the fusions do not take it at all:
    known from its model type before the teacher trains, not when its bundles are built."""
    if recipe.export is None or config.model_type in FUSABLE_TYPES:
        return
    if not fusion_applies(config):
        graph = f"the graph of {name}, a {config.model_type}"
        for bundle_id, spec in recipe.export.bundles.items():
            if spec.source == "teacher" and (unapplied := spec.unapplied_fusion_choices(bundle_id, graph)):
                raise RecipeError(unapplied)
        return
    labeller = recipe.transfer.labeller if recipe.transfer else None
    fused = [
        f"{bundle_id} (transfer.labeller)" if bundle_id == labeller else bundle_id
        for bundle_id, spec in recipe.export.bundles.items()
        if spec.source == "teacher" and spec.fused and spec.runtime == "onnxruntime"
    ]
    if fused:
        raise RecipeError(
            f"export.bundles {', '.join(fused)}: fused: true (the default), but ONNX Runtime's BERT fusions cannot "
            f"fully fuse {name}, a {config.model_type} (they fuse {', '.join(sorted(FUSABLE_TYPES))}); set fused: "
            f"false in each of these teacher bundles ({guide.page('export.md', 'fusion-by-model-type')})"
        )


# Models that number positions from the padding id + 1, as fairseq did: RoBERTa's 514 position embeddings hold
# 512 tokens (`create_position_ids_from_input_ids` in transformers).
POSITIONS_AFTER_PADDING = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "longformer", "roberta-prelayernorm",
     "xmod", "ibert", "luke", "mpnet"}
)  # fmt: skip


def usable_positions(config) -> int:
    """Tokens a model of transformers `config` can read: its position embeddings, less those below the first
    position of the models that number positions after the padding id."""
    positions = config.max_position_embeddings
    if config.model_type in POSITIONS_AFTER_PADDING:
        positions -= config.pad_token_id + 1
    return positions


def require_positions(config, tokens: int, setting: str, name) -> None:
    """Refuse sequences of `tokens` (the recipe's `setting`) longer than the positions of the model `name`, whose
    position embeddings would otherwise be indexed out of range at the first long text."""
    positions = usable_positions(config)
    why = "max_position_embeddings"
    if positions != config.max_position_embeddings:
        why += f" {config.max_position_embeddings}, a {config.model_type}'s numbered from its padding id + 1"
    refuse_past_positions(positions, tokens, setting, name, why)


def refuse_past_positions(positions: int, tokens: int, setting: str, name, why: str) -> None:
    """`RecipeError` where `tokens` (the recipe's `setting`) are more than the `positions` of `name` (`why`: where
    that count comes from)."""
    if tokens > positions:
        raise RecipeError(
            f"{setting}={tokens}, but {name} has {positions} positions ({why}); set {setting} to at most {positions}"
        )


def classifier_class(pooling: str):
    """What builds a new teacher with `finetune.pooling` from a checkpoint (its `from_pretrained`)."""
    return MeanPooledBertForSequenceClassification if pooling == "mean" else AutoModelForSequenceClassification


def load_teacher(folder, **kwargs):
    """A fine-tuned teacher from its folder, whichever head it has (`from_pretrained` keyword arguments)."""
    return AutoModelForSequenceClassification.from_pretrained(folder, **kwargs)


def load_encoder(folder, **kwargs):
    """A fine-tuned teacher's encoder alone (a `BertModel` or `GPT2Model`), whichever head it has."""
    return AutoModel.from_pretrained(folder, **kwargs)


AutoConfig.register(MeanPooledBertConfig.model_type, MeanPooledBertConfig)
AutoModel.register(MeanPooledBertConfig, MeanPooledBertModel)
AutoModelForMaskedLM.register(MeanPooledBertConfig, MeanPooledBertForMaskedLM)
AutoModelForSequenceClassification.register(MeanPooledBertConfig, MeanPooledBertForSequenceClassification)
