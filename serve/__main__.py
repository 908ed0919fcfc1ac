"""`python -m serve --bundle runs/sst2/bundle-cnn-small-folded [--port 50051]`: serve a bundle until SIGTERM."""

import asyncio
import logging
import os
import sys

from serve.app import EXIT_FAULT, serve
from serve.errors import BundleRejected
from serve.logs import configure_logging
from serve.settings import SettingsError, load_settings

log = logging.getLogger("serve")


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except SettingsError as err:
        print(f"python -m serve: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        return asyncio.run(serve(settings))
    except (BundleRejected, SettingsError, OSError) as err:
        log.error("cannot start: %s", err, extra={"event": "start_failed"})
        return 2


if __name__ == "__main__":
    status = main()
    if status == EXIT_FAULT:  # a hung backend call holds a worker thread that a normal exit would wait for
        logging.shutdown()
        os._exit(status)
    sys.exit(status)
