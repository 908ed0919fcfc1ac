"""A tiny variant of recipes/smoke.yaml for stages run in a subprocess."""

import os
from pathlib import Path

from tests.conftest import ROOT

TINY = f"""
extends: {ROOT / "recipes" / "smoke.yaml"}
data: {{train_limit: 600, dev_limit: 100}}
pretrain: {{train_max_lines: 100, eval_max_lines: 50}}
finetune: {{optim: {{epochs: 1}}}}
transfer: {{unlabelled_max_lines: 100, max_unlabelled: 200, max_augmented: 300, n_iter: 1}}
distill:
  students: !replace
    bilstm:
      model: {{arch: bilstm, embed_dim: 16, hidden_size: 16}}
      optim: {{lr: 3.0e-3, epochs: 50, batch_size: 64}}
export: null
"""


def environment(runs: Path) -> dict[str, str]:
    """What a stage runs with: its runs folder, offline, one thread, output unbuffered (read while it runs)."""
    return {
        **os.environ,
        "EDGEDISTILL_RUNS_DIR": str(runs),
        "HF_HUB_OFFLINE": "1",
        "EDGEDISTILL_TORCH_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def tiny_recipe(folder: Path) -> Path:
    """The tiny recipe, written into `folder`."""
    recipe = folder / "tiny.yaml"
    recipe.write_text(TINY)
    return recipe
