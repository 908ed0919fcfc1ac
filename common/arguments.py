"""Command-line argument types the commands share."""

import argparse


def count(value: str) -> int:
    """An argument that counts something, so is at least 1 (`--jobs`, `--batch-size`)."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number
