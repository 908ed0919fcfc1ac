"""A bundle's tokenizer and backend as one call, texts (and pairs) in and logits out: what a peer server serves."""

from pathlib import Path

import numpy as np
from edgedistill.common.bundle import load_bundle
from edgedistill.serve.backend import load_backend
from edgedistill.serve.batching import pad_rows
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import InvalidInput
from edgedistill.serve.settings import Settings


class BundleClassifier:
    """The verified bundle in `folder`, run on ONNX Runtime (or TensorRT) with `threads` intra-op threads."""

    def __init__(self, folder: Path, threads: int = 1):
        bundle = load_bundle(folder)
        self.spec = bundle.spec
        self.encoder = TextEncoder.for_bundle(bundle)
        self.backend = load_backend(bundle, Settings(threads=threads))
        self.output = self.spec.outputs[0].name

    @property
    def labels(self) -> list[str]:
        return list(self.spec.labels)

    def logits(self, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        """float32 logits, one row per text; `InvalidInput` when pairs are missing for a pair model or unexpected."""
        if bool(pairs) != self.spec.pairs:
            raise InvalidInput("this model reads text pairs" if self.spec.pairs else "this model reads single texts")
        rows = self.encoder.encode(texts, pairs or None)
        batch = pad_rows(rows, self.encoder.pad_values)
        return self.backend.infer(batch)[self.output].astype(np.float32, copy=False)

    def close(self) -> None:
        """Release the model (an engine's device memory); `logits` must not be called afterwards."""
        self.backend.close()
