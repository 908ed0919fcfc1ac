"""Deployment settings read from the environment, with defaults that work in a fresh clone.

| variable       | default                                                        |
| -------------- | -------------------------------------------------------------- |
| `DATA_DIR`     | `../shared/data` beside the project if it exists, else `data`  |
| `TEACHER_INIT` | `../shared/models/minilm-l6-h384-uncased` if it exists, else   |
|                | the Hub name `sentence-transformers/all-MiniLM-L6-v2`          |
| `RUNS_DIR`     | `runs`                                                         |
"""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED = PROJECT_ROOT.parent / "shared"
HUB_TEACHER = "sentence-transformers/all-MiniLM-L6-v2"


def _default(local: Path, fallback: str) -> str:
    return str(local) if local.exists() else fallback


def defaults() -> dict[str, str]:
    """The settings above, environment first."""
    base = {
        "DATA_DIR": _default(SHARED / "data", str(PROJECT_ROOT / "data")),
        "TEACHER_INIT": _default(SHARED / "models" / "minilm-l6-h384-uncased", HUB_TEACHER),
        "RUNS_DIR": str(PROJECT_ROOT / "runs"),
    }
    return {key: os.environ.get(key, value) for key, value in base.items()}


def variables() -> dict[str, str]:
    """What a recipe's `${NAME}` may name: any environment variable, and the settings above at their defaults."""
    return dict(os.environ) | defaults()
