"""Model cards: `README.md` with the Hub's metadata header for every model artifact, written from its manifest.

The teacher, each student and baseline, and each bundle get a card: task and labels, data, how the
model was made (teacher, distillation losses and temperature), its figures (dev and test metrics,
retention against the teacher, size, parity of a bundle with its source, latency from the model
benchmark's `bench.json` once it exists, while neither the model nor the teacher was built again since), and how to load or serve it. A card is derived, like the
report: `common.stage` writes it when a model stage publishes (or is found current without one), the report stage rewrites the card of every model of
the run that is of the recipe as it is now (`recipe_change`: the card draws labels, data and pooling from the recipe),
and the manifest does not hash it (`manifest.CARD`).
"""

import json
import shlex
from pathlib import Path

from edgedistill.common import manifest as mf
from edgedistill.common import tables
from edgedistill.common.atomic import atomic_write
from edgedistill.common.data import HubSource
from edgedistill.common.providers import CPU, CUDA, cuda_options
from edgedistill.common.recipe import Recipe, run_dir
from huggingface_hub import ModelCard, ModelCardData

BENCH_FILE = Path("bench") / "bench.json"  # the model benchmark (`bench.models`), when it has run
TEACHER_ROW = "teacher-pytorch-eager"  # the teacher's row in bench.json, which `bench.models` names so
METRICS = {"accuracy": "accuracy", "macro_f1": "f1", "f1": "f1"}  # recipe metric -> Hub metric id
RUNTIMES = {  # a bundle's runtime -> its Hub library (and tag), and how a card's first line names it
    "onnxruntime": ("onnx", "An ONNX Runtime"),
    "tensorrt": ("tensorrt", "A TensorRT"),
}


def is_model(stage: str) -> bool:
    """Whether a stage's artifact is a model: the teacher, a student, a baseline or a bundle."""
    return stage == "teacher" or stage.startswith(("student-", "baseline-", "bundle-"))


def _kind(stage: str) -> str:
    return "teacher" if stage == "teacher" else stage.split("-", 1)[0]


def _dataset(source: str) -> str:
    """A data source as the card names it: the Hub id of a Hub source's dataset (`HubSource`), else the file."""
    return HubSource.parse(source).dataset if source.startswith("hub:") else Path(source).name


def _header(recipe: Recipe, stage: str, info: dict) -> ModelCardData:
    kind = _kind(stage)
    tags = ["text-classification", recipe.name]
    if kind in ("student", "bundle"):
        tags.append("knowledge-distillation")
    library = {"teacher": "transformers"}.get(kind, "edgedistill")  # a cascade is edgedistill's, whatever its members
    if kind == "bundle" and "bundle" in info:
        library = RUNTIMES[info["bundle"]["runtime"]][0]
        tags += [library, info["bundle"]["precision"]]
    init = recipe.model.init
    hub_init = init is not None and not Path(init).exists()  # a local folder is no Hub model
    sources = (recipe.data.train, recipe.data.dev, recipe.data.test)
    hub_data = [_dataset(s) for s in sources if s is not None and s.startswith("hub:")]
    return ModelCardData(
        model_name=f"{recipe.name}-{stage}",
        license="apache-2.0",
        library_name=library,
        pipeline_tag="text-classification",
        tags=tags,
        datasets=sorted(set(hub_data)) or None,
        metrics=sorted({"accuracy", METRICS[recipe.data.metric]}),
        base_model=init if kind == "teacher" and hub_init else None,
    )


def _figure(key: str, value) -> str:
    """A figure of the results table: a float to 4 decimals, but a difference (`max_abs_diff`) or a figure under 1e-3
    to 3 significant digits, so that a small one does not read as 0."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.3g}" if key == "max_abs_diff" or 0 < abs(value) < 1e-3 else f"{value:.4f}"


def _results(metrics: dict) -> list[str]:
    keys = [k for k in metrics if k.startswith(("dev_", "test_", "torch_dev_")) and not k.endswith("_confusion")]
    extra = ("retention", "agreement", "max_abs_diff", "params", "expected_escalated", "calibration_agreement")
    keys += [k for k in extra if k in metrics]
    lines = tables.markdown(["figure", "value"], [[k, _figure(k, metrics[k])] for k in keys])
    if "size_bytes" in metrics:
        lines.append(f"| size | {metrics['size_bytes'] / 2**20:.1f} MiB |")
    return lines


def bench_change(run: Path, stage: str) -> str | None:
    """Why the model benchmark's row of the artifact `stage` (the teacher, or `bundle-<id>`) in the run folder `run`
    is not of the one there now: it, or the teacher every speedup is against, was built again since the benchmark
    ran, or is gone (`common.manifest.parent_change`); None when it is."""
    bench = mf.load(run / BENCH_FILE.parent, verify=False)
    return mf.parent_change(bench, {name: run / name for name in ("teacher", stage)})


def _latency(recipe: Recipe, stage: str) -> list[str]:
    """The model benchmark's cells for this model, the teacher in PyTorch eager or a bundle, while they are of the
    artifact now in the run (`bench_change`)."""
    run = run_dir(recipe)
    path = run / BENCH_FILE
    if not path.is_file() or not (stage == "teacher" or stage.startswith("bundle-")) or bench_change(run, stage):
        return []
    bench = json.loads(path.read_text(encoding="utf-8"))
    name = TEACHER_ROW if stage == "teacher" else stage.removeprefix("bundle-")
    row = next((r for r in bench["rows"] if r["model"] == name), None)
    if row is None:
        return []
    cells, cut = [], ""
    for c in row["cells"]:
        timed = c.get("timed_length", c["length"])  # a bench.json written before cells recorded it: as long
        tokens = str(c["length"])
        if timed != c["length"]:
            tokens += f" (cut to {timed})"
            cut = (
                " Where the benchmark asks for more tokens than the bundle's max_length, it is timed at its max_length "
                "(cut to), with no speedup against the teacher at the longer length."
            )
        speedup = "-" if c["speedup"] is None else f"{c['speedup']:.1f}x"
        cells.append([str(c["batch"]), tokens, f"{c['median_ms']:.2f}", speedup])
    lines = [
        "## Latency",
        "",
        f"From the model benchmark (`edgedistill bench models`, {tables.counted(bench['threads'], 'intra-op thread')}, "
        f"{row['runtime']}); median ms per call, speedup against the teacher in PyTorch eager on the CPU.{cut}",
        "",
        *tables.markdown(["batch", "tokens", "median ms", "speedup"], cells),
    ]
    return [*lines, ""]


def cascade_members(info: dict) -> tuple[list[str], list[list[str]]]:
    """A cascade manifest's `info` -> the headers and rows of its members' table: threshold, temperature, the share of
    dev each answered and its dev accuracy alone."""
    headers = ["member", "threshold", "temperature", "dev share answered", "dev accuracy alone"]
    rows = [
        [
            member["bundle"],
            "-" if member["threshold"] is None else f"{member['threshold']:.4f}",
            f"{member['temperature']:.2f}",
            f"{info['dev_answered_share'][member['bundle']]:.1%}",
            f"{info['member_dev_accuracy'][member['bundle']]:.4f}",
        ]
        for member in info["cascade"]["members"]
    ]
    return headers, rows


def _making(recipe: Recipe, stage: str, info: dict) -> list[str]:
    """How the model was made: the teacher's start, a student's distillation, a bundle's export."""
    kind = _kind(stage)
    if kind == "teacher":
        if recipe.model.init is None:
            start = "a model pretrained from scratch by the pipeline"
        elif recipe.pretrain is None:
            start = f"`{recipe.model.init}`"
        else:
            objective = "masked-LM" if recipe.model.family == "bert" else "causal-LM"
            start = f"`{recipe.model.init}` after further {objective} pretraining by the pipeline"
        return [f"A {recipe.model.family} classifier fine-tuned from {start} ({info.get('steps')} steps)."]
    if kind in ("student", "baseline"):
        losses = info["losses"]
        terms = ", ".join(f"{name} {weight:g}" for name, weight in losses.items() if weight)
        if kind == "student":
            made = f"Distilled from `{run_dir(recipe) / 'teacher'}` on its transfer set, loss weights {terms}"
            if losses["kd"]:
                made += f", temperature {info['temperature']:g}"
        else:
            made = f"The label-only baseline of the distilled student: labelled examples alone ({terms})"
        # what distill.students.init_from_teacher copies: a transformer's blocks too
        copied = "embeddings and evenly spaced layers" if info["arch"] == "transformer" else "embeddings"
        start = f"the teacher's {copied}" if info["init_from_teacher"] else "random weights"
        return [
            f"A {info['arch']} student. {made}; {info['train_examples']} examples, {info['steps']} steps, "
            f"started from {start}."
        ]
    if "cascade" in info:
        members = ", ".join(f"`{m['bundle']}`" for m in info["cascade"]["members"])
        headers, rows = cascade_members(info)
        return [
            f"A confidence cascade of the bundles {members}: each member but the last answers the texts whose "
            f"confidence (`{info['cascade']['rule']}` at its temperature) reaches its threshold and passes the rest "
            "on; the last answers what reaches it.",
            "",
            *tables.markdown(headers, rows),
        ]
    spec = info["bundle"]
    source = run_dir(recipe) / ("teacher" if info["source"] == "teacher" else f"student-{info['source']}")
    return [
        f"{RUNTIMES[spec['runtime']][1]} bundle ({spec['precision']}, opset {spec['opset']}) exported from "
        f"`{source}` and checked against it on the dev set (parity figures below)."
    ]


FROM_SEQUENCE_IDS = "from edgedistill.common.segments import from_sequence_ids"
TOKENISE = "from edgedistill.common.textstyle import tokenise"


def _tokenized(pairs: bool, derived: bool, ptb: bool, cut: str, tensors: str) -> list[str]:
    """Code tokenizing a text, or a text and its pair, into `batch` (`tensors` "pt" or "np", cut by the arguments
    `cut`), written first as the model learnt them where `ptb` (`TOKENISE`), a pair's segment ids as training made
    them: the tokenizer's token types, or, `derived`, from its sequence ids (`common.segments`)."""
    texts = ['"a text"', '"its pair"'] if pairs else ['"a text"']
    texts = [f"[tokenise({text})]" if ptb else f"[{text}]" for text in texts]
    written = ['# text_style ptb_lower: "A gripping, funny film." is written "a gripping , funny film ."']
    code = [*(written if ptb else []), f'batch = tokenizer({", ".join(texts)}, {cut}, return_tensors="{tensors}")']
    if derived:
        array = "torch.tensor" if tensors == "pt" else "np.array"
        code += [
            "# the tokenizer gives no token type 1: sentence B's segment ids come from its sequence ids, as in training",
            f'batch["token_type_ids"] = {array}('
            '[from_sequence_ids(batch.sequence_ids(i)) for i in range(len(batch["input_ids"]))])',
        ]
    return code


def _usage(recipe: Recipe, stage: str, info: dict) -> list[str]:
    folder = run_dir(recipe) / stage
    kind = _kind(stage)
    ptb = _text_style(recipe, info) == "ptb_lower"
    if kind == "teacher":
        registers = ["import edgedistill.distill.heads  # registers the mean-pooled head"]
        code = [
            *(registers if recipe.finetune.pooling == "mean" else []),
            *([TOKENISE] if ptb else []),
            "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
            "",
            f'model = AutoModelForSequenceClassification.from_pretrained("{folder}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            # a pair's token types as the tokenizer gives them, which the teacher trained on
            *_tokenized(recipe.data.pairs, False, ptb, f"truncation=True, max_length={recipe.model.max_length}", "pt"),
            "logits = model(**batch).logits",
        ]
    elif kind in ("student", "baseline"):
        derived = recipe.data.pairs and info.get("pair_segments") == "sequence_ids"
        types = 'batch["token_type_ids"]' if recipe.data.pairs else 'batch.get("token_type_ids")'
        code = [
            *(["import torch", FROM_SEQUENCE_IDS] if derived else []),
            *([TOKENISE] if ptb else []),
            "from edgedistill.distill.students import Student",
            "from transformers import AutoTokenizer",
            "",
            f'model = Student.from_pretrained("{folder}")  # or a Hub repository it was pushed to',
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            "# cut as training, evaluation and the server cut: a Transformer student has no position beyond it",
            *_tokenized(recipe.data.pairs, derived, ptb, "truncation=True, max_length=model.config.max_length", "pt"),
            f'logits = model(batch["input_ids"], batch["attention_mask"], {types})',
        ]
    else:
        bundle = shlex.quote(str(folder))  # one word to the shell, whatever the runs folder's name holds
        served = ["Serve it over gRPC (KServe v2 and the classifier API):", "", "```bash"]
        served.append(f"edgedistill serve --bundle {bundle}")
        if bundle == str(folder):  # make splits a path with spaces or quotes into words
            served.append(f"make serve BUNDLE={bundle}  # in a checkout")
        served.append("```")
        spec = info.get("bundle", {})
        if spec.get("runtime") != "onnxruntime":  # a cascade, or a TensorRT engine
            return served
        # As the server opens it: on the providers it was built for (a GPU bundle would otherwise run on the CPU),
        # CUDA's with the server's options (TF32 off for an fp32 model, as it was checked), without the optimizers it
        # turns off (they would undo a build choice on load: docs/export.md).
        providers = [(name, cuda_options(spec["precision"])) if name == CUDA else name for name in spec["providers"]]
        options = f", providers={providers}" if spec["providers"] != [CPU] else ""
        options += f", disabled_optimizers={spec['disabled_optimizers']}" if spec.get("disabled_optimizers") else ""
        derived = recipe.data.pairs and spec.get("pair_segments") == "sequence_ids"
        return [
            *served,
            "",
            "Or run it in ONNX Runtime with the tokenizer files beside it (`config.json` holds the labels; "
            "docs/export.md says where optimum's `ORTModelForSequenceClassification` stands):",
            "",
            "```python",
            *(["import numpy as np"] if derived else []),
            "import onnxruntime as ort",
            *([FROM_SEQUENCE_IDS] if derived else []),
            *([TOKENISE] if ptb else []),
            "from transformers import AutoTokenizer",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            f'session = ort.InferenceSession("{folder}/{spec["model_file"]}"{options})',
            *_tokenized(recipe.data.pairs, derived, ptb, "truncation=True", "np"),
            'logits = session.run(["logits"], {i.name: batch[i.name] for i in session.get_inputs()})[0]',
            "```",
        ]
    return ["```python", *code, "```"]


def _text_style(recipe: Recipe, info: dict) -> str:
    """How the model's training text was written: as a bundle's spec records it (the server writes texts so), else
    as the recipe's `transfer.text_style`."""
    return info["bundle"].get("text_style", "raw") if "bundle" in info else recipe.text_style


def _style(recipe: Recipe, info: dict) -> list[str]:
    """How to write texts for the model, where its training text was written otherwise than people write."""
    if _text_style(recipe, info) != "ptb_lower":
        return []
    return [
        "The model learnt from lower-cased, PTB-tokenised text (`do n't stop .`), and reads `don't` otherwise than "
        "`do n't`: write texts so before the tokenizer, with `edgedistill.common.textstyle.tokenise`, as the server "
        "does.",
        "",
    ]


def card(recipe: Recipe, folder: Path) -> ModelCard:
    """The card of the model artifact in `folder`, from its manifest (and the benchmark, if it has run)."""
    manifest = mf.load(folder, verify=False)
    stage, info, metrics = manifest.stage, manifest.info, manifest.metrics
    labels = info["bundle"]["labels"] if "bundle" in info else recipe.data.label_names
    splits = {"train": recipe.data.train, "dev": recipe.data.dev, "test": recipe.data.test}
    data = ", ".join(f"{split} `{_dataset(source)}`" for split, source in splits.items() if source)
    body = [
        f"# {recipe.name}-{stage}",
        "",
        *_making(recipe, stage, info),
        "",
        "## Task",
        "",
        f"Text classification{' of sentence pairs' if recipe.data.pairs else ''} into {len(labels)} labels: "
        + ", ".join(f"`{label}`" for label in labels)
        + f". Data: {data}.",
        "",
        "## Results",
        "",
        f"From `{mf.MANIFEST}` (recipe `{recipe.name}`, hash `{manifest.recipe_hash}`); "
        + (
            "unlabelled calibration texts, neither dev nor test, chose the thresholds."
            if "cascade" in info
            else f"dev {recipe.data.metric} chose the checkpoint."
        ),
        "",
        *_results(metrics),
        "",
        *_latency(recipe, stage),
        "## How to use",
        "",
        *_usage(recipe, stage, info),
        "",
        *_style(recipe, info),
    ]
    header = _header(recipe, stage, info).to_yaml()
    return ModelCard(f"---\n{header}\n---\n\n" + "\n".join(body))


def write(recipe: Recipe, folder: Path) -> Path | None:
    """Write `folder/README.md` if `folder` holds a model artifact (teacher, student, baseline, bundle); other
    stages have no card. Returns the card's path, or None."""
    folder = Path(folder)
    if not is_model(mf.load(folder, verify=False).stage):
        return None
    path = folder / mf.CARD
    atomic_write(path, str(card(recipe, folder)))
    return path


def _parents(folder: Path) -> list[Path]:
    """The folders, beside `folder` in its run folder, of the artifacts the one in `folder` was built from."""
    return list(mf.beside(folder, mf.load(folder, verify=False)).values())


def settings_change(recipe: Recipe, folder: Path) -> str | None:
    """Why the artifact in `folder` is not of `recipe`'s settings as they are now: it, or an artifact it was built from
    still in the run folder, records settings that the recipe now has otherwise (the recipe edited since, and the
    stage not built again); None when none does. A student or baseline records its own settings, the fields of its
    spec it reads, in `extra` beside its folder layout (`distill.stages.student`): those fields are compared with
    `distill.students.<name>`."""
    hashed = mf.load(folder, verify=False).hashed  # a manifest of an older release records none
    recorded = hashed.get("settings", {})
    now = _settings_now(recipe, *recorded)
    if _kind(folder.name) in ("student", "baseline"):
        key = f"distill.students.{folder.name.split('-', 1)[1]}"
        spec = _settings_now(recipe, key).get(key, {})
        recorded = recorded | {field: value for field, value in hashed.get("extra", {}).items() if field in spec}
        now = now | spec
    if changed := [key for key in recorded if now.get(key) != recorded[key]]:
        was, is_now = ({"settings": {key: values.get(key) for key in changed}} for values in (recorded, now))
        return f"{folder.name} was built with other {', '.join(changed)} settings ({mf.changes(was, is_now)})"
    built = (parent for parent in _parents(folder) if (parent / mf.MANIFEST).is_file())
    return next((why for parent in built if (why := settings_change(recipe, parent))), None)


def _settings_now(recipe: Recipe, *keys: str) -> dict:
    """`recipe.settings(*keys)`, or none where the recipe no longer has one of them (a bundle or a student taken out of
    it, or its section)."""
    try:
        return recipe.settings(*keys)
    except KeyError:
        return {}


def _built_again(folder: Path) -> str | None:
    """Why the artifact in `folder`, or one it was built from, was built from an artifact of the run folder built
    again since or gone (`common.manifest.built_from_others`); None when none was."""
    if why := mf.built_from_others(folder):
        return f"{folder.name}: {why}"
    return next((why for parent in _parents(folder) if (why := _built_again(parent))), None)


def recipe_change(recipe: Recipe, folder: Path) -> str | None:
    """Why the artifact in `folder` is not of `recipe` as it is now, so that a card drawing labels, data, pooling and
    lengths from the recipe would misdescribe it: it, or an artifact it was built from, records settings that the
    recipe now has otherwise (`settings_change`), or such an artifact in the run folder was built again since or is
    gone; None when it is of the recipe."""
    return settings_change(recipe, folder) or _built_again(folder)


def refresh(recipe: Recipe) -> list[Path]:
    """Rewrite the card of every finished model artifact of the recipe's run that is of the recipe as it is now (the
    benchmark may have run since); the card of one built before the recipe changed (`recipe_change`) is left as its
    build wrote it, of the recipe it was built from."""
    written = []
    for folder in mf.finished(run_dir(recipe)):
        if not is_model(mf.load(folder, verify=False).stage):
            continue
        if why := recipe_change(recipe, folder):
            print(f"[{folder.name}] card left as written, of the recipe it was built from: {why}")
        else:
            written.append(write(recipe, folder))
    return written
