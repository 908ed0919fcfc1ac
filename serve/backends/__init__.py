"""Model runtimes behind one call: `infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`.

The bundle spec's `runtime` picks the backend: `onnxruntime` -> `OrtBackend` (`model.onnx`),
`tensorrt` -> `TensorRTBackend` (`model.plan`). `infer` is called from one worker thread at a time.
"""

from typing import Protocol

import numpy as np

from common.bundle import Bundle
from serve.errors import BundleRejected


class BackendUnavailable(BundleRejected):
    """The runtime a bundle needs is not installed, or has no device to run on."""


class Backend(Protocol):
    providers: list[str]
    """What actually runs the model, e.g. ['CUDAExecutionProvider', 'CPUExecutionProvider']."""

    max_batch_size: int | None
    """The most rows one call accepts (an engine's optimisation profile), None when unbounded."""

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None:
        """Release device memory and sessions; `infer` must not be called afterwards."""


def load_backend(bundle: Bundle, providers: list[str], threads: int, spin: bool = False) -> Backend:
    """The backend for `bundle.spec.runtime`; `providers` (empty: the bundle's), `threads` and `spin` apply to
    ONNX Runtime."""
    runtime = bundle.spec.runtime
    if runtime == "onnxruntime":
        from serve.backends.ort import OrtBackend

        return OrtBackend(bundle.model_path, bundle.spec, providers or bundle.spec.providers, threads, spin)
    if runtime == "tensorrt":
        from serve.backends.trt import TensorRTBackend

        return TensorRTBackend(bundle.model_path, bundle.spec)
    raise BundleRejected(f"{bundle.folder}: unknown runtime {runtime!r}")
