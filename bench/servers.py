"""`python -m bench.servers --port 50052 [--bundle B]`: baseline `edgedistill.v1.Classifier` servers for benchmarks.

Without `--bundle`, the echo server: `Classify` (and KServe `ModelInfer` of model `echo`, for the peer
comparison) answers one constant prediction per text, with no tokenizer, model or batcher, so a load test
against it measures gRPC and the client alone. With
`--bundle`, the bare server: each call tokenizes its texts and runs the bundle's backend on the event
loop, and nothing else (no batcher, limits, request ids, metrics or logs), so it shows the ceiling
of any server that runs this model on its event loop; its session takes the server's `EDGEDISTILL_*` session
settings (`bench.peers.model`). Both have the real server's health
service and limit on the messages they receive (`EDGEDISTILL_MAX_MESSAGE_BYTES`), and stop on SIGTERM/SIGINT.
"""

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import grpc
import numpy as np
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.cascade import ServedModels
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.processes import python_module
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.host import Scores
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.settings import SettingsError, load_settings
from edgedistill.serve.transport import classify_response
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

MODULE = "edgedistill.bench.servers"
MODEL = "echo"  # the one model the echo server's ModelInfer serves
CONSTANT = classifier_pb2.Prediction(
    label="positive", label_id=1, score=0.75, probabilities=[0.25, 0.75], logits=[-0.55, 0.55]
)


class EchoClassifier(classifier_pb2_grpc.ClassifierServicer):
    async def Classify(self, request, context):
        return classifier_pb2.ClassifyResponse(
            predictions=[CONSTANT] * len(request.texts), model_name=MODEL, model_version="1"
        )


class EchoInference(kserve_pb2_grpc.GRPCInferenceServiceServicer):
    """KServe v2 `ModelInfer` answering constant logits, one row per element of the first input, for the model
    `echo` (NOT_FOUND for any other, as a model server answers); always ready."""

    async def ServerReady(self, request, context):
        return kserve_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return kserve_pb2.ModelReadyResponse(ready=True)

    async def ModelInfer(self, request, context):
        if request.model_name != MODEL:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no model {request.model_name!r}: this server serves {MODEL}"
            )
        rows = request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 0
        logits = np.tile(np.asarray(CONSTANT.logits, np.float32), (rows, 1))
        return kserve_pb2.ModelInferResponse(
            model_name=MODEL,
            model_version="1",
            id=request.id,
            outputs=[kserve_pb2.ModelInferResponse.InferOutputTensor(name="logits", datatype="FP32", shape=[rows, 2])],
            raw_output_contents=[logits.tobytes()],
        )


class BareClassifier(classifier_pb2_grpc.ClassifierServicer):
    """The bundle's tokenizer and backend, called on the event loop for every request."""

    def __init__(self, folder: Path, threads: int):
        self.model = BundleClassifier(folder, threads)

    async def Classify(self, request, context):
        logits = self.model.logits(list(request.texts), list(request.text_pairs) or None)
        return classify_response(self.model.spec, Scores(logits))


async def create_baseline_server(
    host: str, port: int, bundle: Path | None = None, threads: int = 1
) -> tuple[grpc.aio.Server, int]:
    """A started echo server (the bare server with `bundle`) reporting SERVING, bound to `host:port` (0: any
    free port), receiving messages of up to this environment's MAX_MESSAGE_BYTES and sending any, as the server
    does."""
    servicer = EchoClassifier() if bundle is None else BareClassifier(bundle, threads)
    limit = load_settings([], flags_taken=False).max_message_bytes
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
    classifier_pb2_grpc.add_ClassifierServicer_to_server(servicer, server)
    if bundle is None:
        kserve_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(EchoInference(), server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def serve(host: str, port: int, bundle: Path | None, threads: int) -> None:
    server, bound = await create_baseline_server(host, port, bundle, threads)
    kind = "echo server" if bundle is None else f"bare server for {bundle}"
    print(f"{kind} on port {bound}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def command(port: int, bundle: Path | None = None, threads: int = 1) -> list[str]:
    """The command of a baseline server on loopback `port`: the echo server, or with `bundle` the bare server, with
    `threads` intra-op threads (none for a TensorRT engine)."""
    line = python_module(MODULE, "--host", "127.0.0.1", "--port", str(port))
    if bundle is None:
        return line
    # a TensorRT engine runs without ONNX Runtime's threads, and `main` refuses --threads for it
    return [*line, "--bundle", str(bundle)] + (
        ["--threads", str(threads)] if ServedModels.read(bundle).onnx_runtime else []
    )


def threads_count(value: str) -> int:
    """A `--threads` argument: a count of intra-op threads, 0 for ONNX Runtime's default."""
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (ONNX Runtime's default) or more, got {number}")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m bench.servers", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50052, help="gRPC port, 0: any free port (default 50052)")
    parser.add_argument("--bundle", type=Path, help="serve this bundle bare instead of echoing")
    parser.add_argument(
        "--threads",
        type=threads_count,
        help="intra-op threads of the bare server (default 1; 0: ONNX Runtime's default; none for a TensorRT engine)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.bundle is None:
        parser.error(
            "--threads sets the bare server's threads: give --bundle, or drop --threads (the echo server runs no model)"
        )
    try:
        if args.threads and not ServedModels.read(args.bundle).onnx_runtime:  # 0, the default, asks for nothing
            parser.error(
                f"{args.bundle} is a TensorRT engine (runtime 'tensorrt'), which runs on its GPU without ONNX Runtime: "
                "--threads, ONNX Runtime's intra-op threads, would do nothing; drop it, or give an ONNX bundle "
                "(runtime 'onnxruntime')"
            )
        asyncio.run(serve(args.host, args.port, args.bundle, 1 if args.threads is None else args.threads))
    except (ArtifactError, SettingsError, BundleRejected) as err:  # a bundle or setting it cannot serve, at start
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
