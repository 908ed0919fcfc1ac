import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import BundleSpec, TensorSpec
from edgedistill.common.runtime import PrecisionRefused, Shapes, provider_options
from edgedistill.export import triton
from edgedistill.export.triton import model_config_pb2, write_repository
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

NAME = "sst2-tiny"


def tiny_onnx(path):
    """(input_ids, attention_mask) int64 [batch, sequence] -> logits float [batch, 2] (embed, mean, linear)."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.normal(size=(4, 2)).astype(np.float32), "weight")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
            helper.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["pooled", "weight"], ["logits"]),
            helper.make_node("Identity", ["attention_mask"], ["unused_mask"]),
        ],
        "tiny",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ("input_ids", "attention_mask")
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [table, weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def plan_build(max_batch: int) -> dict:
    """`info.tensorrt_build` of a plan whose profile takes batches up to `max_batch`."""
    shapes = {"min": [1, 1], "opt": [8, 16], "max": [max_batch, 16]}
    return {
        "tensorrt": "10.16.1.11",
        "gpu": "NVIDIA H100 80GB HBM3",
        "profile": {"input_ids": shapes, "attention_mask": shapes},
    }


def make_bundle(
    tmp_path,
    runtime="onnxruntime",
    version="1",
    build: dict | None = None,
    providers=("CPUExecutionProvider",),
    pair_segments="token_types",
    precision="fp32",
):
    model_file = {"onnxruntime": "model.onnx", "tensorrt": "model.plan"}[runtime]
    folder = tmp_path / f"bundle-{runtime}"
    with mf.stage_folder(folder) as tmp:
        if runtime == "onnxruntime":
            tiny_onnx(tmp / model_file)
        else:
            (tmp / model_file).write_bytes(b"serialized engine bytes")
        (tmp / "tokenizer.json").write_text('{"model": {}}')
        spec = BundleSpec(
            name=NAME,
            version=version,
            labels=["negative", "positive"],
            text_inputs=["text"],
            max_length=16,
            pad_token_id=0,
            inputs=[
                TensorSpec(name=n, dtype="int64", shape=["batch", "sequence"]) for n in ("input_ids", "attention_mask")
            ],
            outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", 2])],
            precision=precision,
            runtime=runtime,
            providers=list(providers),
            model_file=model_file,
            arch="tiny",
            opset=17,
            pair_segments=pair_segments,
        )
        base = mf.Manifest(stage="bundle-tiny", recipe="tiny", recipe_hash="h", config_hash="c")
        if build is None and runtime == "tensorrt":
            build = plan_build(64)
        info = {"bundle": spec.model_dump()} | ({"tensorrt_build": build} if build is not None else {})
        mf.commit(tmp, folder, base.model_copy(update={"info": info}))
    return folder


def read_config(model_dir):
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def test_onnx_bundle_becomes_a_triton_model(tmp_path):
    bundle = make_bundle(tmp_path)
    model_dir = write_repository(bundle, tmp_path / "repo")
    assert model_dir == tmp_path / "repo" / NAME
    config = read_config(model_dir)
    pb2 = model_config_pb2
    assert config.name == NAME
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input_ids", pb2.TYPE_INT64, [-1]),
        ("attention_mask", pb2.TYPE_INT64, [-1]),
    ]
    [output] = config.output
    assert output.name == "logits"
    assert output.data_type == pb2.TYPE_FP32
    assert list(output.dims) == [2]
    assert output.label_filename == "labels.txt"
    assert (model_dir / "labels.txt").read_text().splitlines() == ["negative", "positive"]
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 32]
    assert config.dynamic_batching.max_queue_delay_microseconds == 1000
    [group] = config.instance_group
    assert group.kind == pb2.ModelInstanceGroup.KIND_CPU
    assert group.count == 1
    assert (model_dir / "1" / "model.onnx").read_bytes() == (bundle / "model.onnx").read_bytes()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == [NAME], "no temporary folders left"


def test_plan_bundle_on_gpu_with_custom_batching(tmp_path):
    bundle = make_bundle(tmp_path, runtime="tensorrt")
    model_dir = write_repository(
        bundle,
        tmp_path / "repo",
        max_batch_size=16,
        preferred_batch_sizes=(4, 16),
        max_queue_delay_us=250,
        instance_count=2,
        kind="KIND_GPU",
    )
    config = read_config(model_dir)
    assert config.platform == "tensorrt_plan"
    assert config.max_batch_size == 16
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    [group] = config.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert group.count == 2
    assert (model_dir / "1" / "model.plan").read_bytes() == b"serialized engine bytes"


def test_a_bundle_of_a_content_version_is_triton_version_1(tmp_path):
    model_dir = write_repository(make_bundle(tmp_path, version="5d41402abc4b"), tmp_path / "repo")
    assert sorted(p.name for p in model_dir.iterdir() if p.is_dir()) == ["1"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_batch_size": 0}, "max_batch_size must be >= 1"),
        ({"preferred_batch_sizes": (8, 128)}, r"must lie in 1\.\.64"),
        ({"kind": "KIND_TPU"}, "kind must be one of"),
        ({"instance_count": 0}, "instance_count must be >= 1"),
        ({"max_queue_delay_us": -1}, "max_queue_delay_us must be >= 0"),
    ],
)
def test_bad_settings_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_repository(make_bundle(tmp_path), tmp_path / "repo", **kwargs)
    assert not (tmp_path / "repo" / NAME).exists()


def test_the_default_preferred_batch_sizes_are_those_within_max_batch_size(tmp_path):
    model_dir = write_repository(make_bundle(tmp_path), tmp_path / "repo", max_batch_size=16)
    assert list(read_config(model_dir).dynamic_batching.preferred_batch_size) == [8]


def test_a_plan_refuses_a_max_batch_size_above_its_profile(tmp_path):
    bundle = make_bundle(tmp_path, runtime="tensorrt", build=plan_build(32))
    with pytest.raises(ValueError, match="takes batches of at most 32"):
        write_repository(bundle, tmp_path / "repo", max_batch_size=64, preferred_batch_sizes=(8,), kind="KIND_GPU")


def test_a_plan_within_its_profile_is_written(tmp_path):
    bundle = make_bundle(tmp_path, runtime="tensorrt", build=plan_build(32))
    model_dir = write_repository(bundle, tmp_path / "repo", max_batch_size=32, kind="KIND_GPU")
    assert read_config(model_dir).max_batch_size == 32


def test_a_plan_whose_manifest_records_no_profile_is_refused(tmp_path):
    bundle = make_bundle(tmp_path, runtime="tensorrt", build={})
    with pytest.raises(ValueError, match="records no TensorRT optimization profile"):
        write_repository(bundle, tmp_path / "repo", kind="KIND_GPU")


def test_a_plan_whose_profile_lacks_an_input_is_refused_naming_it(tmp_path):
    shapes = {"min": [1, 1], "opt": [8, 16], "max": [64, 16]}
    bundle = make_bundle(tmp_path, runtime="tensorrt", build={"profile": {"input_ids": shapes}})
    with pytest.raises(ValueError, match=r"profile \(tensorrt_build\) lacks inputs \['attention_mask'\]"):
        write_repository(bundle, tmp_path / "repo")


def test_a_plans_config_gives_the_tensorrt_version_it_loads_on_alone(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path, runtime="tensorrt"), tmp_path / "repo"))
    assert config.parameters["plan_tensorrt"].string_value == "10.16.1.11"


def test_a_plans_config_gives_the_gpu_it_loads_on_alone(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path, runtime="tensorrt"), tmp_path / "repo"))
    assert config.parameters["plan_gpu"].string_value == "NVIDIA H100 80GB HBM3"


def test_a_plan_whose_manifest_records_no_tensorrt_version_is_refused(tmp_path):
    build = {key: value for key, value in plan_build(64).items() if key != "tensorrt"}
    with pytest.raises(ValueError, match="records no tensorrt the plan was built with"):
        write_repository(make_bundle(tmp_path, runtime="tensorrt", build=build), tmp_path / "repo")


def test_an_onnx_bundles_config_gives_no_plan_versions(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert "plan_tensorrt" not in config.parameters


def test_plan_on_cpu_is_refused(tmp_path):
    with pytest.raises(ValueError, match="only on a GPU"):
        write_repository(make_bundle(tmp_path, runtime="tensorrt"), tmp_path / "repo", kind="KIND_CPU")


def test_a_plan_runs_on_a_gpu_unless_told(tmp_path):
    [group] = read_config(write_repository(make_bundle(tmp_path, runtime="tensorrt"), tmp_path / "repo")).instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_a_bundle_built_for_cuda_runs_on_a_gpu_unless_told(tmp_path):
    bundle = make_bundle(tmp_path, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    [group] = read_config(write_repository(bundle, tmp_path / "repo")).instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_corrupted_bundle_is_refused_and_old_model_kept(tmp_path):
    bundle = make_bundle(tmp_path)
    model_dir = write_repository(bundle, tmp_path / "repo")
    before = (model_dir / "config.pbtxt").read_text()
    data = bytearray((bundle / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (bundle / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(mf.ArtifactError, match="sha256"):
        write_repository(bundle, tmp_path / "repo", max_batch_size=8, preferred_batch_sizes=(8,))
    assert (model_dir / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == [NAME]


def test_rewriting_replaces_the_model_folder_whole(tmp_path):
    bundle = make_bundle(tmp_path)
    model_dir = write_repository(bundle, tmp_path / "repo")
    (model_dir / "stale.txt").write_text("from an older export")
    write_repository(bundle, tmp_path / "repo", max_batch_size=8, preferred_batch_sizes=(8,))
    assert read_config(model_dir).max_batch_size == 8
    assert not (model_dir / "stale.txt").exists()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == [NAME]


def test_rewriting_says_the_model_folder_was_replaced(tmp_path, capsys):
    bundle = make_bundle(tmp_path)
    write_repository(bundle, tmp_path / "repo")
    assert capsys.readouterr().err == ""
    write_repository(bundle, tmp_path / "repo")
    assert f"replaced {tmp_path / 'repo' / NAME} whole" in capsys.readouterr().err


def test_a_file_in_the_model_folders_place_is_an_error_not_a_crash(tmp_path, capsys):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / NAME).write_text("not a folder")
    assert triton.main([str(make_bundle(tmp_path)), str(tmp_path / "repo")]) == 2
    assert "error: cannot write the model repository" in capsys.readouterr().err


def test_cli_writes_the_repository_and_reports_errors(tmp_path, capsys):
    bundle = make_bundle(tmp_path)
    assert triton.main([str(bundle), str(tmp_path / "repo"), "--kind", "KIND_GPU", "--preferred-batch-sizes", "4"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "repo" / NAME)
    config = read_config(tmp_path / "repo" / NAME)
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert triton.main([str(tmp_path / "missing"), str(tmp_path / "repo")]) == 2
    assert "not a finished artifact" in capsys.readouterr().err


@pytest.mark.parametrize("repo", ["a-file", "a-file/repo"], ids=["the-file", "under-the-file"])
def test_a_repository_at_or_under_a_file_is_refused_naming_it(tmp_path, capsys, repo):
    bundle = make_bundle(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    assert triton.main([str(bundle), str(tmp_path / repo)]) == 2
    assert f"but {tmp_path / 'a-file'} is a file" in capsys.readouterr().err


def test_the_config_gives_the_bundles_text_style_for_clients_that_tokenize(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert config.parameters["text_style"].string_value == "raw"  # the spec's default: a bundle built without one


def test_the_config_gives_a_bundle_s_pair_segments_for_clients_that_tokenize_pairs(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path, pair_segments="sequence_ids"), tmp_path / "repo"))
    assert config.parameters["pair_segments"].string_value == "sequence_ids"


def test_the_config_gives_the_pad_id_a_client_pads_a_batch_with(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert config.parameters["pad_token_id"].string_value == "0"


def test_the_config_tells_clients_that_tokenize_to_pad_on_the_right(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert config.parameters["padding_side"].string_value == "right"


def test_the_config_gives_the_length_a_client_cuts_a_text_at(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert config.parameters["max_length"].string_value == "16"


def cuda_accelerator(tmp_path, precision: str) -> dict[str, str]:
    """The CUDA accelerator's parameters in the config of a bundle of `precision` built for CUDA."""
    bundle = make_bundle(tmp_path, providers=("CUDAExecutionProvider", "CPUExecutionProvider"), precision=precision)
    [cuda] = read_config(
        write_repository(bundle, tmp_path / "repo")
    ).optimization.execution_accelerators.gpu_execution_accelerator
    assert cuda.name == "cuda"
    return dict(cuda.parameters)


def accelerators(tmp_path, precision: str, providers: tuple[str, ...]) -> list:
    """The GPU execution accelerators in the config of a bundle of `precision` built for `providers`."""
    bundle = make_bundle(tmp_path, providers=providers, precision=precision)
    config = read_config(write_repository(bundle, tmp_path / "repo"))
    return list(config.optimization.execution_accelerators.gpu_execution_accelerator)


TENSORRT_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def test_a_bundle_built_for_tensorrt_runs_on_tensorrt_then_cuda_as_it_was_checked(tmp_path):
    assert [a.name for a in accelerators(tmp_path, "fp16", TENSORRT_PROVIDERS)] == ["tensorrt", "cuda"]


@pytest.mark.parametrize("precision, mode", [("fp16", "FP16"), ("int8", "FP32")])
def test_tensorrt_gets_fp16_kernels_for_an_fp16_bundle_alone(tmp_path, tf32_override, precision, mode):
    [tensorrt, _] = accelerators(tmp_path, precision, TENSORRT_PROVIDERS)
    assert tensorrt.parameters["precision_mode"] == mode


def tensorrt_accelerator(tmp_path, **batching) -> dict[str, str]:
    """The TensorRT accelerator's parameters in the config of an fp16 bundle built for TensorRT, batched by
    `batching`."""
    bundle = make_bundle(tmp_path, providers=TENSORRT_PROVIDERS, precision="fp16")
    config = read_config(write_repository(bundle, tmp_path / "repo", **batching))
    [tensorrt, _] = config.optimization.execution_accelerators.gpu_execution_accelerator
    return dict(tensorrt.parameters)


# the keys Triton's onnxruntime backend takes in the tensorrt accelerator (any other fails the model's load)
TRITON_TENSORRT_KEYS = {
    "precision_mode",
    "trt_engine_cache_enable",
    "trt_engine_cache_path",
    "trt_timing_cache_enable",
    "trt_timing_cache_path",
    "trt_profile_min_shapes",
    "trt_profile_opt_shapes",
    "trt_profile_max_shapes",
}


def test_every_tensorrt_accelerator_parameter_is_one_triton_takes(tmp_path):
    assert set(tensorrt_accelerator(tmp_path)) <= TRITON_TENSORRT_KEYS


def test_tensorrt_gets_one_profile_up_to_tritons_largest_batch_and_the_bundles_max_length(tmp_path):
    parameters = tensorrt_accelerator(tmp_path, max_batch_size=16, preferred_batch_sizes=(8,))
    assert parameters["trt_profile_max_shapes"] == "input_ids:16x16,attention_mask:16x16"


def test_tensorrt_gets_its_profile_from_one_row_of_one_token(tmp_path):
    assert tensorrt_accelerator(tmp_path)["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1"


def test_tensorrt_keeps_the_engines_it_builds(tmp_path):
    assert tensorrt_accelerator(tmp_path)["trt_engine_cache_enable"] == "True"


def test_tensorrt_keeps_engines_in_tritons_tmp_in_the_folder_the_server_names_for_the_model(tmp_path, monkeypatch):
    parameters = tensorrt_accelerator(tmp_path)
    monkeypatch.setenv("EDGEDISTILL_TRT_CACHE", str(tmp_path / "trt"))
    shapes = Shapes(("input_ids", "attention_mask"), 64, 16)  # the server's, at EDGEDISTILL_MAX_BATCH_SIZE=64
    model = tmp_path / "bundle-onnxruntime" / "model.onnx"
    served = Path(provider_options(TENSORRT_PROVIDERS[0], "fp16", model, shapes)["trt_engine_cache_path"])
    assert parameters["trt_engine_cache_path"] == f"/tmp/{served.name}"


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_bundle_tensorrt_would_run_in_tf32_is_refused_naming_the_ways_out(tmp_path, no_tf32_override, precision):
    bundle = make_bundle(tmp_path, providers=TENSORRT_PROVIDERS, precision=precision)
    with pytest.raises(PrecisionRefused, match="TF32 .* CUDAExecutionProvider .* NVIDIA_TF32_OVERRIDE=0"):
        write_repository(bundle, tmp_path / "repo")


def test_the_cli_exits_2_for_a_bundle_tensorrt_would_run_in_tf32(tmp_path, no_tf32_override):
    bundle = make_bundle(tmp_path, providers=TENSORRT_PROVIDERS, precision="int8")
    assert triton.main([str(bundle), str(tmp_path / "repo")]) == 2


def test_an_fp32_bundle_on_a_gpu_runs_without_tf32_as_it_was_checked(tmp_path):
    assert cuda_accelerator(tmp_path, "fp32")["use_tf32"] == "0"


def test_an_fp16_bundle_on_a_gpu_keeps_tf32_as_it_was_checked(tmp_path):
    assert "use_tf32" not in cuda_accelerator(tmp_path, "fp16")


def test_a_bundle_on_a_gpu_picks_convolution_algorithms_by_heuristic(tmp_path):
    bundle = make_bundle(tmp_path, providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    config = read_config(write_repository(bundle, tmp_path / "repo"))
    assert config.parameters["cudnn_conv_algo_search"].string_value == "1"  # Triton's value for HEURISTIC


def test_a_bundle_on_the_cpu_has_no_cuda_options(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert not config.HasField("optimization")


def test_the_config_of_a_bundle_that_splits_pairs_by_token_types_has_no_pair_segments(tmp_path):
    config = read_config(write_repository(make_bundle(tmp_path), tmp_path / "repo"))
    assert "pair_segments" not in config.parameters


def test_the_cli_has_a_flag_for_every_batching_option(capsys):
    with pytest.raises(SystemExit):
        triton.main(["--help"])
    shown = capsys.readouterr().out
    assert all(f"--{name.replace('_', '-')}" in shown for name in triton.Batching.model_fields)


def test_the_clis_batching_flags_reach_the_config(tmp_path):
    bundle = make_bundle(tmp_path)
    triton.main([str(bundle), str(tmp_path / "repo"), "--max-queue-delay-us", "250", "--instance-count", "3"])
    config = read_config(tmp_path / "repo" / NAME)
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    assert config.instance_group[0].count == 3


def test_an_unknown_batching_option_is_refused(tmp_path):
    with pytest.raises(ValueError, match="max_batch"):
        write_repository(make_bundle(tmp_path), tmp_path / "repo", max_batch=8)


def test_a_repository_holds_nothing_but_its_model_folder_while_it_is_written_again(tmp_path, monkeypatch):
    bundle, repo = make_bundle(tmp_path), tmp_path / "repo"
    write_repository(bundle, repo)
    seen, copy = [], shutil.copyfile

    def copy_seen(src, dst):  # the model file copied while the repository is in use
        seen.append(sorted(path.name for path in repo.iterdir()))
        return copy(src, dst)

    monkeypatch.setattr(shutil, "copyfile", copy_seen)
    write_repository(bundle, repo)
    assert seen == [[NAME]]


def test_a_repository_holds_nothing_but_its_model_folder_once_written_again(tmp_path):
    bundle, repo = make_bundle(tmp_path), tmp_path / "repo"
    write_repository(bundle, repo)
    write_repository(bundle, repo)
    assert sorted(path.name for path in repo.iterdir()) == [NAME]
