"""Where training and labelling run: the recipe's `runtime` section resolved against this machine.

`device: auto` is CUDA when PyTorch sees a GPU, else the CPU; under `torchrun` each rank takes the GPU
of its `LOCAL_RANK`. `precision: auto` is bf16 on a GPU that supports it, fp16 with a gradient scaler
on one that does not, and fp32 on the CPU, except for labelling on a CPU that computes bf16 in hardware
(`for_labelling`; docs/training.md). A setting the machine cannot honour raises `DeviceError` before any work starts,
naming the setting and what the machine has: never a silent fall back to the CPU.
"""

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import transformers
from edgedistill.common import settings
from edgedistill.common.config.training import RuntimeConfig
from edgedistill.common.recipe import RecipeError
from edgedistill.distill import dist

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceError(RecipeError):
    """A `runtime` setting this machine cannot honour."""


@dataclass(frozen=True)
class Placement:
    """A resolved device and precision: how a stage moves batches, autocasts and scales its loss. `count`: the GPUs
    the run uses (one per process), 1 on the CPU."""

    device: torch.device
    precision: str
    name: str
    count: int

    def autocast(self):
        """Mixed precision around forward passes (a no-op in fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.precision])

    def scaler(self) -> torch.amp.GradScaler:
        """A loss scaler, active for fp16 only (bf16 has fp32's range)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def move(self, value):
        """`value` (a tensor, or a mapping/list/tuple of them, such as a collator's `BatchEncoding`) on this device;
        a mapping comes back as a dict."""
        if isinstance(value, torch.Tensor):
            return value.to(self.device, non_blocking=True)
        if isinstance(value, Mapping):
            return {key: self.move(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.move(item) for item in value)
        return value

    def describe(self) -> dict:
        """What a manifest records of the placement, with this process's intra-op threads (results repeat byte for
        byte only with the same count)."""
        return {
            "device": str(self.device),
            "device_name": self.name,
            "device_count": self.count,
            "precision": self.precision,
            "threads": torch.get_num_threads(),
        }

    def reset_peak_memory(self) -> None:
        """Start `peak_memory_mb` afresh (a stage that follows another in the same process reports its own)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_mb(self) -> float | None:
        """The most GPU memory this process held (MB), None on the CPU."""
        if self.device.type != "cuda":
            return None
        return round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)


def load_trainable(auto, folder, **kwargs):
    """`auto.from_pretrained(folder, **kwargs)` with fp32 weights, whatever dtype the checkpoint was saved in.

    transformers otherwise keeps a bf16 or fp16 checkpoint's dtype, and training would then update
    low-precision weights; mixed precision comes from `Placement.autocast` alone.
    """
    return auto.from_pretrained(folder, dtype=torch.float32, **kwargs)


def configure_process(threads: int | None = None) -> None:
    """Set-up of a process that runs models in PyTorch: `threads` intra-op threads (default
    `EDGEDISTILL_TORCH_THREADS`, else `OMP_NUM_THREADS`, else every core) and transformers' logs down to errors,
    without progress bars."""
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(threads or settings.threads())


def _machine() -> str:
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return f"{torch.cuda.device_count()} CUDA device(s): {', '.join(names)}"
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"no CUDA device visible to PyTorch {torch.__version__} ({built})"


def for_process(cfg: RuntimeConfig) -> Placement:
    """The placement of this process, with its rank from `torchrun`'s environment."""
    return resolve(cfg, *dist.launched())


def native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX); elsewhere PyTorch emulates it, slower
    than fp32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def emulation_warning(placement: Placement) -> str | None:
    """What to tell a user whose placement computes bf16 on a CPU that only emulates it (several times slower than
    fp32), else None. Not refused: the results are right, only slow."""
    if placement.device.type != "cpu" or placement.precision != "bf16" or native_bf16():
        return None
    return (
        "runtime.precision=bf16 on a CPU without AVX512-BF16 or AMX: PyTorch emulates bf16 there, several times "
        "slower than fp32; set runtime.precision=fp32 (or auto)"
    )


def for_labelling(cfg: RuntimeConfig) -> Placement:
    """The placement of a stage that runs the teacher forward only: as `for_process`, but `precision: auto` on a
    CPU with native bf16 is bf16 (1.6-1.8x fp32's speed there; the labels are checked against fp32)."""
    placement = for_process(cfg)
    if cfg.precision == "auto" and placement.device.type == "cpu" and native_bf16():
        return replace(placement, precision="bf16")
    return placement


def resolve(cfg: RuntimeConfig, local_rank: int = 0, local_world_size: int = 1, world_size: int = 1) -> Placement:
    """The placement of this process (rank `local_rank` of the `local_world_size` on its node, of `world_size` in
    all)."""
    kind, _, index = cfg.device.partition(":")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        precision = "fp32" if cfg.precision == "auto" else cfg.precision
        if precision == "fp16":
            on = f"runtime.device={cfg.device}{settings.env_source('runtime.device', cfg.device)}"
            raise DeviceError(
                f"runtime.precision=fp16{settings.env_source('runtime.precision', 'fp16')} needs a CUDA GPU (its loss "
                f"scaler and kernels), and {on} trains on the CPU: there use bf16 or fp32. This machine: {_machine()}"
            )
        return Placement(torch.device("cpu"), precision, "cpu", 1)
    if not torch.cuda.is_available():
        raise DeviceError(
            f"runtime.device={cfg.device}{settings.env_source('runtime.device', cfg.device)} but {_machine()}. Set "
            "runtime.device=cpu (--runtime.device=cpu or EDGEDISTILL_DEVICE=cpu), or run on a machine with an NVIDIA GPU and a "
            "CUDA build of torch."
        )
    count = torch.cuda.device_count()
    if index and local_world_size > 1:
        raise DeviceError(
            f"runtime.device={cfg.device}{settings.env_source('runtime.device', cfg.device)} names one GPU, but "
            f"torchrun started {local_world_size} processes on this node: use runtime.device=cuda "
            "(--runtime.device=cuda), and each rank takes the GPU of its LOCAL_RANK"
        )
    if not index and local_rank >= count:
        raise DeviceError(
            f"torchrun started {local_world_size} processes on this node, one per GPU, but it has {_machine()}; "
            f"lower --nproc_per_node (make NPROC=) to at most {count}"
        )
    gpu = int(index) if index else local_rank
    if gpu >= count:
        raise DeviceError(
            f"runtime.device={cfg.device}{settings.env_source('runtime.device', cfg.device)} asks for GPU {gpu} (rank "
            f"{local_rank}), but {_machine()}"
        )
    device = torch.device("cuda", gpu)
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16" if gpu_bf16(device) else "fp16"
    if precision == "bf16" and not gpu_bf16(device):
        raise DeviceError(
            f"runtime.precision=bf16{settings.env_source('runtime.precision', 'bf16')} but "
            f"{torch.cuda.get_device_name(device)} (compute capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}) has no bf16 kernels, only an emulation "
            "slower than fp32: use fp16 or fp32"
        )
    torch.cuda.set_device(device)
    return Placement(device, precision, torch.cuda.get_device_name(device), world_size)


def gpu_bf16(device: torch.device) -> bool:
    """Whether GPU `device` computes bf16 natively (NVIDIA from Ampere on). `torch.cuda.is_bf16_supported()` alone
    also says yes where bf16 is only emulated (a V100 or T4), and asks the current device, not `device`."""
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)
