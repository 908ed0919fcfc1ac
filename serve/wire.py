"""Requests refused from their bytes, before they are parsed: a `ModelInfer` request with more inputs, outputs,
parameters or fields in all than a request may hold (`PRECHECKS`, which `serve.observe.CallObserver` runs)."""

from edgedistill.serve.transport import INPUTS, KSERVE, OUTPUTS

# ModelInferRequest's repeated fields (number: name, most entries a request may hold). Parsing expands each entry
# into a message of its own, several times its bytes, so more are refused from the bytes, before parsing; the
# limits leave room for the mistakes that the checks after parsing name precisely (an output asked for twice).
MODEL_INFER_REPEATS = {4: ("parameters", 64), 5: ("inputs", 16), 6: ("outputs", 16), 7: ("raw_input_contents", 16)}
# Top-level fields of a ModelInferRequest walked before parsing: the limits above plus the scalars and room for
# unknown fields. The walk is Python, so more (a megabyte of two-byte unknown fields) would cost more than parsing.
MODEL_INFER_FIELDS = 256
ANY_FIELD = 0  # the "field number" `repeated_too_often` names when a message holds too many fields in all


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


def repeated_too_often(data: bytes, limits: dict[int, int], max_fields: int) -> int | None:
    """The first field number of `limits` that the serialized message `data` holds more often than its limit,
    `ANY_FIELD` when it holds more than `max_fields` top-level fields in all, or None; only the top-level fields are
    walked, at most `max_fields` + 1 of them, and nothing is parsed. Malformed bytes give None: the parser says why."""
    counts = dict.fromkeys(limits, 0)
    offset = walked = 0
    try:
        while offset < len(data):
            walked += 1
            if walked > max_fields:
                return ANY_FIELD
            key, offset = _varint(data, offset)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                offset = _varint(data, offset)[1]
            elif wire_type == 2:
                length, offset = _varint(data, offset)
                offset += length
            elif wire_type in (1, 5):
                offset += 8 if wire_type == 1 else 4
            else:  # groups: not in proto3
                return None
            if number in counts:
                counts[number] += 1
                if counts[number] > limits[number]:
                    return number
    except IndexError:
        return None
    return None


def model_infer_precheck(data: bytes) -> str | None:
    """Why a serialized ModelInferRequest is refused before parsing (too many inputs, outputs, parameters), or None."""
    number = repeated_too_often(data, {n: limit for n, (_, limit) in MODEL_INFER_REPEATS.items()}, MODEL_INFER_FIELDS)
    if number is None:
        return None
    if number == ANY_FIELD:
        return f"the request holds more than {MODEL_INFER_FIELDS} fields: send only the fields of ModelInferRequest"
    name, limit = MODEL_INFER_REPEATS[number]
    return (
        f"the request holds more than {limit} {name}: name each input and output once (inputs "
        f"{', '.join(INPUTS)}; outputs {', '.join(OUTPUTS)})"
    )


PRECHECKS = {f"/{KSERVE}/ModelInfer": model_infer_precheck}  # for `serve.observe.CallObserver`
