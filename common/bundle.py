"""The deployable bundle: the only thing the server reads. Torch-free, so the serving image can load it.

`runs/<recipe>/bundle-<id>/` holds the model file at the top level (`model.onnx` or `model.plan`),
the tokenizer files shared by the whole pipeline (`tokenizer.json`, which the server reads, and
`tokenizer_config.json`), a transformers-style `config.json` (labels, model type) for the Hugging Face
tools, and `manifest.json`, whose `info` carries a `BundleSpec`: what the server needs to feed the
model and read its outputs.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Self

from edgedistill.common import manifest as mf
from edgedistill.common.providers import known_providers
from edgedistill.common.segments import PairSegments
from edgedistill.common.textstyle import Style
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MODEL_FILES = {"onnxruntime": "model.onnx", "tensorrt": "model.plan"}
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CONFIG = "config.json"
# The bundle format's version, hashed by the bundle stage (`export.stages.bundle`): bumped when `BundleSpec` gains
# a field that changes what is served or a bundle's files are written otherwise, so that bundles built before are
# rebuilt. 2: `pad_token_id`; 3: `tokenizer.json` truncates at the bundle's max length (`tokenizer_json`);
# 4: `text_style`.
SPEC_VERSION = 4
# Tokens: far more than the students built here take, and few enough that the server's warm-up rows fit in memory.
MAX_LENGTH = 1 << 16
VERSION_DIGITS = 12  # hex digits of a content version (`ServedModel.content_versioned`)
# The token inputs a model may take, in the order of a BERT-style classifier's forward: input_ids, then optionally
# attention_mask and token_type_ids.
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Where a batch's shorter rows are padded: after their tokens (attention_mask 1s then 0s), as in training. The
# BiLSTM and CNN students find a row's length from its mask and BERT and GPT number positions from 0, so a row padded
# on the left gives other logits.
PADDING_SIDE = "right"
# What to do about a bundle that fails its checks, whatever its folder is called (a copy renamed, a cascade's member):
# the bundles command builds bundles and cascades.
REBUILD = mf.build_with(mf.BUILT_BY["bundle-"], again=True)


def pad_value(name: str, pad_token_id: int) -> int:
    """What pads token input `name` of a shorter row: `pad_token_id` for input_ids, 0 (masked out) for the others."""
    return pad_token_id if name == "input_ids" else 0


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: Literal["int64", "int32", "float32", "float16"]
    shape: list[int | str] = Field(description="symbolic axes as names, e.g. ['batch', 'sequence']")


TextInput = Literal["text", "text_pair"]


def text_inputs(pairs: bool) -> list[TextInput]:
    """The texts a request gives per example: `text`, and `text_pair` beside it for a pair model."""
    return ["text", "text_pair"] if pairs else ["text"]


class ServedModel(BaseModel):
    """What clients of any served model (a bundle or a cascade) are told: its name, labels and inputs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the model name clients ask for, in both gRPC APIs")
    version: str = Field(
        "1",
        description="the version clients are told is served, in both gRPC APIs and the metrics: set from the "
        "model's content when it is built (`content_versioned`); 1 in models built before",
    )
    labels: list[str]
    text_inputs: list[TextInput] = Field(
        description="the texts a request gives per example: ['text'], or ['text', 'text_pair'] for a pair model"
    )

    def content_versioned(self, *digests: str) -> Self:
        """This spec with the version that names what it serves: the first VERSION_DIGITS hex digits of the sha256 of
        the spec (its version aside) and `digests` (the sha256 of what it serves beside the spec, e.g. a bundle's
        model file and tokenizer.json), so that a model built again with other weights or settings is served as another version."""
        content = json.dumps([self.model_dump(mode="json", exclude={"version"}), *digests], sort_keys=True)
        return self.model_copy(update={"version": hashlib.sha256(content.encode()).hexdigest()[:VERSION_DIGITS]})

    @property
    def pairs(self) -> bool:
        """Whether the model takes sentence pairs: then every text needs its pair, and single texts are refused."""
        return "text_pair" in self.text_inputs


class BundleSpec(ServedModel):
    """What a bundle serves and how; stored as `manifest.info['bundle']`."""

    max_length: int = Field(
        gt=0, le=MAX_LENGTH, description="tokens per text, at most MAX_LENGTH; the server's warm-up runs rows this long"
    )
    pad_token_id: int = Field(
        ge=0,
        description="the input id that pads shorter rows of a batch, as in training and the export checks; a "
        "GPT-style model finds its last token by it",
    )
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    precision: Literal["fp32", "fp16", "int8"]
    runtime: Literal["onnxruntime", "tensorrt"]
    providers: list[str] = Field(min_length=1, description="execution providers it was built and checked for")
    model_file: str
    arch: str
    opset: int | None = None
    fused_operators: dict[str, int] = Field(
        {},
        description="the fused operators ONNX Runtime's optimizer made, counted before smoothing and quantization (an "
        "INT8 graph's Attention is then QAttention: `op_counts` in the manifest's info counts the shipped graph)",
    )
    disabled_optimizers: list[str] = Field(
        [], description="ONNX Runtime graph optimizers to turn off when loading, so they cannot undo a build choice"
    )
    text_style: Style = Field(
        "raw",
        description="how the model's training text was written (the recipe's `transfer.text_style`), and so how the "
        "server writes each text before its tokenizer: `ptb_lower` lower-cased and PTB-tokenised, `raw` as sent "
        "(`common.textstyle.as_served`); raw in bundles built before it was recorded",
    )
    pair_segments: PairSegments = Field(
        "token_types",
        description="how a pair's `token_type_ids` input is made (`common.segments`): the tokenizer's token type ids, "
        "or, for a tokenizer that marks sentence B with none (RoBERTa), segment ids from its sequence ids, as the "
        "model was trained; left out of the manifest when `token_types`, which every bundle built before it had",
        exclude_if=lambda rule: rule == "token_types",
    )

    @model_validator(mode="after")
    def _providers_onnx_runtime_knows(self):
        if self.runtime == "onnxruntime":
            known_providers(self.providers)  # ValueError for a name ONNX Runtime has in no build, or one it would skip
        return self

    @model_validator(mode="after")
    def _model_file_of_its_runtime(self):
        if self.model_file != MODEL_FILES[self.runtime]:
            raise ValueError(
                f"model_file {self.model_file!r} is not what runtime {self.runtime} loads ({MODEL_FILES[self.runtime]})"
            )
        return self

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]


def transformers_config(model: dict, spec: BundleSpec) -> dict:
    """`config.json` of a bundle: the exported model's transformers-style config (`model`, with its `model_type`)
    and the bundle's labels as `id2label` / `label2id`, as transformers and optimum read them."""
    return model | {
        "id2label": {str(i): label for i, label in enumerate(spec.labels)},
        "label2id": {label: i for i, label in enumerate(spec.labels)},
    }


def tokenizer_json(data: dict, max_length: int) -> dict:
    """The source's `tokenizer.json` truncating at the model's `max_length` and padding nothing, as the server
    tokenizes, so that `tokenizers.Tokenizer.from_file` alone gives the server's token ids (the source's may carry
    the teacher's longer max length, or padding to a fixed length)."""
    truncation = {"direction": "Right", "max_length": max_length, "strategy": "LongestFirst", "stride": 0}
    return data | {"truncation": truncation, "padding": None}


def tokenizer_config(data: dict, max_length: int) -> dict:
    """The source's `tokenizer_config.json` with the model's `max_length`, so that `truncation=True` fits the model."""
    return data | {"model_max_length": max_length}


class NotABundle(mf.ArtifactError):
    """A finished artifact that is no bundle (another stage's, or a cascade) named where a bundle is read: nothing to
    rebuild, another folder to name."""


class Bundle(BaseModel):
    folder: Path
    manifest: mf.Manifest
    spec: BundleSpec
    manifest_sha256: str  # of the manifest bytes parsed: names the bundle that was loaded

    @property
    def model_path(self) -> Path:
        return self.folder / self.spec.model_file

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / TOKENIZER


def _spec(folder: Path, manifest: mf.Manifest) -> BundleSpec:
    """The bundle spec of a manifest; `NotABundle` for another kind of artifact, `ArtifactError` unless the spec is
    valid and lists the model and tokenizer."""
    if "cascade" in manifest.info:
        raise NotABundle(
            f"{folder} is a confidence cascade, not a bundle: its members are bundles, in {folder / 'members'}"
        )
    if "bundle" not in manifest.info:
        raise NotABundle(
            f"{folder} is a {manifest.stage!r} artifact, not a bundle (no info.bundle): name a bundle folder, "
            "runs/<recipe>/bundle-<id>"
        )
    try:
        spec = BundleSpec.model_validate(manifest.info["bundle"])
    except ValidationError as err:
        given = manifest.info["bundle"]
        old = isinstance(given, dict) and "pad_token_id" not in given
        hint = " (built before bundles recorded their padding id: build it again)" if old else ""
        raise mf.invalid(f"{folder}: invalid bundle spec{hint}", err) from None
    for required in (spec.model_file, TOKENIZER):
        if required not in manifest.files:
            raise mf.ArtifactError(f"{folder}: {required} is not in the bundle's manifest")
    return spec


def load_bundle(folder: str | Path, verify: bool = True) -> Bundle:
    """Read and verify a bundle: every file's sha256 (unless `verify` is off), the model and tokenizer listed,
    the spec valid."""
    folder = Path(folder)
    manifest, digest = mf.read(folder, verify=verify)
    return Bundle(folder=folder, manifest=manifest, spec=_spec(folder, manifest), manifest_sha256=digest)


@dataclass(frozen=True, eq=False)
class ServedFiles:
    """The model file and tokenizer.json of a bundle, as read once and verified: what is opened is what was
    checked. Drop it once the model is open: it holds the whole model file."""

    model: bytes
    tokenizer: str


def read_bundle(folder: str | Path) -> tuple[Bundle, ServedFiles]:
    """A verified bundle and its model and tokenizer in memory, each read once and checked on the bytes read, so a
    folder changed after the check cannot change what is served (the folder is verified as `manifest.load` does)."""
    folder = Path(folder)
    manifest, digest = mf.read(folder, verify=False)  # verified below, keeping the bytes served
    spec = _spec(folder, manifest)
    served = mf.verified(folder, manifest, keep=(spec.model_file, TOKENIZER))
    try:
        tokenizer = served[TOKENIZER].decode("utf-8")
    except UnicodeDecodeError as err:
        raise mf.ArtifactError(f"{folder}: {TOKENIZER} is not UTF-8 text: {err}") from err
    bundle = Bundle(folder=folder, manifest=manifest, spec=spec, manifest_sha256=digest)
    return bundle, ServedFiles(served[spec.model_file], tokenizer)
