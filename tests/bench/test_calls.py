"""The KServe v2 call of the h2load benchmarks: the example sent, the request, and the check of a reply."""

import numpy as np
import pytest
from edgedistill.bench import BenchError, calls
from edgedistill.common.data import Examples
from edgedistill.serve.proto import kserve_pb2


def test_the_example_sent_is_the_one_of_median_length():
    examples = Examples(["a", "abc", "abcdefgh", "ab", "abcd"], None, None, "dev")
    assert calls.median_example(examples) == ("abc", None)


def test_the_median_example_of_pairs_counts_both_sides():
    examples = Examples(["a", "b", "c"], ["xxxxxx", "x", "xxx"], None, "dev")
    assert calls.median_example(examples) == ("c", "xxx")


def test_the_request_asks_for_logits_only():
    request = kserve_pb2.ModelInferRequest.FromString(calls.infer_request("m", "a film", None))
    assert [o.name for o in request.outputs] == ["logits"]


def test_the_request_of_a_pair_model_carries_both_texts():
    request = kserve_pb2.ModelInferRequest.FromString(calls.infer_request("m", "a film", "a movie"))
    assert [(t.name, list(t.contents.bytes_contents)) for t in request.inputs] == [
        ("text", [b"a film"]),
        ("text_pair", [b"a movie"]),
    ]


def reply(logits: np.ndarray, raw: bool) -> bytes:
    output = kserve_pb2.ModelInferResponse.InferOutputTensor(name="logits", datatype="FP32", shape=list(logits.shape))
    response = kserve_pb2.ModelInferResponse(outputs=[output])
    if raw:
        response.raw_output_contents.append(logits.astype(np.float32).tobytes())
    else:
        response.outputs[0].contents.fp32_contents.extend(logits.ravel().tolist())
    return response.SerializeToString()


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_logits_are_read_raw_or_typed(raw):
    logits = np.array([[0.5, -1.5]], np.float32)
    np.testing.assert_array_equal(calls.reply_logits(reply(logits, raw)), logits)


def test_a_reply_with_other_logits_than_the_bundles_is_refused():
    with pytest.raises(BenchError, match="not the bundle's"):
        calls.check_reply("kserve", reply(np.array([[1.0, 2.0]]), True), np.array([[1.0, 2.5]], np.float32))


def test_a_reply_without_logits_is_refused():
    with pytest.raises(BenchError, match="without a 'logits' output"):
        calls.reply_logits(kserve_pb2.ModelInferResponse().SerializeToString())
