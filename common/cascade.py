"""A confidence cascade bundle: member bundles, cheapest first, and the rule and thresholds that route texts.

`runs/<recipe>/bundle-<cascade>/` holds `members/<bundle id>/` (a full copy of each member bundle, its
manifest included) and `manifest.json`, whose `info.cascade` is a `CascadeSpec`. Each
member but the last keeps the texts whose confidence reaches its threshold; the others go on to the
next member; the last answers what reaches it. Torch-free: the server loads it.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import Bundle, ServedModel, load_bundle
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MEMBERS = "members"


@dataclass(frozen=True)
class Confidence:
    """How a rule measures a member's confidence: `of` (N, C) probabilities -> (N,) confidence, higher meaning surer,
    which lies in [`least(C)`, `most`]; the least is that of equal probabilities, so a threshold there keeps every
    text, and one above the most keeps none."""

    what: str  # the measure, as the recipe describes it
    of: Callable[[np.ndarray], np.ndarray]
    least: Callable[[int], float]
    most: float


def _margin(p: np.ndarray) -> np.ndarray:
    top = np.sort(p, -1)
    return top[:, -1] - top[:, -2]


def _minus_entropy(p: np.ndarray) -> np.ndarray:
    return (p * np.log(np.clip(p, 1e-12, None))).sum(-1)


RULES = {
    "max_prob": Confidence("its top-class probability", lambda p: p.max(-1), lambda labels: 1 / labels, 1.0),
    "margin": Confidence("the gap between its two most likely classes", _margin, lambda labels: 0.0, 1.0),
    "entropy": Confidence(
        "minus the entropy of its probabilities", _minus_entropy, lambda labels: -math.log(labels), 0.0
    ),
}
Rule = Literal[tuple(RULES)]


def rules_described() -> str:
    """Each rule's measure, named: `its top-class probability (max_prob), ..., or minus the entropy ... (entropy)`."""
    *others, last = (f"{measure.what} ({rule})" for rule, measure in RULES.items())
    return f"{', '.join(others)}, or {last}"


class CascadeMember(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bundle: str = Field(description="the member's bundle id; its copy is members/<bundle>/")
    manifest_sha256: str = Field(description="sha256 of the member's manifest.json when the cascade was built")
    threshold: float | None = Field(
        allow_inf_nan=False, description="keeps a text whose confidence is at least this; None for the last"
    )
    temperature: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="softmax temperature fitted for the confidence"
    )


class CascadeSpec(ServedModel):
    """What a cascade serves and how it routes; stored as `manifest.info['cascade']`."""

    rule: Rule
    members: list[CascadeMember] = Field(min_length=2)

    @model_validator(mode="after")
    def _last_answers_everything(self):
        if any(m.threshold is None for m in self.members[:-1]) or self.members[-1].threshold is not None:
            raise ValueError("every member but the last needs a threshold, and the last none")
        return self

    @model_validator(mode="after")
    def _thresholds_keep_some_texts_and_not_all(self):
        measure = RULES[self.rule]
        low, high = measure.least(len(self.labels)), measure.most
        for member in self.members[:-1]:
            if not low < member.threshold <= high:
                raise ValueError(
                    f"member {member.bundle}'s threshold {member.threshold} is outside ({low}, {high}]: {self.rule}'s "
                    f"confidence over {len(self.labels)} labels lies in [{low}, {high}], so it would keep every text "
                    "or none"
                )
        return self

    @model_validator(mode="after")
    def _each_member_once(self):
        ids = [member.bundle for member in self.members]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a member is listed twice ({ids}): rebuild the cascade")
        return self


class Cascade(BaseModel):
    folder: Path
    manifest: mf.Manifest
    manifest_sha256: str = Field(description="sha256 of the manifest bytes read, which name what is served")
    spec: CascadeSpec
    members: list[Bundle]


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of (N, C) `logits` at `temperature`, computed and returned in float64; a row with a NaN or
    +inf logit comes out NaN (a -inf one is a probability of 0)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    with np.errstate(invalid="ignore"):  # inf - inf: that row's NaN is the answer, not a fault to warn of
        z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def confidence(logits: np.ndarray, rule: Rule, temperature: float = 1.0) -> np.ndarray:
    """(N, C) logits -> (N,) confidence by `rule` (`RULES`) of their softmax at `temperature`, higher meaning
    surer."""
    return RULES[rule].of(softmax(logits, temperature))


def is_cascade(folder: str | Path) -> bool:
    """Whether `folder` holds a finished cascade (read without verifying: `load_cascade` verifies)."""
    try:
        return "cascade" in mf.load(folder, verify=False).info
    except mf.ArtifactError:
        return False


def cascade_spec(folder: Path, manifest: mf.Manifest) -> CascadeSpec:
    """The cascade spec of `folder`'s manifest; `ArtifactError` unless the folder is a cascade and its spec valid."""
    if "cascade" not in manifest.info:
        raise mf.ArtifactError(f"{folder} is a {manifest.stage!r} artifact, not a cascade (no info.cascade)")
    try:
        return CascadeSpec.model_validate(manifest.info["cascade"])
    except ValidationError as err:
        raise mf.invalid(f"{folder}: invalid cascade spec", err) from None


def served_version(folder: str | Path) -> str:
    """The version a server of `folder`, a bundle or a cascade, reports (read without verifying its files)."""
    if is_cascade(folder):
        return cascade_spec(Path(folder), mf.load(folder, verify=False)).version
    return load_bundle(folder, verify=False).spec.version


def served_bundles(folder: str | Path) -> list[Bundle]:
    """The bundles a server loads from `folder`, read without verifying: the bundle, or a cascade's members."""
    if not is_cascade(folder):
        return [load_bundle(folder, verify=False)]
    spec = cascade_spec(Path(folder), mf.load(folder, verify=False))
    return [load_bundle(mf.listed_file(Path(folder), f"{MEMBERS}/{m.bundle}"), verify=False) for m in spec.members]


@dataclass(frozen=True)
class ServedModels:
    """What a server's start needs of the models it would load from a bundle folder, read once and without verifying
    them (the server's load verifies them): the bytes of their model files (a bundle's, or every member's of a
    cascade), and whether one runs on ONNX Runtime, whose session PROVIDERS, THREADS and SPIN set (a TensorRT engine
    runs without it). `refused` says why the folder could not be read; such a folder counts as a model on ONNX
    Runtime, and its load refuses it, saying why."""

    model_bytes: int = 0
    onnx_runtime: bool = True
    refused: str | None = None

    @classmethod
    def read(cls, folder: str | Path) -> "ServedModels":
        try:
            bundles = served_bundles(folder)
        except (mf.ArtifactError, ValueError, OSError) as err:
            return cls(refused=str(err))
        # every model file is listed: load_bundle refuses a manifest without it
        size = sum(bundle.manifest.files[bundle.spec.model_file].size_bytes for bundle in bundles)
        return cls(size, on_onnx_runtime(bundles))


def on_onnx_runtime(bundles: list[Bundle]) -> bool:
    """Whether any of `bundles` runs on ONNX Runtime rather than as a TensorRT engine."""
    return any(bundle.spec.runtime == "onnxruntime" for bundle in bundles)


def _member_files(manifest: mf.Manifest, member: str) -> dict[str, mf.FileEntry]:
    """The files the cascade's `manifest` lists in `members/<member>/`, by their names in the member, its manifest
    and card aside: those the member's own manifest lists, in a cascade built from a verified bundle."""
    prefix = f"{MEMBERS}/{member}/"
    own = (f"{prefix}{mf.MANIFEST}", f"{prefix}{mf.CARD}")
    return {
        name.removeprefix(prefix): entry
        for name, entry in manifest.files.items()
        if name.startswith(prefix) and name not in own
    }


def load_cascade(folder: str | Path, verify: bool = True) -> Cascade:
    """Read and verify a cascade: every file's sha256 (unless `verify` is off: a server reads and verifies each
    member's files as it loads them), each member's manifest against the hash the cascade recorded and its files as
    the cascade lists them (so the cascade's sha256 check covers the member's own), and members that agree on labels
    and inputs."""
    folder = Path(folder)
    manifest, digest = mf.read(folder, verify=verify)
    spec = cascade_spec(folder, manifest)
    members = []
    for member in spec.members:
        path = mf.listed_file(folder, f"{MEMBERS}/{member.bundle}")
        member_manifest = path / mf.MANIFEST
        try:
            recorded = member_manifest.is_file() and mf.sha256_file(member_manifest) == member.manifest_sha256
        except OSError as err:  # a name the file system refuses (too long), a folder it cannot read
            raise mf.ArtifactError(f"{folder}: member {member.bundle!r} cannot be read: {err.strerror}") from err
        if not recorded:
            raise mf.ArtifactError(
                f"{folder}: member {member.bundle} is missing or not the bundle the cascade was built with "
                "(its manifest's sha256 differs): rebuild the cascade"
            )
        bundle = load_bundle(path, verify=False)
        if _member_files(manifest, member.bundle) != bundle.manifest.files:
            raise mf.ArtifactError(
                f"{folder}: member {member.bundle}'s files are not those its manifest lists (copied from a changed "
                "bundle): rebuild the member, then the cascade"
            )
        if bundle.spec.labels != spec.labels or bundle.spec.text_inputs != spec.text_inputs:
            raise mf.ArtifactError(
                f"{folder}: member {member.bundle} takes {bundle.spec.text_inputs} with labels {bundle.spec.labels}, "
                f"the cascade {spec.text_inputs} with {spec.labels}"
            )
        members.append(bundle)
    return Cascade(folder=folder, manifest=manifest, manifest_sha256=digest, spec=spec, members=members)


def keeps(logits: np.ndarray, spec: CascadeSpec, index: int) -> np.ndarray:
    """(N,) whether member `index` (not the last) keeps each text, from its (N, C) logits: whether its confidence at
    the member's temperature reaches its threshold. A text with a non-finite logit (whose confidence is undefined,
    or 1 for a -inf beside finite ones) does not: it goes on. The server, the export stage and the benchmarks all
    route by this rule."""
    member = spec.members[index]
    finite = np.isfinite(logits).all(-1)
    return (confidence(logits, spec.rule, member.temperature) >= member.threshold) & finite


def least_sure_first(logits: np.ndarray, spec: CascadeSpec, index: int) -> np.ndarray:
    """The rows of member `index`'s (N, C) logits, least confident first (ties in row order): a row with a non-finite
    logit, which `keeps` passes on whatever its confidence reads, before any other. An overloaded server sends the
    escalated texts on in this order while the next member has room."""
    member = spec.members[index]
    scores = confidence(logits, spec.rule, member.temperature)
    return np.argsort(np.where(np.isfinite(logits).all(-1), scores, -np.inf), kind="stable")


def route(member_logits: list[np.ndarray], spec: CascadeSpec) -> tuple[np.ndarray, np.ndarray]:
    """Answers of the cascade from every member's logits on the same N texts: (N, C) logits of the member that
    answered each text, and (N,) its index. The server runs a member only on the texts that reach it; this is the
    same routing, for checks."""
    count = len(member_logits[0])
    answered_by = np.full(count, len(spec.members) - 1)
    open_ = np.ones(count, dtype=bool)
    for index in range(len(spec.members) - 1):
        keep = open_ & keeps(member_logits[index], spec, index)
        answered_by[keep] = index
        open_ &= ~keep
    logits = np.stack([member_logits[m][i] for i, m in enumerate(answered_by)]) if count else member_logits[0]
    return logits, answered_by


class Served(ServedModel):
    """What a client of a bundle or a cascade folder needs: its name, labels and inputs, and a short description."""

    folder: Path
    manifest: mf.Manifest
    description: dict


def describe(description: dict) -> str:
    """`name (arch, precision, runtime)` of a bundle, `name (cascade of a, b)` of a cascade."""
    if description.get("kind") == "cascade":
        return f"{description['name']} (cascade of {', '.join(m['bundle'] for m in description['members'])})"
    parts = [description[key] for key in ("arch", "precision", "runtime") if key in description]
    return f"{description['name']} ({', '.join(parts)})"


def load_served(folder: str | Path) -> Served:
    """A bundle or a cascade folder, verified, as the server will serve it."""
    if is_cascade(folder):
        cascade = load_cascade(folder)
        spec, description = cascade.spec, {"kind": "cascade", "rule": cascade.spec.rule}
        description["members"] = [m.model_dump(include={"bundle", "threshold", "temperature"}) for m in spec.members]
        manifest = cascade.manifest
    else:
        bundle = load_bundle(folder)
        spec, manifest = bundle.spec, bundle.manifest
        description = {"kind": "bundle"} | spec.model_dump(include={"arch", "precision", "runtime"})
    return Served(
        folder=Path(folder),
        manifest=manifest,
        name=spec.name,
        version=spec.version,
        labels=spec.labels,
        text_inputs=list(spec.text_inputs),
        description={"name": spec.name, "version": spec.version} | description,
    )
