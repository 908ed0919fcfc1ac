import contextlib
import os

import pytest
from edgedistill.common.console import Console


def test_a_table_printed_to_a_reader_that_stopped_early_is_a_broken_pipe_for_the_commands_handler():
    reader, writer = os.pipe()
    os.close(reader)
    out = os.fdopen(writer, "w", buffering=1)
    with pytest.raises(BrokenPipeError):
        Console(file=out).print("a row of a table")
    with contextlib.suppress(BrokenPipeError):  # the text the file object still holds, which no reader takes
        out.close()
