"""A bundle as a Seldon MLServer custom inference runtime, written as MLServer's docs write one.

`BundleRuntime` is an `mlserver.MLModel`: `load` opens the bundle named by the model settings'
`parameters.uri`, and `predict` takes a v2 `InferenceRequest` (a BYTES `text` input, and `text_pair`
for a pair model) and returns FP32 `logits`. `bench.peers.launch` writes the settings that point MLServer at it. Runs in the
MLServer environment (`make peers-setup`).
"""

from pathlib import Path

from edgedistill.bench.peers.model import BundleClassifier
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse


def _texts(request: InferenceRequest, name: str) -> list[str] | None:
    """The strings of input `name`, or None when the request has none."""
    for tensor in request.inputs:
        if tensor.name == name:
            return StringCodec.decode_input(tensor)
    return None


class BundleRuntime(MLModel):
    async def load(self) -> bool:
        parameters = self.settings.parameters
        threads = int((parameters.extra or {}).get("threads", 1))
        self.classifier = BundleClassifier(Path(parameters.uri), threads)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        texts = _texts(payload, "text")
        if texts is None:
            raise InferenceError("the request needs a BYTES input named 'text'")
        logits = self.classifier.logits(texts, _texts(payload, "text_pair"))
        return InferenceResponse(
            model_name=self.name, id=payload.id, outputs=[NumpyCodec.encode_output("logits", logits)]
        )
