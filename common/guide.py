"""The user guide's pages as messages name them: a file the user has, whether edgedistill runs from a checkout or from
an installed wheel (the pages install as `edgedistill.docs`)."""

import importlib.resources
from pathlib import Path


def page(name: str, anchor: str = "") -> str:
    """The page `name` (`settings.md`) with `#anchor` where given: relative to the working directory where the page is
    under it (`docs/settings.md` in a checkout), else its full path (in site-packages for an installed wheel)."""
    path = Path(str(importlib.resources.files("edgedistill.docs"))) / name
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"{shown}#{anchor}" if anchor else str(shown)
