"""Command-line argument types the commands share."""

import argparse
from pathlib import Path


def count(value: str) -> int:
    """An argument that counts something, so is at least 1 (`--jobs`, `--batch-size`)."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def input_file(value: str) -> Path:
    """A file to read, where `-` is stdin: a file named `-` is given as `./-`, which `Path` would make `-` too."""
    path = Path(value)
    return path.absolute() if value != "-" and str(path) == "-" else path
