"""Figures of a run: call statistics overall, per stage, per name and per second; CPU and memory of both processes.

Latencies are those of successful calls (ms), from each call's send and (`p99_from_due_ms`, ...) from its due time;
failed calls count in the error rate. A call due that a paced user never sent (`loadtests.recorder.NotSent`) is
unsent: neither a request nor a failure, since the server never saw it, but missing from the successful calls and
timed from its due time to when its user stopped. A call belongs to the second (and stage) in which it returned (an
unsent one, in which its user stopped); one that returned after the schedule ended, to the last stage, and one due
after it, to none (`loadtests.result`).
CPU % is of one core (100 = one core busy).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from edgedistill.bench import stats
from edgedistill.loadtests.plan import Stage
from edgedistill.loadtests.recorder import NotSent

MIN_FIT_REQUESTS = 100  # fewer, and a slope per 10,000 requests is mostly noise


@dataclass(frozen=True)
class Samples:
    """Per-call samples (see `loadtests.recorder`), sorted by the time each call returned."""

    end_s: np.ndarray
    ms: np.ndarray
    due_ms: np.ndarray
    ok: np.ndarray
    name: np.ndarray
    names: list[str]
    code: np.ndarray
    codes: list[str]
    started: float
    due_s: np.ndarray | None = None
    """When each paced call was due (seconds after `started`; NaN for a call of no schedule); None in samples written
    before it was recorded."""

    @classmethod
    def load(cls, path: Path) -> "Samples":
        with np.load(path) as data:
            order = np.argsort(data["end_s"], kind="stable")
            end_s, ms, ok, name = (data[key][order] for key in ("end_s", "ms", "ok", "name"))
            due_ms = data["due_ms"][order] if "due_ms" in data else ms  # written before calls were sent late
            if "code" in data:
                code, codes = data["code"][order], [str(c) for c in data["codes"]]
            else:  # written before statuses were recorded
                code, codes = (~ok).astype(np.int16), ["OK", "unknown"]
            names = [str(n) for n in data["names"]]
            due_s = data["due_s"][order] if "due_s" in data else None
            return cls(end_s, ms, due_ms, ok, name, names, code, codes, float(data["started"]), due_s)

    def where(self, keep: np.ndarray) -> "Samples":
        columns = (self.end_s, self.ms, self.due_ms, self.ok, self.name)
        due_s = None if self.due_s is None else self.due_s[keep]
        return Samples(*(c[keep] for c in columns), self.names, self.code[keep], self.codes, self.started, due_s)

    def unsent(self) -> np.ndarray:
        """Which samples are calls due that a paced user never sent (status `NotSent`)."""
        status = NotSent.__name__
        return self.code == self.codes.index(status) if status in self.codes else np.zeros_like(self.ok)

    def error_codes(self) -> dict[str, int]:
        """Failed calls per gRPC status name, most first."""
        counts = np.bincount(self.code[~self.ok], minlength=len(self.codes))
        return {self.codes[i]: int(counts[i]) for i in np.argsort(-counts, kind="stable") if counts[i]}

    def between(self, start: float, end: float) -> "Samples":
        """The calls that returned in [start, end) seconds."""
        return self.where((self.end_s >= start) & (self.end_s < end))

    def due_before(self, seconds: float) -> "Samples":
        """The calls due before `seconds`: by `due_s`, else (a call of no schedule, or samples without it) by their
        return less their latency from the due time, which can be a millisecond off."""
        due = self.end_s - self.due_ms / 1000
        if self.due_s is not None:
            due = np.where(np.isnan(self.due_s), due, self.due_s)
        return self.where(due < seconds)

    def latencies_by_name(self) -> dict[str, np.ndarray]:
        """The successful calls' latencies (ms) per request name, for the names with any."""
        by_name = {name: self.ms[self.ok & (self.name == i)] for i, name in enumerate(self.names)}
        return {name: ms for name, ms in by_name.items() if ms.size}


def call_stats(samples: Samples, seconds: float, offered_rate: float | None = None) -> dict:
    """`bench.stats.call_stats` of the calls sent in `samples` (latencies from the send), the percentiles of the
    latencies from the due time of the successful and the unsent calls (a client on schedule would have waited at
    least that long for one unsent), the successful calls sent late (`late_calls`), the unsent calls (`unsent_calls`)
    and the failures by status (`error_codes`)."""
    unsent = samples.unsent()
    sent = samples.where(~unsent)
    ms = sent.ms[sent.ok]
    figures = stats.call_stats(ms, int(np.count_nonzero(~sent.ok)), seconds, offered_rate)
    due = {stats.from_due(key): value for key, value in stats.percentiles(samples.due_ms[samples.ok | unsent]).items()}
    late = int(np.count_nonzero(sent.due_ms[sent.ok] > ms))
    counts = {"late_calls": late, "unsent_calls": int(np.count_nonzero(unsent)), "error_codes": sent.error_codes()}
    return figures | due | counts


def by_name(samples: Samples, seconds: float) -> dict[str, dict]:
    return {
        name: call_stats(samples.where(samples.name == i), seconds)
        for i, name in enumerate(samples.names)
        if (samples.name == i).any()
    }


def offered_rate(stages: list[Stage]) -> float:
    """Calls/s offered over the whole schedule, weighted by stage length."""
    return sum(s.offered_rate * (s.end_s - s.start_s) for s in stages) / stages[-1].end_s


def _users(stages: list[Stage], start: float, end: float) -> float:
    """The schedule's users over [start, end): a stage's, or where stages change inside it, their mean weighed by the
    time each holds (a spike from 2.5 s on shows in the second from 2 s)."""
    held = [(min(end, s.end_s) - max(start, s.start_s), s.users) for s in stages]
    mean = round(sum(span * users for span, users in held if span > 0) / (end - start), 1)
    return int(mean) if mean.is_integer() else mean


def per_second(samples: Samples, stages: list[Stage]) -> dict[str, list]:
    """One entry per second of the schedule: users (their mean over a second in which stages change), requests/s,
    failures/s (of the calls sent), latency percentiles (None: no call). The last second counts too the calls that
    return after the schedule ends, as the last stage does, and where the schedule ends inside it (`duration_s: 2.5`),
    its rates are over the part scheduled."""
    end = stages[-1].end_s
    seconds = int(np.ceil(end))
    series = {key: [] for key in ("t_s", "users", "requests_per_s", "failures_per_s", "p50_ms", "p95_ms", "p99_ms")}
    for t in range(seconds):
        stats = call_stats(samples.between(t, math.inf if t == seconds - 1 else t + 1), 1.0)
        width = min(t + 1, end) - t  # 1, but for a last second the schedule ends inside
        series["t_s"].append(t)
        series["users"].append(_users(stages, t, t + width))
        for key, calls in (("requests_per_s", stats["requests"]), ("failures_per_s", stats["failures"])):
            series[key].append(calls if width == 1 else round(calls / width, 1))
        for key in ("p50_ms", "p95_ms", "p99_ms"):
            series[key].append(stats[key])
    return series


@dataclass(frozen=True)
class Resources:
    """Process samples: seconds after the load started, cumulative CPU seconds of server and locust, server RSS (MB)."""

    t_s: np.ndarray
    server_cpu_s: np.ndarray
    locust_cpu_s: np.ndarray
    server_rss_mb: np.ndarray

    @classmethod
    def from_rows(cls, rows: list[tuple[float, float, float, float]], started: float) -> "Resources":
        """`rows` of (monotonic time, server CPU s, locust CPU s, server RSS bytes), `started` on the same clock."""
        table = np.array(rows, dtype=np.float64).reshape(-1, 4)
        return cls(table[:, 0] - started, table[:, 1], table[:, 2], table[:, 3] / 2**20)

    def cpu_pct(self, which: str, start: float, end: float) -> float | None:
        """Mean CPU % of `which` ("server" or "locust") over [start, end] s, from the cumulative CPU time.

        The span is clipped to the samples (locust may exit within a second of the end); None when
        less than half of it is left.
        """
        if len(self.t_s) < 2:
            return None
        clipped = max(start, self.t_s[0]), min(end, self.t_s[-1])
        if clipped[1] - clipped[0] < (end - start) / 2:
            return None
        start, end = clipped
        busy = np.interp([start, end], self.t_s, getattr(self, f"{which}_cpu_s"))
        return float(100 * (busy[1] - busy[0]) / (end - start))

    def series(self, samples: Samples, until: float) -> dict[str, list]:
        """Per process sample within [0, until] s: CPU % since the previous sample, RSS, requests done (calls sent and
        returned) so far."""
        keep = np.flatnonzero((self.t_s >= 0) & (self.t_s <= until))
        keep = keep[keep > 0]  # the first sample has no interval before it
        spans = self.t_s[keep] - self.t_s[keep - 1]
        returned = samples.where(~samples.unsent()).end_s
        return {
            "t_s": self.t_s[keep].round(3).tolist(),
            "server_cpu_pct": (100 * np.diff(self.server_cpu_s)[keep - 1] / spans).round(1).tolist(),
            "locust_cpu_pct": (100 * np.diff(self.locust_cpu_s)[keep - 1] / spans).round(1).tolist(),
            "server_rss_mb": self.server_rss_mb[keep].round(2).tolist(),
            "requests_done": np.searchsorted(returned, self.t_s[keep], side="right").tolist(),
        }


def rss_growth_per_10k(
    requests_done: list[int], rss_mb: list[float], skip: float = 0.5, least: int = MIN_FIT_REQUESTS
) -> float | None:
    """Server RSS growth in MB per 10,000 requests: the least-squares slope after the first `skip` share of samples.

    The start is left out because allocators and caches grow while they warm up; None when fewer than
    3 samples or `least` requests remain to fit.
    """
    done = np.asarray(requests_done, np.float64)[int(len(requests_done) * skip) :]
    rss = np.asarray(rss_mb, np.float64)[int(len(rss_mb) * skip) :]
    if len(done) < 3 or done[-1] - done[0] < least:
        return None
    slope = np.polyfit(done, rss, 1)[0]
    return float(slope * 10_000)
