"""edgedistill: distil a Transformer teacher into a small, fast student, export it and serve it.

The stages live in the checkout's top-level folders (`common/`, `distill/`, `export/`, `serve/`, `bench/`,
`loadtests/`, `report/`) and are installed as subpackages of this one, so that no generic top-level name
(`common`, `export`, `report`, ...) is taken in an environment.
"""

import os

from edgedistill.common.grpc_core import quiet_when_run_as_module

# ONNX Runtime's Linux wheels (1.29 and later) record each session (model file name, graph hashes, ...) in a local
# database and send it to Microsoft unless told not to; an edge server and an offline pipeline must not. Set before
# any module of this package imports onnxruntime; ORT_DISABLE_TELEMETRY=0 in the environment keeps it on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

quiet_when_run_as_module()  # `python -m edgedistill.<module>`
