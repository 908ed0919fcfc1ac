from types import SimpleNamespace

from edgedistill.serve.transport import platform_of


def test_a_runtime_triton_has_no_platform_for_reports_none_and_names_its_backend():
    runtime = SimpleNamespace(spec=SimpleNamespace(runtime="openvino"))
    assert platform_of(runtime) == ("", "openvino")


def test_a_triton_runtime_reports_its_platform():
    assert platform_of(SimpleNamespace(spec=SimpleNamespace(runtime="onnxruntime"))) == (
        "onnxruntime_onnx",
        "onnxruntime",
    )
