"""What a recipe's `runtime` section means on this machine, as far as it can be told without importing torch, which
loads for seconds: a command whose stages are all current checks its `runtime` here, and imports torch only where the
answer takes it (`distill.device` resolves the section in full)."""

import ast
import importlib.util
from pathlib import Path

from edgedistill.common.config.training import RuntimeConfig


def torch_is_cpu_only() -> bool:
    """Whether the installed torch is a build without CUDA or ROCm, told without importing it (`cpu_only_build`);
    False where there is no torch."""
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin is not None and cpu_only_build(Path(spec.origin).parent / "version.py")


def cpu_only_build(version_py: Path) -> bool:
    """Whether torch's `version.py` says a build without CUDA or ROCm (`cuda` and `hip` None); False where it cannot
    be read, or does not say."""
    try:
        tree = ast.parse(version_py.read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    built = {}
    for node in tree.body:  # `cuda: Optional[str] = None`, `hip: Optional[str] = '6.4...'`
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    built[target.id] = node.value.value
    return all(name in built and built[name] is None for name in ("cuda", "hip"))


def on_cpu(runtime: RuntimeConfig) -> bool:
    """Whether `runtime.device` surely resolves to the CPU here: `cpu`, or `auto` with a torch that has no GPU build."""
    return runtime.device == "cpu" or (runtime.device == "auto" and torch_is_cpu_only())


def check(runtime: RuntimeConfig) -> None:
    """Refuse a `runtime` this machine cannot honour (`distill.device.DeviceError`), as a command that builds would.
    A setting that no machine refuses to one process, or one the CPU honours where it surely runs there, is passed
    without importing torch; the others (`cuda`, fp16, bf16 where a GPU may be found) are resolved in full. Under
    torchrun, whose ranks never skip a stage (`common.stage.skip_all`), the build resolves each rank's GPU."""
    if runtime.precision in ("auto", "fp32") and runtime.device in ("auto", "cpu"):
        return
    if runtime.precision != "fp16" and on_cpu(runtime):
        return
    from edgedistill.distill import device

    device.for_process(runtime)
