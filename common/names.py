"""Names in errors: the nearest known one to a name that matches none, to suggest (or beside a path that does not
exist); the first few of a list; names an option was given that match none."""

import difflib
import os
from collections.abc import Iterable
from pathlib import Path


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean X? ` for the known name nearest to `name`, or "" where none is near."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {near[0]}? " if near else ""


def not_among(option: str, given: Iterable[str], known: list[str], where: str) -> str:
    """The error for those of the names `given` with `option` (`--only`) that are not `known` (those of `where`), one
    clause each with the nearest known name, or for names joined by commas, that `option` takes one name each time;
    "" where all are known."""
    clauses = []
    for name in dict.fromkeys(given):
        if name in known:
            continue
        if len(parts := [part.strip() for part in name.split(",") if part.strip()]) > 1:
            fix = f": {option} takes one name each time: {' '.join(f'{option} {part}' for part in parts)}"
        else:
            fix = f": {near}" if (near := did_you_mean(name, known).rstrip()) else ""
        clauses.append(f"{option} {name}: not in {where} ({', '.join(known)}){fix}")
    return "; ".join(clauses)


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
