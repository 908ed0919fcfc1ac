"""`make bench`: teacher PyTorch eager against every bundle, side by side, in one process and one run.

Each cell is the median of many timed calls after warm-up, with min and max; ratios are against
the teacher in PyTorch eager mode on the CPU at the same batch size and length. Bundles for GPU
execution providers are timed where this onnxruntime build offers them (with the teacher in eager
mode on CUDA beside them when PyTorch sees a GPU), and left out with the reason elsewhere. Results go
to `runs/<recipe>/bench/` as JSON and markdown (with a manifest) and are printed as a table.
"""

import json
import statistics
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForSequenceClassification

from common import manifest as mf
from common.bundle import load_bundle
from common.recipe import BenchConfig, Recipe, run_dir
from export.providers import missing_here, session_for

EAGER = "teacher-pytorch-eager"


def time_calls(call, cfg: BenchConfig) -> dict[str, float]:
    """Median, min and max milliseconds per call after `cfg.warmup` untimed calls."""
    for _ in range(cfg.warmup):
        call()
    times, start = [], time.perf_counter()
    while len(times) < cfg.iterations or time.perf_counter() - start < cfg.min_seconds:
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "calls": len(times)}


def inputs(names: list[str], batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {
        "input_ids": rng.integers(1000, 2000, size=(batch, length), dtype=np.int64),
        "attention_mask": np.ones((batch, length), dtype=np.int64),
        "token_type_ids": np.zeros((batch, length), dtype=np.int64),
    }
    return {name: values[name] for name in names}


def _eager_row(recipe: Recipe, cfg: BenchConfig, device: str = "cpu") -> dict:
    folder = run_dir(recipe) / "teacher"
    manifest = mf.load(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval().to(device)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if model.config.model_type == "bert" else [])

    def call(feed):
        logits = model(**feed).logits
        return logits.cpu()  # waits for the GPU; as a server would, it reads the result back

    cells = {}
    with torch.inference_mode():
        for batch in cfg.batch_sizes:
            for length in cfg.seq_lens:
                feed = {k: torch.from_numpy(v).to(device) for k, v in inputs(names, batch, length).items()}
                cells[f"b{batch}_s{length}"] = time_calls(lambda feed=feed: call(feed), cfg)
    m = manifest.metrics
    return {
        "model": EAGER if device == "cpu" else f"{EAGER}-{device}",
        "precision": "fp32",
        "runtime": f"pytorch ({device})",
        "size_bytes": m["size_bytes"],
        "dev_accuracy": m["dev_accuracy"],
        "cells": cells,
    }


def _bundle_row(bundle_id: str, folder, cfg: BenchConfig) -> dict:
    bundle = load_bundle(folder)
    sess = session_for(
        bundle.model_path, bundle.spec.providers, cfg.threads, disabled_optimizers=bundle.spec.disabled_optimizers
    )
    names = bundle.spec.input_names
    cells = {}
    for batch in cfg.batch_sizes:
        for length in cfg.seq_lens:
            feed = inputs(names, batch, min(length, bundle.spec.max_length))
            cells[f"b{batch}_s{length}"] = time_calls(lambda feed=feed: sess.run(["logits"], feed), cfg)
    m = bundle.manifest.metrics
    return {
        "model": bundle_id,
        "precision": bundle.spec.precision,
        "runtime": f"onnxruntime ({', '.join(sess.get_providers())})",
        "size_bytes": m["size_bytes"],
        "dev_accuracy": m["dev_accuracy"],
        "max_length": bundle.spec.max_length,
        "cells": cells,
    }


def _left_out(spec) -> str | None:
    """Why a bundle cannot be timed here, or None."""
    if spec.runtime != "onnxruntime":
        return f"runtime {spec.runtime} (served by serve.backends; `python -m serve.bench` times it)"
    return missing_here(spec.runtime, spec.providers)


def run(recipe: Recipe, force: bool = False) -> list[dict]:
    """Time every bundle this machine can run against the teacher; skipped when the last run had the same
    settings and parents."""
    cfg = recipe.export.bench
    out = run_dir(recipe) / "bench"
    if not force and mf.is_current(out, recipe.section_hash("export")):
        print(f"[bench] up to date: {out} (--force to measure again)")
        return json.loads((out / "bench.json").read_text())["rows"]
    watch = mf.Stopwatch()
    torch.set_num_threads(cfg.threads)
    rows = [_eager_row(recipe, cfg)]
    if torch.cuda.is_available():
        rows.append(_eager_row(recipe, cfg, "cuda"))
    parents = {"teacher": mf.parent_of(run_dir(recipe) / "teacher")}
    missing, left_out = [], {}
    for bundle_id, spec in recipe.export.bundles.items():
        reason = _left_out(spec)
        if reason is not None:
            left_out[bundle_id] = reason
            continue
        folder = run_dir(recipe) / f"bundle-{bundle_id}"
        if not (folder / mf.MANIFEST).is_file():
            missing.append(bundle_id)
            continue
        rows.append(_bundle_row(bundle_id, folder, cfg))
        parents[bundle_id] = mf.parent_of(folder)
    if missing:
        print(f"[bench] not built yet, left out: {', '.join(missing)} (make bundles)")
    for bundle_id, reason in left_out.items():
        print(f"[bench] {bundle_id} not timed here: {reason}")
    base = rows[0]["cells"]
    for row in rows:
        for key, cell in row["cells"].items():
            cell["speedup"] = base[key]["median_ms"] / cell["median_ms"]
            cell["items_per_s"] = int(key[1:].split("_")[0]) * 1e3 / cell["median_ms"]
    with mf.stage_folder(out) as tmp:
        (tmp / "bench.json").write_text(json.dumps({"threads": cfg.threads, "rows": rows}, indent=1))
        (tmp / "bench.md").write_text(markdown(rows, cfg))
        mf.commit(
            tmp,
            out,
            mf.for_stage(
                recipe,
                "bench",
                recipe.section_hash("export"),
                watch,
                parents=parents,
                info={
                    "threads": cfg.threads,
                    "bench": cfg.model_dump(),
                    "missing_bundles": missing,
                    "left_out": left_out,
                },
            ),
        )
    print_table(rows, cfg)
    return rows


def _keys(cfg: BenchConfig) -> list[str]:
    return [f"b{b}_s{s}" for b in cfg.batch_sizes for s in cfg.seq_lens]


def markdown(rows: list[dict], cfg: BenchConfig) -> str:
    keys = _keys(cfg)
    head = "| model | precision | size MiB | dev acc | " + " | ".join(f"{k} ms (min-max) / x" for k in keys) + " |"
    lines = [f"Latency per call, median of timed calls after warm-up, {cfg.threads} intra-op threads.", "", head]
    lines.append("|" + "---|" * (4 + len(keys)))
    for r in rows:
        cells = [
            f"{r['cells'][k]['median_ms']:.2f} ({r['cells'][k]['min_ms']:.2f}-{r['cells'][k]['max_ms']:.2f}) / "
            f"{r['cells'][k]['speedup']:.1f}x"
            for k in keys
        ]
        size = r["size_bytes"] / 2**20
        lines.append(
            f"| {r['model']} | {r['precision']} | {size:.1f} | {r['dev_accuracy']:.4f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict], cfg: BenchConfig) -> None:
    table = Table(title=f"latency ms (median, speedup vs {EAGER}), {cfg.threads} threads", title_justify="left")
    for column in ("model", "prec", "MiB", "dev acc", *_keys(cfg)):
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in rows:
        cells = [f"{r['cells'][k]['median_ms']:.2f} ({r['cells'][k]['speedup']:.1f}x)" for k in _keys(cfg)]
        table.add_row(r["model"], r["precision"], f"{r['size_bytes'] / 2**20:.1f}", f"{r['dev_accuracy']:.4f}", *cells)
    Console(width=200).print(table)
