"""Measurement windows: a job's progress reports and a cumulative energy counter turned into the per-step energy and
time of one GPU level, for the online tuner (governor.policy.tuner). Written once for the daemon, ``ftgov evaluate``
and the benchmarks, so that warm-up and window arithmetic cannot drift between them."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

from governor.errors import FtgovError

if TYPE_CHECKING:
    from governor.policy.tuner import OnlineTuner

# A probe is DEFAULT_WARMUP_STEPS discarded steps after a change of level, then DEFAULT_WINDOW_STEPS measured steps.
# One warm-up step is enough to leave the step during which the clock changed out of the window (a devfreq write takes
# effect within milliseconds; unverified on a real Orin), and four measured steps average out most of the step noise.
DEFAULT_WARMUP_STEPS = 1
DEFAULT_WINDOW_STEPS = 4


class TuningError(FtgovError, ValueError):
    """A bad argument or measurement given to the tuner (unknown level, non-positive or non-finite value)."""


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TuningError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TuningError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Measurement:
    """One closed measurement window, ready for ``OnlineTuner.observe``."""

    level_hz: int
    joules_per_step: float
    seconds_per_step: float
    measured_steps: int  # steps inside the window
    profiled_steps: int  # steps from the start of the probe to the end of the window: warm-up included


class ProbeWindow:
    """One probe at one level, fed by a job's progress reports.

    ``steps`` is the job's total step count (the ``progress`` notification), ``energy_j`` a cumulative energy counter
    (the rails integrated from any origin) and ``time_s`` a monotonic clock, all read when the report arrives: only
    their differences are used. The first ``warmup_steps`` steps after ``begin_steps`` are discarded (the step during
    which the clock changed); the window then closes at the first report at least ``window_steps`` steps later. Reports
    may skip steps: the window is then longer, and the per-step figures use the steps that really passed. A report of
    any phase but "train" (eval, checkpoint, data loading) discards the open window, which restarts at the next train
    report.
    """

    def __init__(self, level_hz: int, begin_steps: int, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                 window_steps: int = DEFAULT_WINDOW_STEPS):
        self.level_hz = level_hz
        self.begin_steps = _count(begin_steps, "begin_steps", 0)
        self.warmup_steps = _count(warmup_steps, "warmup_steps", 0)
        self.window_steps = _count(window_steps, "window_steps", 1)
        self._last_steps = self.begin_steps
        self._mark: tuple[int, float, float] | None = None  # (steps, energy_j, time_s) where the window opened
        self.measurement: Measurement | None = None

    def feed(self, steps: int, energy_j: float, time_s: float, phase: str = "train") -> Measurement | None:
        """Take one progress report; return the measurement when this report closes the window."""
        if self.measurement is not None:
            raise TuningError("this window is already closed: start a new one")
        steps = _count(steps, "steps", 0)
        if steps < self._last_steps:
            raise TuningError(f"steps went backwards: {steps} after {self._last_steps}")
        self._last_steps = steps
        if phase != "train":
            self._mark = None
            return None
        if self._mark is None:
            if steps >= self.begin_steps + self.warmup_steps:
                self._mark = (steps, float(energy_j), float(time_s))
            return None
        mark_steps, mark_j, mark_s = self._mark
        n = steps - mark_steps
        if n < self.window_steps:
            return None
        joules, seconds = float(energy_j) - mark_j, float(time_s) - mark_s
        if not (math.isfinite(joules) and joules > 0 and math.isfinite(seconds) and seconds > 0):
            raise TuningError(f"window at {self.level_hz} Hz measured {joules!r} J in {seconds!r} s: the energy "
                              "counter or the clock did not advance")
        self.measurement = Measurement(self.level_hz, joules / n, seconds / n, n, steps - self.begin_steps)
        return self.measurement


# A window this many times faster per step than the last one kept cannot be its steps: a change of clock moves the
# step time by at most the clocks' ratio (4.25x from 306 to 1300 MHz on an AGX Orin, 5.7x over an H200's table).
# It is reports read in a burst (the daemon was held up, by a state save's fsync on a loaded disk, say): steps that
# ran earlier, at another level, closing a window in no time (a CI run saw 4 steps in 0.1 ms, 0.0009 J a step).
BURST_FACTOR = 10.0
# A backlog is drained in one window: after this many dropped in a row, the windows are the job's real steps and
# the reference (the fastest window kept) was a slow one, a stall say: the next is kept.
MAX_BURSTS_IN_A_ROW = 2


class TuningSession:
    """Drives an ``OnlineTuner`` from a job's progress reports: the loop the daemon, ``ftgov evaluate`` and the
    benchmark share, so that warm-up and window arithmetic are written once.

    Create it when the job has been pinned at ``tuner.next_level_hz()`` (the start level), with the step count, energy
    counter and clock read then; ``total_steps``, when the job's length is known, is the step count it will end at (same
    count as ``steps``): the tuner's exploration budget is a fraction of the energy of the steps left. Feed every
    progress report to ``on_progress``; when it returns a measurement, pin ``level_hz`` if it changed (and log the
    measurement with ``tuner.state()``). Re-measuring the level already pinned needs no warm-up; a new level gets
    ``warmup_steps`` discarded steps first.
    """

    def __init__(self, tuner: OnlineTuner, steps: int, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                 window_steps: int = DEFAULT_WINDOW_STEPS, *, total_steps: int | None = None):
        self.tuner = tuner
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.profiled_steps = 0
        self.bursts = 0  # windows dropped as reports read in a burst (BURST_FACTOR)
        self._fastest_s_per_step: float | None = None  # of the windows kept
        self._bursts_in_a_row = 0
        # The tuner's budget is priced in windows of this session's size, over the steps the job has left.
        remaining = None
        if total_steps is not None:
            remaining = max(1, _count(total_steps, "total_steps", 0) - _count(steps, "steps", 0))
        tuner.set_job(total_steps=remaining, probe_steps=max(1, warmup_steps + window_steps))
        self._window = ProbeWindow(tuner.next_level_hz(), steps, warmup_steps, window_steps)

    @property
    def level_hz(self) -> int:
        """The level the tuner wants next (the job is pinned there once the open window closes)."""
        return self.tuner.next_level_hz()

    @property
    def measuring_hz(self) -> int:
        """The level the open window measures: what the job must be pinned at while it is open."""
        return self._window.level_hz

    @property
    def converged(self) -> bool:
        return self.tuner.converged

    def repinned(self, steps: int) -> None:
        """The job reached the open window's level only now, at ``steps`` (its pin waited): the window starts over
        from here, warm-up first, as after any change of clock."""
        self._window = ProbeWindow(self._window.level_hz, steps, self.warmup_steps, self.window_steps)

    def on_progress(self, steps: int, energy_j: float, time_s: float, phase: str = "train") -> Measurement | None:
        if self.tuner.converged:
            return None
        m = self._window.feed(steps, energy_j, time_s, phase)
        if m is None:
            return None
        fastest = self._fastest_s_per_step
        if (fastest is not None and m.seconds_per_step * BURST_FACTOR < fastest
                and self._bursts_in_a_row < MAX_BURSTS_IN_A_ROW):
            # Not this level's steps: measured again from here, warm-up first (they may have run at another level).
            self.bursts += 1
            self._bursts_in_a_row += 1
            self._window = ProbeWindow(m.level_hz, steps, self.warmup_steps, self.window_steps)
            return None
        # Kept: a backlog is drained by then, so windows this fast in a row are the job's steps, and the windows kept
        # before were the slow ones (a stall in the first): the fastest kept is the reference from now on.
        self._bursts_in_a_row = 0
        self._fastest_s_per_step = m.seconds_per_step if fastest is None else min(fastest, m.seconds_per_step)
        self.tuner.observe(m.level_hz, m.joules_per_step, m.seconds_per_step)
        self.profiled_steps += m.profiled_steps
        if not self.tuner.converged:
            nxt = self.tuner.next_level_hz()
            warmup = 0 if nxt == m.level_hz else self.warmup_steps
            self._window = ProbeWindow(nxt, steps, warmup, self.window_steps)
            if warmup == 0:  # the same level goes on running: this report opens the next window at once
                self._window.feed(steps, energy_j, time_s, phase)
        return m
