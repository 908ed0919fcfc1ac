"""The recipe sections of export: how each bundle is built and gated, and the confidence cascades of bundles."""

from typing import Literal

from edgedistill.common.cascade import Rule, rules_described
from edgedistill.common.config.strict import Name, Strict
from edgedistill.common.names import did_you_mean
from edgedistill.common.providers import known_providers
from pydantic import Field, field_validator, model_validator

# Every TensorRT engine's batch profile (min, opt, max); INT8 calibrates at the opt batch.
ENGINE_BATCH = (1, 8, 64)
# The sequence length TensorRT tunes for, where the model takes longer ones.
ENGINE_OPT_SEQUENCE = 64
# Dynamic INT8's settings, and every setting an engine (runtime: tensorrt) would not apply.
DYNAMIC_INT8 = frozenset({"per_channel", "int8_ops"})
ONNXRUNTIME_ONLY = frozenset({"fused", "attention", "skip_layer_norm", "quantization", "providers", *DYNAMIC_INT8})
# How a fused graph is fused: they change nothing where ONNX Runtime's BERT fusions do not take the source's graph.
FUSION_CHOICES = ("attention", "skip_layer_norm")
# Each precision's agreement gate: its key under the recipe's `export` section.
AGREEMENT_KEYS = {"fp32": "min_agreement", "fp16": "min_fp16_agreement", "int8": "min_int8_agreement"}
# The operator types ONNX Runtime's dynamic INT8 quantizes (`onnxruntime.quantization.registry.IntegerOpsRegistry`,
# which a test keeps this equal to): it skips any other `int8_ops` names without a word.
DYNAMIC_INT8_OPS = ("Attention", "Conv", "EmbedLayerNormalization", "Gather", "LSTM", "MatMul", "Transpose")
# Those whose weights dynamic INT8 scales per output channel where `per_channel` says so.
PER_CHANNEL_OPS = ("Attention", "LSTM", "MatMul")


class BundleRecipe(Strict):
    """How one bundle is built: from the teacher or a student, at a precision, for a runtime."""

    source: str = Field(description="`teacher` or a name in distill.students")
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    fused: bool = Field(
        True,
        description="fuse attention/LayerNorm/GELU kernels (BERT-style Transformer graphs); a teacher whose model type "
        "ONNX Runtime fuses only in part is refused with it before training (docs/export.md#fusion-by-model-type)",
    )
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
    per_channel: bool = Field(
        False,
        description="dynamic INT8: weight scales per output channel instead of per tensor, for MatMul, Attention and "
        "LSTM weights (ONNX Runtime's dynamic Conv takes one scale per tensor, and it quantizes a Gather's or "
        "EmbedLayerNormalization's table as an activation, one uint8 scale, whatever this says); static INT8 always "
        "has them",
    )
    int8_ops: list[str] | None = Field(
        None,
        description="dynamic INT8: operator types to quantize, e.g. [MatMul] (default: all ONNX Runtime can; an empty "
        "list is refused)",
    )
    smooth: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="dynamic INT8 of a fused Transformer: move this share (SmoothQuant's alpha) of each MatMul input's "
        "per-channel range into its weights first, calibrated on the first export.smooth_sentences train examples "
        "(docs/export.md); a gpt teacher's bundle is refused with it (its projections are Gemms)",
    )
    runtime: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"], min_length=1)

    @property
    def calibrated_on_transfer_set(self) -> bool:
        """Static INT8 and TensorRT INT8 take their activation ranges from transfer-set sentences."""
        return self.precision == "int8" and (self.quantization == "static" or self.runtime == "tensorrt")

    def unapplied_fusion_choices(self, bundle_id: str, graph: str) -> str | None:
        """Why bundle `bundle_id`'s `FUSION_CHOICES` would change nothing, naming each it sets, for a source whose
        `graph` ONNX Runtime's BERT fusions do not take; None where it sets none."""
        given = ", ".join(f"export.bundles.{bundle_id}.{key}" for key in FUSION_CHOICES if key in self.model_fields_set)
        if not given:
            return None
        return (
            f"{given} would not apply: they choose how ONNX Runtime's BERT fusions fuse a graph, and those fusions do "
            f"not take {graph}, which ships unfused (remove {given})"
        )

    @field_validator("int8_ops")
    @classmethod
    def _int8_ops_quantizable(cls, ops: list[str] | None) -> list[str] | None:
        if ops == []:  # ONNX Runtime reads an empty list as every type it quantizes
            raise ValueError(
                f"int8_ops is empty, which ONNX Runtime reads as every type it quantizes: name the types "
                f"({', '.join(DYNAMIC_INT8_OPS)}), or leave int8_ops out for its default"
            )
        if twice := sorted({op for op in ops or () if ops.count(op) > 1}):
            raise ValueError(f"int8_ops names {twice} more than once: name each operator type once")
        for op in [op for op in ops or () if op not in DYNAMIC_INT8_OPS]:
            raise ValueError(
                f"{op!r} is no operator type ONNX Runtime's dynamic INT8 quantizes, so it would quantize nothing: "
                f"{did_you_mean(op, DYNAMIC_INT8_OPS)}it quantizes {', '.join(DYNAMIC_INT8_OPS)}"
            )
        return ops

    @field_validator("providers")
    @classmethod
    def _providers_exist(cls, providers: list[str]) -> list[str]:
        return known_providers(providers)

    @model_validator(mode="after")
    def _smoothing_is_for_dynamic_int8(self):
        if self.smooth is not None and not (
            self.precision == "int8" and self.quantization == "dynamic" and self.runtime == "onnxruntime" and self.fused
        ):
            raise ValueError(
                "smooth applies to dynamic INT8 of a fused graph in ONNX Runtime: it needs precision: int8, "
                "quantization: dynamic, runtime: onnxruntime and fused: true"
            )
        if self.smooth is not None and self.int8_ops is not None and "MatMul" not in self.int8_ops:
            raise ValueError(
                f"smooth would not apply: it smooths the inputs of MatMuls, and int8_ops {self.int8_ops} leaves every "
                "MatMul in fp32 (remove smooth, or add MatMul to int8_ops)"
            )
        return self

    @model_validator(mode="after")
    def _static_int8_sets_its_own_choices(self):
        if self.quantization == "static" and (given := sorted(self.model_fields_set & DYNAMIC_INT8)):
            raise ValueError(
                "quantization: static quantizes MatMul and Conv (and a GPT teacher's Gemm) with weights per channel, "
                f"so {given} would not apply: they are dynamic INT8 settings (remove them)"
            )
        return self

    @model_validator(mode="after")
    def _per_channel_has_weights_to_scale(self):
        if self.per_channel and self.int8_ops is not None and not set(self.int8_ops) & set(PER_CHANNEL_OPS):
            raise ValueError(
                f"per_channel would not apply: it scales the weights of {', '.join(PER_CHANNEL_OPS)} per channel, and "
                f"int8_ops {self.int8_ops} names none of them (remove per_channel, or name one)"
            )
        return self

    @model_validator(mode="after")
    def _int8_settings_need_int8(self):
        if self.precision != "int8" and (given := sorted(self.model_fields_set & {"quantization", *DYNAMIC_INT8})):
            keys = ", ".join(given)
            raise ValueError(
                f"{keys} would not apply: INT8 settings, and precision is {self.precision} (remove {keys}, or set "
                "precision: int8)"
            )
        return self

    @model_validator(mode="after")
    def _tensorrt_takes_no_onnxruntime_settings(self):
        if self.runtime == "tensorrt" and (given := sorted(self.model_fields_set & ONNXRUNTIME_ONLY)):
            keys = ", ".join(given)
            raise ValueError(
                f"{keys} would not apply: ONNX Runtime settings, and runtime: tensorrt builds an engine from the plain "
                f"graph, which TensorRT fuses, calibrates and runs on the GPU its own way (remove {keys})"
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
    rule: Rule = Field("max_prob", description=f"a member keeps a text when {rules_described()} reaches its threshold")
    target_agreement: float = Field(
        0.99,
        gt=0,
        le=1,
        description="each member's threshold is the lowest at which it agrees this often with the last member on the "
        "calibration texts that reach it (those it passes on counted as agreeing); with three members or more the "
        "cascade as a whole may agree less often (its calibration_agreement)",
    )
    calibration_sentences: int = Field(
        20_000,
        ge=100,
        description="unlabelled texts the transfer set did not read, labelled by the last member, that choose the "
        "thresholds (neither dev nor test); fewer found (at least 100) build with a warning",
    )
    temperature_scaling: bool = Field(True, description="fit each member's softmax temperature on the same texts")


class ExportConfig(Strict):
    hashed_when_set = frozenset({"min_int8_agreement", "tie_margin", "smooth_sentences"})

    opset: int = Field(
        17, ge=14, le=20, description="ONNX opset of the exported graphs (14-20: what torch.onnx's exporter writes)"
    )
    bundles: dict[Name, BundleRecipe] = Field(min_length=1)
    cascades: dict[Name, CascadeRecipe] = Field(
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
    max_int8_drop: float = Field(0.005, ge=0, description="int8 gate: dev figure of data.metric lost against PyTorch")
    min_int8_agreement: float = Field(
        0.97,
        gt=0,
        le=1,
        description="int8 gate, with max_int8_drop: share of dev predictions equal to PyTorch's, so that a bundle "
        "whose answers moved cannot pass on its net accuracy alone",
    )
    tie_margin: float = Field(
        0.1,
        ge=0,
        description="a dev example whose PyTorch logits' top two are closer than this is a near-tie: a prediction "
        "that differs there by a label whose PyTorch logit is this close to the top is counted (`tie_flips`) but not "
        "against the agreement gates, as transfer.tie_margin does for labels",
    )
    calibration_sentences: int = Field(
        256,
        gt=0,
        description="calibration sentences: transfer-set ones for static INT8 and TensorRT INT8 (at least 8 there, "
        "the engine's opt batch, and the transfer set needs as many texts)",
    )
    smooth_sentences: int = Field(
        256,
        gt=0,
        description="train examples (the first ones) whose per-channel activation ranges calibrate `smooth`",
    )

    @property
    def default_cascade(self) -> str | None:
        """The cascade `bench cascade` measures unless named: the deployed one, else the first; None without any."""
        if self.deploy in self.cascades:
            return self.deploy
        return next(iter(self.cascades), None)

    @model_validator(mode="after")
    def _deploy_known(self):
        if self.deploy not in self.bundles and self.deploy not in self.cascades:
            known = [*self.bundles, *self.cascades]
            raise ValueError(
                f"export.deploy={self.deploy} is not one of export.bundles ({', '.join(self.bundles)}) or "
                f"export.cascades ({', '.join(self.cascades) or 'none'}): {did_you_mean(self.deploy, known)}name one"
            )
        return self

    @model_validator(mode="after")
    def _engine_calibration_fills_a_batch(self):
        engines = [
            name for name, spec in self.bundles.items() if spec.runtime == "tensorrt" and spec.precision == "int8"
        ]
        if engines and self.calibration_sentences < ENGINE_BATCH[1]:
            raise ValueError(
                f"export.calibration_sentences={self.calibration_sentences}: the TensorRT INT8 bundles {engines} "
                f"calibrate on batches of {ENGINE_BATCH[1]} sentences (their profile's opt batch): set it to at least "
                f"{ENGINE_BATCH[1]}"
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
