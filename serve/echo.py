"""`python -m serve.echo --port 50052`: a do-nothing `edgedistill.v1.Classifier` for transport baselines.

`Classify` answers one constant prediction per text, with no tokenizer, model or batcher, so a load
test against it measures gRPC and the client alone. It has the real server's health service and
message limits, and stops on SIGTERM/SIGINT.
"""

import argparse
import asyncio
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from serve.proto import classifier_pb2, classifier_pb2_grpc
from serve.settings import Settings

CONSTANT = classifier_pb2.Prediction(
    label="positive", label_id=1, score=0.75, probabilities=[0.25, 0.75], logits=[-0.55, 0.55]
)


class EchoClassifier(classifier_pb2_grpc.ClassifierServicer):
    async def Classify(self, request, context):
        return classifier_pb2.ClassifyResponse(
            predictions=[CONSTANT] * len(request.texts), model_name="echo", model_version="1"
        )


async def create_echo_server(host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A started echo server reporting SERVING, bound to `host:port` (0: any free port)."""
    limit = Settings.model_fields["max_message_bytes"].default
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
    )
    classifier_pb2_grpc.add_ClassifierServicer_to_server(EchoClassifier(), server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await status.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def serve(host: str, port: int) -> None:
    server, bound = await create_echo_server(host, port)
    print(f"echo server on port {bound}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve.echo", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50052, help="gRPC port, 0: any free port (default 50052)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
