"""The model benchmark: teacher PyTorch eager against every bundle, side by side, in one process and one run.

Each cell is the median of many timed calls after warm-up, with min and max; ratios are against
the teacher in PyTorch eager mode on the CPU at the same batch size and length. A bundle is timed at its
`max_length` where a cell asks for more (the server cuts texts to it): such a cell records the length it was timed
at, and no ratio. Bundles for GPU execution providers are timed where this onnxruntime build offers them, and left out with the reason
elsewhere; the teacher in eager mode is also timed on the GPU that the recipe's `runtime.device` resolves
to, if it resolves to one (`distill.device`). A pair model is timed on a long pair cut to each length, as the
server makes its rows (sentence B marked by the bundle's own rule), the teacher on the same pair as its tokenizer
writes it. Settings come from the recipe's `bench.models` section, its
`threads` for PyTorch and ONNX Runtime alike. Results go to `runs/<recipe>/bench/` as a
`bench.records.ModelTable` in bench.json and as markdown (with a manifest), and are printed as a table. The stage is
declared in `bench.model_stage`.
"""

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from edgedistill.bench import model_stage
from edgedistill.bench.records import Cell, ModelRow, ModelTable, Timing, cut_note
from edgedistill.common import manifest as mf
from edgedistill.common import progress, tables
from edgedistill.common.bundle import Bundle, read_bundle
from edgedistill.common.config.measure import ModelBenchConfig
from edgedistill.common.config.training import Metric
from edgedistill.common.console import Console
from edgedistill.common.modelcard import TEACHER_ROW
from edgedistill.common.recipe import RecipeError
from edgedistill.common.runtime import open_bundle
from edgedistill.common.stage import Built, Inputs
from edgedistill.distill import heads
from edgedistill.distill.tokenization import encode, load_tokenizer
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import InvalidInput

PAIR_WORD = "text"  # the words of the pairs that pair models are timed on

Timings = dict[tuple[int, int], tuple[int, Timing]]  # (batch, length) -> the length timed at, timing


def time_calls(call, cfg: ModelBenchConfig) -> Timing:
    """Milliseconds per call after `cfg.warmup` untimed calls."""
    for _ in range(cfg.warmup):
        call()
    times, start = [], time.perf_counter()
    while len(times) < cfg.iterations or time.perf_counter() - start < cfg.min_seconds:
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing.of(times)


def inputs(names: Sequence[str], batch: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds of a single-text model: `batch` rows of `length` random token ids, every token attended. The ids are
    drawn from 1000-1999, or from the upper half of a vocabulary of fewer ids: clear of special tokens kept at a
    vocabulary's start (BERT's), though a small vocabulary's upper half holds those kept at its end (GPT-2's)."""
    rng = np.random.default_rng(seed)
    high = min(2000, vocab_size)
    values = {
        "input_ids": rng.integers(min(1000, high // 2), high, size=(batch, length), dtype=np.int64),
        "attention_mask": np.ones((batch, length), dtype=np.int64),
        "token_type_ids": np.zeros((batch, length), dtype=np.int64),
    }
    return {name: values[name] for name in names}


def _pair(length: int) -> tuple[list[str], list[str]]:
    """One pair whose texts are each more than `length` tokens long in any tokenizer (at least one token a word), so
    that one cut to `length` tokens leaves about half to each text, as a long pair request is cut."""
    text = " ".join([PAIR_WORD] * length)
    return [text], [text]


def _too_short(length: int, pairs: bool = True) -> RecipeError:
    what, texts, timed = ("a pair", "each text", "pair models") if pairs else ("a text", "the text", "this teacher")
    return RecipeError(
        f"bench.models.seq_lens: {what} cannot be cut to {length} tokens, which its special tokens and a token of "
        f"{texts} exceed; time {timed} at longer lengths"
    )


def _tiled(
    row: dict[str, np.ndarray], names: Sequence[str], batch: int, length: int, pairs: bool = True
) -> dict[str, np.ndarray]:
    """`row` (a pair's inputs, or a text's, `length` tokens) as every row of a batch; a `RecipeError` where the
    tokenizer could not cut it to `length` tokens."""
    if len(row["input_ids"]) != length:
        raise _too_short(length, pairs)
    return {name: np.tile(row[name], (batch, 1)) for name in names}


def bundle_feed(bundle: Bundle, tokenizer_json: str, batch: int, length: int) -> dict[str, np.ndarray]:
    """What a bundle is timed on: for a pair model, the rows the server makes of a pair request `length` tokens long
    (both texts cut to about half, `token_type_ids` by the bundle's `pair_segments`: `serve.encoding`); else
    `inputs`."""
    encoder = TextEncoder.for_bundle(bundle, tokenizer_json, max_length=length)
    if not bundle.spec.pairs:
        return inputs(bundle.spec.input_names, batch, length, encoder.vocab_size)
    try:
        row = encoder.encode(*_pair(length))[0]
    except InvalidInput as err:  # a length that leaves a text no token
        raise _too_short(length) from err
    return _tiled(row, bundle.spec.input_names, batch, length)


def teacher_feed(
    tokenizer, names: Sequence[str], batch: int, length: int, pairs: bool, written: bool = False
) -> dict[str, np.ndarray]:
    """What the teacher is timed on in PyTorch: for a pair task, a pair `length` tokens long as its tokenizer writes
    it (`token_type_ids` its own, as the teacher was trained), the rows its bundles are timed on; with `written`, a
    text `length` tokens long as its tokenizer writes it, special tokens and all (an encoder-decoder's head reads its
    `</s>`, which random ids lack); else `inputs`."""
    if not (pairs or written):
        return inputs(names, batch, length, len(tokenizer))
    texts, second = _pair(length)
    encoded = encode(tokenizer, texts, second if pairs else None, length)
    row = {key: np.asarray(rows[0], dtype=np.int64) for key, rows in encoded.items()}
    row["attention_mask"] = np.ones_like(row["input_ids"])
    return _tiled(row, names, batch, length, pairs)


def shapes(cfg: ModelBenchConfig) -> list[tuple[int, int]]:
    """(batch, length) of every cell, in the order of the columns."""
    return [(batch, length) for batch in cfg.batch_sizes for length in cfg.seq_lens]


def _cell_done(cells, model: str, batch: int, length: int, timing: Timing) -> None:
    """Advance the progress of the benchmark by one timed cell."""
    cells.set_postfix(model=model, shape=f"{batch}x{length}", median_ms=f"{timing.median_ms:.2f}", refresh=False)
    cells.update()


def _eager_row(
    folder: Path, cfg: ModelBenchConfig, cells, on: torch.device, metric: Metric, pairs: bool
) -> tuple[dict, Timings]:
    manifest = mf.load(folder, verify=False)  # verified as the stage's parent
    model = heads.load_teacher(folder).eval().to(on)
    # a bundle is cut to its max_length, but the teacher in PyTorch reads every token of the cell
    heads.require_positions(model.config, max(cfg.seq_lens), "bench.models.seq_lens", f"the teacher {folder}")
    name = TEACHER_ROW if on.type == "cpu" else f"{TEACHER_ROW}-{on.type}"
    tokenizer = load_tokenizer(str(folder))
    names = heads.teacher_inputs(model.config, tokenizer)

    def call(feed):
        logits = model(**feed).logits
        return logits.cpu()  # waits for the GPU; as a server would, it reads the result back

    timings = {}
    with torch.inference_mode():
        for batch, length in shapes(cfg):
            feed = teacher_feed(tokenizer, names, batch, length, pairs, model.config.is_encoder_decoder)
            feed = {k: torch.from_numpy(v).to(on) for k, v in feed.items()}
            timing = time_calls(lambda feed=feed: call(feed), cfg)
            timings[batch, length] = length, timing
            _cell_done(cells, name, batch, length, timing)
    row = {"model": name, "precision": "fp32", "runtime": f"pytorch ({on.type})"}
    return row | _figures(manifest.metrics, metric), timings


def _bundle_row(bundle_id: str, folder, cfg: ModelBenchConfig, cells, metric: Metric) -> tuple[dict, Timings]:
    bundle, files = read_bundle(folder)
    runner = open_bundle(bundle, model=files.model, threads=cfg.threads, max_batch=max(cfg.batch_sizes))
    timings = {}
    try:
        for batch, length in shapes(cfg):
            timed = min(length, bundle.spec.max_length)
            feed = bundle_feed(bundle, files.tokenizer, batch, timed)
            timing = time_calls(lambda feed=feed: runner.infer(feed), cfg)
            timings[batch, length] = timed, timing
            _cell_done(cells, bundle_id, batch, timed, timing)
        providers = runner.providers
    finally:
        runner.close()
    row = {
        "model": bundle_id,
        "precision": bundle.spec.precision,
        "runtime": f"{bundle.spec.runtime} ({', '.join(providers)})",
        "max_length": bundle.spec.max_length,
    }
    return row | _figures(bundle.manifest.metrics, metric), timings


def _figures(metrics: dict, metric: Metric) -> dict:
    """A row's size and dev figures from its manifest: accuracy, and the selection metric when it is another."""
    selected = None if metric == "accuracy" else metrics.get(f"dev_{metric}")
    return {"size_bytes": metrics["size_bytes"], "dev_accuracy": metrics["dev_accuracy"], "dev_selected": selected}


def table(threads: int, measured: list[tuple[dict, Timings]], metric: Metric) -> ModelTable:
    """The rows with every cell's speedup over the first row's, where it was timed at the same length, and items/s."""
    base = measured[0][1]

    def cell(batch: int, length: int, timed: int, timing: Timing) -> Cell:
        base_timed, base_timing = base[batch, length]
        return Cell(
            **timing.model_dump(),
            batch=batch,
            length=length,
            timed_length=timed,
            speedup=base_timing.median_ms / timing.median_ms if timed == base_timed else None,
            items_per_s=batch * 1e3 / timing.median_ms,
        )

    rows = [
        ModelRow(**row, cells=[cell(batch, length, *timed) for (batch, length), timed in timings.items()])
        for row, timings in measured
    ]
    return ModelTable(threads=threads, metric=metric, rows=rows)


def build_stage(inputs: Inputs, devices: list[str]) -> Built:
    """The body of `bench.model_stage.stage`, timing the teacher in PyTorch eager on `devices` (torch's names)."""
    recipe = inputs.recipe
    cfg = recipe.bench.models
    teacher = inputs.parent("teacher")
    missing, left_out, timed = [], {}, []
    for bundle_id, spec in recipe.export.bundles.items():
        if (reason := model_stage.left_out(spec)) is not None:
            left_out[bundle_id] = reason
        elif f"bundle-{bundle_id}" in inputs.folders:
            timed.append(bundle_id)
        else:
            missing.append(bundle_id)
    cells = progress.bar((len(devices) + len(timed)) * len(shapes(cfg)), desc=model_stage.STAGE, unit="cell")
    metric = recipe.data.metric
    measured = [_eager_row(teacher, cfg, cells, torch.device(on), metric, recipe.data.pairs) for on in devices]
    measured += [
        _bundle_row(bundle_id, inputs.parent(f"bundle-{bundle_id}"), cfg, cells, metric) for bundle_id in timed
    ]
    cells.close()
    if missing:
        print(
            f"[bench] not built yet, left out: {', '.join(missing)} (edgedistill bundles RECIPE builds them; make "
            "bundles in a checkout)"
        )
    for bundle_id, reason in left_out.items():
        print(f"[bench] {bundle_id} not timed here: {reason}")
    result = table(cfg.threads, measured, metric)
    print_table(result)

    return Built(
        lambda folder: result.save(folder, markdown(result)),
        info={"threads": cfg.threads, "bench": cfg.model_dump(), "missing_bundles": missing, "left_out": left_out},
        line=f"{len(result.rows)} models x {len(shapes(cfg))} shapes timed",
    )


def markdown(result: ModelTable) -> str:
    labels = [cell.label for cell in result.rows[0].cells]
    header = ["model", "precision", "size MiB", *result.dev_columns(), *(f"{k} ms (min-max) / x" for k in labels)]
    rows = [
        [
            r.model,
            r.precision,
            f"{r.size_bytes / 2**20:.1f}",
            *result.dev_figures(r),
            *(f"{c.median_ms:.2f} ({c.min_ms:.2f}-{c.max_ms:.2f}) / {c.versus}" for c in r.cells),
        ]
        for r in result.rows
    ]
    lines = [
        f"Latency per call, median of timed calls after warm-up, {tables.counted(result.threads, 'intra-op thread')}.",
        "",
    ]
    if note := cut_note(result.rows):
        lines += [note, ""]
    return "\n".join(lines + tables.markdown(header, rows)) + "\n"


def print_table(result: ModelTable) -> None:
    title = f"latency ms (median, speedup vs {TEACHER_ROW}), {tables.counted(result.threads, 'thread')}"
    header = ["model", "prec", "MiB", *result.dev_columns(), *(cell.label for cell in result.rows[0].cells)]
    rows = [
        [r.model, r.precision, f"{r.size_bytes / 2**20:.1f}", *result.dev_figures(r)]
        + [f"{c.median_ms:.2f} ({c.versus})" for c in r.cells]
        for r in result.rows
    ]
    Console(width=200).print(tables.console_table(title, header, rows))
    if note := cut_note(result.rows):
        print(note)
