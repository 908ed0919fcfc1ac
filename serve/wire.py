"""Requests refused from their bytes, before they are parsed: a `ModelInfer` request with more inputs, outputs,
parameters (its own or a tensor's), contents elements or fields in all than a request may hold (`prechecks`, which
`serve.observe.CallObserver` runs)."""

from collections.abc import Iterator
from functools import partial

from edgedistill.serve.observe import Precheck
from edgedistill.serve.transport import CASCADE_OUTPUTS, INPUTS, KSERVE, OUTPUTS

NAME_EACH_ONCE = (
    f"name each input and output once (inputs {', '.join(INPUTS)}; outputs {', '.join(OUTPUTS)}, and a cascade's "
    f"{', '.join(CASCADE_OUTPUTS)})"
)
# ModelInferRequest's repeated fields (number: name, most entries a request may hold, what a request holding more is
# told). Parsing expands each entry into a message of its own, several times its bytes, so more are refused from the
# bytes, before parsing; the limits leave room for the mistakes that the checks after parsing name precisely (an
# output asked for twice).
MODEL_INFER_REPEATS = {
    4: ("parameters", 64, "the server reads none of them, so leave them out (a call's deadline is its gRPC deadline)"),
    5: ("inputs", 16, NAME_EACH_ONCE),
    6: ("outputs", 16, NAME_EACH_ONCE),
    7: ("raw_input_contents", 16, "send one per input"),
}
# Top-level fields of a ModelInferRequest walked before parsing: the limits above plus the scalars and room for
# unknown fields. The walk is Python, so more (a megabyte of two-byte unknown fields) would cost more than parsing.
MODEL_INFER_FIELDS = 256
TOO_MANY_FIELDS = f"the request holds more than {MODEL_INFER_FIELDS} fields: send only the fields of ModelInferRequest"
# Each entry of `inputs` and `outputs` is walked too, for its `parameters` map (field 4 of an input, 2 of a requested
# output) and an input's `contents` (field 5). A map entry parses into a message of its own, like a top-level
# entry: 84,000 of them in one input took 74 ms to parse and held 9.4 MB for the whole call. Triton's clients set
# at most four on a tensor (the shared-memory region, offset and size; `classification` on an output), and this
# server reads two, so 16 leave room for the rest.
INPUT_FIELDS = {"parameters": 4, "contents": 5}
OUTPUT_FIELDS = {"parameters": 2}
TENSOR_PARAMETERS = 16
# Fields of one input or output in all: name, datatype, the shape (one packed field; a dimension each if unpacked,
# at most 8 served), 16 parameters, contents. The bound keeps the walk of 32 tensors to about a thousand fields.
TENSOR_FIELDS = 32
# Elements of the inputs' typed `contents` in all, per MAX_TEXTS: each BYTES element (a text) is a field of its own,
# 500,000 empty ones parse in 10 ms, and numbers are one packed field per tensor, as protobuf libraries write
# them. A text and its pair take 2 x MAX_TEXTS; twice that leaves the checks after parsing room to refuse a few
# texts too many precisely (RESOURCE_EXHAUSTED: split the request). Tied to MAX_TEXTS, the walk costs at most what
# the texts of a request the server takes do.
CONTENTS_PER_TEXT = 4


class _Refused(Exception):
    """A request refused from its bytes: the message says why."""


class _Malformed(Exception):
    """Bytes that do not parse: left to the parser, which says why."""


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    """The varint at `offset` and the offset after it; `IndexError` when `data` ends inside it."""
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def _fields(data: bytes, start: int, end: int, max_fields: int, too_many: str) -> Iterator[tuple[int, int, int]]:
    """(number, start, end of its payload) of each field of the message serialized in `data[start:end]`, the payload
    of a length-delimited field (-1, -1 for the others), nothing parsed; `_Refused(too_many)` at field `max_fields` +
    1, `_Malformed` at bytes that are not a message. One-byte keys and lengths, nearly all, skip `_varint`'s loop."""
    offset, walked = start, 0
    try:
        while offset < end:
            walked += 1
            if walked > max_fields:
                raise _Refused(too_many)
            key = data[offset]
            offset += 1
            if key > 0x7F:
                key, offset = _varint(data, offset - 1)
            wire_type, first, last = key & 7, -1, -1
            if wire_type == 2:
                length = data[offset]
                offset += 1
                if length > 0x7F:
                    length, offset = _varint(data, offset - 1)
                first = offset
                offset = last = offset + length
            elif wire_type == 0:
                offset = _varint(data, offset)[1]
            elif wire_type in (1, 5):
                offset += 8 if wire_type == 1 else 4
            else:  # groups: not in proto3
                raise _Malformed
            if offset > end:
                raise _Malformed
            yield key >> 3, first, last
    except IndexError:
        raise _Malformed from None


def _tensor_elements(
    data: bytes, start: int, end: int, kind: str, index: int, elements: int, too_many_elements: str
) -> int:
    """Walk entry `index` of `kind` ("inputs" or "outputs") in `data[start:end]`: the elements of its contents, at
    most `elements` (more: `_Refused(too_many_elements)`)."""
    numbers = INPUT_FIELDS if kind == "inputs" else OUTPUT_FIELDS
    message = "InferInputTensor" if kind == "inputs" else "InferRequestedOutputTensor"
    too_many = f"{kind}[{index}] holds more than {TENSOR_FIELDS} fields: send only the fields of {message}"
    parameters = found = 0
    for number, first, last in _fields(data, start, end, TENSOR_FIELDS, too_many):
        if number == numbers["parameters"]:
            parameters += 1
            if parameters > TENSOR_PARAMETERS:
                raise _Refused(
                    f"{kind}[{index}].parameters holds more than {TENSOR_PARAMETERS} entries: send only the parameters "
                    "the server reads ('classification' on an output)"
                )
        elif number == numbers.get("contents") and first >= 0:
            found += sum(1 for _ in _fields(data, first, last, elements - found, too_many_elements))
    return found


def model_infer_precheck(data: bytes, max_texts: int) -> str | None:
    """Why a serialized ModelInferRequest is refused before parsing (too many inputs, outputs, parameters, contents
    elements for the server's `max_texts`, fields), or None. Malformed bytes give None: the parser says why."""
    counts = dict.fromkeys(MODEL_INFER_REPEATS, 0)
    elements, found = CONTENTS_PER_TEXT * max_texts, 0
    too_many_elements = (
        f"the inputs' contents hold more than {elements} elements in all ({CONTENTS_PER_TEXT} x the server's "
        f"MAX_TEXTS, {max_texts}): split the request, and send numbers packed, as protobuf libraries write them, or "
        "in raw_input_contents"
    )
    try:
        for number, first, last in _fields(data, 0, len(data), MODEL_INFER_FIELDS, TOO_MANY_FIELDS):
            if number not in counts:
                continue
            name, limit, advice = MODEL_INFER_REPEATS[number]
            counts[number] += 1
            if counts[number] > limit:
                return f"the request holds more than {limit} {name}: {advice}"
            if name in ("inputs", "outputs") and first >= 0:
                found += _tensor_elements(
                    data, first, last, name, counts[number] - 1, elements - found, too_many_elements
                )
    except _Refused as refused:
        return str(refused)
    except _Malformed:
        return None
    return None


def prechecks(max_texts: int) -> dict[str, Precheck]:
    """The prechecks of a server taking `max_texts` texts a request, by method, for `serve.observe.CallObserver`."""
    return {f"/{KSERVE}/ModelInfer": partial(model_infer_precheck, max_texts=max_texts)}
