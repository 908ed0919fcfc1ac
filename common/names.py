"""A name given that matches none known: the nearest known one, to suggest in the error."""

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean X? ` for the known name nearest to `name`, or "" where none is near."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {near[0]}? " if near else ""
