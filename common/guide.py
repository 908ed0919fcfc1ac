"""The user guide's pages as messages name them: a file the user has, whether edgedistill runs from a checkout or from
an installed wheel (the pages install as `edgedistill.docs`)."""

import importlib.resources
from pathlib import Path


def page(name: str, anchor: str = "") -> str:
    """The page `name` (`settings.md`) with `#anchor` where given: `docs/<name>` where the working directory is the
    checkout's top folder, else its full path (in site-packages for an installed wheel)."""
    folder = Path(str(importlib.resources.files("edgedistill.docs")))
    try:
        here = folder == Path.cwd() / "docs"
    except OSError:  # a working directory since deleted
        here = False
    shown = Path("docs", name) if here else folder / name
    return f"{shown}#{anchor}" if anchor else str(shown)
