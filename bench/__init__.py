"""Measurements of built bundles: `python -m bench models RECIPE` and `python -m bench serving RECIPE`.

`models` times every bundle beside the teacher in PyTorch eager (`bench.models`); `serving` drives the
server, the echo and bare servers of `bench.servers` with the drivers of `bench.drivers`
(`bench.serving`). Both write an artifact folder with a manifest. `bench.processes` starts and stops
server subprocesses, also for `loadtests`; `bench.stats` holds the statistics and result records,
`bench.slo` the verdicts on them.
"""

import hashlib
import json


class BenchError(RuntimeError):
    """A benchmark could not measure: a server did not start or stop cleanly, no call succeeded, or no texts."""


def config_hash(recipe, sections: tuple[str, ...], **choices) -> str:
    """The hash that keeps a measurement current: the recipe `sections` it reads (a `common.recipe.Recipe`'s
    dotted keys) and the command's `choices` (bundle, texts, ...), which the recipe does not hold."""
    settings = {"recipe": recipe.settings(*sections), "choices": {k: str(v) for k, v in choices.items()}}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
