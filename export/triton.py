"""A Triton Inference Server model repository for a bundle: `<repo>/<model name>/{config.pbtxt, 1/model.*}`.

The config is built as Triton's own `ModelConfig` protobuf message and printed in text format, so it
is well-formed by construction. The model folder is written atomically (`common.atomic`). It holds one version,
1, as Triton numbers versions: the bundle's own version (`ServedModel.version`, a content hash) is not a number.
`python -m export.triton BUNDLE_FOLDER REPO_ROOT [options]`.
"""

import argparse
import importlib.util
import re
import shutil
import sys
from pathlib import Path, PurePosixPath
from types import ModuleType

from edgedistill.common import manifest as mf
from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.atomic import atomic_write, publish_folder
from edgedistill.common.bundle import PADDING_SIDE, Bundle, BundleSpec, TensorSpec, load_bundle
from edgedistill.common.providers import cuda_options
from edgedistill.common.runtime import (
    CUDA,
    TENSORRT,
    TRITON_LABELS_FILE,
    TRITON_PLATFORMS,
    Shapes,
    refuse_tf32,
    tensorrt_options,
)
from google.protobuf import text_format
from pydantic import BaseModel, ConfigDict, Field

DATA_TYPES = {"int64": "TYPE_INT64", "int32": "TYPE_INT32", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
KINDS = ("KIND_CPU", "KIND_GPU")
PREFERRED_BATCH_SIZES = (8, 32)  # those within max_batch_size, unless told
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
FLAG_TYPES = {"preferred_batch_sizes": {"type": int, "nargs": "*"}, "kind": {"choices": KINDS}}  # else an int
VERSION = "1"  # the model folder's only version folder: a new bundle replaces the whole model folder
# Where Triton's TensorRT accelerator keeps the engines it builds, in Triton's filesystem: a folder every container has
# (the provider makes only the engine folder below it). Instances and reloads share them; a new container builds again.
TRITON_TRT_CACHE = PurePosixPath("/tmp")
# What a plan loads on alone, as its manifest records it (`info.tensorrt_build`): config parameters plan_<key>.
PLAN_BUILT_WITH = ("tensorrt", "gpu")


def _load_model_config_pb2() -> ModuleType:
    """Triton's `model_config_pb2`, loaded by itself.

    Importing it through `tritonclient.grpc` would also load that package's KServe `inference.*`
    service messages, which the server defines too: protobuf allows one copy per process.
    """
    name = "tritonclient.grpc.model_config_pb2"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("tritonclient")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError(
            "writing a Triton repository needs tritonclient: pip install 'tritonclient[grpc]'", name="tritonclient"
        )
    path = Path(next(iter(package.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    module.__spec__.loader.exec_module(module)
    sys.modules[name] = module
    return module


model_config_pb2 = _load_model_config_pb2()


def _tensor(message, spec: TensorSpec) -> None:
    """Fill a ModelInput/ModelOutput: Triton dims leave out the batch axis and write symbolic axes as -1."""
    if not isinstance(spec.shape[0], str):
        raise ValueError(f"tensor {spec.name}: first axis {spec.shape[0]} is fixed; Triton batching needs a batch axis")
    message.name = spec.name
    message.data_type = model_config_pb2.DataType.Value(DATA_TYPES[spec.dtype])
    message.dims.extend(-1 if isinstance(axis, str) else axis for axis in spec.shape[1:])


class Batching(BaseModel):
    """How Triton batches and places the model, each option declared once for `write_repository` and the command
    line; `model_config` checks them, against the bundle too."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch_size: int = Field(64, description="rows per batch Triton may form")
    preferred_batch_sizes: tuple[int, ...] | None = Field(
        None,
        description=f"the dynamic batcher's (default: those of {' '.join(map(str, PREFERRED_BATCH_SIZES))} within "
        "max_batch_size)",
    )
    max_queue_delay_us: int = Field(1000, description="how long a request waits for a batch, in microseconds")
    instance_count: int = Field(1, description="model instances")
    kind: str | None = Field(
        None,
        description="where the instances run (default: KIND_GPU for a TensorRT plan or a bundle built for a GPU "
        "provider, else KIND_CPU)",
    )


def default_kind(spec: BundleSpec) -> str:
    """Where a bundle's instances run unless told: on a GPU for a TensorRT plan or a bundle built for a GPU provider."""
    on_gpu = spec.runtime == "tensorrt" or bool({CUDA, TENSORRT} & set(spec.providers))
    return "KIND_GPU" if on_gpu else "KIND_CPU"


def model_config(bundle: Bundle, batching: Batching):
    """The `ModelConfig` message for a loaded bundle, batched and placed by `batching`."""
    spec = bundle.spec
    max_batch_size, preferred_batch_sizes = batching.max_batch_size, batching.preferred_batch_sizes
    max_queue_delay_us, instance_count = batching.max_queue_delay_us, batching.instance_count
    kind = batching.kind or default_kind(spec)
    if preferred_batch_sizes is None:
        preferred_batch_sizes = tuple(size for size in PREFERRED_BATCH_SIZES if size <= max_batch_size)
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if any(not 1 <= size <= max_batch_size for size in preferred_batch_sizes):
        raise ValueError(f"preferred batch sizes {list(preferred_batch_sizes)} must lie in 1..{max_batch_size}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if instance_count < 1:
        raise ValueError(f"instance_count must be >= 1, got {instance_count}")
    if max_queue_delay_us < 0:
        raise ValueError(f"max_queue_delay_us must be >= 0, got {max_queue_delay_us}")
    if spec.runtime not in TRITON_PLATFORMS:
        raise ValueError(f"{bundle.folder}: Triton has no platform for runtime {spec.runtime!r}")
    if spec.runtime == "tensorrt" and kind != "KIND_GPU":
        raise ValueError("a TensorRT plan runs only on a GPU: use kind='KIND_GPU'")
    if spec.runtime == "tensorrt" and max_batch_size > (largest := _profile_max_batch(bundle)):
        raise ValueError(
            f"{bundle.folder}: the plan's optimization profile takes batches of at most {largest}, and Triton refuses "
            f"a max_batch_size above it: use {largest} or less"
        )
    if spec.runtime == "tensorrt" and (missing := [key for key in PLAN_BUILT_WITH if key not in _plan_build(bundle)]):
        raise ValueError(f"{bundle.folder}: the manifest records no {' or '.join(missing)} the plan was built with")
    if not MODEL_NAME.match(spec.name):
        raise ValueError(f"bundle name {spec.name!r} is not usable as a Triton model folder name")
    config = model_config_pb2.ModelConfig(
        name=spec.name, platform=TRITON_PLATFORMS[spec.runtime], max_batch_size=max_batch_size
    )
    for tensor in spec.inputs:
        _tensor(config.input.add(), tensor)
    for tensor in spec.outputs:
        output = config.output.add()
        _tensor(output, tensor)
        if tensor.shape[-1] == len(spec.labels):
            output.label_filename = TRITON_LABELS_FILE  # class names for Triton's classification extension
    config.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes)
    config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    config.instance_group.add(count=instance_count, kind=model_config_pb2.ModelInstanceGroup.Kind.Value(kind))
    # for clients that tokenize: how they write texts, pad a batch (on the right, with the pad id a GPT-style model
    # finds its last token by) and cut a text, and make a pair's token_type_ids (common.segments)
    config.parameters["text_style"].string_value = spec.text_style
    config.parameters["pad_token_id"].string_value = str(spec.pad_token_id)
    config.parameters["padding_side"].string_value = PADDING_SIDE
    config.parameters["max_length"].string_value = str(spec.max_length)
    if spec.pair_segments != "token_types":
        config.parameters["pair_segments"].string_value = spec.pair_segments
    if spec.runtime == "tensorrt":  # it loads on a Triton release of its TensorRT version, on its GPU, alone
        for key in PLAN_BUILT_WITH:
            config.parameters[f"plan_{key}"].string_value = _plan_build(bundle)[key]
    if kind == "KIND_GPU" and spec.runtime == "onnxruntime":
        refuse_tf32(spec.providers, spec.precision, f"{bundle.folder} on Triton's tensorrt execution accelerator")
        accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
        if TENSORRT in spec.providers:
            # the provider it was built and checked with, as the server runs it: FP16 kernels for an fp16 bundle only,
            # one profile over Triton's batches and the bundle's max length, engines cached in Triton's filesystem
            shapes = Shapes(tuple(spec.input_names), max_batch_size, spec.max_length)
            digest = bundle.manifest.files[spec.model_file].sha256
            options = tensorrt_options(spec.precision, digest, shapes, TRITON_TRT_CACHE)
            tensorrt = accelerators.add(name="tensorrt")
            tensorrt.parameters["precision_mode"] = "FP16" if options.pop("trt_fp16_enable") else "FP32"
            for key, value in options.items():
                tensorrt.parameters[key] = str(value)
        # the CUDA options the bundle was checked with and the server runs it with (TF32 off but for fp16)
        cuda = accelerators.add(name="cuda")
        for key, value in cuda_options(spec.precision).items():
            cuda.parameters[key] = str(value)
        # and where the config has parameters, Triton's backend sets an exhaustive search unless this one says (1:
        # heuristic), over the accelerator's
        config.parameters["cudnn_conv_algo_search"].string_value = "1"
    return config


def _plan_build(bundle: Bundle) -> dict:
    """How a TensorRT bundle's plan was built, as its manifest records it (`info.tensorrt_build`)."""
    return bundle.manifest.info.get("tensorrt_build", {})


def _profile_max_batch(bundle: Bundle) -> int:
    """The largest batch every input of a TensorRT bundle's optimization profile takes (its manifest records it)."""
    profile = _plan_build(bundle).get("profile")
    if not profile:
        raise ValueError(f"{bundle.folder}: the manifest records no TensorRT optimization profile (tensorrt_build)")
    if missing := [name for name in bundle.spec.input_names if name not in profile]:
        raise ValueError(f"{bundle.folder}: the TensorRT optimization profile (tensorrt_build) lacks inputs {missing}")
    return min(shapes["max"][0] for shapes in profile.values())


def write_repository(bundle_folder: str | Path, repo_root: str | Path, **batching) -> Path:
    """Verify the bundle and write `<repo_root>/<name>/` (config.pbtxt, labels.txt, 1/model file); return it.

    `batching`: the options of `Batching`. A TensorRT plan's optimization profile must cover `max_batch_size`, or
    Triton refuses to load it. An existing model folder of the same name is replaced whole.
    """
    root = Path(repo_root)
    existing = next(folder for folder in (root, *root.parents) if folder.exists())
    if not existing.is_dir():
        raise ValueError(f"the repository {root} must be a folder (made where missing), but {existing} is a file")
    bundle = load_bundle(bundle_folder)
    spec = bundle.spec
    config = model_config(bundle, Batching(**batching))
    final = root / spec.name

    def fill(folder: Path) -> None:
        (folder / VERSION).mkdir(parents=True)
        copied = folder / VERSION / spec.model_file
        shutil.copyfile(bundle.model_path, copied)
        if mf.sha256_file(copied) != bundle.manifest.files[spec.model_file].sha256:
            raise mf.ArtifactError(f"{bundle.model_path} changed while it was being copied")
        (folder / TRITON_LABELS_FILE).write_text("".join(f"{label}\n" for label in spec.labels), encoding="utf-8")
        (folder / "config.pbtxt").write_text(text_format.MessageToString(config), encoding="utf-8")

    replaced = final.exists()
    # Made beside the repository, not in it: Triton reads each of its folders as a model, hidden ones too, and one
    # half-written, or the old one a rewrite swaps out, would be a model it fails to load
    staged = root.resolve().parent / f".{root.name}.{spec.name}"
    atomic_write(staged, fill)
    root.mkdir(parents=True, exist_ok=True)
    publish_folder(staged, final)
    if replaced:
        print(f"replaced {final} whole: its earlier versions and config.pbtxt are gone", file=sys.stderr)
    return final


def main(argv: list[str] | None = None, prog: str = "python -m export.triton") -> int:
    parser = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("bundle", help="a bundle folder, e.g. runs/sst2/bundle-cnn-small-folded")
    parser.add_argument("repo", help="the model repository root Triton is started with (--model-repository)")
    for name, field in Batching.model_fields.items():
        shown = "" if field.default is None else f" (default {field.default})"
        parser.add_argument(
            "--" + name.replace("_", "-"),
            default=argparse.SUPPRESS,
            help=field.description + shown,
            **FLAG_TYPES.get(name, {"type": int}),
        )
    args = vars(parser.parse_args(argv))
    try:
        folder = write_repository(args.pop("bundle"), args.pop("repo"), **args)
    except (mf.ArtifactError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a folder in the way, one it may not write to
        print(f"error: cannot write the model repository: {err}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":  # its usage names the module as it was run: `edgedistill.` first when installed
    from edgedistill.cli import run_module

    run_module(main, f"python -m {__spec__.name}", "triton-repo")
