"""Build the bundles of a recipe: `runs/<recipe>/bundle-<id>/`, the only thing the server reads.

Each bundle is exported from its source artifact (teacher or student), optionally fused and
quantized, checked against PyTorch on the dev set and at odd shapes, gated, and published
atomically with a manifest that carries its `BundleSpec`.
"""

import contextlib
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from edgedistill.common import manifest as mf
from edgedistill.common import progress
from edgedistill.common.atomic import remove_orphans, temporary_name
from edgedistill.common.bundle import (
    CONFIG,
    MODEL_FILES,
    TOKENIZER,
    TOKENIZER_CONFIG,
    BundleSpec,
    TensorSpec,
    text_inputs,
    tokenizer_config,
    tokenizer_json,
    transformers_config,
)
from edgedistill.common.config.export import AGREEMENT_KEYS, ENGINE_OPT_SEQUENCE, BundleRecipe
from edgedistill.common.data import DEV_EXAMPLES, load_splits
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.runtime import (
    Shapes,
    open_runner,
)
from edgedistill.common.segments import PairSegments
from edgedistill.common.stage import Built, Inputs
from edgedistill.common.text import read_texts
from edgedistill.distill.batching import collate
from edgedistill.distill.students import Student, TransformerClassifier
from edgedistill.distill.tokenization import encode, load_tokenizer, pair_segments
from edgedistill.export import optimize, quantize, stages, validate
from edgedistill.export.fold import fold
from edgedistill.export.onnx_export import ExportError, Source, export_onnx, load_source, op_counts
from edgedistill.export.smooth import smooth
from edgedistill.export.tensorrt import EngineBuildError, build_engine

CHECK_THREADS = 2
# Rows of a calibration batch for static INT8.
CALIBRATION_BATCH = 32


def max_length(recipe: Recipe, source: str) -> int:
    return recipe.model.max_length if source == "teacher" else recipe.transfer.max_length


def token_features(
    tokenizer, texts: list[str], pairs: list[str] | None, length: int, segments: PairSegments
) -> dict[str, list[list[int]]]:
    """`texts` (with their `pairs`) as unpadded token ids with segment ids, zero for single sentences: what the
    parity checks, the calibration feeds and a cascade's members run on. A pair's are made by the bundle's rule
    (`BundleSpec.pair_segments`), as the server makes them: the tokenizer's own, or from its sequence ids."""
    feats = encode(tokenizer, texts, pairs, length, student_segments=segments == "sequence_ids")
    feats.setdefault("token_type_ids", [[0] * len(ids) for ids in feats["input_ids"]])
    return feats


class SourceCache:
    """Per-source work shared by its bundles: the module, its plain ONNX graph, its PyTorch dev logits."""

    def __init__(self, recipe: Recipe, scratch: Path):
        self.recipe, self.scratch = recipe, scratch
        # by source name and the sha256 of its folder's manifest, and the teacher's (whose tokenizer every source uses)
        self._sources: dict[tuple[str, str], tuple[Source, Path, np.ndarray]] = {}
        self._teacher: str | None = None
        self.tokenizer = None
        self.train, self.dev = load_splits(recipe.data)
        # the dev texts as the bundles' servers write them, once for every source and bundle
        self.served_dev = self.dev.as_served(recipe.text_style)

    def segments(self, name: str) -> PairSegments:
        """How a pair's `token_type_ids` are made for source `name`, as it was trained: a pair student's by the
        students' rule (`pair_segments`); the teacher's as its tokenizer gives them, which for a tokenizer that
        gives type ids but marks no sentence B with 1 are 0 throughout, whatever its students read."""
        if name == "teacher" or not self.recipe.data.pairs:
            return "token_types"
        return pair_segments(self.tokenizer, self.tokenizer.name_or_path)

    def features(self, name: str) -> dict[str, list[list[int]]]:
        """The dev split's features for source `name`, its texts written as the bundles' servers write them."""
        return token_features(
            self.tokenizer,
            self.served_dev.texts,
            self.served_dev.pairs,
            max_length(self.recipe, name),
            self.segments(name),
        )

    def get(self, name: str, folder: Path, teacher: Path) -> tuple[Source, Path, np.ndarray]:
        """The source `name` from its (verified) artifact `folder`, exported once per version of it: one published
        again meanwhile (by another command) is loaded again, as the bundle records it as its parent. Dev features
        are tokenized with the tokenizer in the `teacher` folder."""
        if (published := mf.parent_of(teacher).manifest_sha256) != self._teacher:
            self._sources, self._teacher, self.tokenizer = {}, published, load_tokenizer(str(teacher))
        key = (name, mf.parent_of(folder).manifest_sha256)
        if key not in self._sources:
            self._sources = {k: v for k, v in self._sources.items() if k[0] != name}  # an earlier version's
            source = load_source(folder)
            # made for the first bundle built: bundles all current write nothing (a read-only runs folder serves)
            self.scratch.mkdir(parents=True, exist_ok=True)
            plain = self.scratch / f"{name}.onnx"
            export_onnx(source, plain, self.recipe.export.opset)
            logits = validate.dev_logits(
                validate.torch_forward(source), self.features(name), self.tokenizer.pad_token_id
            )
            self._sources[key] = (source, plain, logits)
        return self._sources[key]


def _batches(
    texts: list[str],
    pairs: list[str] | None,
    tokenizer,
    length: int,
    inputs: tuple[str, ...],
    segments: PairSegments,
) -> list[dict[str, np.ndarray]]:
    """`texts` (with their `pairs`, segment ids made by `segments`) as token-id batches padded to their longest, the
    feeds of a calibration."""
    feats = token_features(tokenizer, texts, pairs, length, segments)
    batches = []
    for start in range(0, len(texts), CALIBRATION_BATCH):
        batch = collate(feats, list(range(start, min(start + CALIBRATION_BATCH, len(texts)))), tokenizer.pad_token_id)
        batches.append({name: batch[name].numpy() for name in inputs})
    return batches


def model_config(source: Source) -> dict:
    """The exported model's transformers-style config: the teacher's own; a transformer student's BERT config; a
    BiLSTM or CNN student's `StudentConfig` under a model type of its own, which no transformers class reads."""
    if not isinstance(source.module, Student):
        return json.loads((source.folder / CONFIG).read_text(encoding="utf-8"))
    if isinstance(source.module, TransformerClassifier):
        return source.module.bert.config.to_dict()
    return source.module.config.model_dump(mode="json") | {"model_type": f"edgedistill-{source.arch}"}


def require_fusion_applies(spec: BundleRecipe, bundle_id: str, source: Source) -> None:
    """Refuse bundle `bundle_id`'s fusion choices (`attention`, `skip_layer_norm`) for a `source` whose graph ONNX
    Runtime's BERT fusions do not take: a GPT-2 or encoder-decoder teacher trained before the recipe set them (the
    recipe refuses them for a student, the teacher's stage before it trains)."""
    graph = f"the graph of {spec.source}, a {source.arch}"
    if not source.is_transformer and (unapplied := spec.unapplied_fusion_choices(bundle_id, graph)):
        raise ExportError(unapplied)


def _transform(
    spec: BundleRecipe, source: Source, plain: Path, work: Path, calibration, train_calibration
) -> tuple[Path, dict, int, dict]:
    """Fusion, smoothing and precision: the graph the bundle ships, the fused-operator counts, how many tensors
    were smoothed and the quantization applied (`train_calibration`: feeds from the train split, which the labeller
    bundle may read before the transfer set exists)."""
    graph, fused, smoothed, quantized = plain, {}, 0, {}
    if source.is_transformer and spec.fused:
        graph = work / "fused.onnx"
        fused = optimize.fuse(
            plain, graph, source.num_heads, source.hidden_size, source.num_layers, spec.attention, spec.skip_layer_norm
        )
    if spec.smooth is not None:
        out = work / "smoothed.onnx"
        smoothed = smooth(graph, out, train_calibration(), spec.smooth, threads=CHECK_THREADS)
        graph = out
    if spec.precision == "int8":
        out = work / "int8.onnx"
        if spec.quantization == "static":
            quantized = quantize.int8_static(graph, out, calibration(), quantize.static_ops(source.arch))
        else:
            quantized = quantize.int8_dynamic(graph, out, spec.per_channel, spec.int8_ops)
        if not quantize.int8_weights(out):  # the bundle would be fp32 under an int8 name
            fix = "int8_ops naming some of them" if spec.quantization == "dynamic" else "quantization: dynamic"
            raise ExportError(
                f"{source.arch}: {spec.quantization} INT8 of {quantized['op_types']} quantizes nothing in this graph "
                f"(its operators: {', '.join(sorted(op_counts(onnx.load(str(graph)))))}): use {fix}, or fp32"
            )
        graph = out
    elif spec.precision == "fp16" and not spec.fold:  # a folded graph has its table in fp16 already
        out = work / "fp16.onnx"
        quantize.fp16(graph, out)
        graph = out
    return graph, fused, smoothed, quantized


def build_stage(inputs: Inputs, bundle_id: str, cache: SourceCache) -> Built:
    """The body of `export.stages.bundle`."""
    recipe = inputs.recipe
    spec = recipe.export.bundles[bundle_id]  # one this machine can build (`stages.buildable_here`)
    source_name = "teacher" if spec.source == "teacher" else f"student-{spec.source}"
    source, plain, torch_logits = cache.get(spec.source, inputs.parent(source_name), inputs.parent("teacher"))
    require_fusion_applies(spec, bundle_id, source)
    length = max_length(recipe, spec.source)
    segments = cache.segments(spec.source)

    def short_of(found: int, key: str, where: str) -> None:
        if found < (asked := getattr(recipe.export, key)):
            print(
                f"[bundle-{bundle_id}] warning: INT8 calibration found {found} of the {asked} texts "
                f"export.{key} asks for in {where}, and calibrates on those {found}"
            )

    def calibration() -> list[dict[str, np.ndarray]]:
        """Batches of the first `calibration_sentences` transfer-set examples (pairs too, where it has them)."""
        count, transfer = recipe.export.calibration_sentences, inputs.parent("transfer")
        texts = read_texts(transfer / "texts.txt", count)
        short_of(len(texts), "calibration_sentences", "the transfer set")
        pairs = read_texts(transfer / "pairs.txt", count) if (transfer / "pairs.txt").is_file() else None
        return _batches(texts, pairs, cache.tokenizer, length, source.inputs, segments)

    def train_calibration() -> list[dict[str, np.ndarray]]:
        """Batches of the first `smooth_sentences` train examples."""
        train, count = cache.train, recipe.export.smooth_sentences
        texts = train.texts[:count]
        short_of(len(texts), "smooth_sentences", "the training split (smooth)")
        pairs = train.pairs[:count] if train.pairs else None
        return _batches(texts, pairs, cache.tokenizer, length, source.inputs, segments)

    # ONNX Runtime would fuse the kept Add + LayerNormalization pairs again when it loads the graph.
    disabled = ["SkipLayerNormFusion"] if source.is_transformer and spec.fused and not spec.skip_layer_norm else []
    work = inputs.fresh_work()
    model_file = MODEL_FILES[spec.runtime]
    model = work / model_file
    build_info, providers, smoothed, quantized = {}, [spec.runtime], 0, {}
    if spec.fold:
        plain = work / "folded.onnx"
        folded = fold(source.module, half=spec.precision == "fp16")
        export_onnx(dataclasses.replace(source, module=folded), plain, recipe.export.opset)
    if spec.runtime == "tensorrt":
        # TensorRT fuses on its own and cannot parse ONNX Runtime's contrib ops: it takes the plain graph.
        build_info = build_engine(
            plain,
            model,
            list(source.inputs),
            sequence=(1, min(ENGINE_OPT_SEQUENCE, length), length),
            fp16=spec.precision in ("fp16", "int8"),
            int8=spec.precision == "int8",
            calibration=calibration() if spec.precision == "int8" else None,
            pad_id=cache.tokenizer.pad_token_id,
        )
        runner, fused = open_runner(model, spec.runtime, []), {}
    else:
        graph, fused, smoothed, quantized = _transform(spec, source, plain, work, calibration, train_calibration)
        shutil.copy2(graph, model)
        runner = open_runner(
            model,
            spec.runtime,
            spec.providers,
            threads=CHECK_THREADS,
            disabled_optimizers=disabled,
            precision=spec.precision,
            shapes=Shapes(tuple(source.inputs), validate.DEV_BATCH, length),
        )
        providers = runner.providers
    run = validate.logits_runner(runner)
    try:  # an engine holds device memory and a CUDA stream until it is closed
        shapes = validate.check_shapes(
            run,
            source,
            spec.precision,
            length,
            fused=spec.runtime == "onnxruntime" and source.is_transformer and spec.fused,
        )
        exported_logits = validate.dev_logits(
            validate.as_forward(run), cache.features(spec.source), cache.tokenizer.pad_token_id
        )
    finally:
        runner.close()
    validate.require_finite(exported_logits, "on dev", spec.precision)
    cfg = recipe.export
    figures = validate.parity(exported_logits, torch_logits, cache.dev.labels, recipe.data, cfg.tie_margin)
    agreement = getattr(cfg, AGREEMENT_KEYS[spec.precision])
    validate.gate(figures, spec.precision, agreement, cfg.max_int8_drop, recipe.data.metric)
    unversioned = BundleSpec(
        name=f"{recipe.name}-{bundle_id}",
        labels=recipe.data.label_names,
        text_inputs=text_inputs(recipe.data.pairs),
        max_length=length,
        pad_token_id=cache.tokenizer.pad_token_id,
        inputs=[TensorSpec(name=n, dtype="int64", shape=["batch", "sequence"]) for n in source.inputs],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", len(recipe.data.label_names)])],
        precision=spec.precision,
        runtime=spec.runtime,
        providers=providers,
        model_file=model_file,
        arch=source.arch,
        opset=recipe.export.opset,
        fused_operators=fused,
        disabled_optimizers=disabled if spec.runtime == "onnxruntime" else [],
        text_style=recipe.text_style,
        pair_segments=segments,
    )
    tokenizer = tokenizer_json(json.loads((source.folder / TOKENIZER).read_text(encoding="utf-8")), length)
    tokenizer_bytes = json.dumps(tokenizer, ensure_ascii=False).encode("utf-8")
    # the server tokenizes with tokenizer.json: another tokenizer before the same graph is another version
    bundle = unversioned.content_versioned(mf.sha256_file(model), hashlib.sha256(tokenizer_bytes).hexdigest())
    ops = op_counts(onnx.load(str(model))) if spec.runtime == "onnxruntime" else {}

    def write(folder: Path) -> None:
        shutil.copy2(model, folder / model_file)
        (folder / TOKENIZER).write_bytes(tokenizer_bytes)
        tokenizer_file = source.folder / TOKENIZER_CONFIG
        settings = tokenizer_config(json.loads(tokenizer_file.read_text(encoding="utf-8")), length)
        (folder / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        config = transformers_config(model_config(source), bundle)
        (folder / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")

    fused_note = f" fused={fused}" if fused else ""
    selected = recipe.data.selection_key
    selected_note = f" {selected}={figures[selected]:.4f}" if selected != "dev_accuracy" else ""
    return Built(
        write,
        metrics={
            "dev_accuracy": figures["dev_accuracy"],
            "torch_dev_accuracy": figures["torch_dev_accuracy"],
            "agreement": figures["agreement"],
            "agreement_beyond_ties": figures["agreement_beyond_ties"],
            "tie_flips": figures["tie_flips"],
            "max_abs_diff": figures["max_abs_diff"],
            **{
                key: figures[key]
                for key in ("dev_macro_f1", "dev_f1", "torch_dev_macro_f1", "torch_dev_f1")
                if key in figures
            },
            "params": source.params,
        },
        info={
            "bundle": bundle.model_dump(),
            "source": spec.source,
            "recipe": spec.model_dump(),
            "shape_checks_max_abs_diff": shapes,
            "op_counts": ops,
            "smoothed_tensors": smoothed,
            "quantization": quantized,
            "tensorrt_build": build_info,
            DEV_EXAMPLES: cache.dev.digest(),
        },
        line=lambda manifest: (
            f"gate passed: dev_accuracy={figures['dev_accuracy']:.4f}{selected_note} "
            f"(torch {figures['torch_dev_accuracy']:.4f}, "
            f"agreement {figures['agreement']:.4f}, near-tie flips {figures['tie_flips']}, "
            f"max|Δ| {figures['max_abs_diff']:.2e}) "
            f"size={manifest.metrics['size_bytes'] / 2**20:.1f} MiB{fused_note}"
        ),
        size_of=model_file,
    )


@contextlib.contextmanager
def _named(bundle_id: str):
    """An export's or engine build's error named by its bundle, where it does not name it: the bundles of one source
    meet the same messages."""
    try:
        yield
    except (ExportError, EngineBuildError) as err:
        if f"export.bundles.{bundle_id}" in str(err):
            raise
        raise type(err)(f"bundle {bundle_id} (export.bundles.{bundle_id}): {err}") from err


def build(recipe: Recipe, ids: list[str], force: bool = False, keep: set[str] = frozenset()) -> list[mf.Manifest]:
    """The bundles `ids` of the recipe (`export.stages.of_command` chooses them), sharing per-source exports; with
    `force`, built again but for those of `keep`, built only where stale."""
    work = run_dir(recipe) / ".work" / "export"  # this process's own, so that two exports can run at once
    remove_orphans(work)
    scratch = temporary_name(work)
    shutil.rmtree(scratch, ignore_errors=True)
    cache = SourceCache(recipe, scratch)
    built = progress.bar(len(ids), desc="bundles", unit="bundle")
    manifests = []
    try:
        for bundle_id in ids:
            with _named(bundle_id):
                manifests.append(stages.bundle(recipe, bundle_id, cache).run(force and bundle_id not in keep))
            built.set_postfix(last=bundle_id, refresh=False)
            built.update()
    finally:
        built.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return manifests
