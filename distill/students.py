"""Student models: BiLSTM (Tang et al. 2019), CNN (Kim 2014) and a small BERT (DistilBERT/TinyBERT).

Every student maps `input_ids` and `attention_mask`, both (B, T) int64, to logits (B, C) from
`forward(input_ids, attention_mask, token_type_ids=None)`. Padding is on the right (the mask is 1s then 0s, as
`distill.batching.collate` builds it), and logits do not depend on how much of it there is; `check_student`
checks this contract.

A pair student (`StudentConfig.pairs`) reads `token_type_ids`: the teacher tokenizer's
`[CLS] A [SEP] B [SEP]`, with 1 marking sentence B (for a tokenizer that gives no type 1, such as RoBERTa's,
`<s> A </s> </s> B </s>` with 1 from B's first token on: `common.segments`). The BiLSTM and the CNN encode each sentence on
its own with shared weights and classify the matching features `[u, v, u * v, |u - v|]` (Tang et
al. 2019); the Transformer reads both as two segments, like its teacher.

Every student is a `Student`, a huggingface_hub `PyTorchModelHubMixin`: `save_pretrained(folder)` writes
`config.json` (the `StudentConfig` fields and the label names) and `model.safetensors`, and
`Student.from_pretrained(folder)` (or the architecture's own class) rebuilds it, from a folder or a Hub
repository. This module needs torch, transformers and huggingface_hub only, not the training code.
"""

import contextlib
import inspect
import io

import torch
import torch.nn.functional as F
from edgedistill.common.config.training import StudentConfig
from edgedistill.distill.losses import layer_map
from huggingface_hub import PyTorchModelHubMixin
from torch import Tensor, nn
from transformers import BertConfig, BertModel, PreTrainedModel


def _rotation(shifts: Tensor, length: int) -> Tensor:
    """Gather index (B, T) rotating each row right by shifts[b] in 0..T: out[b, t] = x[b, (t - shifts[b]) mod T]."""
    index = torch.arange(length, device=shifts.device).unsqueeze(0) - shifts.unsqueeze(1)  # in -T..T-1
    return torch.where(index < 0, index + length, index)  # not `%`: the ONNX exporter rejects a symbolic divisor


def _rotate(x: Tensor, index: Tensor) -> Tensor:
    """x (B, T, D) reordered along time by a `_rotation` index (B, T)."""
    return x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def require_segments(token_type_ids: Tensor | None) -> None:
    """`ValueError` for a pair student called without `token_type_ids`, which would read each pair as one text."""
    if token_type_ids is None:
        raise ValueError("a pair student needs token_type_ids (1 marks sentence B); got none")


def pair_sides(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None) -> tuple[Tensor, Tensor]:
    """Pairs (B, T) -> both sentences as one batch (2B, T) of ids and masks: the A sides (`[CLS] A [SEP]`), then
    the B sides (`B [SEP]`) moved to the start of their rows, each right-padded by its own mask."""
    require_segments(token_type_ids)
    length = input_ids.shape[1]
    first = ((token_type_ids == 0) & attention_mask.bool()).sum(1)  # (B,)
    second = attention_mask.sum(1) - first
    positions = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)
    second_ids = input_ids.gather(1, _rotation(length - first, length))  # B's first token to position 0
    masks = [(positions < n.unsqueeze(1)).to(attention_mask.dtype) for n in (first, second)]
    return torch.cat([input_ids, second_ids]), torch.cat(masks)


def match(features: Tensor) -> Tensor:
    """(2B, D), the A sides then the B sides -> (B, 4D): `[u, v, u * v, |u - v|]`."""
    u, v = features.chunk(2)
    return torch.cat([u, v, u * v, (u - v).abs()], -1)


def _matched(cfg: StudentConfig) -> int:
    """How many feature vectors the classifier reads: 4 for a siamese pair student, else 1."""
    return 4 if cfg.pairs else 1


LABELS = "labels"  # config.json holds the StudentConfig fields and, beside them, the label names


def _config_from_json(data: dict) -> StudentConfig:
    return StudentConfig.model_validate({key: value for key, value in data.items() if key != LABELS})


CODERS = {StudentConfig: (lambda cfg: cfg.model_dump(mode="json"), _config_from_json)}


class Student(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="edgedistill",
    license="apache-2.0",
    pipeline_tag="text-classification",
    tags=["text-classification", "knowledge-distillation"],
    coders=CODERS,
):
    """A student classifier: `config` (its `StudentConfig`, vocab_size set) and `labels` (the names in index
    order; `LABEL_<i>` when not given). `Student.from_pretrained` builds the class `config.arch` names."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(coders=CODERS, **kwargs)  # the mixin does not pass its coders on to subclasses

    def __init__(self, config: StudentConfig, labels: list[str] | None = None):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("StudentConfig.vocab_size is not set (it comes from the teacher's tokenizer)")
        labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(config.num_labels)]
        if len(labels) != config.num_labels:
            raise ValueError(f"{len(labels)} label names for num_labels={config.num_labels}: {labels}")
        self.config, self.labels = config, labels

    @classmethod
    def _from_pretrained(cls, *, model_id: str, config: StudentConfig | None = None, strict: bool = True, **kwargs):
        """The architecture `config.arch` names (refused unless it is `cls` or a subclass), its weights loaded
        strictly: a missing or unexpected tensor raises."""
        if config is None:
            raise ValueError(f"{model_id} has no config.json: not a saved student")
        arch = ARCHITECTURES[config.arch]
        if not issubclass(arch, cls):
            raise TypeError(f"{model_id} holds a {config.arch} student ({arch.__name__}), not a {cls.__name__}")
        with contextlib.redirect_stdout(io.StringIO()):  # huggingface_hub prints "Loading weights from local directory"
            return super(Student, arch)._from_pretrained(model_id=model_id, config=config, strict=strict, **kwargs)


class BiLSTMClassifier(Student):
    """Embedding -> one bidirectional LSTM -> pooling over real tokens -> dropout -> ReLU layer -> logits.

    Packed sequences do not export cleanly to ONNX, so the LSTM runs on 2B rows instead: the batch as
    it is (right padding), whose forward direction never sees padding before a token, and the batch
    rotated to left padding, whose backward direction never does. The forward states of the first half
    and the realigned backward states of the second are exact; the other half of the work is discarded.
    """

    def __init__(self, config: StudentConfig, labels: list[str] | None = None):
        super().__init__(config, labels)
        self.pooling, self.pairs = config.pooling, config.pairs
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_token_id)
        self.lstm = nn.LSTM(config.embed_dim, config.hidden_size, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(config.dropout)
        self.hidden = nn.Linear(2 * config.hidden_size * _matched(config), config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def encode(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Bidirectional states (B, T, 2H) unaffected by padding; states at padded positions are meaningless."""
        batch, length = input_ids.shape
        lengths = attention_mask.sum(1)
        padding_first = _rotation(length - lengths, length)  # right padding -> left padding
        padding_last = _rotation(lengths, length)  # and back
        x = self.embed(input_ids)  # (B, T, E)
        rows = torch.cat([x, _rotate(x, padding_first)])
        kind = rows.device.type
        if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16:
            # CUDA autocast runs cuDNN's LSTM in fp16 whatever its dtype, and bf16 has no loss scaler; oneDNN has no
            # bf16 LSTM on a CPU without AVX512-BF16: fp32 on either
            with torch.autocast(kind, enabled=False):
                states, _ = self.lstm(rows.float())  # (2B, T, 2H)
        else:
            states, _ = self.lstm(rows)  # (2B, T, 2H)
        size = self.lstm.hidden_size
        forward_states = states[:batch, :, :size]
        backward_states = _rotate(states[batch:, :, size:], padding_last)
        return torch.cat([forward_states, backward_states], -1)

    def pool(self, states: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T, 2H) -> (B, 2H): max or mean over real tokens, or [forward at last token; backward at first]; a row
        without tokens (an empty side of a pair) pools to zeros, whatever its padding."""
        valid = attention_mask.bool().unsqueeze(-1)  # (B, T, 1)
        if self.pooling == "mean":
            return (states * valid).sum(1) / valid.sum(1).clamp(min=1)
        if self.pooling == "max":
            pooled = states.masked_fill(~valid, torch.finfo(states.dtype).min).amax(1)
        else:  # an empty row's backward state at 0 has read all its padding
            size = self.lstm.hidden_size
            last = (attention_mask.sum(1) - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, size)
            pooled = torch.cat([states[..., :size].gather(1, last).squeeze(1), states[:, 0, size:]], -1)
        return pooled * valid.any(1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if self.pairs:
            input_ids, attention_mask = pair_sides(input_ids, attention_mask, token_type_ids)
        pooled = self.pool(self.encode(input_ids, attention_mask), attention_mask)
        if self.pairs:
            pooled = match(pooled)
        return self.classifier(F.relu(self.hidden(self.dropout(pooled))))


class CNNClassifier(Student):
    """Kim (2014): embedding -> Conv1d per kernel width -> ReLU -> max over time -> dropout -> logits.

    Convolutions are wide (k - 1 zeros on each side, as in Kim's code), so a one-token input works and
    every window that touches a real token counts. Embeddings at padded positions are zeroed, so a
    window reaching into the padding sees the same zeros as the convolution's own padding.
    """

    def __init__(self, config: StudentConfig, labels: list[str] | None = None):
        super().__init__(config, labels)
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_token_id)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.embed_dim, config.num_filters, k, padding=k - 1) for k in config.kernel_sizes
        )
        self.dropout = nn.Dropout(config.dropout)
        self.pairs = config.pairs
        self.classifier = nn.Linear(config.num_filters * len(config.kernel_sizes) * _matched(config), config.num_labels)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if self.pairs:
            ids, mask = pair_sides(input_ids, attention_mask, token_type_ids)
            return self.classifier(self.dropout(match(self.features(ids, mask))))
        return self.classifier(self.dropout(self.features(input_ids, attention_mask)))

    def features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T) -> (B, filters x widths): each filter's max over the windows that touch a real token."""
        x = (self.embed(input_ids) * attention_mask.unsqueeze(-1)).transpose(1, 2)  # (B, E, T)
        lengths = attention_mask.sum(1, keepdim=True)  # (B, 1)
        features = []
        for conv in self.convs:
            out = F.relu(conv(x))  # (B, F, T + k - 1); window j covers input positions j - k + 1 .. j
            valid = torch.arange(out.shape[-1], device=x.device) < lengths + conv.kernel_size[0] - 1  # (B, T + k - 1)
            # After ReLU every value is >= 0, so zeroing invalid windows leaves the max over valid ones.
            features.append((out * valid.unsqueeze(1)).amax(-1))
        return torch.cat(features, -1)


class TransformerClassifier(Student):
    """A small BERT encoder -> [CLS] state -> dropout -> logits; BertModel, so teacher weights fit."""

    def __init__(self, config: StudentConfig, labels: list[str] | None = None):
        super().__init__(config, labels)
        bert = BertConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            max_position_embeddings=config.max_length,
            hidden_dropout_prob=config.dropout,
            attention_probs_dropout_prob=config.dropout,
            pad_token_id=config.pad_token_id,
            attn_implementation="eager",  # the fused kernels do not return attention probabilities
        )
        self.bert = BertModel(bert, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        return_internals: bool = False,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Logits (B, C); with `return_internals` also hidden_states (L + 1 of (B, T, H), embeddings first)
        and attentions (L of (B, heads, T, T)). `token_type_ids` mark sentence B of a pair, as for the teacher."""
        # The flags are passed only when set: given explicitly, even as False, they break the TorchScript export.
        flags = {"output_hidden_states": True, "output_attentions": True} if return_internals else {}
        if self.config.pairs:  # BertModel would take no segments as all sentence A
            require_segments(token_type_ids)
        if token_type_ids is not None:
            flags["token_type_ids"] = token_type_ids
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, **flags)
        logits = self.classifier(self.dropout(out.last_hidden_state[:, 0]))
        if return_internals:
            return logits, out.hidden_states, out.attentions
        return logits

    def keep_attention_rows(self) -> None:
        """Turn attention dropout off, so that the attentions `forward` returns with `return_internals` are
        probabilities (rows summing to 1) in train mode too: eager attention returns them after its dropout.
        Evaluation and inference never drop, so the outputs in eval mode, and the export, are unchanged."""
        self.bert.config.attention_probs_dropout_prob = 0.0
        for layer in self.bert.encoder.layer:
            layer.attention.self.dropout.p = 0.0


ARCHITECTURES = {"bilstm": BiLSTMClassifier, "cnn": CNNClassifier, "transformer": TransformerClassifier}


class StudentError(ValueError):
    """A student architecture that breaks the contract of this module's docstring; the message says how."""


def build_student(cfg: StudentConfig, labels: list[str] | None = None) -> Student:
    """A freshly initialised student of `cfg.arch`; `cfg.vocab_size` must be set."""
    if cfg.arch not in ARCHITECTURES:
        raise StudentError(f"arch {cfg.arch!r} has no class in distill.students.ARCHITECTURES: add it there")
    return ARCHITECTURES[cfg.arch](cfg, labels)


def check_student(student: Student, from_teacher: bool) -> None:
    """Raise `StudentError` where `student` breaks the contract: `forward(input_ids, attention_mask,
    token_type_ids)` gives logits (B, num_labels) that padding does not change and, for a pair student, that depend
    on token_type_ids; with `from_teacher`, `init_from_teacher` has a rule for it. Leaves `student` in eval mode."""
    name, cfg = type(student).__name__, student.config
    ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))  # padding too
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    types = torch.tensor([[0] * 4 + [1] * 4, [0] * 3 + [1] * 2 + [0] * 3]) if cfg.pairs else None
    try:  # as training calls it, and as the export calls a single-text student: without token_type_ids
        inspect.signature(student.forward).bind(ids, mask, types)
        if types is None:
            inspect.signature(student.forward).bind(ids, mask)
    except TypeError as err:
        raise StudentError(
            f"{name}.forward must take (input_ids, attention_mask, token_type_ids=None): {err}"
        ) from None
    if from_teacher and not _starts_from_teacher(student):
        raise StudentError(
            f"init_from_teacher has no rule for {name}, which has no `embed` word embedding (nn.Embedding): set "
            "init_from_teacher: false (and baseline_init_from_teacher: false) for it, or extend init_from_teacher"
        )
    student.eval()
    with torch.no_grad():
        logits = student(ids, mask, *([] if types is None else [types]))
        if not isinstance(logits, Tensor) or logits.shape != (2, cfg.num_labels):
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise StudentError(
                f"{name} returns {got} for 2 texts; want logits (batch, num_labels) = (2, {cfg.num_labels})"
            )
        alone = student(ids[1:, :5], mask[1:, :5], *([] if types is None else [types[1:, :5]]))
        if not torch.allclose(logits[1:], alone, atol=1e-4):
            raise StudentError(
                f"{name}'s logits for a padded text differ from those of the same text alone (max |Δ| "
                f"{(logits[1:] - alone).abs().max():.2e}): forward must ignore the positions attention_mask marks 0, "
                "since batches pad texts to the longest"
            )
        if types is not None:
            moved = types.clone()
            moved[0, 3] = 1  # sentence B one token longer
            if torch.allclose(student(ids, mask, moved)[0], logits[0]):
                raise StudentError(
                    f"{name}'s logits do not depend on token_type_ids, but this task's texts are pairs "
                    "(data.text_pair_column): read which tokens are sentence B (`pair_sides` and `match` make a "
                    "siamese student)"
                )


def _starts_from_teacher(student: nn.Module) -> bool:
    """Whether `init_from_teacher` has a rule for `student`: a Transformer, or a word embedding `embed`."""
    return isinstance(student, TransformerClassifier) or isinstance(getattr(student, "embed", None), nn.Embedding)


def _teacher_embedding_basis(words: Tensor, dim: int) -> Tensor:
    """(V, H_t) -> (V, dim): principal components of the centred embeddings, scaled to unit std.

    The first min(dim, H_t) components keep the most variance; extra dimensions, when dim > H_t, are 0.
    The single scale factor matches nn.Embedding's N(0, 1) init, so the LSTM/conv input has its usual
    size (BERT's vectors are ~20 times smaller); it keeps the relative geometry.
    """
    centred = words.float() - words.float().mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    scores = centred @ vh[:dim].T  # (V, min(dim, H_t))
    scores = scores / scores.std().clamp(min=1e-12)
    return F.pad(scores, (0, dim - scores.shape[1]))


# What a transformer student copies from its teacher (`init_from_teacher`): a BERT's blocks, at the same sizes, which
# compute the same function only with the same activation and layer norm epsilon (the student's are BertConfig's own)
COPIED_SIZES = ("hidden_size", "num_attention_heads", "intermediate_size")
COPIED_FUNCTION = ("hidden_act", "layer_norm_eps")
BERT_TYPES = ("bert", "edgedistill-bert-mean")  # a plain BERT, and a mean-pooled teacher's (distill.heads)


def teacher_misfits(student: BertConfig, teacher) -> list[str]:
    """Why a transformer student of config `student` cannot copy the layers of a teacher of transformers config
    `teacher`; empty when it can. Another architecture's blocks (RoBERTa's positions, DistilBERT's or DeBERTa's
    layers) are not a BERT's."""
    if teacher.model_type not in BERT_TYPES:
        return [f"the teacher's model_type is {teacher.model_type}, not bert"]
    differ = [
        f"{n} {getattr(student, n)} vs {getattr(teacher, n)}"
        for n in COPIED_SIZES
        if getattr(student, n) != getattr(teacher, n)
    ]
    if student.max_position_embeddings > teacher.max_position_embeddings:
        differ.append(f"max_length {student.max_position_embeddings} vs {teacher.max_position_embeddings} positions")
    misfits = [f"student vs teacher sizes differ: {', '.join(differ)}"] if differ else []
    if functions := [
        f"{n} {getattr(student, n)} vs {getattr(teacher, n)}"
        for n in COPIED_FUNCTION
        if getattr(student, n) != getattr(teacher, n)
    ]:
        misfits.append(f"the copied layers would compute another function: {', '.join(functions)}")
    return misfits


def _check_vocabulary(student_rows: int, teacher_rows: int) -> None:
    """Refuse a student vocabulary (the teacher tokenizer's) that the teacher's embedding rows do not cover. More
    rows than tokens are fine: checkpoints pad their embeddings (DeBERTa-v3: 128,100 rows, 128,001 tokens), and
    the rows past the tokenizer's ids are never read."""
    if student_rows > teacher_rows:
        raise ValueError(f"vocab sizes differ: student {student_rows} vs teacher {teacher_rows} embedding rows")


def _check_fits(student: BertModel, teacher: BertModel) -> None:
    if misfits := teacher_misfits(student.config, teacher.config):
        raise ValueError(f"cannot copy teacher weights, {misfits[0]}")
    _check_vocabulary(student.config.vocab_size, teacher.config.vocab_size)


@torch.no_grad()
def init_from_teacher(student: nn.Module, teacher: PreTrainedModel) -> None:
    """Initialise `student` in place from a teacher's base model (`AutoModel`: a `BertModel` or a `GPT2Model`).

    Transformer: embeddings (the first max_length positions) and, by `distill.losses.layer_map`,
    student block i <- teacher block i * N_t // N_s (1-based; 0-based teacher 2i + 1 for half depth),
    the same pairs the hidden-state loss uses. Vocabulary, width, heads and FFN size must match.
    Any other student (BiLSTM, CNN): its word embedding `embed`, the teacher's reduced to embed_dim by PCA
    (`_teacher_embedding_basis`), the padding row zeroed. The teacher's embedding rows must cover the student's
    vocabulary (the first rows are taken); a Transformer student needs a BERT teacher.
    """
    teacher_words = teacher.get_input_embeddings().weight
    if isinstance(student, TransformerClassifier):
        if not isinstance(teacher, BertModel):
            raise TypeError(
                f"a transformer student copies a BERT teacher's layers, not a {type(teacher).__name__}'s: set "
                "init_from_teacher: false for it, or use a bert teacher"
            )
        _check_fits(student.bert, teacher)
        ours, theirs = student.bert.embeddings, teacher.embeddings
        ours.word_embeddings.weight.copy_(theirs.word_embeddings.weight[: student.bert.config.vocab_size])
        for name in ("token_type_embeddings", "LayerNorm"):
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())
        positions = ours.position_embeddings.weight
        positions.copy_(theirs.position_embeddings.weight[: positions.shape[0]])
        pairs = layer_map(student.bert.config.num_hidden_layers, teacher.config.num_hidden_layers)
        for s, t in pairs:
            student.bert.encoder.layer[s - 1].load_state_dict(teacher.encoder.layer[t - 1].state_dict())
        return
    if not _starts_from_teacher(student):
        raise TypeError(f"{type(student).__name__} has no `embed` word embedding (nn.Embedding) to start from")
    _check_vocabulary(student.embed.num_embeddings, teacher_words.shape[0])
    words = teacher_words[: student.embed.num_embeddings]  # rows past the tokenizer's ids are never read
    student.embed.weight.copy_(_teacher_embedding_basis(words, student.embed.embedding_dim))
    if student.embed.padding_idx is not None:
        student.embed.weight[student.embed.padding_idx].zero_()


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters())
