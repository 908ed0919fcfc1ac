"""ONNX Runtime sessions on the execution providers a bundle asks for, refusing a silent CPU fallback.

ONNX Runtime drops a requested provider it cannot use (plain `onnxruntime` installed, or
`onnxruntime-gpu` on a machine without a GPU) and runs on CPU with only a console warning, which
would make a GPU benchmark or bundle check measure the CPU. `session_for` compares what ran with
what was asked and raises `ProviderFallback` unless the caller accepts the fallback.
"""

import logging
from pathlib import Path

import onnxruntime as ort

from common.providers import CPU, TENSORRT, provider_options
from export.tensorrt import tensorrt_problems

log = logging.getLogger(__name__)

GPU_HINT = (
    "GPU providers need onnxruntime-gpu on a machine with an NVIDIA GPU and driver: pip install '.[gpu]' "
    "(uninstall onnxruntime first; onnxruntime and onnxruntime-gpu must not be installed together)."
)


class ProviderFallback(RuntimeError):
    """A requested execution provider is not active in the session; the message names requested vs active."""


def available() -> list[str]:
    """The execution providers this onnxruntime build offers (offered is not the same as usable)."""
    return ort.get_available_providers()


def missing_here(runtime: str, providers: list[str]) -> str | None:
    """Why this machine cannot run a bundle for `runtime` on `providers`, or None when it can."""
    if runtime == "tensorrt" or TENSORRT in providers:
        problems = tensorrt_problems()
        if problems:
            return "; ".join(problems)
    absent = [p for p in providers if p != CPU and p not in available()]
    return f"{', '.join(absent)} not offered by this onnxruntime build" if absent else None


def session_for(
    model_path: str | Path,
    requested: list[str],
    threads: int | None = None,
    *,
    allow_fallback: bool = False,
    fp16: bool = True,
    cache_dir: Path | None = None,
    disabled_optimizers: list[str] | None = None,
) -> ort.InferenceSession:
    """An InferenceSession on `requested` providers (in priority order); raise `ProviderFallback` if any is not active.

    `threads` sets intra-op threads (None: ONNX Runtime's default); `disabled_optimizers` names graph
    optimizers to skip (a bundle's own list). With `allow_fallback` a missing provider is logged as a
    warning and the session is returned anyway.
    """
    if not requested:
        raise ValueError("no execution providers requested (e.g. ['CPUExecutionProvider'])")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    offered = available()
    # Leave out providers this build lacks, so ONNX Runtime does not print its own fallback banner;
    # they are reported below together with those that failed to start.
    usable = [p for p in requested if p in offered]
    providers = [(p, provider_options(p, model_path, fp16, cache_dir)) for p in usable] or [CPU]
    session = ort.InferenceSession(
        str(model_path), options, providers=providers, disabled_optimizers=disabled_optimizers or None
    )
    active = session.get_providers()
    missing = [p for p in requested if p not in active]
    if missing:
        reasons = [
            f"{p} is {'offered but failed to start (no GPU or driver?)' if p in offered else 'not in this onnxruntime build'}"
            for p in missing
        ]
        message = (
            f"{model_path}: requested providers {requested}, active {active}; " + "; ".join(reasons) + f". {GPU_HINT}"
        )
        if not allow_fallback:
            raise ProviderFallback(message)
        log.warning("falling back: %s", message)
    return session
