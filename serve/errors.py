"""Errors the serving layer raises, each naming the gRPC status the transport answers with.

Kept free of grpc so the model and batching layers can raise them; `serve.transport` maps `code`
(a `grpc.StatusCode` name) to the status.
"""


class ServeError(Exception):
    """An error with a client-facing message and the gRPC status code name it maps to."""

    code = "INTERNAL"
    recurs = False
    """Sending the same request again would fail the same way, even where the code is one clients retry."""


class InvalidInput(ServeError):
    code = "INVALID_ARGUMENT"


class TooLarge(ServeError):
    """A request over a size limit (texts per request), like gRPC's own message size limit: split it;
    sent again unchanged it fails again."""

    code = "RESOURCE_EXHAUSTED"
    recurs = True


class ModelNotFound(ServeError):
    code = "NOT_FOUND"


class PermissionDenied(ServeError):
    code = "PERMISSION_DENIED"


class NotReady(ServeError):
    """The model is not loaded or warm yet, or the server is draining."""

    code = "UNAVAILABLE"


class ReloadFailed(ServeError):
    """A new bundle could not be loaded; the previous model keeps serving."""

    code = "FAILED_PRECONDITION"


class BundleRejected(RuntimeError):
    """A bundle that cannot be served: failed verification, missing runtime, wrong model I/O."""
