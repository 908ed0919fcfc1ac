"""Typed recipes: one YAML file per experiment, validated at load, overridable from the CLI.

A `Recipe` holds the sections (their schemas: `common.config`) and the rules that span them; its `hash` and
`section_hash` cover the settings that shape artifacts, local files by their contents.
`${NAME}` in a string value is replaced by the environment variable of that name, or by the setting's
default (see `common.settings`); a string value that then starts with `./` or `../` is a path relative to
the recipe's own folder. `extends:` starts from another recipe (see `_merge` for how the two combine).
Overrides use dotted keys: `--finetune.optim.lr=3e-5`; values are parsed as YAML scalars. A command refuses an
override of a section it does not read (`common.sections`, `load_command_recipe`).
"""

import argparse
import datetime
import difflib
import functools
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from edgedistill.common import guide, progress, sections, settings
from edgedistill.common import manifest as mf
from edgedistill.common.arguments import WholeWordsHelp, file_in_the_way
from edgedistill.common.config import schema
from edgedistill.common.config.export import ExportConfig
from edgedistill.common.config.measure import BenchConfig, LoadtestConfig
from edgedistill.common.config.strict import HASHING, NAME_RULE, RUN_NAME_RULE, Overridden, RunName, Strict
from edgedistill.common.config.training import (
    STUDENT_FROM_DATA,
    UNQUOTED,
    DataConfig,
    DistillConfig,
    FinetuneConfig,
    ModelConfig,
    PretrainConfig,
    RuntimeConfig,
    StudentConfig,
    TransferConfig,
    quoted,
    yaml_word,
)
from edgedistill.common.names import did_you_mean, first_of
from edgedistill.common.providers import CPU
from edgedistill.common.textstyle import Style
from pydantic import Field, ValidationError, model_validator

UNHASHED = ("runtime", "bench", "loadtest", "tracking")  # sections that change no artifact of another stage


class Recipe(Strict):
    name: RunName = Field(
        description=f"the run folder's name, `runs/<name>/`: {RUN_NAME_RULE}",
        # not a default of the model: load_recipe fills it in from the file name where the recipe has none
        json_schema_extra={"default_from": "the recipe file's name, without `.yaml`"},
    )
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

    @property
    def text_style(self) -> Style:
        """How the task's text is written, in which its bundles' servers write each text they are sent:
        `transfer.text_style`, or `raw` for a recipe without a transfer set."""
        return self.transfer.text_style if self.transfer else "raw"

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
                arch = "teacher" if bundle.source == "teacher" else self.distill.students[bundle.source].model.arch
                if bundle.fold and arch != "cnn":
                    raise ValueError(f"export.bundles.{bundle_id}.fold: true needs a CNN student as its source")
                graph = f"the graph of {bundle.source}, a {arch} student"
                if arch not in ("teacher", "transformer") and (
                    unapplied := bundle.unapplied_fusion_choices(bundle_id, graph)
                ):
                    raise ValueError(unapplied)
                if arch not in ("teacher", "transformer") and "fused" in bundle.model_fields_set:
                    raise ValueError(
                        f"export.bundles.{bundle_id}.fused would not apply: ONNX Runtime's BERT fusions fuse a "
                        f"Transformer's graph, and {graph} ships as exported (remove fused)"
                    )
                if bundle.smooth is not None and arch not in ("teacher", "transformer"):
                    raise ValueError(
                        f"export.bundles.{bundle_id}.smooth needs a fused graph, the teacher's or a transformer "
                        f"student's: {bundle.source} is a {arch}, whose graph has no LayerNorm or GELU feeding a MatMul "
                        "(remove smooth)"
                    )
        return self

    @model_validator(mode="after")
    def _transfer_set_readers_have_one(self):
        if self.transfer is not None:
            return self
        readers = ["distill"] if self.distill is not None else []
        if self.export is not None:
            bundles = self.export.bundles.items()
            readers += [f"export.bundles.{name}" for name, spec in bundles if spec.calibrated_on_transfer_set]
            readers += [f"export.cascades.{name}" for name in self.export.cascades]
        if readers:
            raise ValueError(
                f"{', '.join(readers)} read the transfer set (students learn from it, static and TensorRT INT8 "
                "calibrate on it, cascades calibrate on the unlabelled lines past it), but there is no `transfer` "
                "section: add one, or drop them"
            )
        return self

    @model_validator(mode="after")
    def _cascades_have_lines_past_the_transfer_set(self):
        cascades = list(self.export.cascades) if self.export is not None else []
        if cascades and self.transfer is not None and self.transfer.unlabelled_max_lines is None:
            raise ValueError(
                f"export.cascades ({', '.join(cascades)}) calibrate on the unlabelled lines past those the transfer set "
                "reads, but transfer.unlabelled_max_lines is unset, so it reads them all: set "
                "transfer.unlabelled_max_lines below the number of lines in transfer.unlabelled_files, or drop the "
                "cascades (export.cascades: null)"
            )
        return self

    @model_validator(mode="after")
    def _cascade_routing_choices_apply(self):
        if self.export is None or self.data.num_labels != 2:
            return self
        for name, cascade in self.export.cascades.items():
            moot = [f"rule: {cascade.rule}"] if cascade.rule != "max_prob" else []
            moot += [] if cascade.temperature_scaling else ["temperature_scaling: false"]
            if moot:
                raise ValueError(
                    f"export.cascades.{name}: {' and '.join(moot)} would not apply: with two labels every rule, at "
                    "any temperature, orders the texts by the gap between their two logits, and a threshold is chosen "
                    "by that order, so each member keeps the texts max_prob keeps (they matter with three labels or "
                    f"more; remove {' and '.join(entry.partition(':')[0] for entry in moot)})"
                )
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
        bundles = self.export.bundles if self.export else {}
        if name not in bundles:
            able = [
                key
                for key, one in bundles.items()
                if (one.source, one.runtime, one.providers) == ("teacher", "onnxruntime", [CPU])
                and one.precision in ("fp32", "int8")
            ]
            those = (
                f"{did_you_mean(name, able)}the teacher's CPU bundles that can label are {', '.join(able)}, or"
                if able
                else "the recipe has no fp32 or INT8 CPU bundle of the teacher to label with:"
            )
            raise ValueError(
                f"transfer.labeller={name!r} is not one of export.bundles: {those} transfer.labeller: null labels in "
                "PyTorch"
            )
        bundle = bundles[name]
        if (bundle.source, bundle.runtime) != ("teacher", "onnxruntime") or bundle.precision not in ("fp32", "int8"):
            raise ValueError(
                f"transfer.labeller={name!r} must be an fp32 or INT8 ONNX Runtime bundle of the teacher, got source="
                f"{bundle.source}, precision={bundle.precision}, runtime={bundle.runtime}"
            )
        if bundle.providers != [CPU]:
            raise ValueError(
                f"transfer.labeller={name!r} has providers {', '.join(bundle.providers)}: the labeller labels on the "
                f"CPU (a GPU labels in PyTorch), and was gated on its providers; name a bundle on {CPU} alone"
            )
        if bundle.quantization == "static" and bundle.precision == "int8":
            raise ValueError(
                f"transfer.labeller={name!r} is a static INT8 bundle, which is calibrated on the transfer set it would "
                "label: use dynamic INT8 (quantization: dynamic) for the labeller"
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
                "data.text_pair_column is set but model.family is gpt: the pair students find sentence B by the "
                "tokenizer's token_type_ids or a special token between the two texts, and a GPT-2 pair has neither; "
                "use a bert-family teacher (BERT, RoBERTa, DeBERTa, ...) for pair tasks"
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
    def _bert_only_settings(self):
        """Settings only a BERT teacher has a use for: refused for a GPT one, each with its reason."""
        if self.model.family == "bert":
            return self
        bundles = self.export.bundles.items() if self.export is not None else ()
        smoothed = [name for name, spec in bundles if spec.source == "teacher" and spec.smooth is not None]
        smooth_key = f"export.bundles.{smoothed[0]}.smooth" if smoothed else "smooth"
        misfits = {
            "finetune.pooling=mean": (
                self.finetune.pooling == "mean",
                "a causal model's last token is the one that has read the whole text",
            ),
            "finetune.classifier_dropout": (
                self.finetune.classifier_dropout is not None,
                "GPT-2's classification head has no dropout of its own, so the setting would change nothing",
            ),
            "pretrain.whole_word_mask": (
                self.pretrain is not None and self.pretrain.whole_word_mask,
                "a causal LM predicts every next token and masks none, so the setting would change nothing",
            ),
            "pretrain.mlm_probability": (
                self.pretrain is not None and "mlm_probability" in self.pretrain.model_fields_set,
                "a causal LM predicts every next token and masks none, so the setting would change nothing",
            ),
            smooth_key: (
                bool(smoothed),
                "it smooths LayerNorm and GELU outputs feeding MatMuls, and a GPT-2 graph's projections are Gemms; "
                "drop smooth from the bundle (and a labeller that names it)",
            ),
        }
        for setting, (given, reason) in misfits.items():
            if given:
                raise ValueError(f"{setting} needs a bert teacher (model.family is {self.model.family}): {reason}")
        for bundle_id, spec in bundles:  # known here for a GPT-2 teacher, before it is pretrained from scratch
            if spec.source == "teacher" and (unapplied := spec.unapplied_fusion_choices(bundle_id, "a GPT-2 graph")):
                raise ValueError(unapplied)
        return self

    @model_validator(mode="after")
    def _scratch_needs_pretrain(self):
        if self.model.init is None and self.pretrain is None:
            raise ValueError(
                "model.init is null (build from scratch) but there is no `pretrain` section: add one (see recipes/"
                "sst2-gpt.yaml), or set model.init to a checkpoint (a folder or a Hub name) to fine-tune"
            )
        return self

    def settings(self, *keys: str) -> dict:
        """The named settings (sections or dotted keys, e.g. `export.bundles.int8`) as JSON, for a stage's hash.

        Local files and folders named in them count by their contents, not their paths: moving the
        data or the checkout keeps artifacts current, and editing a data file makes them stale. A key the schema
        takes but the recipe leaves out (a null section, a setting hashed only once set) is None; any other raises
        `KeyError`. A setting that changes no artifact (`Strict.unread`) is at its default.
        """
        dumped = self.model_dump(mode="json", context=HASHING)
        return {key: by_content(_setting(dumped, key)) for key in keys}

    def section_hash(self, *sections: str) -> str:
        """A short hash of `settings(*sections)`."""
        return hashlib.sha256(json.dumps(self.settings(*sections), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def hash(self) -> str:
        """Hash of the sections that shape artifacts; `bench` and `loadtest` only measure them, so they are left out."""
        return self.section_hash(*(name for name in type(self).model_fields if name not in UNHASHED))


def _setting(dumped: dict, key: str):
    """The value of dotted `key` in a recipe's JSON dump (see `Recipe.settings`)."""
    value, parts = dumped, key.split(".")
    for depth, part in enumerate(parts):
        if isinstance(value, dict) and part in value:
            value = value[part]
            continue
        section = schema.section_at(Recipe, tuple(parts[:depth]))
        if section is None or part not in section.model_fields:
            raise KeyError(f"{key}: the recipe has no such setting")
        value = None
    return value


def by_content(value):
    """`value` (JSON) with every string naming an existing local file or folder replaced by its digest. A bare name
    (`train.tsv`, no `/`) counts as a file, or as a folder holding a checkpoint (`config.json`), which is what the
    stages read it as; a bare name of another folder is a setting's value (a student named `bench`). A path that does
    not exist stays as written (`common.manifest.gone` tells it from a Hub name where a change is described)."""
    if isinstance(value, dict):
        return {key: by_content(item) for key, item in value.items()}
    if isinstance(value, list):
        return [by_content(item) for item in value]
    if isinstance(value, str) and value and _names_local(Path(value), written_as_path="/" in value):
        return f"sha256:{_digest(Path(value))}"
    return value


def _names_local(path: Path, written_as_path: bool) -> bool:
    """Whether a recipe's string is read as the local `path` (see `by_content`)."""
    if written_as_path:
        return path.exists()
    return path.is_file() or (path / "config.json").is_file()


def _digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's file names and their digests (recursively). An artifact folder (one
    with a manifest, a teacher of another run given as model.init) counts by the files its manifest lists: its card
    (README.md), which that run's report writes again, and the manifest itself are left out."""
    if path.is_file():
        stat = path.stat()
        return _file_digest(path.resolve(), stat.st_size, stat.st_mtime_ns)
    if (path / mf.MANIFEST).is_file():
        files = sorted(path / name for name in mf.load(path, verify=False).files)
    else:
        files = sorted(item for item in path.rglob("*") if item.is_file())
    listing = [(item.relative_to(path).as_posix(), _digest(item)) for item in files]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


@functools.lru_cache(maxsize=256)
def _file_digest(path: Path, size: int, mtime_ns: int) -> str:  # size and mtime: a changed file is read again
    return mf.sha256_file(path)


class RecipeError(ValueError):
    """A recipe that cannot be used, with the file and key that are wrong."""


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SHELL_VAR = re.compile(r"\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*)")  # what a shell would replace, and a recipe does not


class _Replace(dict):
    """A mapping tagged `!replace`: it takes the place of the base recipe's mapping instead of merging into it."""


class _Loader(yaml.SafeLoader):
    """Safe YAML plus the `!replace` tag, refusing a key written twice in one mapping (YAML keeps the last)."""

    def __init__(self, stream):
        super().__init__(stream)
        # the mappings whose own keys were checked, before a merge (`<<: *a`) added the anchor's beside them
        self._checked: set[yaml.Node] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # a mapping is flattened where it is built, and an anchored one also where a merge key names it, perhaps
        # first: its own keys are checked once, before the merged ones sit beside them
        if node not in self._checked:
            self._checked.add(node)
            self._refuse_repeated_keys(node)
        super().flatten_mapping(node)

    def _refuse_repeated_keys(self, node: yaml.MappingNode) -> None:
        lines = {}  # key -> the line it is first written on
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in lines:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is written twice in one mapping, here and on line {lines[key] + 1}, and only the last "
                    "would count: keep one (merge the two)",
                    key_node.start_mark,
                )
            lines[key] = key_node.start_mark.line


_OCTAL = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1 reads 010 as 8
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?")  # ... and 1:30 as 90


class AmbiguousNumber(yaml.constructor.ConstructorError):
    """A number YAML 1.1 reads in a base no one means: `010` as octal 8, `1:30` as base-60 90."""

    def __init__(self, written: str, parsed, mark):
        base, fix = (
            ("an octal", "without its leading 0") if _OCTAL.fullmatch(written) else ("a base-60", "as one number")
        )
        super().__init__(
            None,
            None,
            f"YAML 1.1 reads {written} as {base} number, {parsed}: write it {fix} ({parsed} if that is the one meant), "
            "or quote it to give it as text",
            mark,
        )
        self.written = written


def _number(construct):
    """A constructor of YAML numbers that refuses `AmbiguousNumber`s."""

    def number(loader: "_Loader", node: yaml.ScalarNode):
        parsed = construct(loader, node)
        if _OCTAL.fullmatch(node.value) or _SEXAGESIMAL.fullmatch(node.value):
            raise AmbiguousNumber(node.value, parsed, node.start_mark)
        return parsed

    return number


def _replace_tag(loader: _Loader, node: yaml.Node) -> _Replace:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(
            None, None, "!replace marks a mapping (a section, a student, a bundle)", node.start_mark
        )
    return _Replace(loader.construct_mapping(node, deep=True))


_Loader.add_constructor("!replace", _replace_tag)
_Loader.add_constructor("tag:yaml.org,2002:int", _number(yaml.SafeLoader.construct_yaml_int))
_Loader.add_constructor("tag:yaml.org,2002:float", _number(yaml.SafeLoader.construct_yaml_float))


def _localize(value, variables: dict[str, str], folder: Path | None, where: str):
    """`${NAME}` replaced in every string; then strings starting ~/ made absolute from the home folder and, with a
    `folder`, strings starting ./ or ../ from it."""
    if isinstance(value, dict):
        return type(value)(
            {k: _localize(v, variables, folder, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        )
    if isinstance(value, list):
        return [_localize(v, variables, folder, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(match):
        if match.group(1).startswith(settings.ENV_PREFIX) and match.group(1) not in settings.PIPELINE:
            raise RecipeError(
                f"{where}: ${{{match.group(1)}}}: {settings.ENV_PREFIX}* names are edgedistill's own settings, and "
                f"{_why_not_in_a_recipe(match.group(1))}: name the variable without that prefix"
            )
        if match.group(1) not in variables:
            raise RecipeError(
                f"{where}: unknown setting ${{{match.group(1)}}}: no environment variable of that name is set "
                f"(settings with a default: {', '.join(sorted(settings.defaults()))})"
            )
        if not variables[match.group(1)]:  # `${DATA}/train.tsv` would become `/train.tsv`, `${TEACHER}` no checkpoint
            raise RecipeError(
                f"{where}: ${{{match.group(1)}}} is set but empty: set {match.group(1)} to a value, or unset it to use "
                "a setting's default"
            )
        return variables[match.group(1)]

    # each ${NAME} read as its name: a $ before one ($${NAME}) would keep a $ before the value
    if unreplaced := _SHELL_VAR.search(_VAR.sub(lambda match: match.group(1), value)):
        raise RecipeError(
            f"{where}: {unreplaced.group(0)} would be kept as written: a recipe replaces only ${{NAME}} (no $NAME, no "
            "${NAME:-default}); write ${NAME} and set the variable"
        )
    value = settings.under_home(_VAR.sub(sub, value))
    return str((folder / value).resolve()) if folder is not None and value.startswith(settings.RELATIVE) else value


def _why_not_in_a_recipe(name: str) -> str:
    """Why a recipe's `${name}` may not name an `EDGEDISTILL_*` variable other than a pipeline setting: a server
    setting is read by the servers the measurements start, in this environment; the server refuses any other."""
    if name not in settings.SERVER:
        return "the server (and so every serving stage) refuses at start one it does not know"
    if name.removeprefix(settings.ENV_PREFIX).lower() in settings.MEASURED_SETTINGS:
        return (
            f"{name} is a server setting, which the benchmarks and load tests set for their servers themselves, and "
            "refuse in the environment"
        )
    if name.removeprefix(settings.ENV_PREFIX) in settings.MEASURED_PLAINTEXT:
        return (
            f"{name} is a server setting, which the benchmarks and load tests refuse in the environment, as they call "
            "their servers over plaintext loopback"
        )
    return (
        f"{name} is a server setting, which the servers started in this environment read (the benchmarks' and load "
        "tests' among them), so a value set for the recipe would set theirs too"
    )


def apply_override(raw: dict, dotted: str, value, given: str = "") -> None:
    """Set `raw[a][b][c] = value` for `dotted = "a.b.c"`, creating sections (`Overridden`) as needed; a null drops a
    mapping, as `key: null` does in a recipe that extends another (`_merge`): `--export.cascades=null`. `given`: what
    sets it, as errors name it (default: the override `--a.b.c`)."""
    given = given or f"override --{dotted}"
    *parents, leaf = dotted.split(".")
    node = raw
    for depth, key in enumerate(parents):
        where = ".".join(parents[: depth + 1])
        if value is None and key not in node and _drops_nothing(tuple(parents[: depth + 1]), (*parents, leaf)):
            raise RecipeError(f"override --{dotted}=null drops nothing: the recipe has no {where}")
        child = node.setdefault(key, Overridden())
        if child is None:
            raise RecipeError(
                f"{given}: the recipe sets {where} to null, so it has no {where} to set a key of: write "
                f"the {where} section in the recipe, or give it whole (--{where}={{...}})"
            )
        if not isinstance(child, dict):
            raise RecipeError(f"{given}: {where} is a setting, not a section")
        node = child
    if value is None and isinstance(node.get(leaf), dict):
        del node[leaf]
    elif value is None and _names_nothing(node, leaf, tuple(parents)):
        raise RecipeError(
            f"override --{dotted}=null drops nothing: {'.'.join(parents)} has no {leaf!r} ({', '.join(sorted(node))})"
        )
    elif value is None and leaf not in node and _is_section((*parents, leaf)):
        raise RecipeError(f"override --{dotted}=null drops nothing: the recipe has no {dotted}")
    else:
        node[leaf] = value


def parse_overrides(args: list[str]) -> dict[str, object]:
    """`["--a.b=1", "--c=x"]` -> `{"a.b": 1, "c": "x"}`; values are YAML scalars, or a mapping or list (`{lr: 1e-4}`).
    A key given twice, or inside a section given whole (`--a.b.c=1 --a.b={d: 2}`), is refused, as a key written twice
    in a recipe is (`_Loader`): which of the two counts would depend on their order."""
    out, given = {}, {}  # key -> the argument that gave it
    for index, arg in enumerate(args):
        if refusal := not_an_override(args, index):
            raise RecipeError(refusal)
        if not arg.startswith("--") or "=" not in arg:
            raise RecipeError(f"override {arg!r} must look like --section.key=value")
        key, _, value = arg[2:].partition("=")
        if clash := next((other for other in given if _overlap(key, other)), None):
            raise RecipeError(_clash(given[clash], arg))
        given[key] = arg
        if not value.strip():  # `--model.init=$CKPT` with CKPT unset: a null would build a model from scratch
            raise RecipeError(
                f"override --{key}={value and repr(value)} is empty (an unset shell variable?): give a value, or null "
                f"to unset it (--{key}=null)"
            )
        try:
            out[key] = _scalar(key, value)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or err
            raise RecipeError(
                f"override --{key}: {value!r} is not a YAML value ({problem}); {_quoting(args, index)}"
            ) from None
    return out


# the keys an override may set without a dot; extends only for load_recipe to refuse, saying why
_TOP_KEYS = (*Recipe.model_fields, "extends")
_VALUE_KEYS = ("name", "tracking")  # the recipe's keys that hold a value, not a section


def not_an_override(args: list[str], index: int, options: Iterable[str] = ()) -> str | None:
    """Why `args[index]` is not an override but a recipe key given its value after a space (`--name x`,
    `--finetune.optim.lr 5e-5`), or an option the command does not have (`--job 2`, `--job=2`, `-j 2`): naming the
    nearest of the command's `options` and the recipe's sections; None where it may be an override."""
    arg = args[index]
    key, equals, _ = arg.partition("=")
    name = key.removeprefix("--") if key.startswith("--") else None  # None: no long option's name
    value_after = index + 1 < len(args) and not args[index + 1].startswith("--")
    if name is not None and not equals and (name in _TOP_KEYS or ("." in name and value_after)):
        return f"{arg}: an override gives its value after =, not a space: {arg}=VALUE"
    if (name is not None and "." not in name and name not in _TOP_KEYS) or re.match(r"-[A-Za-z]", arg):
        near = did_you_mean(key, options) or _nearest_key(key)
        return (
            f"{key}: no such option, nor a recipe section: {near}--help lists the options, and an override is "
            "--section.key=value"
        )
    return None


def _nearest_key(option: str) -> str:
    """`did you mean --KEY=VALUE? ` (`--KEY.key=VALUE` for a section) for the recipe key nearest to `option`, or ""."""
    near = difflib.get_close_matches(option, [f"--{key}" for key in Recipe.model_fields], n=1)
    if not near:
        return ""
    return f"did you mean {near[0]}{'' if near[0][2:] in _VALUE_KEYS else '.key'}=VALUE? "


def _overlap(a: str, b: str) -> bool:
    """Whether the dotted keys `a` and `b` name one setting, or one is inside the other."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def _clash(earlier: str, later: str) -> str:
    """The error for two overrides, as given, that set one key (`_overlap`)."""
    outer, inner = sorted((earlier, later), key=lambda arg: arg.partition("=")[0].count("."))
    key, section = inner[2:].partition("=")[0], outer[2:].partition("=")[0]
    if key == section:
        return f"override --{key} is given twice ({earlier} and {later}), and only the last would count: keep one"
    return (
        f"overrides {earlier} and {later} both set {key}, as {outer} gives {section} whole, and which counts would "
        "depend on their order: keep one (merge the two)"
    )


def _quoting(args: list[str], index: int) -> str:
    """How to quote the override `args[index]`, whose value YAML cannot read: a mapping or list whole, for the shell,
    which splits one at its spaces into the arguments after it (`'--a={b: 1}'`); other text in YAML's quotes."""
    key, _, value = args[index][2:].partition("=")
    if not value.startswith(("{", "[")):
        return f"to give it as text, quote it: --{key}='\"{value}\"'"
    if pieces := list(itertools.takewhile(lambda arg: not arg.startswith("--"), args[index + 1 :])):
        return f"the shell split it at a space: quote the whole argument: '--{key}={' '.join([value, *pieces])}'"
    if _variable_in_flow(value):
        return f"{_FLOW_VARIABLE} (in YAML's quotes, within the shell's): '--{key}={_FLOW_EXAMPLE}'"
    whole = "{...}" if value.startswith("{") else "[...]"
    return f"quote the whole argument for the shell where it holds spaces: '--{key}={whole}'"


def _scalar(key: str, value: str):
    """An override's value as YAML reads it; one holding a number YAML 1.1 reads in another base
    (`AmbiguousNumber`), or ending in what YAML takes for a comment (` #...`, which it drops), is refused."""
    loader = _Loader(value)
    try:
        node = loader.get_single_node()
        parsed = None if node is None else loader.construct_document(node)
    except AmbiguousNumber as err:
        quoted = f"--{key}='\"{value}\"'" if err.written == value.strip() else f"'\"{err.written}\"'"
        raise RecipeError(f"override --{key}: {err.problem}: {quoted}") from None
    finally:
        loader.dispose()
    if (rest := value[node.end_mark.index :] if node is not None else value).strip():
        raise RecipeError(
            f"override --{key}: YAML reads {rest.strip()!r} as a comment and would drop it: quote the value to keep "
            f"it whole: --{key}='\"{value}\"'"
        )
    return parsed


def _drops_nothing(missing: tuple, target: tuple) -> bool:
    """Whether a null for `target`, under the section `missing` that the recipe lacks, drops nothing: `target` is a
    section, `missing` a new name among named sections (students, bundles, cascades) or no setting. A null for a
    setting sets it, as any other value would (`--loadtest.soak.slo.min_rate_share=null`)."""
    return (
        schema.field_at(Recipe, missing) is None or schema.names_sections(Recipe, missing[:-1]) or _is_section(target)
    )


def _is_section(loc: tuple) -> bool:
    """Whether `loc` is a section of the recipe, or a mapping of named sections (students, bundles, cascades)."""
    return schema.section_at(Recipe, loc) is not None or schema.names_sections(Recipe, loc)


def _names_nothing(node: dict, key, loc: tuple) -> bool:
    """Whether `key: null` in `node`, the mapping at `loc` of named sections (students, bundles, cascades), names one
    it lacks: it drops nothing, so the name is misspelt or stale."""
    return key not in node and schema.names_sections(Recipe, loc)


def _merge(base: dict, top: dict, where: str = "") -> dict:
    """`top` over `base`: mappings merge key by key, except those tagged `!replace`, which take the base's place,
    as lists and scalars do; `key: null` removes a key whose base value is a mapping, and sets any other to null;
    one that names nothing (`_names_nothing`) is an error."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if value is None and isinstance(below, dict):
            del out[key]
        elif value is None and _names_nothing(out, key, tuple(where.split("."))):
            raise RecipeError(f"{where}.{key}: null drops nothing: the base recipe has no {key!r} ({sorted(out)})")
        elif isinstance(value, dict) and isinstance(below, dict | None) and not isinstance(value, _Replace):
            # over nothing too: a null inside names nothing the base has (a student of a section the base lacks)
            out[key] = _merge(below or {}, value, f"{where}.{key}" if where else str(key))
        else:
            out[key] = value
    return out


def _base_path(path: Path, name) -> Path:
    """The file `extends: name` in `path` means: a path (absolute, or relative to `path`'s folder) or, for a bare
    name, the recipe of that name (`settings.find_recipe`)."""
    if not isinstance(name, str) or not name:
        raise RecipeError(f"{path}: extends must name a recipe (a path, or a recipe's name), got {name!r}")
    if "/" in name:
        base = path.parent / name
    else:
        base = (path.parent / name) if (path.parent / name).is_file() else settings.find_recipe(name, path)
    if base is None and "/" not in name and _names_itself(path, name):
        raise RecipeError(
            f"{path}: extends {name}, which names this recipe itself (no other recipe of that name is found): give the "
            "base by its path, or this recipe another name"
        )
    if base is None or not base.is_file():
        file = f"{name}.yaml"
        beside = (
            f"did you mean extends: {file}, the file {path.parent / file}? " if (path.parent / file).is_file() else ""
        )
        raise RecipeError(
            f"{path}: extends {name}, which does not exist; {beside}extends takes a path relative to the recipe, an "
            f"absolute path, or the name of a recipe ({_known()})"
        )
    return base


def _names_itself(path: Path, name: str) -> bool:
    """Whether the bare `name` that `path` extends finds `path` alone: as a recipe's name, or as the file beside it."""
    return settings.find_recipe(name) is not None or (path.parent / f"{name}.yaml").resolve() == path.resolve()


def _known() -> str:
    folders = " or ".join(str(folder) for folder in settings.recipe_folders() if folder.is_dir())
    return f"one of {', '.join(settings.recipe_names())}, from {folders}"


def _closest(path: Path) -> str:
    """`did you mean X? ` for the recipe nearest to a missing one: a file beside it (in the working directory for a
    name without a folder), else a recipe's name; '' when none is near."""
    beside = {file.stem: file for file in path.parent.glob("*.y*ml")}
    close = difflib.get_close_matches(path.stem, beside, n=1)
    if close:
        return f"did you mean {beside[close[0]]}? "
    return did_you_mean(path.stem, settings.recipe_names())


_FLOW_VARIABLE = "inside {...} or [...], quote a value that holds ${NAME}, whose { YAML reads as a mapping's"
_FLOW_EXAMPLE = '["${EDGEDISTILL_DATA_DIR}/file.txt"]'
# In one left-to-right scan, so that a `'` in a comment opens no string and a `#` in a string starts no comment: a
# YAML quoted scalar (which may hold `${` and brackets; `''` escapes a `'`), which opens where a value may start, not
# within a word (SST-2's), or a comment, which starts a line or follows a space.
_QUOTED_OR_COMMENT = re.compile(r"""(?<![^\s\[{,:])("(?:[^"\\]|\\[\s\S])*"|'(?:[^']|'')*')|(?<!\S)#[^\n]*""")


def _variable_in_flow(text: str) -> bool:
    """Whether `text` (a recipe's lines, an override's value) holds `${` unquoted inside `{...}` or `[...]`."""
    bare = _QUOTED_OR_COMMENT.sub(lambda found: '""' if found[1] else "", text)
    for variable in re.finditer(r"\$\{", bare):
        before = _VAR.sub("", bare[: variable.start()])  # the braces of a `${NAME}` open no mapping
        if before.count("{") + before.count("[") > before.count("}") + before.count("]"):
            return True
    return False


def _unquoted_variable(text: str, err: yaml.YAMLError) -> str:
    """A hint where the line YAML stopped at holds `${` unquoted inside `{...}` or `[...]` (`_FLOW_VARIABLE`), the
    brackets counted from the recipe's first line, as a list or mapping in brackets may span lines."""
    mark = getattr(err, "problem_mark", None)
    lines = text.splitlines()
    if mark is None or mark.line >= len(lines) or "${" not in lines[mark.line]:
        return ""
    return f"\n({_FLOW_VARIABLE}: {_FLOW_EXAMPLE})" if _variable_in_flow("\n".join(lines[: mark.line + 1])) else ""


def _settings_in(node: dict, prefix: str = "") -> list[str]:
    """The dotted keys of the settings (values other than mappings) a recipe's mapping writes."""
    return [
        dotted
        for key, value in node.items()
        for dotted in (_settings_in(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"])
    ]


# A column or label name written unquoted after `#` (`text_pair_column: #2 String`, MRPC's header): YAML reads a comment
# and the key as null, which for the pair column means "no pairs, on purpose". A comment (`# none`) starts with a space.
_COMMENTED_NAME = re.compile(
    r"^[ \t]*(text_column|text_pair_column|label_column|positive_label)[ \t]*:[ \t]+(#\S.*)$", re.MULTILINE
)


def _read(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict, dict[str, Path]]:
    """One recipe file, localized (see `_localize`), over the recipe it `extends` (read the same way); and the file
    each setting comes from, by dotted key."""
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise RecipeError(f"{path}: extends itself: {cycle}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not UTF-8 text ({err}): save the recipe as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_Loader) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}{_unquoted_variable(text, err)}") from err
    if commented := _COMMENTED_NAME.search(text):
        line = text.count("\n", 0, commented.start()) + 1
        raise RecipeError(
            f"{path}:{line}: data.{commented[1]}: its value starts with #, which YAML reads as a comment, so the key "
            f'is empty: quote the value ({commented[1]}: "{commented[2].strip()}"), or write null'
        )
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: the top level must be a mapping of sections")
    try:
        raw = _localize(raw, settings.variables(), path.parent.resolve(), "")
    except RecipeError as err:
        raise RecipeError(f"{path}: {err}") from None
    base_name = raw.pop("extends", None)
    written = dict.fromkeys(_settings_in(raw), path)
    if base_name is None:
        return raw, written
    base, base_written = _read(_base_path(path, base_name), (*chain, path.resolve()))
    base.pop("name", None)
    base_written.pop("name", None)
    try:
        merged = _merge(base, raw)
    except RecipeError as err:
        raise RecipeError(f"{path}: {err}") from None
    _refuse_inherited_splits(path, raw, base, merged, base_written)
    present = set(_settings_in(merged))  # not a key this recipe dropped (`key: null`, `!replace`)
    return merged, {key: source for key, source in (base_written | written).items() if key in present}


def _refuse_inherited_splits(path: Path, top: dict, base: dict, merged: dict, base_written: dict[str, Path]) -> None:
    """A recipe that sets a `data.train` of its own but takes its dev or test split from a recipe it extends would score
    its models on that recipe's task, a mistake no figure would show: refused, naming the split and the recipe it comes
    from. (Labels renamed over the base's files, or its train file named again (`_same_file`), keep its splits.)"""
    data = top.get("data") if isinstance(top.get("data"), dict) else {}
    if "train" not in data or _same_file(data["train"], (base.get("data") or {}).get("train")):
        return
    for split in ("dev", "test"):
        inherited = (merged.get("data") or {}).get(split)
        if split not in data and inherited is not None and f"data.{split}" in base_written:
            raise RecipeError(
                f"{path}: sets data.train but takes data.{split} ({inherited}) from {base_written[f'data.{split}']}, "
                f"a recipe it extends: set data.{split} in this recipe too (the same value, if that is this task's "
                f"{split} split{'; null for none' if split == 'test' else ''})"
            )


RECIPE_HELP = "recipe file, or the name of a shipped recipe: recipes/sst2.yaml, sst2"
# The override a command's help shows (as `edgedistill` names the command): a setting its own stages are built from,
# at a value no shipped recipe has. The report and the headline have none: an override only makes runs look stale.
OVERRIDE_EXAMPLES = {
    "pretrain": "pretrain.optim.lr=5e-4",
    "finetune": "finetune.optim.lr=5e-5",
    "teacher": "finetune.optim.lr=5e-5",
    "labeller": "export.opset=18",
    "transfer": "transfer.n_iter=5",
    "distill": "transfer.n_iter=5",  # it builds the transfer set first
    "bundles": "export.opset=18",
    "bench models": "bench.models.threads=4",
    "bench serving": "bench.serving.repeats=5",
    "bench accuracy": "export.tie_margin=0.05",
    "bench cascade": "bench.serving.repeats=5",
    "bench peers": "bench.peers.workers=1",
    "bench scaling": "bench.scaling.workers=[1,2,4]",
    "loadtest": "loadtest.timeout_s=30",
}


def overrides_help(command: str) -> str:
    """The line of `command`'s help that says how to override the recipe, with its `OVERRIDE_EXAMPLES` where it has
    one."""
    example = f", e.g. --{OVERRIDE_EXAMPLES[command]}" if command in OVERRIDE_EXAMPLES else ""
    return f"Further --section.key=value arguments override the recipe{example} (every key: {guide.page('settings.md', 'recipe')})."


def reads_help(command: str) -> str:
    """The line of `command`'s help that names the sections it reads, whose overrides it takes."""
    return (
        f"This command reads the sections {', '.join(sections.named(command))} (those of the stages it builds on "
        "included): an override of any other section would change nothing it does, and is refused, unless the recipe "
        "cannot load without it."
    )


def add_recipe_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """The positional `recipe`, and the lines of the help that say how `command` (as `edgedistill` names it, e.g.
    `bench serving`) takes overrides."""
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.not_an_override = not_an_override  # a `common.arguments.ArgumentParser` refuses what is none
    parser.formatter_class = WholeWordsHelp  # the epilog names a page of the docs, a path
    parser.epilog = " ".join(filter(None, [parser.epilog, overrides_help(command), reads_help(command)]))


def load_recipe(path: str | Path, overrides: dict[str, object] | None = None) -> Recipe:
    """Read, expand and validate a recipe; errors name the file and the offending key."""
    path = Path(path)
    if not path.is_file() and len(path.parts) == 1:
        path = settings.find_recipe(path.name) or path
    if path.is_dir():
        held = [str(file) for file in sorted(path.glob("*.yaml"))]
        raise RecipeError(
            f"recipe {path} is a folder: give one of its recipe files ({first_of(held)})"
            if held
            else f"recipe {path} is a folder, with no recipe (*.yaml) in it: give a recipe file, or the name of a "
            f"recipe ({_known()})"
        )
    if not path.is_file():
        raise RecipeError(
            f"recipe {path} does not exist: {_closest(path)}give a recipe file, or the name of a recipe ({_known()})"
        )
    raw, written = _read(path)
    settings.refuse_unknown_variables()  # after `_read`, whose errors name the `${EDGEDISTILL_*}` a recipe misuses
    progress.mode(), progress.interval()  # a bad progress setting stops the command now, not at its first bar
    origins = _origins(written, path)
    if "name" not in raw:
        raw["name"] = path.stem
        origins["name"] = f" (the run's name, from the file name {path.stem!r}: rename the file, or set name:)"
    variables = settings.variables()
    written_train = (raw.get("data") or {}).get("train") if isinstance(raw.get("data"), dict) else None
    for key, value in (overrides or {}).items():
        if key == "extends":
            raise RecipeError(
                f"{path}: override --extends: a recipe file names the recipe it extends (`extends:`), which the "
                "command line cannot change: write a recipe that extends the one meant"
            )
        try:
            apply_override(raw, key, _localize(value, variables, None, f"override --{key}"))
        except RecipeError as err:
            raise RecipeError(f"{path}: {err}") from None
        for end in range(1, key.count(".") + 2):  # the setting, and the sections it is in, which it now writes
            origins.pop(".".join(key.split(".")[:end]), None)
    _refuse_kept_splits(path, overrides or {}, written_train, raw)
    # after the command line's overrides, which win only where they set the key: `--runtime={precision: fp32}`
    # keeps EDGEDISTILL_DEVICE
    for variable, key in settings.ENV_OVERRIDES.items():
        if os.environ.get(variable) and not _sets(overrides or {}, key):
            given = f"{variable}={os.environ[variable]}, which sets {key}"
            try:
                apply_override(raw, key, os.environ[variable], given)
            except RecipeError as err:
                raise RecipeError(f"{path}: {err}") from None
            origins[key] = settings.env_source(key)
    try:
        return Recipe.model_validate(raw)
    except ValidationError as err:
        problems = [_problem(e, origins, list(overrides or {}), raw) for e in err.errors()]
        raise RecipeError(f"{path}: {'; '.join(problems)}") from None


def _refuse_kept_splits(path: Path, overrides: dict[str, object], written_train: object, raw: dict) -> None:
    """An override of `data.train` that keeps the recipe's dev or test split would score the models on the recipe's
    task, as `_refuse_inherited_splits` says of a recipe: refused, naming the split, unless an override sets it too."""
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    if not _sets(overrides, "data.train") or _same_file(data.get("train"), written_train):
        return
    for split in ("dev", "test"):
        if data.get(split) is not None and not _sets(overrides, f"data.{split}"):
            raise RecipeError(
                f"{path}: --data.train replaces the recipe's data.train but keeps its data.{split} ({data[split]}), "
                f"which would score the models on the recipe's task: give --data.{split} too (the same value, if that "
                f"is this task's {split} split{'; null for none' if split == 'test' else ''})"
            )


def _same_file(a: object, b: object) -> bool:
    """Whether two values of `data.train` name one file: as written, as the same path written otherwise (`./a.tsv`,
    `data//a.tsv`), or through a link."""
    if a == b:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return os.path.normpath(a) == os.path.normpath(b) or os.path.samefile(a, b)
    except OSError:  # either is not a file here: a Hub dataset's name, or a path to be made
        return False


def _sets(overrides: dict[str, object], dotted: str) -> bool:
    """Whether `overrides` set the key `dotted`: by its name, or in a mapping given for a section above it."""
    for key, value in overrides.items():
        if key == dotted:
            return True
        if dotted.startswith(f"{key}.") and isinstance(value, dict):
            node = value
            *parents, leaf = dotted.removeprefix(f"{key}.").split(".")
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and leaf in node:
                return True
    return False


def needless(path: str | Path, overrides: dict[str, object], keys) -> list[str]:
    """Those of `keys` (of `overrides`) that the recipe loads without, all left out together: each is left out in turn
    while the recipe still loads without it and those left out before it, until no more can be. One the recipe needs
    beside the overrides kept stays, as `--distill.students.extra.model.arch=cnn` does beside
    `--export.bundles.cnn-folded.source=extra`; one needed only beside another that is left out goes with it, as that
    student does with `--distill.deploy=extra`."""
    kept = dict(overrides)
    left_out = True
    while left_out:
        left_out = False
        for key in [key for key in keys if key in kept]:
            rest = {other: value for other, value in kept.items() if other != key}
            try:
                load_recipe(path, rest)
            except RecipeError:
                continue
            kept, left_out = rest, True
    return [key for key in keys if key not in kept]


def unread(path: str | Path, overrides: dict[str, object], command: str) -> list[str]:
    """The overrides of sections `command` does not read (`common.sections`) that the recipe loads without
    (`needless`): each would change nothing the command does."""
    return needless(path, overrides, sections.outside(overrides, command))


def load_command_recipe(path: str | Path, overrides: dict[str, object], command: str, label: str) -> Recipe:
    """`load_recipe` for `command` (as `edgedistill` names it; `label`: as it was run): an override of a section it
    does not read is refused (`RecipeError`), before any work. Environment variables that set recipe keys
    (`settings.ENV_OVERRIDES`) apply to every command and are not checked."""
    recipe = load_recipe(path, overrides)
    if refused := unread(path, overrides, command):
        read = ", ".join(sections.reads(command))
        raise RecipeError(
            "; ".join(
                f"--{key}: {label} reads no {sections.scope(key, command)} setting (it reads {read}), so the override "
                f"would change nothing: drop it{_read_by(key)}"
                for key in refused
            )
        )
    return recipe


def _read_by(key: str) -> str:
    """Where a refused override of a shared section's part belongs (`, or give it to edgedistill bench peers`): the
    commands that read that part alone, which are few, where those that read its whole section are most of them."""
    section = key.partition(".")[0]
    readers = [command for command in sections.readers(key) if section not in sections.reads(command)]
    return f", or give it to {' or '.join(f'edgedistill {command}' for command in readers)}" if readers else ""


def _origins(written: dict[str, Path], path: Path) -> dict[str, str]:
    """Key -> where its value came from, for errors, where the recipe file `path` does not hold it: each setting a
    recipe it extends wrote, and each section all of whose settings one such recipe wrote (an unknown key in it is
    named by the section)."""
    inside: dict[str, set[Path]] = {}  # a setting or section -> the files that wrote what it holds
    for key, base in written.items():
        parts = key.split(".")
        for end in range(1, len(parts) + 1):
            inside.setdefault(".".join(parts[:end]), set()).add(base)
    return {
        key: f" ({key} comes from {next(iter(bases))}, which this recipe extends)"
        for key, bases in inside.items()
        if len(bases) == 1 and path not in bases
    }


def _problem(error: dict, origins: dict[str, str], given: list[str], raw: dict) -> str:
    """One validation error as `key: message`, with where its value came from (`_source`); a rule's message that
    starts with the keys it checks stands alone."""
    # the mapping, not the name YAML misread
    loc = error["loc"][:-2] if _unquoted_name(error) else error["loc"][:-1] if _unquoted_key(error) else error["loc"]
    key = ".".join(str(p) for p in loc if p != "[key]")  # a name in a mapping of named sections
    message = _message(error)
    if message.startswith(key):  # a rule's: the setting it names first is the one at fault
        return message + _source(re.match(r"[\w.-]*", message).group(), error, origins, given, raw)
    return f"{key}: {message}" + _source(key, error, origins, given, raw)


def _source(key: str, error: dict, origins: dict[str, str], given: list[str], raw: dict) -> str:
    """Where the value at `key` came from, for its error: the overrides `given` that set it (or a mapping above it),
    that made the section it is in where the recipe has none (`_made`), or that set keys under it; else the recipe
    it comes from, or the names a named section has."""
    if setting := [override for override in given if override == key or key.startswith(f"{override}.")]:
        return f" ({_flags(setting)} on the command line)"
    if made := _made(key, error, given, raw):
        return made
    if under := [override for override in given if override.startswith(f"{key}.")]:
        return f" ({_flags(under)} on the command line)"
    return origins.get(key, "") + _new_entry(error, raw)


def _made(key: str, error: dict, given: list[str], raw: dict) -> str:
    """For an error at or under a section the recipe lacks, which overrides made (`Overridden`): those overrides,
    and under it, the name meant (`--distill.students.cnnn.optim.lr` for student cnn), or that the recipe has no such
    section (or which named ones it has) and what the one made lacks; else ""."""
    parts = key.split(".")
    parent, node, end = None, raw, 0
    while end < len(parts) and isinstance(node, dict) and not isinstance(node, Overridden):
        parent, node, end = node, node.get(parts[end]), end + 1
    if not isinstance(node, Overridden):
        return ""
    section, (*above, name) = ".".join(parts[:end]), parts[:end]
    if not (makers := _flags([override for override in given if override.startswith(f"{section}.")])):
        return ""  # made by an environment variable
    if end == len(parts):
        return f" ({makers} on the command line made it a section)"
    known = [str(other) for other, value in parent.items() if not isinstance(value, Overridden)]
    named = schema.names_sections(Recipe, tuple(above))
    if (named or schema.field_at(Recipe, tuple(parts[:end])) is None) and (near := did_you_mean(name, known)):
        return f" ({makers} made it: {'.'.join(above) or 'the recipe'} has no {name}; {near.rstrip()})"
    lacks = (
        f"the recipe's {'.'.join(above)} are {first_of(known)}"
        if named and known
        else f"the recipe has no {section} section"
    )
    needs = f", which needs its {'.'.join(parts[end:])}" if error["type"] == "missing" else ""
    return f" ({lacks}: {makers} on the command line made {name if named else 'one'}{needs})"


def _flags(keys: list[str]) -> str:
    """Overrides' keys as given: `--a.b and --a.c`."""
    return " and ".join(f"--{key}" for key in keys)


def _new_entry(error: dict, raw: dict) -> str:
    """For a required setting a named section lacks (`distill.students.bilsm.model`), the names the recipe has, as the
    name may be a misspelt one (a recipe file's `bilsm:` for `bilstm:`); else ""."""
    loc = error["loc"]
    if error["type"] != "missing" or len(loc) < 3 or not schema.names_sections(Recipe, loc[:-2]):
        return ""
    node = raw
    for part in loc[:-2]:
        node = node.get(part) if isinstance(node, dict) else None
    known = [str(name) for name, entry in (node or {}).items() if isinstance(entry, dict) and loc[-1] in entry]
    if not known:
        return ""
    section = ".".join(str(part) for part in loc[:-2])
    return (
        f" ({did_you_mean(str(loc[-2]), known)}the recipe's {section} are {first_of(known)}, and a new one needs "
        f"its {loc[-1]})"
    )


def _message(error: dict) -> str:
    """Pydantic's message, or where it names no valid value: for an unknown key, the nearest known one and every key
    its section takes; for a value off a pattern, the values the setting's description gives; for a whole number YAML
    1.1 read as text (`5e4`), the number written out."""
    loc = error["loc"]
    if error["type"] == "extra_forbidden" and (section := schema.section_at(Recipe, loc[:-1])):
        keys = list(section.model_fields) + ([] if loc[:-1] else ["extends"])  # read before the schema sees the rest
        if section is StudentConfig:  # the stage sets these, and refuses them in a recipe
            keys = [key for key in keys if key not in STUDENT_FROM_DATA]
        where = ".".join(str(p) for p in loc[:-1]) or "a recipe"
        return f"unknown key: {did_you_mean(str(loc[-1]), keys)}{where} takes {', '.join(keys)}"
    if error["type"] == "string_pattern_mismatch" and loc[-1] == "[key]":
        return f"{error['input']!r} is not a valid name: give {NAME_RULE} (it names a folder and a dotted key)"
    if _unquoted_name(error) or _unquoted_key(error):
        name = error["input"]
        kind = "boolean" if isinstance(name, bool) else "number" if isinstance(name, int | float) else "null"
        what = "name" if _unquoted_name(error) else "key"
        written = yaml_word(name) if isinstance(name, bool) else "null" if name is None else name
        return f'a {what} read as a {kind}, {name!r}: {UNQUOTED}; quote it ("{written}": for {written}:)'
    if error["type"] == "string_type" and isinstance(error["input"], bool | int | float | datetime.date):
        if (off := _off_pattern(loc, error["input"])) is not None:  # quoted, it would be refused all the same
            return off
        return _read_as(error["input"], ".".join(str(p) for p in loc if p != "[key]"))
    if (error["type"] == "missing" or error["type"] == "too_short" and not error["input"]) and schema.names_sections(
        Recipe, loc
    ):
        section = ".".join(str(p) for p in loc[:-1])
        return f"none left: give at least one, or drop the section to build none ({section}: null)"
    if error["type"] == "int_parsing" and (whole := _whole_number(error["input"])) is not None:
        return (
            f"YAML 1.1 reads {error['input']} as text, not a number (a number with an exponent needs a dot and a "
            f"signed exponent: 5.0e+4): write it out, {whole}"
        )
    field = schema.field_at(Recipe, loc)
    if error["type"] == "string_pattern_mismatch" and field and field.description:
        return f"{error['input']!r} is not valid: give {field.description}"
    return error["msg"].removeprefix("Value error, ")


def _whole_number(text) -> int | None:
    """The whole number `text` writes with an exponent (`5e4`, `1.5e1`), which YAML 1.1 reads as text; else None."""
    try:
        number = float(text)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _off_pattern(loc: tuple, value) -> str | None:
    """For a value YAML read as another type whose text the setting's pattern refuses too (`runtime.device: 0`): the
    values its description gives; None where quoting it would do."""
    field = schema.field_at(Recipe, loc)
    pattern = next((rule.pattern for rule in field.metadata if getattr(rule, "pattern", None)), None) if field else None
    if pattern is None or not field.description or re.fullmatch(pattern, str(value)):
        return None
    return f"{value!r} is not valid: give {field.description}"


def _read_as(value, key: str) -> str:
    """The error for text that YAML read as another type (`name: 2024-01-01`, `deploy: on`): how to quote it."""
    kind = "boolean" if isinstance(value, bool) else "date" if isinstance(value, datetime.date) else "number"
    written = yaml_word(value) if isinstance(value, bool) else value.isoformat() if kind == "date" else value
    shown = written if kind == "date" else repr(value)
    example = quoted(key, f'"{written}"')
    return f"{shown} is a {kind} to YAML, not text: {UNQUOTED}, and dates too; quote it as written, e.g. {example}"


def _unquoted_name(error: dict) -> bool:
    """Whether `error` is of a name in a mapping of named sections (a student, a bundle) that YAML read as a boolean,
    null or a number (`on:`, `1:`)."""
    return error["loc"][-1:] == ("[key]",) and error["type"] == "string_type"


def _unquoted_key(error: dict) -> bool:
    """Whether `error` is of a section's key that YAML read as a boolean, null or a number (`yes:`): pydantic names
    it by its value (1 for true)."""
    return error["type"] == "invalid_key"


def run_dir(recipe: Recipe) -> Path:
    """`runs/<recipe>/`, the folder every stage of this recipe writes into; `SettingError` where a file stands in the
    way of the runs folder."""
    runs = Path(settings.defaults()["EDGEDISTILL_RUNS_DIR"])
    if (file := file_in_the_way(runs)) is not None:
        raise settings.SettingError(
            f"{settings.env_name('EDGEDISTILL_RUNS_DIR')} {runs}: {file} is a file, not a folder: name the folder the runs go in (made where "
            "missing)"
        )
    return runs / recipe.name
