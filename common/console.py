"""The console every command prints its tables and figures to: rich's, but a reader that stopped early (`| head`)
is left to the commands' one handler (`edgedistill.cli.guarded`: exit 141), where rich would exit 1, the status
of a failed check."""

import errno

from rich import console


class Console(console.Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written, as rich does
        raise BrokenPipeError(errno.EPIPE, "the reader of the output stopped early")
