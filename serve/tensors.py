"""KServe v2 tensors <-> numpy: typed `contents` fields and little-endian `raw_*_contents` bytes.

BYTES tensors are encoded element by element as a 4-byte little-endian length and the bytes.
"""

import math
import struct

import numpy as np
from edgedistill.serve.errors import InvalidInput, TooLarge

NUMPY = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP32": np.float32,
    "FP64": np.float64,
}
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_LENGTH = struct.Struct("<I")
# Said when raw BYTES data does not parse: a client sending bare bytes, or big-endian lengths (Java's ByteBuffer
# default), would otherwise see only a length it never wrote.
_BYTES_LAYOUT = "each element is its length as a 4-byte little-endian unsigned integer, then its bytes"
MAX_RANK = 8  # numpy stops at 64 dimensions; no input of a text classifier needs more than 2


def serialize_bytes(elements: list[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(e)) + e for e in elements)


def deserialize_bytes(raw: bytes, name: str = "tensor", count: int | None = None) -> list[bytes]:
    """The elements of raw BYTES data; with `count`, more elements than that are refused as soon as they appear."""
    elements, offset = [], 0
    view = memoryview(raw)
    while offset < len(raw):
        if count is not None and len(elements) == count:
            raise InvalidInput(f"input {name!r}: raw BYTES data holds more than the {count} elements of its shape")
        if offset + 4 > len(raw):
            raise InvalidInput(
                f"input {name!r}: raw BYTES data ends inside an element's 4-byte length prefix ({_BYTES_LAYOUT})"
            )
        (size,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidInput(
                f"input {name!r}: raw BYTES element {len(elements)} claims {size} bytes past the end ({_BYTES_LAYOUT})"
            )
        elements.append(bytes(view[offset : offset + size]))
        offset += size
    return elements


def _element_count(name: str, shape) -> int:
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input {name!r}: shape has {len(shape)} dimensions, at most {MAX_RANK} are supported")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input {name!r}: shape {list(shape)} has a negative dimension")
    return math.prod(shape)  # exact: np.prod wraps around in int64, so [2**32, 2**32] would claim 0 elements


def _room(datatype: str, contents, raw: bytes | None) -> int:
    """The most elements the request can hold, without decoding one: its contents' or its raw fixed-size elements'
    count, or for raw BYTES one per 4-byte length prefix its bytes have room for."""
    if raw is None:
        return len(getattr(contents, CONTENTS[datatype])) if contents is not None else 0
    return len(raw) // (4 if datatype == "BYTES" else np.dtype(NUMPY[datatype]).itemsize)


def _present(datatype: str, contents, raw: bytes | None, most: int) -> int:
    """How many elements the request holds, up to `most`, without decoding one: raw BYTES by their length prefixes."""
    if raw is None:
        return min(len(getattr(contents, CONTENTS[datatype])) if contents is not None else 0, most)
    if datatype != "BYTES":
        return min(len(raw) // np.dtype(NUMPY[datatype]).itemsize, most)
    present, offset = 0, 0
    while offset + 4 <= len(raw) and present < most:
        (size,) = _LENGTH.unpack_from(raw, offset)
        offset += 4 + size
        present += offset <= len(raw)
    return present


def decode(
    name: str, datatype: str, shape, contents=None, raw: bytes | None = None, max_elements: int | None = None
) -> np.ndarray:
    """A tensor from either its `contents` message or its raw bytes, checked against `datatype` and `shape`.

    The element count (from the shape, and from `contents`) is checked against `max_elements` before any
    element is decoded. BYTES tensors come back as an object array of `bytes`.
    """
    if datatype not in CONTENTS:
        raise InvalidInput(f"input {name!r}: unknown datatype {datatype!r}")
    count = _element_count(name, shape)
    if max_elements is not None and count > max_elements:
        if count > (room := _room(datatype, contents, raw)):  # a shape claiming more than was sent: nothing to split
            if raw is not None and datatype == "BYTES":  # room is a bound: count the elements, up to the limit
                present = _present(datatype, contents, raw, max_elements + 1)
                room = present if present <= max_elements else f"more than {max_elements}"
            raise InvalidInput(f"input {name!r}: {room} elements for shape {list(shape)} ({count} expected)")
        present = _present(datatype, contents, raw, max_elements + 1)
        if present < min(count, max_elements + 1):  # a shape claiming more than was sent: nothing to split
            raise InvalidInput(f"input {name!r}: {present} elements for shape {list(shape)} ({count} expected)")
        raise TooLarge(
            f"input {name!r}: shape {list(shape)} holds {count} elements; the limit is {max_elements}: "
            "split the request"
        )
    if raw is not None:
        if datatype == "BYTES":
            elements = deserialize_bytes(raw, name, count)
            values = np.empty(len(elements), dtype=object)
            values[:] = elements
        else:
            dtype = np.dtype(NUMPY[datatype]).newbyteorder("<")
            if len(raw) != count * dtype.itemsize:
                raise InvalidInput(
                    f"input {name!r}: {len(raw)} raw bytes for shape {list(shape)} of {datatype} "
                    f"(expected {count * dtype.itemsize})"
                )
            values = np.frombuffer(raw, dtype=dtype).astype(NUMPY[datatype])
    else:
        field = getattr(contents, CONTENTS[datatype]) if contents is not None else []
        if len(field) != count:  # before building one object per element
            raise InvalidInput(
                f"input {name!r}: {len(field)} elements for shape {list(shape)} ({count} expected in "
                f"contents.{CONTENTS[datatype]}, the field of {datatype})"
            )
        if datatype == "BYTES":
            values = np.empty(len(field), dtype=object)
            values[:] = list(field)
        else:
            values = np.asarray(field, dtype=NUMPY[datatype])
    if values.size != count:
        raise InvalidInput(f"input {name!r}: {values.size} elements for shape {list(shape)} ({count} expected)")
    try:
        return values.reshape(tuple(shape))
    except ValueError as err:  # an empty tensor with a dimension too large for numpy, e.g. [0, 2**63 - 1]
        raise InvalidInput(f"input {name!r}: shape {list(shape)} is not supported: {err}") from err


def encode(array: np.ndarray, datatype: str, contents, raw: bool) -> bytes | None:
    """Fill `contents` (typed field) or return the raw little-endian bytes when `raw`."""
    if datatype == "BYTES":
        elements = [bytes(e) for e in array.reshape(-1)]
        if raw:
            return serialize_bytes(elements)
        contents.bytes_contents.extend(elements)
        return None
    flat = np.ascontiguousarray(array, dtype=np.dtype(NUMPY[datatype]).newbyteorder("<")).reshape(-1)
    if raw:
        return flat.tobytes()
    getattr(contents, CONTENTS[datatype]).extend(flat.tolist())
    return None
