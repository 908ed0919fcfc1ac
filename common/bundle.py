"""The deployable bundle: the only thing the server reads. Torch-free, so the serving image can load it.

`runs/<recipe>/bundle-<id>/` holds the model file at the top level (`model.onnx` or `model.plan`),
the `tokenizer.json` shared by the whole pipeline, and `manifest.json`, whose `info` carries a
`BundleSpec`: what the server needs to feed the model and read its outputs.
"""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common import manifest as mf

MODEL_FILES = {"onnxruntime": "model.onnx", "tensorrt": "model.plan"}
TOKENIZER = "tokenizer.json"


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    dtype: Literal["int64", "int32", "float32", "float16"]
    shape: list[int | str] = Field(description="symbolic axes as names, e.g. ['batch', 'sequence']")


class BundleSpec(BaseModel):
    """What a bundle serves and how; stored as `manifest.info['bundle']`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the model name clients ask for, in both gRPC APIs")
    version: str = "1"
    labels: list[str]
    text_inputs: list[Literal["text", "text_pair"]] = Field(
        description="the texts a request gives per example: ['text'], or ['text', 'text_pair'] for a pair model"
    )
    max_length: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    precision: Literal["fp32", "fp16", "int8"]
    runtime: Literal["onnxruntime", "tensorrt"]
    providers: list[str] = Field(description="execution providers it was built and checked for")
    model_file: str
    arch: str
    opset: int | None = None
    fused_operators: dict[str, int] = {}
    disabled_optimizers: list[str] = Field(
        [], description="ONNX Runtime graph optimizers to turn off when loading, so they cannot undo a build choice"
    )

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def pairs(self) -> bool:
        """Whether the model takes sentence pairs: then every text needs its pair, and single texts are refused."""
        return "text_pair" in self.text_inputs


class Bundle(BaseModel):
    folder: Path
    manifest: mf.Manifest
    spec: BundleSpec

    @property
    def model_path(self) -> Path:
        return self.folder / self.spec.model_file

    @property
    def tokenizer_path(self) -> Path:
        return self.folder / TOKENIZER


def load_bundle(folder: str | Path) -> Bundle:
    """Read and verify a bundle: every file's sha256, the model and tokenizer present, the spec valid."""
    folder = Path(folder)
    manifest = mf.load(folder)
    if "bundle" not in manifest.info:
        raise mf.ArtifactError(f"{folder} is a {manifest.stage!r} artifact, not a bundle (no info.bundle)")
    try:
        spec = BundleSpec.model_validate(manifest.info["bundle"])
    except ValueError as err:
        raise mf.ArtifactError(f"{folder}: invalid bundle spec: {err}") from err
    for required in (spec.model_file, TOKENIZER):
        if required not in manifest.files:
            raise mf.ArtifactError(f"{folder}: {required} is not in the bundle's manifest")
    return Bundle(folder=folder, manifest=manifest, spec=spec)
