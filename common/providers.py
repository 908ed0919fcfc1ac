"""ONNX Runtime execution-provider options, the same for the export checks, the benchmark and the server."""

from pathlib import Path

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def provider_options(provider: str, model_path: str | Path, fp16: bool = True, cache_dir: Path | None = None) -> dict:
    """Options for one provider: CUDA picks cuDNN algorithms by heuristic; TensorRT gets FP16 and engine/timing
    caches (default `<model folder>/trt_cache`)."""
    if provider == CUDA:
        # A server meets a new (batch, length) shape on most calls, and ONNX Runtime's default, an exhaustive
        # cuDNN search, runs again for every new shape a convolution sees: a CNN student served on an H100
        # took 97 ms per call (median) with it.
        return {"cudnn_conv_algo_search": "HEURISTIC"}
    if provider != TENSORRT:
        return {}
    cache = Path(cache_dir) if cache_dir is not None else Path(model_path).parent / "trt_cache"
    return {
        "trt_fp16_enable": fp16,
        # Building an engine takes minutes for a BERT; the cache is keyed by model, GPU and TensorRT version.
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(cache),
    }
