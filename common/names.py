"""Names in errors: the nearest known one to a name that matches none, to suggest; the first few of a list."""

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean X? ` for the known name nearest to `name`, or "" where none is near."""
    near = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {near[0]}? " if near else ""


def first_of(names: list[str], count: int = 5) -> str:
    """The first `count` of `names`, comma-separated, with `...` where there are more."""
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")
