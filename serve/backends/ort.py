"""ONNX Runtime backend: one `InferenceSession` with the requested execution providers."""

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from common.bundle import BundleSpec
from common.providers import provider_options
from serve.errors import BundleRejected

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
ALIASES = {
    "cpu": CPU,
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}
GPU_PROVIDERS = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}
SPIN_KEY = "session.intra_op.allow_spinning"


def resolve_providers(requested: list[str]) -> list[str]:
    """Full provider names in priority order (aliases such as 'cuda' expanded), CPU last as the fallback."""
    names = [ALIASES.get(name.lower(), name) for name in requested]
    ordered = list(dict.fromkeys(names))
    if CPU not in ordered:
        ordered.append(CPU)
    return ordered


class OrtBackend:
    def __init__(self, model_path: Path, spec: BundleSpec, providers: list[str], threads: int = 0, spin: bool = False):
        requested = resolve_providers(providers)
        available = set(ort.get_available_providers())
        missing = [name for name in requested if name not in available]
        for name in missing:
            hint = " (install onnxruntime-gpu: pip install '.[gpu]')" if name in GPU_PROVIDERS else ""
            log.warning(
                "execution provider %s was requested but this onnxruntime build lacks it%s; available: %s",
                name,
                hint,
                sorted(available),
                extra={"event": "provider_missing", "provider": name},
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry(SPIN_KEY, "1" if spin else "0")
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(
                str(model_path),
                sess_options=options,
                providers=[(p, provider_options(p, model_path)) for p in requested if p in available],
                disabled_optimizers=spec.disabled_optimizers or None,
            )
        except Exception as err:  # onnxruntime raises its own exception types for bad graphs
            raise BundleRejected(f"onnxruntime cannot load {model_path}: {err}") from err
        self.providers = self.session.get_providers()
        self.max_batch_size = None
        fell_back = [name for name in requested if name in GPU_PROVIDERS and name not in self.providers]
        if fell_back:
            log.warning(
                "GPU execution provider(s) %s requested but not in use: the model runs on %s. "
                "Check the CUDA/cuDNN/TensorRT libraries and that a GPU is visible.",
                fell_back,
                self.providers,
                extra={"event": "provider_fallback", "requested": requested, "in_use": self.providers},
            )
        log.info(
            "onnxruntime session ready on %s, %s intra-op threads, spinning %s",
            self.providers,
            threads or "default",
            "on" if spin else "off",
            extra={
                "event": "backend_ready",
                "runtime": "onnxruntime",
                "providers": self.providers,
                "threads": threads,
                "spin": spin,
            },
        )
        self._check_io(spec, model_path)
        self.output_names = [out.name for out in self.session.get_outputs()]

    def _check_io(self, spec: BundleSpec, model_path: Path) -> None:
        model_inputs = {i.name for i in self.session.get_inputs()}
        if model_inputs != set(spec.input_names):
            raise BundleRejected(
                f"{model_path} takes inputs {sorted(model_inputs)}, the bundle spec says {sorted(spec.input_names)}"
            )
        model_outputs = {o.name for o in self.session.get_outputs()}
        missing = {o.name for o in spec.outputs} - model_outputs
        if missing:
            raise BundleRejected(f"{model_path} has no output(s) {sorted(missing)} named in the bundle spec")

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(self.output_names, inputs)
        return dict(zip(self.output_names, values, strict=True))

    def close(self) -> None:
        del self.session
