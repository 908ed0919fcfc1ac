"""Typed recipes: one YAML file per experiment, validated at load, overridable from the CLI.

`${NAME}` in a string value is replaced by the environment variable of that name, or by the setting's
default (see `common.settings`); a string value that then starts with `./` or `../` is a path relative to
the recipe's own folder. `extends:` starts from another recipe (see `_merge` for how the two combine).
Overrides use dotted keys: `--finetune.optim.lr=3e-5`; values are parsed as YAML scalars.
"""

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import ClassVar, Literal, get_args

import yaml
from edgedistill.common import settings
from edgedistill.common.manifest import sha256_file
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Settings added after runs of this version existed: left out of the dump (so of every stage's hash) while at
    # their default, so that a new setting nobody sets keeps those runs' artifacts current.
    hashed_when_set: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset_later_settings(self, handler):
        dumped = handler(self)
        for name in self.hashed_when_set:
            if getattr(self, name) == type(self).model_fields[name].default:
                dumped.pop(name, None)
        return dumped


class DataConfig(Strict):
    """Labelled task data: a local TSV/CSV/JSONL file or `hub:<dataset>[/<config>]:<split>`."""

    train: str
    dev: str
    test: str | None = Field(None, description="a labelled test split: evaluated once, on the kept checkpoints")
    text_column: str = "sentence"
    text_pair_column: str | None = None
    label_column: str = Field("label", description="the label's column: a name from label_names, or its index")
    label_names: list[str] = Field(
        min_length=2,
        description="the task's labels in index order (label 0 first); their number is the number of classes",
    )
    metric: Literal["accuracy", "macro_f1", "f1"] = Field(
        "accuracy",
        description="the dev metric that selects checkpoints: accuracy, macro_f1 (F1 averaged over the labels) or "
        "f1 (F1 of positive_label)",
    )
    positive_label: str | None = Field(
        None, description="the label whose F1 is reported as f1; default: the second label of a binary task"
    )
    symmetric_pairs: bool = Field(
        False,
        description="the label does not depend on the order of the two texts (paraphrase, similarity): every "
        "labelled train pair is also used the other way round",
    )
    train_limit: int | None = Field(None, gt=0)
    dev_limit: int | None = Field(None, gt=0)
    hashed_when_set = frozenset({"symmetric_pairs"})

    @model_validator(mode="before")
    @classmethod
    def _label_names_listed(cls, data):
        if not isinstance(data, dict):
            return data
        if "label_names" not in data:
            raise ValueError(
                "data.label_names is missing: list the task's label names in the recipe, in index order "
                "(label 0 first), e.g. label_names: [negative, positive]"
            )
        unquoted = [name for name in data["label_names"] or [] if not isinstance(name, str)]
        if unquoted:
            raise ValueError(
                f"data.label_names: {unquoted} are not names: YAML reads yes/no/true/false/on/off, null and bare "
                'numbers as other types; quote them, e.g. ["no", "yes"] or ["1", "2"]'
            )
        return data

    @model_validator(mode="after")
    def _labels_and_metric(self):
        repeated = sorted({name for name in self.label_names if self.label_names.count(name) > 1})
        if repeated:
            raise ValueError(f"data.label_names lists {repeated} more than once")
        if self.positive_label is not None and self.positive_label not in self.label_names:
            raise ValueError(
                f"data.positive_label={self.positive_label!r} is not one of data.label_names {self.label_names}"
            )
        if self.symmetric_pairs and self.text_pair_column is None:
            raise ValueError("data.symmetric_pairs needs data.text_pair_column: only pairs have an order to swap")
        if self.metric == "f1" and self.positive_index is None:
            raise ValueError(
                f"data.metric=f1 needs data.positive_label: a task of {self.num_labels} labels has no default "
                f"positive class; name one of {self.label_names}, or use metric: macro_f1"
            )
        return self

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def positive_index(self) -> int | None:
        """The class whose F1 is `f1`: `positive_label`, else the second of two labels; None for more labels."""
        if self.positive_label is not None:
            return self.label_names.index(self.positive_label)
        return 1 if self.num_labels == 2 else None

    @property
    def pairs(self) -> bool:
        """Whether every example is a sentence pair (`text_pair_column` set)."""
        return self.text_pair_column is not None


class ModelConfig(Strict):
    """The teacher: `init` is a local folder or a Hub name; `null` builds it from scratch."""

    family: Literal["bert", "gpt"] = "bert"
    init: str | None = None
    max_length: int = Field(128, ge=8)
    # Sizes for a model built from scratch (ignored when `init` is set).
    vocab_size: int = Field(8000, ge=100)
    hidden_size: int = Field(256, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1024, ge=8)
    dropout: float = Field(0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        return self


class OptimConfig(Strict):
    """AdamW with linear warm-up and decay; evaluation and checkpoint cadence in steps."""

    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, gt=0)
    batch_size: int = Field(
        32, ge=1, description="examples per optimizer step, whatever the number of processes (split among them)"
    )
    grad_accum: int = Field(
        1, ge=1, description="micro-batches per optimizer step and process, for models whose batch does not fit"
    )
    grad_clip: float = Field(1.0, gt=0)
    eval_every: int | None = Field(None, gt=0, description="also evaluate every N steps")
    checkpoint_every: int = Field(200, gt=0)
    patience: int | None = Field(None, gt=0, description="evaluations without improvement before stopping")
    layer_decay: float | None = Field(
        None, gt=0, le=1, description="learning rate x this factor per layer further from the head"
    )
    ema_decay: float | None = Field(
        None, gt=0, lt=1, description="evaluate and keep an exponential moving average of the weights"
    )
    seed: int = 13


class PretrainConfig(Strict):
    """Masked-LM (BERT) or causal-LM (GPT) pretraining, from scratch or continued from `model.init`."""

    train_files: list[str] = Field(min_length=1)
    eval_files: list[str] = Field(default_factory=list, description="empty: hold out the last train lines")
    eval_holdout_lines: int = Field(500, gt=0)
    train_max_lines: int | None = Field(None, gt=0)
    eval_max_lines: int | None = Field(None, gt=0)
    seq_len: int = Field(128, ge=8)
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    whole_word_mask: bool = False
    optim: OptimConfig = OptimConfig(lr=1e-4)


class FinetuneConfig(Strict):
    """Sequence classification on the labelled task; the best dev checkpoint is kept."""

    optim: OptimConfig = OptimConfig()
    classifier_dropout: float | None = Field(None, ge=0, lt=1)
    reinit_layers: int = Field(
        0, ge=0, description="top Transformer layers (and the pooler) initialised afresh instead of from the init"
    )
    pooling: Literal["cls", "mean"] = Field(
        "cls",
        description="what the classifier reads: `cls`, the family's own head (BERT's [CLS] pooler, GPT's last "
        "token); `mean`, the final states averaged over real tokens (bert only), as sentence-embedding "
        "checkpoints were trained",
    )
    hashed_when_set = frozenset({"reinit_layers", "pooling"})


class TransferConfig(Strict):
    """The transfer set: unlabelled sentences plus Tang et al. augmentations of the train inputs."""

    unlabelled_files: list[str] = Field(min_length=1)
    unlabelled_max_lines: int | None = Field(None, gt=0, description="raw lines (reviews) to read")
    max_unlabelled: int | None = Field(None, gt=0, description="sentences kept from the unlabelled text")
    include_train: bool = True
    n_iter: int = Field(20, ge=0, description="augmented samples drawn per train example")
    max_augmented: int | None = Field(None, gt=0)
    p_mask: float = Field(0.1, ge=0, le=1)
    p_replace: float = Field(0.1, ge=0, le=1)
    p_ngram: float = Field(0.25, ge=0, le=1)
    text_style: Literal["raw", "ptb_lower"] = Field(
        "raw",
        description="how every transfer-set text (unlabelled, train, augmented) is written: as given, or "
        "lower-cased and PTB-tokenised like SST-2",
    )
    max_length: int = Field(
        64, ge=8, description="tokens per example (both sides of a pair), for labelling and students"
    )
    shard_size: int = Field(50_000, gt=0)
    label_batch_size: int = Field(128, gt=0, description="sentences per labelling batch (length-sorted)")
    labeller: str | None = Field(
        None,
        description="on the CPU, label with this fp32 or INT8 teacher bundle in ONNX Runtime (built first by "
        "`edgedistill labeller`) instead of PyTorch; on a GPU, PyTorch labels",
    )
    relabel_margin: float | None = Field(
        None,
        gt=0,
        description="with an INT8 labeller (and only then): every text whose INT8 margin (the gap between its two "
        "highest logits) is below this is labelled again by the teacher in PyTorch, in the labelling precision",
    )
    precision_check_sentences: int = Field(
        5000,
        gt=0,
        description="labelled in bf16/fp16 or by an INT8 labeller, this many, evenly spaced over the whole set, are "
        "labelled again in fp32 and compared",
    )
    tie_margin: float = Field(
        0.1,
        ge=0,
        description="a checked text whose fp32 logits' top two are closer than this is a near-tie: a label that "
        "differs from fp32's there is counted (`fp32_tie_flips`) but does not count against min_agreement",
    )
    min_agreement: float = Field(
        0.999,
        gt=0,
        le=1,
        description="labels made by an INT8 labeller (always) or in bf16/fp16 (with runtime.precision auto; an "
        "explicit one keeps its labels, with a warning) that agree with fp32 on fewer of the checked sentences than "
        "this, near-ties aside, are made again in fp32",
    )
    seed: int = 13

    @model_validator(mode="after")
    def _probabilities(self):
        if self.p_mask + self.p_replace > 1:
            raise ValueError(f"transfer.p_mask + transfer.p_replace = {self.p_mask + self.p_replace} exceeds 1")
        return self


# What the student stage sets on a student's config from the data and the teacher, whatever a recipe says.
STUDENT_FROM_DATA = frozenset({"vocab_size", "num_labels", "pad_token_id", "max_length", "pairs"})


class StudentConfig(Strict):
    """Architecture and sizes of a student; fields an architecture does not use are ignored by it."""

    arch: Literal["bilstm", "cnn", "transformer"]
    vocab_size: int | None = Field(None, gt=0, description="set from the teacher's tokenizer")
    num_labels: int = Field(2, ge=2, description="classes (set from the data)")
    embed_dim: int = Field(300, gt=0, description="word vectors of bilstm/cnn; the transformer uses hidden_size")
    hidden_size: int = Field(300, gt=0, description="LSTM units per direction / transformer width")
    num_layers: int = Field(1, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(1200, gt=0)
    kernel_sizes: list[int] = Field(default_factory=lambda: [3, 4, 5], min_length=1)
    num_filters: int = Field(100, gt=0)
    dropout: float = Field(0.1, ge=0, lt=1)
    pooling: Literal["max", "mean", "last"] = "max"
    pairs: bool = Field(False, description="set from the data: takes sentence pairs (token_type_ids mark sentence B)")
    max_length: int = Field(128, gt=0, description="tokens per text (set from transfer.max_length)")
    pad_token_id: int = Field(0, ge=0, description="the padding token (set from the teacher's tokenizer)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.arch == "transformer" and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.arch == "bilstm" and self.num_layers != 1:
            # Padding invariance without packed sequences (see BiLSTMClassifier) holds for one layer only.
            raise ValueError(f"bilstm supports num_layers=1, got {self.num_layers}")
        if any(k < 1 for k in self.kernel_sizes):
            raise ValueError(f"kernel_sizes must be positive, got {self.kernel_sizes}")
        if self.vocab_size is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside vocab_size={self.vocab_size}")
        return self


class LossWeights(Strict):
    """Weights of the distillation terms: a weight of 0 skips the term (see `distill.losses`)."""

    kd: float = Field(0.0, ge=0, description="soft-target KL at the temperature, times T^2 (Hinton)")
    mse: float = Field(1.0, ge=0, description="logit MSE (Tang et al.)")
    ce: float = Field(0.0, ge=0, description="hard-label cross-entropy where a label exists")
    hidden: float = Field(0.0, ge=0, description="hidden-state MSE (transformer students)")
    attention: float = Field(0.0, ge=0, description="attention KL (transformer students)")


class StudentRun(Strict):
    """One student: its architecture, optimizer and losses; the baseline reuses all but the losses."""

    model: StudentConfig
    optim: OptimConfig = OptimConfig(lr=1e-3, batch_size=64)
    losses: LossWeights = LossWeights()
    temperature: float = Field(2.0, gt=0)
    init_from_teacher: bool = Field(True, description="teacher embeddings (and layers, for a transformer)")
    baseline_init_from_teacher: bool = Field(
        False, description="start the label-only baseline from the teacher too (off: it sees nothing of the teacher)"
    )


class DistillConfig(Strict):
    students: dict[str, StudentRun] = Field(min_length=1)
    deploy: str = Field(description="the student that is exported and served by default")

    @model_validator(mode="after")
    def _deploy_known(self):
        if self.deploy not in self.students:
            raise ValueError(f"distill.deploy={self.deploy!r} is not one of distill.students {sorted(self.students)}")
        return self


class BundleRecipe(Strict):
    """How one bundle is built: from the teacher or a student, at a precision, for a runtime."""

    source: str = Field(description="`teacher` or a name in distill.students")
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    fused: bool = Field(True, description="fuse attention/LayerNorm/GELU kernels (Transformer graphs)")
    attention: Literal["Attention", "MultiHeadAttention"] = Field(
        "Attention",
        description="the fused attention operator: `Attention` takes the Q/K/V projections inside it (in fp32); "
        "`MultiHeadAttention` leaves them as MatMuls, so INT8 quantizes them too",
    )
    skip_layer_norm: bool = Field(
        True,
        description="fuse residual Add + LayerNormalization into SkipLayerNormalization; false keeps the two "
        "(ONNX Runtime's CPU SkipLayerNormalization kernel is the slower of the two on some builds)",
    )
    fold: bool = Field(
        False,
        description="CNN students: fold the convolutions into the embedding table, so a window is a sum of looked-up "
        "rows instead of matrix products (several times faster, about ten times the size on disk and in memory)",
    )
    quantization: Literal["dynamic", "static"] = "dynamic"
    per_channel: bool = Field(False, description="INT8 weight scales per output channel instead of per tensor")
    int8_ops: list[str] | None = Field(
        None, description="dynamic INT8: operator types to quantize, e.g. [MatMul] (default: all ONNX Runtime can)"
    )
    smooth: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="dynamic INT8 of a fused Transformer: move this share (SmoothQuant's alpha) of each MatMul input's "
        "per-channel range into its weights first, calibrated on the first export.calibration_sentences train "
        "examples (docs/export.md)",
    )
    runtime: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"], min_length=1)

    @model_validator(mode="after")
    def _smoothing_is_for_dynamic_int8(self):
        if self.smooth is not None and not (
            self.precision == "int8" and self.quantization == "dynamic" and self.runtime == "onnxruntime" and self.fused
        ):
            raise ValueError(
                "smooth applies to dynamic INT8 of a fused graph in ONNX Runtime: it needs precision: int8, "
                "quantization: dynamic, runtime: onnxruntime and fused: true"
            )
        return self

    @model_validator(mode="after")
    def _fusion_choices_need_fusion(self):
        if self.attention != "Attention" and not self.fused:
            raise ValueError(f"attention={self.attention} names a fused operator: it needs fused: true")
        if not self.skip_layer_norm and not self.fused:
            raise ValueError("skip_layer_norm: false is a fusion choice: it needs fused: true")
        return self


class CascadeRecipe(Strict):
    """A confidence cascade: the first member answers the texts it is sure of, the rest go on to the next."""

    members: list[str] = Field(min_length=2, description="bundles of export.bundles, cheapest first")
    rule: Literal["max_prob", "margin", "entropy"] = Field(
        "max_prob",
        description="a member keeps a text when its top-class probability (max_prob), the gap between its two most "
        "likely classes (margin), or minus the entropy of its probabilities (entropy) reaches its threshold",
    )
    target_agreement: float = Field(
        0.99, gt=0, le=1, description="thresholds are the lowest whose answers agree this often with the last member's"
    )
    calibration_sentences: int = Field(
        20_000,
        ge=100,
        description="unlabelled texts the transfer set did not read, labelled by the last member, that choose the "
        "thresholds (neither dev nor test)",
    )
    temperature_scaling: bool = Field(True, description="fit each member's softmax temperature on the same texts")


class ExportConfig(Strict):
    opset: int = Field(17, ge=14)
    bundles: dict[str, BundleRecipe] = Field(min_length=1)
    cascades: dict[str, CascadeRecipe] = Field(
        {}, description="confidence cascades of the bundles above, served under one name like any bundle"
    )
    deploy: str = Field(description="the bundle (or cascade) `make serve` serves by default")
    min_agreement: float = Field(
        0.999, gt=0, le=1, description="fp32 gate: share of dev predictions equal to PyTorch's"
    )
    min_fp16_agreement: float = Field(
        0.995,
        gt=0,
        le=1,
        description="fp16 gate: the same share; half precision moves logits by about 1e-3, which flips the "
        "odd sentence the teacher is unsure of",
    )
    max_int8_drop: float = Field(0.005, ge=0, description="int8 gate: dev accuracy lost against PyTorch")
    calibration_sentences: int = Field(
        256, gt=0, description="calibration sentences: transfer-set ones for static INT8, train ones for `smooth`"
    )

    @model_validator(mode="after")
    def _deploy_known(self):
        if self.deploy not in self.bundles and self.deploy not in self.cascades:
            raise ValueError(
                f"export.deploy={self.deploy!r} is not one of export.bundles {sorted(self.bundles)} or export.cascades "
                f"{sorted(self.cascades)}"
            )
        return self

    @model_validator(mode="after")
    def _cascades_of_known_bundles(self):
        for name, cascade in self.cascades.items():
            if name in self.bundles:
                raise ValueError(f"export.cascades.{name}: a bundle has that name too")
            if unknown := [m for m in cascade.members if m not in self.bundles]:
                raise ValueError(f"export.cascades.{name}.members: {unknown} are not in export.bundles")
            if len(set(cascade.members)) != len(cascade.members):
                raise ValueError(f"export.cascades.{name}.members: a bundle is listed twice")
        return self


Scenario = Literal["single", "batch", "stream", "kserve"]
Profile = Literal["smoke", "steady", "step", "spike", "soak"]


class SloConfig(Strict):
    """What a load-test run (or, for `step`, each step) must meet; a null threshold is not checked.

    Latencies are those of successful calls as the load generator saw them, in ms.
    """

    p50_ms: float | None = Field(None, gt=0, description="median call latency")
    p95_ms: float | None = Field(None, gt=0, description="95th percentile call latency")
    p99_ms: float | None = Field(None, gt=0, description="99th percentile call latency")
    max_error_rate: float = Field(0.0, ge=0, le=1, description="failed calls / all calls")
    min_rate_share: float | None = Field(
        0.95,
        gt=0,
        le=1,
        description="achieved calls/s / offered calls/s: a server (or load generator) that falls behind fails",
    )


class LoadProfile(Strict):
    """What every load profile sets: the scenario mix and the SLO."""

    scenarios: dict[Scenario, int] = Field(
        default_factory=lambda: {"single": 1}, min_length=1, description="scenario -> weight (locust task weight)"
    )
    slo: SloConfig = SloConfig()

    @model_validator(mode="after")
    def _weights(self):
        if any(w < 0 for w in self.scenarios.values()) or not sum(self.scenarios.values()):
            raise ValueError(f"scenario weights must be >= 0 with at least one > 0, got {self.scenarios}")
        return self


class ConstantLoad(LoadProfile):
    """`users` users for `duration_s`, each paced so that together they offer `rate` calls/s."""

    users: int = Field(10, ge=1)
    rate: float = Field(200.0, gt=0, description="calls/s offered by all users together")
    duration_s: float = Field(60.0, gt=0)

    @property
    def user_rate(self) -> float:
        return self.rate / self.users


class SoakLoad(ConstantLoad):
    """A long constant load; the server's memory growth is measured and may be gated."""

    max_rss_growth_mb_per_10k: float | None = Field(
        None, gt=0, description="server RSS slope over the second half of the run, MB per 10,000 calls"
    )


class StepLoad(LoadProfile):
    """`users`, then `step_users` more every `step_s`, `steps` steps, each user paced at `user_rate` calls/s.

    Capacity: the highest achieved calls/s of a step that met the SLO.
    """

    users: int = Field(10, ge=1, description="users in the first step")
    step_users: int = Field(10, ge=1)
    steps: int = Field(10, ge=1)
    step_s: float = Field(10.0, gt=0)
    settle_s: float = Field(2.0, ge=0, description="seconds at the start of each step left out of its figures")
    user_rate: float = Field(20.0, gt=0, description="calls/s per user")
    min_capacity_rps: float | None = Field(None, gt=0, description="fail the run when capacity is below this")

    @model_validator(mode="after")
    def _settles_within_step(self):
        if self.settle_s >= self.step_s:
            raise ValueError(f"settle_s={self.settle_s} leaves nothing of step_s={self.step_s}")
        return self


class SpikeLoad(LoadProfile):
    """`users` for `before_s`, `spike_users` for `spike_s`, `users` again for `after_s`; `user_rate` calls/s each."""

    users: int = Field(10, ge=1)
    spike_users: int = Field(50, ge=1)
    user_rate: float = Field(20.0, gt=0, description="calls/s per user")
    before_s: float = Field(20.0, gt=0)
    spike_s: float = Field(10.0, gt=0)
    after_s: float = Field(20.0, gt=0)

    @model_validator(mode="after")
    def _spikes(self):
        if self.spike_users <= self.users:
            raise ValueError(f"spike_users={self.spike_users} must exceed users={self.users}")
        return self


class ModelBenchConfig(Strict):
    """The model benchmark (`python -m bench models`): every bundle beside the teacher in PyTorch eager."""

    batch_sizes: list[int] = Field(default_factory=lambda: [1, 32], min_length=1)
    seq_lens: list[int] = Field(default_factory=lambda: [32, 64, 128], min_length=1)
    warmup: int = Field(10, ge=0)
    iterations: int = Field(100, gt=0)
    min_seconds: float = Field(1.0, ge=0, description="keep timing until this much time has passed")
    threads: int = Field(2, gt=0, description="intra-op threads for PyTorch and ONNX Runtime alike")


class ServingBenchConfig(Strict):
    """The serving benchmark (`python -m bench serving`): how long each phase runs, and its targets.

    A null target is not checked.
    """

    rate: float = Field(200.0, gt=0, description="calls/s of the paced phases")
    duration_s: float = Field(20.0, gt=0, description="seconds per phase and repeat")
    concurrency: int = Field(12, ge=1, description="calls in flight in the capacity phases")
    threads: int = Field(1, ge=0, description="intra-op threads of the servers and the raw backend (0: the default)")
    repeats: int = Field(3, ge=1, description="repeats of every phase, interleaved; figures are their medians")
    paced_slo: SloConfig = Field(SloConfig(), description="what the server must meet when paced at `rate`")
    min_capacity_vs_echo: float | None = Field(
        None, gt=0, description="capacity target: the server's single-text calls/s / the echo server's"
    )
    min_batched_vs_raw: float | None = Field(
        None, gt=0, description="batched target: texts/s of batch-32 calls through the server / the raw backend's"
    )


class PeersBenchConfig(Strict):
    """The peer comparison (`python -m bench peers`): the server against the Python servers a user would pick
    instead, on one bundle, driven by h2load. A null target is not checked."""

    peers: list[Literal["kserve", "mlserver"]] = Field(
        ["kserve", "mlserver"], min_length=1, description="the peers, each from its own environment"
    )
    rate: float = Field(200.0, gt=0, description="calls/s of the paced phase")
    duration_s: float = Field(10.0, gt=0, description="seconds per phase, server and repeat")
    warmup_s: float = Field(3.0, ge=0, description="seconds of unrecorded load on each server before the first repeat")
    connections: int = Field(
        16, ge=1, description="HTTP/2 connections at saturation (several, so worker processes share them)"
    )
    streams: int = Field(2, ge=1, description="calls in flight per connection at most (all of them at saturation)")
    paced_connections: int = Field(
        4,
        ge=1,
        description="connections of the paced phase, each from its own h2load process started 1/rate s after the "
        "last, so that their calls interleave",
    )
    threads: int = Field(1, ge=1, description="intra-op threads of every server's model")
    workers: int = Field(
        0,
        ge=0,
        description="processes per server where it has that setting: the server's WORKERS and MLServer's "
        "parallel_workers (KServe's ModelServer answers gRPC from one process whatever its workers); 0: one per core",
    )
    repeats: int = Field(3, ge=1, description="repeats, the servers interleaved; figures are their medians")
    min_capacity_vs_best_peer: float | None = Field(
        None, gt=0, description="the server's calls/s at saturation / the best peer's"
    )
    max_p99_vs_best_peer: float | None = Field(
        None, gt=0, description="the server's p99 when paced at `rate` / the best peer's (the lowest)"
    )


class ScalingBenchConfig(Strict):
    """The server's scaling with its worker processes (`python -m bench scaling`): one bundle served with each
    count of `workers` in turn, driven by h2load. A null target is not checked."""

    workers: list[int] = Field(
        [1, 2, 0],
        min_length=2,
        description="worker counts, the first the reference the others are compared with; 0: the server's default, "
        "one per core as memory allows",
    )
    rate: float = Field(200.0, gt=0, description="calls/s of the paced phase")
    duration_s: float = Field(10.0, gt=0, description="seconds per phase, count and repeat")
    warmup_s: float = Field(3.0, ge=0, description="seconds of unrecorded load on each count before its first repeat")
    connections_per_worker: int = Field(
        4, ge=1, description="HTTP/2 connections per worker at saturation, so that the kernel spreads them over all"
    )
    streams: int = Field(2, ge=1, description="calls in flight per connection at saturation")
    paced_connections: int = Field(
        4,
        ge=1,
        description="connections of the paced phase, the same for every count, each from its own h2load process "
        "started 1/rate s after the last, so that their calls interleave (over one, a single worker would get every "
        "call)",
    )
    client_threads: int = Field(1, ge=1, description="h2load's threads (more where one cannot keep the workers busy)")
    threads: int = Field(1, ge=1, description="intra-op threads of each worker's model")
    repeats: int = Field(3, ge=1, description="repeats, the counts interleaved; figures are their medians")
    min_capacity_vs_first: float | None = Field(
        None, gt=0, description="calls/s at saturation with the most workers / with the first count"
    )
    max_p99_vs_first: float | None = Field(
        None, gt=0, description="each other count's p99 paced at `rate` / the first count's"
    )


class BenchConfig(Strict):
    """Measurements of the built bundles: `models` for the model benchmark, `serving` for the serving one,
    `peers` for the comparison with other servers, `scaling` for the server's worker processes."""

    models: ModelBenchConfig = ModelBenchConfig()
    serving: ServingBenchConfig = ServingBenchConfig()
    peers: PeersBenchConfig = PeersBenchConfig()
    scaling: ScalingBenchConfig = ScalingBenchConfig()


# Each profile starts from its preset; a recipe's keys replace the preset's (one level: `slo` as a whole).
LOAD_PRESETS: dict[str, dict] = {
    "smoke": {"users": 2, "rate": 20.0, "duration_s": 30.0, "scenarios": dict.fromkeys(get_args(Scenario), 1)},
    "steady": {},
    "step": {},
    "spike": {},
    "soak": {"duration_s": 600.0},
}


class LoadtestConfig(Strict):
    """Locust load tests of a served bundle (`python -m loadtests RECIPE --profile NAME`), one field per profile."""

    batch_size: int = Field(8, ge=1, description="texts per call in the `batch` scenario")
    stream_messages: int = Field(8, ge=1, description="requests (one text each) per `ClassifyStream` call")
    timeout_s: float = Field(10.0, gt=0, description="deadline per call")
    threads: int = Field(1, ge=0, description="the server's intra-op threads (0: the runtime's default)")
    smoke: ConstantLoad = Field(description="short, every scenario, low rate: does everything answer?")
    steady: ConstantLoad = Field(description="a fixed rate for a while: the latency SLO")
    step: StepLoad = Field(description="rising load: the capacity within the SLO")
    spike: SpikeLoad = Field(description="a sudden burst and the recovery after it")
    soak: SoakLoad = Field(description="a fixed rate for long: memory growth")

    @model_validator(mode="before")
    @classmethod
    def _presets(cls, data):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, preset in LOAD_PRESETS.items():
            value = data.get(name)
            data[name] = value if isinstance(value, BaseModel) else preset | (value or {})
        return data

    def profile(self, name: Profile) -> ConstantLoad | StepLoad | SpikeLoad:
        return getattr(self, name)


class RuntimeConfig(Strict):
    """Where training and labelling run: an execution choice, recorded in each manifest, not part of any hash."""

    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="auto (CUDA when PyTorch sees a GPU, else the CPU), cpu, cuda, or cuda:N",
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="auto: bf16 on a GPU that has it, else fp16 with a loss scaler; fp32 on the CPU, except "
        "labelling on a CPU with native bf16 (AVX512-BF16 or AMX)",
    )


UNHASHED = ("runtime", "bench", "loadtest", "tracking")  # sections that change no artifact of another stage


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    data: DataConfig
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig | None = None
    finetune: FinetuneConfig = FinetuneConfig()
    transfer: TransferConfig | None = None
    distill: DistillConfig | None = None
    export: ExportConfig | None = None
    bench: BenchConfig = BenchConfig()
    loadtest: LoadtestConfig | None = None
    runtime: RuntimeConfig = RuntimeConfig()
    tracking: Literal["none", "tensorboard", "mlflow"] = Field(
        "none",
        description="experiment tracking into runs/<recipe>/tracking/ (common.tracking): none, tensorboard, mlflow",
    )

    @model_validator(mode="after")
    def _bundle_sources_known(self):
        if self.export is not None:
            students = set(self.distill.students) if self.distill else set()
            for bundle_id, bundle in self.export.bundles.items():
                if bundle.source != "teacher" and bundle.source not in students:
                    raise ValueError(
                        f"export.bundles.{bundle_id}.source={bundle.source!r} is neither teacher nor one of "
                        f"distill.students {sorted(students)}: drop the bundle too (export.bundles.{bundle_id}: null)"
                    )
                if bundle.fold and (
                    bundle.source == "teacher" or self.distill.students[bundle.source].model.arch != "cnn"
                ):
                    raise ValueError(f"export.bundles.{bundle_id}.fold: true needs a CNN student as its source")
        return self

    @model_validator(mode="after")
    def _labeller_is_a_cpu_teacher_bundle(self):
        name = self.transfer.labeller if self.transfer else None
        margin = self.transfer.relabel_margin if self.transfer else None
        if name is None:
            if margin is not None:
                raise ValueError(
                    "transfer.relabel_margin is set but transfer.labeller is not: it applies to an INT8 labeller"
                )
            return self
        bundle = self.export.bundles.get(name) if self.export else None
        if bundle is None:
            raise ValueError(f"transfer.labeller={name!r} is not one of export.bundles")
        if (bundle.source, bundle.runtime) != ("teacher", "onnxruntime") or bundle.precision not in ("fp32", "int8"):
            raise ValueError(
                f"transfer.labeller={name!r} must be an fp32 or INT8 ONNX Runtime bundle of the teacher, got source="
                f"{bundle.source}, precision={bundle.precision}, runtime={bundle.runtime}"
            )
        if bundle.precision == "int8" and margin is None:
            raise ValueError(
                f"transfer.labeller={name!r} is an INT8 bundle: set transfer.relabel_margin (e.g. 1.0), below which its "
                "labels are made again in PyTorch, since INT8 alone disagrees with the teacher on about 1 % of texts"
            )
        if bundle.precision == "fp32" and margin is not None:
            raise ValueError(
                f"transfer.relabel_margin applies to an INT8 labeller; transfer.labeller={name!r} is fp32 (drop the margin)"
            )
        return self

    @model_validator(mode="after")
    def _pairs_need_segments(self):
        if self.data.pairs and self.model.family == "gpt":
            raise ValueError(
                "data.text_pair_column is set but model.family is gpt: sentence pairs need a tokenizer that marks "
                "sentence B (token_type_ids), which the bert family has; use a bert teacher for pair tasks"
            )
        return self

    @model_validator(mode="after")
    def _students_leave_what_the_data_sets(self):
        for name, run in (self.distill.students if self.distill else {}).items():
            if given := sorted(run.model.model_fields_set & STUDENT_FROM_DATA):
                raise ValueError(
                    f"distill.students.{name}.model sets {given}: the stage sets these from the data and the teacher "
                    "(data.label_names, data.text_pair_column, transfer.max_length, the teacher's tokenizer); "
                    "remove them"
                )
        return self

    @model_validator(mode="after")
    def _transformer_students_copy_a_bert(self):
        if self.model.family != "bert" and self.distill is not None:
            for name, run in self.distill.students.items():
                if run.model.arch == "transformer" and (run.init_from_teacher or run.baseline_init_from_teacher):
                    raise ValueError(
                        f"distill.students.{name} is a transformer that starts from the teacher's layers, but "
                        f"model.family is {self.model.family}: it copies a BERT's blocks; set "
                        f"distill.students.{name}.init_from_teacher: false (and baseline_init_from_teacher: false)"
                    )
        return self

    @model_validator(mode="after")
    def _mean_pooling_needs_bert(self):
        if self.finetune.pooling == "mean" and self.model.family != "bert":
            raise ValueError(
                f"finetune.pooling=mean needs a bert teacher (model.family is {self.model.family}): a causal model's "
                "last token is the one that has read the whole text"
            )
        return self

    @model_validator(mode="after")
    def _scratch_needs_pretrain(self):
        if self.model.init is None and self.pretrain is None:
            raise ValueError("model.init is null (build from scratch) but there is no `pretrain` section")
        return self

    def settings(self, *keys: str) -> dict:
        """The named settings (sections or dotted keys, e.g. `export.bundles.int8`) as JSON, for a stage's hash.

        Local files and folders named in them count by their contents, not their paths: moving the
        data or the checkout keeps artifacts current, and editing a data file makes them stale.
        """
        dumped = self.model_dump(mode="json")
        out = {}
        for key in keys:
            value = dumped
            for part in key.split("."):
                value = value[part] if isinstance(value, dict) and part in value else None
            out[key] = by_content(value)
        return out

    def section_hash(self, *sections: str) -> str:
        """A short hash of `settings(*sections)`."""
        return hashlib.sha256(json.dumps(self.settings(*sections), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def hash(self) -> str:
        """Hash of the sections that shape artifacts; `bench` and `loadtest` only measure them, so they are left out."""
        return self.section_hash(*(name for name in type(self).model_fields if name not in UNHASHED))


def by_content(value):
    """`value` (JSON) with every string naming an existing local file or folder replaced by its digest."""
    if isinstance(value, dict):
        return {key: by_content(item) for key, item in value.items()}
    if isinstance(value, list):
        return [by_content(item) for item in value]
    if isinstance(value, str) and "/" in value and (path := Path(value)).exists():
        return f"sha256:{_digest(path)}"
    return value


def _digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's file names and their digests (recursively)."""
    if path.is_file():
        stat = path.stat()
        return _file_digest(path.resolve(), stat.st_size, stat.st_mtime_ns)
    files = sorted(item for item in path.rglob("*") if item.is_file())
    listing = [(item.relative_to(path).as_posix(), _digest(item)) for item in files]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


@functools.lru_cache(maxsize=256)
def _file_digest(path: Path, size: int, mtime_ns: int) -> str:  # size and mtime: a changed file is read again
    return sha256_file(path)


class RecipeError(ValueError):
    """A recipe that cannot be used, with the file and key that are wrong."""


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
LOCAL = ("./", "../")  # a string value starting with these is a path relative to its recipe's folder


class _Replace(dict):
    """A mapping tagged `!replace`: it takes the place of the base recipe's mapping instead of merging into it."""


class _Loader(yaml.SafeLoader):
    """Safe YAML plus the `!replace` tag."""


def _replace_tag(loader: _Loader, node: yaml.Node) -> _Replace:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(
            None, None, "!replace marks a mapping (a section, a student, a bundle)", node.start_mark
        )
    return _Replace(loader.construct_mapping(node, deep=True))


_Loader.add_constructor("!replace", _replace_tag)


def _localize(value, variables: dict[str, str], folder: Path | None, where: str):
    """`${NAME}` replaced in every string; then, with a `folder`, strings starting ./ or ../ made absolute from it."""
    if isinstance(value, dict):
        return type(value)(
            {k: _localize(v, variables, folder, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        )
    if isinstance(value, list):
        return [_localize(v, variables, folder, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(match):
        if match.group(1) not in variables:
            raise RecipeError(
                f"{where}: unknown setting ${{{match.group(1)}}}: no environment variable of that name is set "
                f"(settings with a default: {', '.join(sorted(settings.defaults()))})"
            )
        return variables[match.group(1)]

    value = _VAR.sub(sub, value)
    return str((folder / value).resolve()) if folder is not None and value.startswith(LOCAL) else value


def apply_override(raw: dict, dotted: str, value) -> None:
    """Set `raw[a][b][c] = value` for `dotted = "a.b.c"`, creating sections as needed."""
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise RecipeError(f"override {dotted}: {key} is not a section")
        node = child
    node[leaf] = value


def parse_overrides(args: list[str]) -> dict[str, object]:
    """`["--a.b=1", "--c=x"]` -> `{"a.b": 1, "c": "x"}`; values are YAML scalars."""
    out = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise RecipeError(f"override {arg!r} must look like --section.key=value")
        key, _, value = arg[2:].partition("=")
        out[key] = yaml.safe_load(value) if value else None
    return out


def _merge(base: dict, top: dict, where: str = "") -> dict:
    """`top` over `base`: mappings merge key by key, except those tagged `!replace`, which take the base's place,
    as lists and scalars do; `key: null` removes a key whose base value is a mapping, and sets any other to null.
    In a mapping of named mappings (students, bundles), `key: null` for a name the base lacks is an error: it drops
    nothing, so it is a misspelt or stale name."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if value is None and isinstance(below, dict):
            del out[key]
        elif value is None and key not in out and where and out and all(isinstance(v, dict) for v in out.values()):
            raise RecipeError(f"{where}.{key}: null drops nothing: the base recipe has no {key!r} ({sorted(out)})")
        elif isinstance(value, dict) and isinstance(below, dict) and not isinstance(value, _Replace):
            out[key] = _merge(below, value, f"{where}.{key}" if where else str(key))
        else:
            out[key] = value
    return out


def _base_path(path: Path, name) -> Path:
    """The file `extends: name` in `path` means: a path (absolute, or relative to `path`'s folder) or, for a bare
    name, the recipe of that name in recipes/."""
    if not isinstance(name, str) or not name:
        raise RecipeError(f"{path}: extends must name a recipe (a path, or a name in recipes/), got {name!r}")
    is_path = "/" in name or name.endswith((".yaml", ".yml"))
    base = path.parent / name if is_path else settings.recipes_dir() / f"{name}.yaml"
    if not base.is_file():
        raise RecipeError(
            f"{path}: extends {name}, which does not exist ({base}); extends takes a path relative to the recipe, "
            "an absolute path, or the name of a recipe in recipes/ of the working directory (extends: sst2)"
        )
    return base


def _read(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """One recipe file, localized (see `_localize`), over the recipe it `extends` (read the same way)."""
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise RecipeError(f"{path}: extends itself: {cycle}")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: the top level must be a mapping of sections")
    try:
        raw = _localize(raw, settings.variables(), path.parent.resolve(), "")
    except RecipeError as err:
        raise RecipeError(f"{path}: {err}") from None
    base_name = raw.pop("extends", None)
    if base_name is None:
        return raw
    base = _read(_base_path(path, base_name), (*chain, path.resolve()))
    base.pop("name", None)
    return _merge(base, raw)


def load_recipe(path: str | Path, overrides: dict[str, object] | None = None) -> Recipe:
    """Read, expand and validate a recipe; errors name the file and the offending key."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe {path} does not exist (recipes live in recipes/, e.g. recipes/sst2.yaml)")
    raw = _read(path)
    raw.setdefault("name", path.stem)
    for variable, key in settings.ENV_OVERRIDES.items():
        if os.environ.get(variable):
            apply_override(raw, key, os.environ[variable])
    variables = settings.variables()
    for key, value in (overrides or {}).items():
        apply_override(raw, key, _localize(value, variables, None, f"override --{key}"))
    try:
        return Recipe.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<recipe>'}: {e['msg']}" for e in err.errors())
        raise RecipeError(f"{path}: {problems}") from None


def run_dir(recipe: Recipe) -> Path:
    """`runs/<recipe>/`, the folder every stage of this recipe writes into."""
    return Path(settings.defaults()["EDGEDISTILL_RUNS_DIR"]) / recipe.name
