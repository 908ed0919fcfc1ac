"""The KServe v2 call of the h2load benchmarks (the peer comparison and the scaling benchmark): one example
sent as a `ModelInfer` request with `logits` requested, and the check that a reply carries the bundle's logits."""

import statistics

import numpy as np
from edgedistill.bench import BenchError
from edgedistill.common.data import Examples
from edgedistill.serve.proto import kserve_pb2

LOGITS_TOLERANCE = 1e-3  # every server runs the same ONNX Runtime model; only thread scheduling may differ


def median_example(examples: Examples) -> tuple[str, str | None]:
    """The example of median length (characters of the text and its pair)."""
    lengths = examples.lengths()
    index = lengths.index(statistics.median_low(lengths))
    return examples.texts[index], examples.pairs[index] if examples.pairs else None


ABSENT_MODEL = "edgedistill-absent-model"  # served by no server: a request for it measures how a server fails


def infer_request(model: str, text: str, pair: str | None) -> bytes:
    """The serialized `ModelInfer` request for one example, `logits` requested."""
    tensors = [("text", text)] + ([("text_pair", pair)] if pair is not None else [])
    request = kserve_pb2.ModelInferRequest(
        model_name=model,
        id="bench",
        inputs=[
            kserve_pb2.ModelInferRequest.InferInputTensor(
                name=name,
                datatype="BYTES",
                shape=[1],
                contents=kserve_pb2.InferTensorContents(bytes_contents=[value.encode()]),
            )
            for name, value in tensors
        ],
        outputs=[kserve_pb2.ModelInferRequest.InferRequestedOutputTensor(name="logits")],
    )
    return request.SerializeToString()


def reply_logits(reply: bytes) -> np.ndarray:
    """The `logits` output of a serialized `ModelInfer` reply, raw or typed; `BenchError` when it has none."""
    response = kserve_pb2.ModelInferResponse.FromString(reply)
    for index, output in enumerate(response.outputs):
        if output.name == "logits":
            if response.raw_output_contents:
                values = np.frombuffer(response.raw_output_contents[index], np.float32)
            else:
                values = np.asarray(output.contents.fp32_contents, np.float32)
            return values.reshape(list(output.shape))
    raise BenchError(f"reply without a 'logits' output: {[o.name for o in response.outputs]}")


def check_reply(name: str, reply: bytes, expected: np.ndarray | None) -> None:
    """`BenchError` unless `reply` carries `expected` logits (any logits for the echo server, `expected` None)."""
    logits = reply_logits(reply)
    if expected is not None and (
        logits.shape != expected.shape or not np.allclose(logits, expected, atol=LOGITS_TOLERANCE)
    ):
        raise BenchError(f"{name} answered logits {logits.tolist()}, not the bundle's {expected.tolist()}")
