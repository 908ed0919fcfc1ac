"""TensorRT engine backend: deserialises `model.plan` and runs it with CUDA buffers from cuda-python.

Needs the `tensorrt` and `cuda-python` packages and an NVIDIA GPU; without them loading fails with
a `BackendUnavailable` naming what is missing. Engines are tied to the TensorRT version and GPU
they were built on.
"""

import logging
from pathlib import Path

import numpy as np

from common.bundle import BundleSpec
from serve.backends import BackendUnavailable
from serve.errors import BundleRejected

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install '.[gpu]' on a machine with an NVIDIA GPU and its driver"


class TensorRTError(RuntimeError):
    """A CUDA or TensorRT call failed while running the engine."""


def import_runtime():
    """`(tensorrt, cudart)`, or `BackendUnavailable` saying which package is missing and how to get it."""
    try:
        import tensorrt
    except ImportError as err:
        raise BackendUnavailable(
            f"this bundle is a TensorRT engine (runtime 'tensorrt') but the tensorrt Python package is not "
            f"importable ({err}). Install it with {INSTALL_HINT}, or serve an ONNX bundle (runtime 'onnxruntime')."
        ) from err
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python layout
        except ImportError as err:
            raise BackendUnavailable(
                f"the TensorRT backend needs the cuda-python package for GPU buffers, which is not importable "
                f"({err}). Install it with {INSTALL_HINT}."
            ) from err
    return tensorrt, cudart


class TensorRTBackend:
    def __init__(self, model_path: Path, spec: BundleSpec):
        trt, cudart = import_runtime()
        self.trt, self.cudart = trt, cudart
        err, count = cudart.cudaGetDeviceCount()
        if err != cudart.cudaError_t.cudaSuccess or count == 0:
            raise BackendUnavailable(
                f"no NVIDIA GPU is visible (cudaGetDeviceCount: {self._error_name(err)}, {count} devices); a "
                f"TensorRT engine needs one. Run on a GPU machine ({INSTALL_HINT}) or serve an ONNX bundle."
            )
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(model_path).read_bytes())
        if self.engine is None:
            raise BundleRejected(
                f"TensorRT {trt.__version__} cannot deserialise {model_path}: engines only load on the TensorRT "
                "version and GPU they were built for; rebuild it on this machine"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        if set(self.inputs) != set(spec.input_names):
            raise BundleRejected(f"{model_path} takes inputs {self.inputs}, the bundle spec says {spec.input_names}")
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        limits = [self.engine.get_tensor_profile_shape(n, 0)[2] for n in self.inputs]  # (min, opt, max)[max]
        self.max_batch_size = min(int(shape[0]) for shape in limits)
        longest = min(int(shape[1]) for shape in limits)
        if longest < spec.max_length:
            raise BundleRejected(
                f"{model_path}: the engine's profile allows sequences up to {longest} tokens, the bundle's "
                f"max_length is {spec.max_length}; rebuild the engine with a larger profile"
            )
        self.stream = self._check(cudart.cudaStreamCreate())
        self._buffers: dict[str, tuple[int, int]] = {}
        self.providers = [f"TensorRT {trt.__version__}"]
        log.info(
            "TensorRT engine ready (max batch %d)",
            self.max_batch_size,
            extra={"event": "backend_ready", "runtime": "tensorrt", "providers": self.providers},
        )

    @staticmethod
    def _error_name(err) -> str:
        return getattr(err, "name", str(err))

    def _check(self, result):
        err, *values = result
        if err != self.cudart.cudaError_t.cudaSuccess:
            raise TensorRTError(f"CUDA call failed: {self._error_name(err)}")
        return values[0] if len(values) == 1 else values

    def _buffer(self, name: str, nbytes: int) -> int:
        """A device buffer of at least `nbytes` for `name`, grown (never shrunk) as batches get bigger."""
        pointer, capacity = self._buffers.get(name, (0, 0))
        if capacity < nbytes:
            if pointer:
                self._check(self.cudart.cudaFree(pointer))
            pointer = int(self._check(self.cudart.cudaMalloc(nbytes)))
            self._buffers[name] = (pointer, nbytes)
        return pointer

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart = self.cudart
        host_inputs = []  # kept alive until the stream is synchronised
        for name in self.inputs:
            array = np.ascontiguousarray(inputs[name], dtype=self.dtypes[name])
            if not self.context.set_input_shape(name, array.shape):
                raise TensorRTError(f"the engine rejects input {name} of shape {array.shape}")
            pointer = self._buffer(name, array.nbytes)
            self._check(
                cudart.cudaMemcpyAsync(
                    pointer, array.ctypes.data, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream
                )
            )
            self.context.set_tensor_address(name, pointer)
            host_inputs.append(array)
        results = {}
        for name in self.outputs:
            result = np.empty(tuple(self.context.get_tensor_shape(name)), dtype=self.dtypes[name])
            self.context.set_tensor_address(name, self._buffer(name, max(result.nbytes, 1)))
            results[name] = result
        if not self.context.execute_async_v3(int(self.stream)):
            raise TensorRTError("TensorRT execution failed (see the TensorRT log above)")
        for name, result in results.items():
            self._check(
                cudart.cudaMemcpyAsync(
                    result.ctypes.data,
                    self._buffers[name][0],
                    result.nbytes,
                    cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                    self.stream,
                )
            )
        self._check(cudart.cudaStreamSynchronize(self.stream))
        return {
            name: value.astype(np.float32) if value.dtype == np.float16 else value for name, value in results.items()
        }

    def close(self) -> None:
        for pointer, _ in self._buffers.values():
            self.cudart.cudaFree(pointer)
        self._buffers.clear()
        self.cudart.cudaStreamDestroy(self.stream)
