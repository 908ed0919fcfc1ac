"""`model_infer_precheck`: ModelInfer requests refused from their bytes, nested entries included, and real ones
let through (the server's refusals of them: test_bad_inputs.py and test_floods.py)."""

from edgedistill.serve.proto.kserve_pb2 import ModelInferRequest
from edgedistill.serve.wire import model_infer_precheck

MAX_TEXTS = 64  # the server's default


def text_request(*texts: bytes, pairs: tuple[bytes, ...] = ()) -> ModelInferRequest:
    """A request of typed BYTES `text` (and `text_pair`) inputs."""
    request = ModelInferRequest(model_name="tiny-sentiment")
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)]).contents.bytes_contents.extend(texts)
    if pairs:
        request.inputs.add(name="text_pair", datatype="BYTES", shape=[len(pairs)]).contents.bytes_contents.extend(pairs)
    return request


def flag(tensor, count: int) -> None:
    """Give an input or requested output `count` boolean parameters."""
    for i in range(count):
        tensor.parameters[f"{i:x}"].bool_param = True


def delimited(number: int, payload: bytes) -> bytes:
    """Field `number` of a message, length-delimited (lengths under 2**14)."""
    length = bytes([len(payload)]) if len(payload) < 0x80 else bytes([len(payload) & 0x7F | 0x80, len(payload) >> 7])
    return bytes([number << 3 | 2]) + length + payload


def check(request: ModelInferRequest | bytes) -> str | None:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    return model_infer_precheck(data, MAX_TEXTS)


def test_84000_parameters_on_an_input_are_refused_before_parsing():
    request = text_request(b"good")
    flag(request.inputs[0], 84_000)  # about 1 MB, under the default MAX_MESSAGE_BYTES; parsed in 74 ms
    assert "inputs[0].parameters holds more than 16 entries" in check(request)


def test_84000_parameters_on_a_requested_output_are_refused_before_parsing():
    request = text_request(b"good")
    flag(request.outputs.add(name="logits"), 84_000)
    assert "outputs[0].parameters holds more than 16 entries" in check(request)


def test_more_than_16_requested_outputs_are_refused_naming_a_cascades_outputs_too():
    request = text_request(b"good")
    for _ in range(17):
        request.outputs.add(name="answered_by")
    assert "outputs logits, probabilities, and a cascade's answered_by, escalation_refused)" in check(request)


def test_more_than_64_request_parameters_are_refused_saying_the_server_reads_none():
    request = text_request(b"good")
    for i in range(65):
        request.parameters[f"p{i}"].int64_param = i
    assert "holds more than 64 parameters: the server reads none of them, so leave them out" in check(request)


def test_more_than_16_raw_input_contents_are_refused_asking_for_one_per_input():
    request = text_request(b"good")
    request.raw_input_contents.extend([b"\x04\x00\x00\x00good"] * 17)
    assert "holds more than 16 raw_input_contents: send one per input" in check(request)


def test_500000_typed_bytes_elements_are_refused_before_parsing():
    request = text_request(*[b""] * 500_000)
    assert "contents hold more than 256 elements in all (4 x the server's MAX_TEXTS, 64)" in check(request)


def test_contents_elements_are_counted_over_all_inputs():
    request = text_request(*[b"a"] * 200, pairs=(b"b",) * 57)
    assert "contents hold more than 256 elements" in check(request)


def test_unpacked_token_ids_count_one_element_each():
    ids = b"\x18\x01" * 300  # int64_contents (field 3) as one varint field per id, not packed
    entry = delimited(1, b"input_ids") + delimited(2, b"INT64") + delimited(5, ids)
    assert "contents hold more than 256 elements" in check(delimited(5, entry))


def test_packed_token_ids_are_one_element_whatever_their_count():
    request = ModelInferRequest(model_name="tiny-sentiment")
    for name in ("input_ids", "attention_mask"):
        request.inputs.add(name=name, datatype="INT64", shape=[64, 512]).contents.int64_contents.extend([1] * 64 * 512)
    assert check(request) is None


def test_an_input_of_more_than_32_fields_is_refused():
    entry = delimited(1, b"text") + b"\x18\x01" * 40  # 40 shape dimensions, unpacked
    assert "inputs[0] holds more than 32 fields" in check(delimited(5, entry))


def test_a_request_of_texts_and_pairs_up_to_max_texts_passes():
    request = text_request(*[b"a great movie"] * MAX_TEXTS, pairs=(b"a fine plot",) * MAX_TEXTS)
    request.outputs.add(name="probabilities").parameters["classification"].int64_param = 2
    assert check(request) is None


def test_a_few_texts_over_max_texts_are_left_to_the_precise_check_after_parsing():
    assert check(text_request(*[b"good"] * (MAX_TEXTS + 1))) is None


def test_malformed_nested_bytes_are_left_to_the_parser():
    assert check(b"\x2a\x03\x0a\x09x") is None  # an input whose name claims 9 bytes of its 3
