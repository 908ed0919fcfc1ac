"""deploy/wheel-test.sh, read: the Pythons it runs import nothing from a PYTHONPATH."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "wheel-test.sh"


def test_wheel_test_clears_pythonpath_before_it_runs_any_python():
    lines = SCRIPT.read_text().splitlines()
    first_python = next(i for i, line in enumerate(lines) if re.search(r'"\$(PY|VPY|PYTHON)"', line))
    assert "unset PYTHONPATH" in lines[:first_python]
