"""ONNX Runtime's execution providers by name, and CUDA's provider options: what needs no ONNX Runtime installed (the
`report` role, which has none, writes them into model cards)."""

from edgedistill.common.names import did_you_mean

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
ALIASES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT, "trt": TENSORRT}
# Every execution provider ONNX Runtime names, whether or not a build offers it (`onnxruntime.get_all_providers()`,
# which a test keeps this equal to): another name is a typo, which no build on any machine would run.
PROVIDERS = (
    "ACLExecutionProvider",
    "AzureExecutionProvider",
    "CANNExecutionProvider",
    "CoreMLExecutionProvider",
    CPU,
    CUDA,
    "DmlExecutionProvider",
    "DnnlExecutionProvider",
    "JsExecutionProvider",
    "MIGraphXExecutionProvider",
    "NnapiExecutionProvider",
    "NvTensorRTRTXExecutionProvider",
    "OpenVINOExecutionProvider",
    "QNNExecutionProvider",
    "RknpuExecutionProvider",
    TENSORRT,
    "VitisAIExecutionProvider",
    "VSINPUExecutionProvider",
    "WebGpuExecutionProvider",
    "WebNNExecutionProvider",
    "XnnpackExecutionProvider",
)


def known_providers(providers: list[str]) -> list[str]:
    """`providers` by their full names (`ALIASES` expanded), in their order of priority. `ValueError` where one is no
    name of `PROVIDERS` nor `ALIASES` (naming the nearest), is named twice, or comes after the CPU's, where it would
    run nothing: ONNX Runtime gives each node to the first provider that takes it, and the CPU's takes every node."""
    for name in [name for name in providers if name not in PROVIDERS and name.lower() not in ALIASES]:
        raise ValueError(
            f"{name!r} is no ONNX Runtime execution provider, in any build: {did_you_mean(name, PROVIDERS)}ONNX Runtime's are "
            f"{', '.join(PROVIDERS)} (or {', '.join(ALIASES)} for short)"
        )
    full = [ALIASES.get(name.lower(), name) for name in providers]
    for twice in [name for index, name in enumerate(full) if name in full[:index]]:
        raise ValueError(f"{twice} is named twice ({', '.join(providers)}): name each provider once")
    if CPU in full[:-1]:
        after = ", ".join(full[full.index(CPU) + 1 :])
        raise ValueError(
            f"{after} after {CPU} would run nothing: ONNX Runtime gives each node to the first provider that takes it, "
            f"and {CPU} takes every node. List {CPU} last (or leave it out: it is added last)"
        )
    return full


def cuda_options(precision: str) -> dict:
    """CUDA's options for a model of `precision` (a bundle's: fp32, fp16 or int8): cuDNN algorithms picked by
    heuristic, TF32 off but for an fp16 model."""
    # A server meets a new (batch, length) shape on most calls, and ONNX Runtime's default, an exhaustive
    # cuDNN search, runs again for every new shape a convolution sees: a CNN student served on an H100
    # took 97 ms per call (median) with it.
    heuristic = {"cudnn_conv_algo_search": "HEURISTIC"}
    # ONNX Runtime's default runs fp32 MatMuls and convolutions in TF32 on Ampere and later (10 mantissa bits),
    # so an fp32 model would be checked and served in less than fp32; its TensorRT engine is built without TF32.
    return heuristic if precision == "fp16" else heuristic | {"use_tf32": 0}
