"""Build the bundles of a recipe: `runs/<recipe>/bundle-<id>/`, the only thing the server reads.

Each bundle is exported from its source artifact (teacher or student), optionally fused and
quantized, checked against PyTorch on the dev set and at odd shapes, gated, and published
atomically with a manifest that carries its `BundleSpec`.
"""

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx

from common import manifest as mf
from common.bundle import MODEL_FILES, TOKENIZER, BundleSpec, TensorSpec
from common.recipe import BundleRecipe, Recipe, run_dir
from distill.data import load_splits
from distill.tokenization import encode, load_tokenizer
from export import optimize, quantize, validate
from export.fold import fold
from export.onnx_export import ExportError, Source, export_onnx, load_source, op_counts
from export.providers import missing_here, session_for
from export.tensorrt import build_engine, require_tensorrt

CHECK_THREADS = 2


class SourceCache:
    """Per-source work shared by its bundles: the module, its plain ONNX graph, its PyTorch dev logits."""

    def __init__(self, recipe: Recipe, scratch: Path):
        self.recipe, self.scratch = recipe, scratch
        self._sources: dict[str, tuple[Source, Path, np.ndarray]] = {}
        teacher_dir = run_dir(recipe) / "teacher"
        self.tokenizer = load_tokenizer(str(teacher_dir))
        _, self.dev = load_splits(recipe.data)

    def max_length(self, name: str) -> int:
        return self.recipe.model.max_length if name == "teacher" else self.recipe.transfer.max_length

    def features(self, name: str) -> dict[str, list[list[int]]]:
        feats = encode(self.tokenizer, self.dev.texts, self.dev.pairs, self.max_length(name))
        feats.setdefault("token_type_ids", [[0] * len(ids) for ids in feats["input_ids"]])
        return feats

    def get(self, name: str) -> tuple[Source, Path, np.ndarray]:
        if name not in self._sources:
            source = load_source(self.recipe, name)
            plain = self.scratch / f"{name}.onnx"
            export_onnx(source, plain, self.recipe.export.opset)
            logits = validate.dev_logits(
                validate.torch_forward(source), self.features(name), self.tokenizer.pad_token_id
            )
            self._sources[name] = (source, plain, logits)
        return self._sources[name]


def config_hash(recipe: Recipe, bundle_id: str) -> str:
    cfg = recipe.export
    relevant = {
        "bundle": cfg.bundles[bundle_id].model_dump(),
        "opset": cfg.opset,
        "gates": [cfg.min_agreement, cfg.min_fp16_agreement, cfg.max_int8_drop, cfg.calibration_sentences],
        "max_length": recipe.model.max_length,
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _calibration(
    recipe: Recipe, cache: SourceCache, source: str, inputs: tuple[str, ...]
) -> list[dict[str, np.ndarray]]:
    """Batches of transfer-set sentences for static INT8 calibration."""
    texts = (run_dir(recipe) / "transfer" / "texts.txt").read_text(encoding="utf-8").splitlines()
    texts = texts[: recipe.export.calibration_sentences]
    batches = []
    for start in range(0, len(texts), 32):
        enc = cache.tokenizer(
            texts[start : start + 32],
            truncation=True,
            max_length=cache.max_length(source),
            padding=True,
            return_tensors="np",
        )
        enc.setdefault("token_type_ids", np.zeros_like(enc["input_ids"]))
        batches.append({name: enc[name].astype(np.int64) for name in inputs})
    return batches


def _transform(recipe: Recipe, spec: BundleRecipe, source: Source, plain: Path, work: Path, cache) -> tuple[Path, dict]:
    """Fusion and precision: the graph the bundle ships, plus the fused-operator counts."""
    graph, fused = plain, {}
    if source.is_transformer and spec.fused:
        graph = work / "fused.onnx"
        fused = optimize.fuse(
            plain, graph, source.num_heads, source.hidden_size, source.num_layers, spec.attention, spec.skip_layer_norm
        )
    if spec.precision == "int8":
        out = work / "int8.onnx"
        if spec.quantization == "static":
            quantize.int8_static(graph, out, _calibration(recipe, cache, spec.source, source.inputs))
        else:
            quantize.int8_dynamic(graph, out, spec.per_channel, spec.int8_ops)
        graph = out
    elif spec.precision == "fp16" and not spec.fold:  # a folded graph has its table in fp16 already
        out = work / "fp16.onnx"
        quantize.fp16(graph, out)
        graph = out
    return graph, fused


def run(recipe: Recipe, bundle_id: str, cache: SourceCache, force: bool = False) -> mf.Manifest:
    spec = recipe.export.bundles[bundle_id]
    out = run_dir(recipe) / f"bundle-{bundle_id}"
    chash = config_hash(recipe, bundle_id)
    if not force and mf.is_current(out, chash):
        print(f"[bundle-{bundle_id}] up to date: {out}")
        return mf.load(out, verify=False)
    if spec.runtime == "tensorrt":
        require_tensorrt()
    watch = mf.Stopwatch()
    source, plain, torch_logits = cache.get(spec.source)
    max_length = cache.max_length(spec.source)
    # ONNX Runtime would fuse the kept Add + LayerNormalization pairs again when it loads the graph.
    disabled = ["SkipLayerNormFusion"] if source.is_transformer and spec.fused and not spec.skip_layer_norm else []
    with mf.stage_folder(out) as tmp:
        model_file = MODEL_FILES[spec.runtime]
        build_info, providers = {}, [spec.runtime]
        work = tmp / ".work"
        work.mkdir()
        if spec.fold:
            plain = work / "folded.onnx"
            folded = fold(source.module, half=spec.precision == "fp16")
            export_onnx(dataclasses.replace(source, module=folded), plain, recipe.export.opset)
        if spec.runtime == "tensorrt":
            # TensorRT fuses on its own and cannot parse ONNX Runtime's contrib ops: it takes the plain graph.
            build_info = build_engine(
                plain,
                tmp / model_file,
                list(source.inputs),
                sequence=(1, min(64, max_length), max_length),
                fp16=spec.precision in ("fp16", "int8"),
                int8=spec.precision == "int8",
                calibration=_calibration(recipe, cache, spec.source, source.inputs)
                if spec.precision == "int8"
                else None,
            )
            run, fused = validate.trt_runner(tmp / model_file, source.inputs), {}
        else:
            graph, fused = _transform(recipe, spec, source, plain, work, cache)
            shutil.copy2(graph, tmp / model_file)
            sess = session_for(tmp / model_file, spec.providers, CHECK_THREADS, disabled_optimizers=disabled)
            run, providers = validate.ort_runner(sess), sess.get_providers()
        shutil.rmtree(work)
        shapes = validate.check_shapes(run, source, spec.precision == "fp32", max_length)
        exported_logits = validate.dev_logits(
            validate.as_forward(run), cache.features(spec.source), cache.tokenizer.pad_token_id
        )
        figures = validate.parity(exported_logits, torch_logits, cache.dev.labels)
        cfg = recipe.export
        agreement = cfg.min_fp16_agreement if spec.precision == "fp16" else cfg.min_agreement
        validate.gate(figures, spec.precision, agreement, cfg.max_int8_drop, bundle_id)
        shutil.copy2(source.folder / TOKENIZER, tmp / TOKENIZER)
        bundle = BundleSpec(
            name=f"{recipe.name}-{bundle_id}",
            labels=recipe.data.label_names,
            max_length=max_length,
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
        )
        ops = op_counts(onnx.load(str(tmp / model_file))) if spec.runtime == "onnxruntime" else {}
        manifest = mf.commit(
            tmp,
            out,
            mf.for_stage(
                recipe,
                f"bundle-{bundle_id}",
                chash,
                watch,
                parents={"source": mf.parent_of(source.folder)},
                metrics={
                    "dev_accuracy": figures["dev_accuracy"],
                    "torch_dev_accuracy": figures["torch_dev_accuracy"],
                    "agreement": figures["agreement"],
                    "max_abs_diff": figures["max_abs_diff"],
                    "params": source.params,
                    "size_bytes": (tmp / model_file).stat().st_size,
                },
                info={
                    "bundle": bundle.model_dump(),
                    "source": spec.source,
                    "recipe": spec.model_dump(),
                    "shape_checks_max_abs_diff": shapes,
                    "op_counts": ops,
                    "tensorrt_build": build_info,
                },
            ),
        )
    fused_note = f" fused={fused}" if fused else ""
    print(
        f"[bundle-{bundle_id}] dev_accuracy={figures['dev_accuracy']:.4f} (torch {figures['torch_dev_accuracy']:.4f}, "
        f"agreement {figures['agreement']:.4f}, max|Δ| {figures['max_abs_diff']:.2e}) "
        f"size={manifest.metrics['size_bytes'] / 2**20:.1f} MiB{fused_note} -> {out}"
    )
    return manifest


def buildable(recipe: Recipe, only: list[str] | None = None) -> list[str]:
    """The bundles to build: those named in `only`, else every bundle this machine can run.

    A recipe may list GPU bundles beside CPU ones; where their runtime or execution provider is absent
    they are left out with the reason. Named with `--only`, such a bundle fails with the full error.
    """
    if only:
        return list(only)
    ids = []
    for bundle_id, spec in recipe.export.bundles.items():
        reason = missing_here(spec.runtime, spec.providers)
        if reason is None:
            ids.append(bundle_id)
        else:
            print(f"[bundle-{bundle_id}] not built here: {reason} (name it with --only for the whole error)")
    return ids


def build(recipe: Recipe, only: list[str] | None = None, force: bool = False) -> list[mf.Manifest]:
    """Every bundle of the recipe this machine can run (or those in `only`), sharing per-source exports."""
    if recipe.export is None:
        raise ExportError(f"recipe {recipe.name} has no `export` section")
    ids = buildable(recipe, only)
    scratch = run_dir(recipe) / ".work" / "export"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    cache = SourceCache(recipe, scratch)
    try:
        return [run(recipe, bundle_id, cache, force) for bundle_id in ids]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
