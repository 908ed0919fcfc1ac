"""What a backend call costs, how a batch splits into calls, and what runs at once on the event loop.

A backend call costs a fixed overhead plus time per padded token (`BackendCost`, fitted to timings at
several shapes): a batch of mixed lengths is split into groups of similar length, each run as its own
call, wherever the padding saved is worth more than the extra calls (`BackendCost.split`). Work whose
expected cost is within a hop to a worker thread and back runs on the event loop instead, and a
request at light load skips the queue too (`runs_inline`). Pure: numbers in, numbers out.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import NamedTuple

import numpy as np

INLINE_TOKENIZE_CHARS = 256  # tens of microseconds of tokenizing: less than a hop to a thread and back


class Timing(NamedTuple):
    """One backend call of `rows` rows padded to `longest`, and the seconds it took."""

    rows: int
    longest: int
    seconds: float


def _terms(rows: int, longest: int) -> tuple[float, float, float]:
    """What a call's time grows with: once per call, per padded token, per padded token times length."""
    return 1.0, rows * longest, rows * longest * longest


# Every non-empty subset of the terms, the fullest first: `BackendCost.fit` takes the best with no negative coefficient,
# which is the non-negative least-squares fit (that fit is the plain one over the terms it leaves above zero).
_TERM_SUBSETS = tuple(subset for size in (3, 2, 1) for subset in combinations(range(3), size))


@dataclass
class BackendCost:
    """Expected seconds of one backend call of `rows` rows padded to `longest`:
    `scale * (overhead + per_token * rows * longest + per_token_length * rows * longest**2)`;
    the last term is attention's, zero for models without it.

    The coefficients come from timings at several shapes (`fit`) and decide how a batch splits;
    `scale` follows the measured times since (`observe`), so a machine that slows down moves the
    estimate without changing the split.
    """

    overhead: float
    per_token: float
    per_token_length: float = 0.0
    scale: float = 1.0

    @classmethod
    def fit(cls, timings: Sequence[Timing]) -> "BackendCost":
        """Least relative squared error over single calls at two or more shapes, with no coefficient below zero."""
        if len({(rows, longest) for rows, longest, _ in timings}) < 2:
            raise ValueError("fitting a backend cost needs timings at two or more shapes")
        if not_finite := [timing for timing in timings if not math.isfinite(timing[2])]:
            raise ValueError(f"fitting a backend cost needs finite timings, got {not_finite}")
        terms = np.array([_terms(rows, longest) for rows, longest, _ in timings])
        seconds = np.maximum([s for *_, s in timings], 1e-9)
        best, best_error = None, math.inf
        for subset in _TERM_SUBSETS:
            scaled = terms[:, subset] / seconds[:, None]  # relative error: short calls count as much as long ones
            solution = np.linalg.lstsq(scaled, np.ones(len(seconds)), rcond=None)[0]
            if (solution < 0).any():
                continue
            coefficients = np.zeros(3)
            coefficients[list(subset)] = solution
            error = float(((terms @ coefficients / seconds - 1) ** 2).sum())
            if error < best_error:
                best, best_error = coefficients, error
        return cls(*(float(c) for c in best))

    @classmethod
    def per_token_only(cls, groups: Sequence[tuple[int, int]], seconds: float) -> "BackendCost":
        """With no overhead known, all of `seconds` (calls of (rows, longest) in all) counts per padded token."""
        return cls(0.0, max(seconds, 1e-9) / sum(rows * longest for rows, longest in groups))

    def call(self, rows: int, longest: int) -> float:
        """Seconds for one call at the fitted speed."""
        return self.overhead + rows * longest * (self.per_token + self.per_token_length * longest)

    def unscaled(self, groups: Sequence[tuple[int, int]]) -> float:
        """Seconds for calls of (rows, longest) at the fitted speed."""
        return sum(self.call(rows, longest) for rows, longest in groups)

    def seconds(self, groups: Sequence[tuple[int, int]]) -> float:
        return self.scale * self.unscaled(groups)

    def observe(self, groups: Sequence[tuple[int, int]], seconds: float) -> None:
        """Move `scale` towards measured / expected for calls that took `seconds` in all."""
        if (expected := self.unscaled(groups)) > 0:
            self.scale = 0.8 * self.scale + 0.2 * seconds / expected

    def split(self, lengths: Sequence[int]) -> list[int]:
        """For lengths in ascending order, where to cut them into groups (end indices, the last one
        `len(lengths)`) so that the calls' expected time is least; one group when there is no overhead
        to weigh padding against. Dynamic programming over the distinct lengths."""
        if self.overhead <= 0:
            return [len(lengths)]
        ends = [i + 1 for i in range(len(lengths)) if i + 1 == len(lengths) or lengths[i + 1] != lengths[i]]
        starts = [0, *ends]
        best, cut = [0.0], [0]
        for j, end in enumerate(ends):
            longest = lengths[end - 1]
            choices = [best[i] + self.call(end - starts[i], longest) for i in range(j + 1)]
            k = min(range(j + 1), key=choices.__getitem__)
            best.append(choices[k])
            cut.append(k)
        cuts, j = [], len(ends)
        while j > 0:
            cuts.append(ends[j - 1])
            j = cut[j]
        return cuts[::-1]


def group_shapes(lengths: Sequence[int], cuts: Sequence[int]) -> list[tuple[int, int]]:
    """(rows, longest) of each group when ascending `lengths` are cut at the end indices `cuts`."""
    return [(end - start, lengths[end - 1]) for start, end in zip([0, *cuts], cuts, strict=False)]


class Load(NamedTuple):
    """What the batcher is doing when a request arrives; made for every request, so a tuple, which costs a third of
    a frozen dataclass's `__init__`."""

    max_delay: float  # seconds a partial batch waits for more rows
    queued: int  # rows waiting
    busy: bool  # a batch is running in the worker thread
    idle_for: float  # seconds since the last batch finished


def runs_inline(work: float, limit: float, load: Load | None = None) -> bool:
    """Whether work runs at once on the event loop rather than in a worker thread: its expected cost `work`
    is within `limit`, what a hop to the thread and back costs (both in one unit: seconds of backend time,
    or characters to tokenize). With the batcher's `load`, whether a request also skips the queue: only at
    light load too (no queue delay asked, nothing queued or running, and no batch finished within `limit`
    seconds), where a request gains nothing by waiting for company; under heavy load requests arrive right
    after a batch ends and go through the queue, where they batch."""
    if work > limit:
        return False
    return load is None or not (load.max_delay or load.queued or load.busy) and load.idle_for > limit
