"""Structured logs: one JSON object per line on stderr, with the request id of the call being served and the model
that answers it."""

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
MODEL: ContextVar[tuple[str, str] | None] = ContextVar("model", default=None)  # (name, version) of the call's model
_RECORD_FIELDS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "pid", "msg", "request_id"?, "model"?, "model_version"?, ...extra}`; `extra={...}`
    keys become fields. The pid tells apart the lines of several workers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        if (request_id := REQUEST_ID.get()) is not None:
            entry["request_id"] = request_id
        if (model := MODEL.get()) is not None:
            entry["model"], entry["model_version"] = model
        entry.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and not k.startswith("_")})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO") -> None:
    """Send every logger's records to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
