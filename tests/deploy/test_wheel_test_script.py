"""deploy/wheel-test.sh, read: the Pythons it runs import nothing from a PYTHONPATH, and its server takes no setting of
the shell."""

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "wheel-test.sh"


def lines_before_python() -> list[str]:
    """The script's lines before the first that runs a Python."""
    lines = SCRIPT.read_text().splitlines()
    first_python = next(i for i, line in enumerate(lines) if re.search(r'"\$(PY|VPY|PYTHON)"', line))
    return lines[:first_python]


def test_wheel_test_clears_pythonpath_before_it_runs_any_python():
    assert "unset PYTHONPATH" in lines_before_python()


def test_wheel_test_passes_no_server_setting_of_the_shell_to_any_python(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    preamble = tmp_path / "preamble.sh"
    preamble.write_text("\n".join([*lines_before_python(), "env"]) + "\n")
    shell = os.environ | {"EDGEDISTILL_TOKEN": "the-shells-token"}
    seen = subprocess.run(["bash", preamble, tmp_path], env=shell, capture_output=True, text=True, check=True).stdout
    assert "EDGEDISTILL_TOKEN=" not in seen
