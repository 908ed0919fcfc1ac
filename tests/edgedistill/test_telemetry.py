"""ONNX Runtime's telemetry is off in every process of the package, unless the environment turns it on."""

import os
import subprocess
import sys

SESSION = """
import numpy as np
from onnx import TensorProto, helper
from edgedistill.common.runtime import open_session

value = helper.make_tensor_value_info
graph = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])], "g",
    [value("x", TensorProto.FLOAT, [1])], [value("y", TensorProto.FLOAT, [1])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
open_session("identity.onnx", ["CPUExecutionProvider"], model=model.SerializeToString()).run(None, {"x": np.ones(1, np.float32)})
"""


def run_session(home, **env) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "CI", "XDG_CACHE_HOME")}
    subprocess.run([sys.executable, "-c", SESSION], cwd=home, env=clean | {"HOME": str(home)} | env, check=True)


def test_a_session_opened_through_the_package_leaves_no_telemetry_behind(tmp_path):
    run_session(tmp_path)
    assert not (tmp_path / ".cache" / "Microsoft").exists()


def test_telemetry_turned_on_in_the_environment_stays_on():
    code = "import os, edgedistill; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    env = os.environ | {"ORT_DISABLE_TELEMETRY": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "0"
