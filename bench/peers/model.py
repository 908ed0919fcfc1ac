"""A bundle's tokenizer and backend as one call, texts (and pairs) in and logits out: what a peer server serves.

Its session is the measured server's: the same `threads`, and the session settings of the `EDGEDISTILL_*` variables
(SPIN, PROVIDERS, ALLOW_CPU_FALLBACK) read from the same environment, so that a comparison runs every server's model
alike.
"""

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from edgedistill.bench.environ import server_environ
from edgedistill.common.bundle import load_bundle
from edgedistill.serve.backend import load_backend
from edgedistill.serve.batching import pad_rows
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import InvalidInput
from edgedistill.serve.settings import Settings, load_settings

SESSION = ("threads", "spin", "providers", "allow_cpu_fallback")  # the server settings that shape a model's session


def session_settings(threads: int, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of one server process with `threads` intra-op threads and the `EDGEDISTILL_*` variables of
    `environ` (default a measured server's, `server_environ`), read as the server reads them."""
    return load_settings(
        ["--threads", str(threads), "--workers", "1"], server_environ() if environ is None else environ
    )


def session_of(settings: Settings) -> dict:
    """The `SESSION` settings of `settings`, as a result records them."""
    return settings.model_dump(mode="json", include=set(SESSION))


class BundleClassifier:
    """The verified bundle in `folder`, run on ONNX Runtime (or TensorRT) with `threads` intra-op threads and the
    session settings of this process's environment (`session_settings`)."""

    def __init__(self, folder: Path, threads: int = 1):
        bundle = load_bundle(folder)
        self.spec = bundle.spec
        self.encoder = TextEncoder.for_bundle(bundle)
        self.settings = session_settings(threads)
        self.backend = load_backend(bundle, self.settings)
        self.output = self.spec.outputs[0].name

    @property
    def labels(self) -> list[str]:
        return list(self.spec.labels)

    def logits(self, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        """float32 logits, one row per text, in calls of at most the backend's largest batch (as the server splits
        them); `InvalidInput` when pairs are missing for a pair model or unexpected."""
        if bool(pairs) != self.spec.pairs:
            raise InvalidInput("this model reads text pairs" if self.spec.pairs else "this model reads single texts")
        rows = self.encoder.encode(texts, pairs or None)
        size = self.backend.max_batch_size or len(rows)
        return np.concatenate([self._infer(rows[start : start + size]) for start in range(0, len(rows), size)])

    def _infer(self, rows: list[dict[str, np.ndarray]]) -> np.ndarray:
        """float32 logits of encoded `rows`, padded into one call."""
        batch = pad_rows(rows, self.encoder.pad_values)
        return self.backend.infer(batch)[self.output].astype(np.float32, copy=False)

    def close(self) -> None:
        """Release the model (an engine's device memory); `logits` must not be called afterwards."""
        self.backend.close()
