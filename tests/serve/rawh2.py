"""A bare HTTP/2 client on a socket, for the clients no gRPC library would be: calls stalled mid-message, ping
floods, rapid resets, header blocks that never end. Frames as in RFC 9113; header blocks as HPACK literals
without Huffman coding (RFC 7541, 6.2.2)."""

import contextlib
import socket
import struct
import threading
from enum import IntEnum

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
INITIAL_WINDOW = 65_535
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME = 16_384
ENHANCE_YOUR_CALM = 0xB


class Kind(IntEnum):
    DATA = 0
    HEADERS = 1
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


def frame(kind: Kind, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _integer(value: int, prefix_bits: int = 7) -> bytes:
    """HPACK's integer with a `prefix_bits` prefix (RFC 7541, 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def literal(name: str, value: str) -> bytes:
    """One header field as a literal never indexed, with a new name (RFC 7541, 6.2.3)."""
    name_bytes, value_bytes = name.encode(), value.encode()
    return b"\x10" + _integer(len(name_bytes)) + name_bytes + _integer(len(value_bytes)) + value_bytes


def header_block(path: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A gRPC call's request headers for `path`, and `extra` ones."""
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]
    return b"".join(literal(name, value) for name, value in fields)


def message_prefix(length: int) -> bytes:
    """gRPC's 5-byte message prefix: not compressed, `length` bytes follow."""
    return b"\x00" + length.to_bytes(4, "big")


class RawClient:
    """One connection: the client preface and an empty SETTINGS, the server's SETTINGS acknowledged and its PINGs
    answered when `answer_pings` (without `preface`, nothing at all is sent); every frame the server sends is kept
    in `frames`, and its flow-control windows are followed by `send_data`."""

    def __init__(self, port: int, preface: bool = True, answer_pings: bool = True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.preface = preface
        self.answer_pings = answer_pings
        self.frames: list[tuple[int, int, int, bytes]] = []  # (kind, flags, stream, payload)
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._initial = INITIAL_WINDOW
        self._window = INITIAL_WINDOW
        self._windows: dict[int, int] = {}
        if preface:
            self.send(PREFACE + frame(Kind.SETTINGS, 0, 0))
        threading.Thread(target=self._read, name="rawh2-reader", daemon=True).start()

    def send(self, data: bytes) -> bool:
        """False once the server has closed the connection."""
        try:
            with self._send_lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def open_call(self, stream: int, path: str, extra: tuple[tuple[str, str], ...] = ()) -> bool:
        with self._lock:
            self._windows.setdefault(stream, self._initial)
        return self.send(frame(Kind.HEADERS, END_HEADERS, stream, header_block(path, extra)))

    def read_nothing(self) -> bool:
        """Set every stream's window to 0 (SETTINGS_INITIAL_WINDOW_SIZE), never to grow: the server can send headers
        but no message."""
        return self.send(frame(Kind.SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0)))

    def send_data(self, stream: int, payload: bytes) -> int:
        """Send as much of `payload` as the windows allow now; the bytes sent."""
        with self._lock:
            allowed = min(len(payload), self._window, self._windows.get(stream, self._initial))
            if allowed <= 0:
                return 0
            self._window -= allowed
            self._windows[stream] = self._windows.get(stream, self._initial) - allowed
        for start in range(0, allowed, MAX_FRAME):
            if not self.send(frame(Kind.DATA, 0, stream, payload[start : min(allowed, start + MAX_FRAME)])):
                return start
        return allowed

    def goaway_code(self) -> int | None:
        """The error code of the server's first GOAWAY, None without one."""
        found = [payload for kind, _, _, payload in self.frames if kind == Kind.GOAWAY]
        return int.from_bytes(found[0][4:8], "big") if found else None

    def close(self) -> None:
        """Close the connection. `close` alone would not: the reader thread's `recv` holds the socket open, so the
        server would keep the connection and its calls until it timed them out."""
        with contextlib.suppress(OSError):  # the server closed it first
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := self.sock.recv(1 << 16):
                buffer += chunk
                while len(buffer) >= 9 and len(buffer) >= 9 + (length := int.from_bytes(buffer[:3], "big")):
                    kind, flags = buffer[3], buffer[4]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                    self.frames.append((kind, flags, stream, payload))
                    if self.preface:
                        self._follow(kind, flags, stream, payload)
        except OSError:
            pass
        self.closed.set()

    def _follow(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == Kind.SETTINGS and not flags & ACK:
            with self._lock:
                for offset in range(0, len(payload), 6):
                    ident, value = struct.unpack(">HI", payload[offset : offset + 6])
                    if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                        for known in self._windows:
                            self._windows[known] += value - self._initial
                        self._initial = value
            self.send(frame(Kind.SETTINGS, ACK, 0))
        elif kind == Kind.PING and not flags & ACK and self.answer_pings:
            self.send(frame(Kind.PING, ACK, 0, payload))
        elif kind == Kind.WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            with self._lock:
                if stream == 0:
                    self._window += increment
                else:
                    self._windows[stream] = self._windows.get(stream, self._initial) + increment
