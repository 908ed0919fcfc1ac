"""The served model's runner: the bundle opened by `common.runtime` with the server's settings, its errors as
`BundleRejected`. The runner's `infer` is called from one thread at a time."""

import logging

from edgedistill.common import manifest as mf
from edgedistill.common.bundle import Bundle
from edgedistill.common.runtime import (
    DeviceError,
    ModelLoadError,
    PrecisionRefused,
    ProviderFallback,
    Runner,
    TensorRTUnavailable,
    open_bundle,
)
from edgedistill.common.settings import SettingError
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.settings import Settings, env_name, flag_name
from edgedistill.serve.workers import intra_op_threads

log = logging.getLogger(__name__)


class BackendUnavailable(BundleRejected):
    """The runtime or execution provider a bundle needs is not installed here, or has no device (or device memory) to
    run on."""


def load_backend(bundle: Bundle, settings: Settings, model: bytes | None = None) -> Runner:
    """The bundle's runner (from `model`, its model file's verified bytes, where given) on `settings.providers`
    (empty: the bundle's), `threads` (0: `intra_op_threads` for the server's WORKERS) and `spin`, for batches of up to
    `largest_batch` rows.

    A requested GPU provider that is not active refuses the bundle, unless `allow_cpu_fallback` accepts the CPU. A
    TensorRT engine runs on its GPU whatever `providers`, `threads` and `spin` say (`serve.cascade.refuse_unused_by`
    refuses them for a server of engines alone).
    """
    # ONNX Runtime's intra-op threads (WORKERS=0 is one process here); a TensorRT engine runs none, nor spins them
    onnx_runtime = bundle.spec.runtime == "onnxruntime"
    threads = intra_op_threads(settings.threads, max(1, settings.workers)) if onnx_runtime else None
    try:
        runner = open_bundle(
            bundle,
            settings.providers,
            model=model,
            threads=threads,
            spin=settings.spin,
            allow_cpu_fallback=settings.allow_cpu_fallback,
            max_batch=settings.largest_batch,
        )
    except SettingError as err:  # TensorRT's engine cache (EDGEDISTILL_TRT_CACHE) cannot be made
        raise BackendUnavailable(str(err)) from err
    except PrecisionRefused as err:
        chosen = f"those {env_name('providers')} names" if settings.providers else "the bundle's"
        raise BackendUnavailable(
            f"{err}. The providers are {chosen}; {env_name('providers')} ({flag_name('providers')}) chooses others."
        ) from err
    except ProviderFallback as err:
        raise BackendUnavailable(
            f"{err} To serve on the CPU anyway, set {env_name('allow_cpu_fallback')}=true "
            f"({flag_name('allow_cpu_fallback')} true)."
        ) from err
    except TensorRTUnavailable as err:
        raise BackendUnavailable(
            f"{bundle.folder} is a TensorRT engine (runtime 'tensorrt'): {err}\n"
            "Or serve an ONNX bundle (runtime 'onnxruntime')."
        ) from err
    except DeviceError as err:  # an engine's execution context or CUDA stream the GPU cannot make (its memory full)
        raise BackendUnavailable(f"{bundle.folder} cannot start on its GPU: {err}") from err
    except (ModelLoadError, mf.ArtifactError) as err:
        raise BundleRejected(str(err)) from err
    session = f", {threads or 'default'} intra-op threads, spinning {'on' if settings.spin else 'off'}"
    log.info(
        "%s ready on %s%s",
        bundle.spec.runtime,
        runner.providers,
        session if onnx_runtime else "",
        extra={
            "event": "backend_ready",
            "runtime": bundle.spec.runtime,
            "providers": runner.providers,
            "threads": threads,
            "spin": settings.spin if onnx_runtime else None,
        },
    )
    return runner
