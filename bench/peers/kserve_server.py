"""`python -m edgedistill.bench.peers.kserve_server --bundle B --grpc_port P --http_port H [--threads T]`.

A bundle behind KServe's Python `ModelServer`, written as KServe's docs write a custom model: a
`kserve.Model` whose `load` opens the model and whose `predict` takes a v2 `InferRequest` (a BYTES
`text` input, and `text_pair` for a pair model) and returns FP32 `logits`. Runs in the KServe
environment (`make peers-setup`); every `ModelServer` flag (`--grpc_port`, `--workers`, ...) is KServe's own.
"""

import argparse
from pathlib import Path

import kserve
from edgedistill.bench.peers.model import BundleClassifier
from kserve import InferOutput, InferRequest, InferResponse


def _texts(request: InferRequest, name: str) -> list[str] | None:
    """The strings of input `name`, or None when the request has none."""
    for tensor in request.inputs:
        if tensor.name == name:
            return [t.decode() if isinstance(t, bytes) else t for t in tensor.as_numpy().ravel()]
    return None


class BundleModel(kserve.Model):
    def __init__(self, name: str, folder: Path, threads: int):
        super().__init__(name)
        self.folder, self.threads = folder, threads
        self.classifier: BundleClassifier | None = None
        self.load()

    def load(self) -> bool:
        self.classifier = BundleClassifier(self.folder, self.threads)
        self.ready = True
        return self.ready

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        texts = _texts(payload, "text")
        if texts is None:
            raise kserve.errors.InvalidInput("the request needs a BYTES input named 'text'")
        logits = self.classifier.logits(texts, _texts(payload, "text_pair"))
        output = InferOutput(name="logits", shape=list(logits.shape), datatype="FP32", data=logits)
        return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id)


def main() -> None:
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle folder to serve")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    args, _ = parser.parse_known_args()
    model = BundleModel(args.model_name, args.bundle, args.threads)
    kserve.ModelServer().start([model])


if __name__ == "__main__":
    main()
