"""Progress of long work: a tqdm bar on a terminal, a plain status line every few seconds in a log, or nothing.

Every stage reports progress through `bar`, so CI logs stay short (no carriage-return frames) while a long stage
still says how far it is. Two deployment settings steer it:

| variable                        | default | meaning                                                     |
| ------------------------------- | ------- | ----------------------------------------------------------- |
| `EDGEDISTILL_PROGRESS`          | `auto`  | `auto` (a bar when stderr is a terminal, else lines), `bar`, |
|                                 |         | `lines` or `off`                                            |
| `EDGEDISTILL_PROGRESS_INTERVAL` | `30`    | seconds between status lines                                |
"""

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from edgedistill.common.settings import PROGRESS_INTERVAL_VAR, PROGRESS_VAR, SettingError
from tqdm import tqdm

MODES = ("auto", "bar", "lines", "off")
DEFAULT_INTERVAL_S = 30.0


def mode() -> str:
    """`bar`, `lines` or `off`: the setting, with `auto` resolved by whether stderr is a terminal."""
    chosen = os.environ.get(PROGRESS_VAR) or "auto"  # empty: unset, as every EDGEDISTILL_* variable
    if chosen not in MODES:
        raise SettingError(f"{PROGRESS_VAR}={chosen!r}: expected one of {', '.join(MODES)}")
    if chosen == "auto":
        return "bar" if sys.stderr.isatty() else "lines"
    return chosen


def interval() -> float:
    """Seconds between status lines."""
    raw = os.environ.get(PROGRESS_INTERVAL_VAR) or str(DEFAULT_INTERVAL_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < math.inf:  # also refuses nan, which would never print a line
        raise SettingError(f"{PROGRESS_INTERVAL_VAR}={raw!r}: expected a positive, finite number of seconds")
    return seconds


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _number(value: float) -> str:
    """A count or a rate as a status line shows it, never in e-notation: below 100 to three significant figures
    (`3.21`, `60`), else whole with thousands separators (`30,864`, `1,234,567`)."""
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


class StatusLines:
    """The tqdm calls a stage makes (`update`, `set_postfix[_str]`, `close`, `n`), answered by one plain line on
    stderr at most every `every` seconds: `[desc] done/total unit (share), rate, elapsed, left, postfix`."""

    def __init__(
        self,
        total: float | None,
        desc: str,
        unit: str,
        initial: float,
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.desc, self.unit, self.n, self.every, self.clock = total, desc, unit, initial, every, clock
        self.initial, self.postfix = initial, ""
        self.started = self.shown = clock()

    def update(self, n: float = 1) -> None:
        self.n += n
        self._maybe_show()

    def set_postfix(self, refresh: bool = True, **figures: Any) -> None:
        """Figures for the next line (shown with the next `update`)."""
        self.postfix = ", ".join(f"{key}={value}" for key, value in figures.items())

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Text for the next line (shown with the next `update`)."""
        self.postfix = text

    def close(self) -> None:
        """Nothing to clear: the stage prints its own summary line when it ends."""

    def line(self) -> str:
        """The status line for the figures so far."""
        elapsed = self.clock() - self.started
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        done = f"{_number(self.n)}/{_number(self.total)}" if self.total else _number(self.n)
        parts = [f"{done} {self.unit}"]
        if self.total:
            parts[0] += f" ({self.n / self.total:.0%})"
        parts.append(f"{_number(rate)} {self.unit}/s")
        parts.append(f"{_clock(elapsed)} elapsed")
        if self.total and rate > 0:
            parts.append(f"{_clock((self.total - self.n) / rate)} left")
        if self.postfix:
            parts.append(self.postfix)
        return f"[{self.desc}] " + ", ".join(parts)

    def _maybe_show(self) -> None:
        now = self.clock()
        if now - self.shown >= self.every:
            self.shown = now
            print(self.line(), file=sys.stderr, flush=True)


def bar(
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    initial: float = 0,
    enabled: bool = True,
    position: int | None = None,
) -> "tqdm | StatusLines":
    """A progress counter for `total` units (None: open-ended) under the mode the environment sets; `enabled`
    False (e.g. on a worker rank) silences it; `position` is the terminal line of a bar when jobs share one."""
    chosen = mode() if enabled else "off"
    if chosen == "lines":
        return StatusLines(total, desc, unit, initial, interval())
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        disable=chosen == "off",
        position=position,
        mininterval=2,
        dynamic_ncols=True,
    )


def write(message: str) -> None:
    """Print a message (an evaluation, a resume note) on stdout without tearing a bar that is drawn."""
    tqdm.write(message)
