"""Names in errors: the nearest known one to a name that matches none, to suggest (or beside a path that does not
exist); the first few of a list."""

import difflib
import os
from collections.abc import Iterable
from pathlib import Path


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean X? ` for the known name nearest to `name`, or "" where none is near."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {near[0]}? " if near else ""


def first_of(names: list[str], count: int = 5) -> str:
    """The first `count` of `names`, comma-separated, with `...` where there are more."""
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")


def nearest_beside(path: Path) -> str:
    """` (<folder> has <name>)` for the name in a missing `path`'s folder nearest to its own, or "" where none is near
    (or the folder is gone too)."""
    try:
        near = difflib.get_close_matches(path.name, os.listdir(path.parent), n=1, cutoff=0.8)
    except OSError:
        return ""
    return f" ({path.parent} has {near[0]})" if near else ""
