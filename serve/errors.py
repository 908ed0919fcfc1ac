"""The serving layer's errors, one hierarchy.

Free of grpc so the host and the batcher can raise them; `serve.transport` maps each class a call can
raise to its status code (`STATUS_CODES`), and answers any other error as an internal one.
"""

# A client's deadline ends its call on the client first (which then cancels it on the server), a little before the
# server's own timer, which started when the call's headers arrived: a cancel this close to the deadline is its expiry,
# to the batcher's dropped rows and the call's recorded status alike.
DEADLINE_SLACK_S = 0.05


class ServeError(Exception):
    """An error of the serving layer; its message says what went wrong and what to do."""

    recurs = False
    """Sending the same request again would fail the same way, even where its status is one clients retry."""


class InvalidInput(ServeError):
    """A request that is malformed or out of range."""


class UnreadableText(InvalidInput):
    """Text `row` of a request (or its pair: `kind`) gives no token but the special ones to `reader`'s tokenizer;
    `read_chars`: in the characters the server reads of it (MAX_TEXT_CHARS), where it was cut there."""

    def __init__(
        self, row: int, kind: str, note: str = "", reader: str = "the tokenizer", read_chars: int | None = None
    ):
        dropped = f"only characters it drops, such as control or zero-width ones{note}"
        super().__init__(
            f"{kind} {row} holds nothing {reader} keeps ({dropped}): the model would see an empty text"
            if read_chars is None
            else f"{kind} {row} holds nothing {reader} keeps in its first {read_chars} characters (MAX_TEXT_CHARS), "
            f"all of a text the server reads ({dropped}): send it without them"
        )
        self.row, self.kind, self.note, self.reader, self.read_chars = row, kind, note, reader, read_chars

    def at(self, row: int, reader: str) -> "UnreadableText":
        """The same error for the request's text `row`, read by `reader` (a cascade member that got some rows)."""
        return UnreadableText(row, self.kind, self.note, reader, self.read_chars)

    def cut_at(self, read_chars: int) -> "UnreadableText":
        """The same error for a text the server cut to its first `read_chars` characters."""
        return UnreadableText(self.row, self.kind, self.note, self.reader, read_chars)


class TooLarge(ServeError):
    """A request over a size limit (texts per request), like gRPC's own message size limit: split it;
    sent again unchanged it fails again."""

    recurs = True


class ModelNotFound(ServeError):
    """A model name or version this server does not serve."""


class PermissionDenied(ServeError):
    """A request for something outside what the server allows (a reload outside its root)."""


class NotReady(ServeError):
    """The model is not loaded or warm yet, or the server is draining."""


class ServerFault(NotReady):
    """The batcher stopped on an internal fault (an error of its own, or a backend call past its time limit):
    the server fails what it holds, reports NOT_SERVING and not live, and exits for its supervisor to restart it."""


class Overloaded(ServeError):
    """The queue holds `max_queued` rows already; the caller should back off and retry."""


class DeadlineExpired(ServeError):
    """The request's deadline passed while its rows were queued; they were dropped."""


class BatcherClosed(ServeError):
    """The batcher stopped taking work (shutdown, or its model was replaced)."""


class ReloadFailed(ServeError):
    """A new bundle could not be loaded; the previous model keeps serving."""


class BundleRejected(ServeError):
    """A bundle that cannot be served: failed verification, missing runtime, wrong model I/O. Raised while
    loading, never to a call (a failed reload answers `ReloadFailed`)."""
