"""A tuned job's measured saving: its energy per step at the level the tuner picked against its baseline window at the
default governor, with the saving's own uncertainty (saved_pct, saved_pct_err). Written once for the daemon
(governor.daemon.tuning) and the simulated jobs (governor.sim.tuned_job), so that the benchmarks measure what unregister
reports.

The tuned side is every step run converged at the pick: stretches, each from the first report after the pin moved
there and the meter settled (the steps before are its warm-up), and the windows measured at the pick while the tuner
confirmed its near-ties. Its uncertainty is reckoned as a window's (governor.policy.windows.window_noise_rel): the
steps' scatter, read off the intervals between the stretches' reports (at a steady power a stretch's J/step is its mean
step time), pooled with the prior, and the meter's ends, an update's energy at each end of each stretch.

Both parts assume that steps scatter independently. A real GPU's do not: on the H200 successive steps correlate and
their means drift by several percent over tens of steps (the default governor moving the clock, the data), so a
baseline window of 100 steps may sit well off the job's long-run J/step while its own scatter looks small. The
stretches at the pick show how far: cut into blocks as long as the baseline window (in steps), their J/step scatter by
what a segment of the baseline's length scatters by in this job, drift and meter ends included. That is the least the
baseline's uncertainty is taken to be, and the blocks' scatter over the square root of their number (batch means) the
least the tuned side's is. Drift that is not stationary (a job whose first steps run differently from the rest)
escapes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from governor.policy.windows import PRIOR_DOF, Intervals, Measurement

Point = tuple[float, float, float]  # (steps, energy_j, time_s), as windows take them

# The stretches keep a point every so many steps (marks) to cut blocks from: at first every MARK_STEPS, the spacing
# doubling whenever they hold more than MAX_MARKS, so that a long job's stay bounded. The baseline's uncertainty takes
# the blocks' scatter into account once there are MIN_BLOCKS of them.
MARK_STEPS = 2.0
MAX_MARKS = 4096
MIN_BLOCKS = 5


@dataclass
class _Stretch:
    """Steps run converged at one pinned level: its first and last point, and its intervals (the steps' scatter)."""

    level_hz: int
    first: Point
    last: Point
    intervals: Intervals = field(default_factory=Intervals)
    marks: list[Point] = field(default_factory=list)  # from the first point, a point each mark_steps or more

    def extend(self, point: Point, mark_steps: float) -> None:
        m, dt = point[0] - self.last[0], point[2] - self.last[2]
        if m > 0 and dt > 0:
            self.intervals.add(m, dt)
        self.last = point
        if point[0] - (self.marks[-1] if self.marks else self.first)[0] >= mark_steps:
            self.marks.append(point)

    def thin(self, mark_steps: float) -> None:
        """Keep the marks at least ``mark_steps`` apart."""
        kept: list[Point] = []
        for point in self.marks:
            if point[0] - (kept[-1] if kept else self.first)[0] >= mark_steps:
                kept.append(point)
        self.marks = kept

    def blocks(self, block_steps: float) -> list[tuple[float, float]]:
        """The stretch cut at its marks into consecutive blocks of at least ``block_steps`` steps: (steps, joules)
        each; the remainder is left out."""
        out = []
        start = self.first
        for point in self.marks:
            if point[0] - start[0] >= block_steps:
                out.append((point[0] - start[0], point[1] - start[1]))
                start = point
        return out

    @property
    def steps(self) -> float:
        return self.last[0] - self.first[0]

    @property
    def joules(self) -> float:
        return self.last[1] - self.first[1]

    @property
    def seconds(self) -> float:
        return self.last[2] - self.first[2]


class MeasuredSaving:
    """The tuned side of a job's saving, fed as the job runs; ``result`` sets it against the baseline window.

    ``prior_rel``: what a window of ``prior_steps`` steps or ``prior_s`` seconds is assumed to scatter by (the tuner's
    noise_rel, for window_steps or window_min_s), the floor of a stretch whose reports say little. ``meter_update_s``:
    how often the energy meter updates (the error at each end); ``settle_s``: how long after a move the meter takes to
    show the new level wholly (a stretch begins after it)."""

    def __init__(self, prior_rel: float, prior_steps: int, *, prior_s: float = 0.0, meter_update_s: float = 0.0,
                 settle_s: float = 0.0):
        self.prior_rel, self.prior_steps, self.prior_s = prior_rel, prior_steps, prior_s
        self.meter_update_s = meter_update_s
        self.settle_s = settle_s
        self.stretches: list[_Stretch] = []
        self.at_pick: list[Measurement] = []  # windows closed while confirming near-ties, at whatever level
        self.mixed = False  # a stretch ran while another job shared the GPU: no measurement of this one
        self._open: _Stretch | None = None
        self._moved: tuple[int, float] | None = None  # (level_hz, time_s of its first point): settling
        self.mark_steps = MARK_STEPS
        self._marks = 0

    def converged_at(self, level_hz: int, points: list[Point]) -> None:
        """A report's points, run converged and pinned at ``level_hz``."""
        for point in points:
            if self._open is not None and self._open.level_hz == level_hz:
                before = len(self._open.marks)
                self._open.extend(point, self.mark_steps)
                self._marks += len(self._open.marks) - before
                if self._marks > MAX_MARKS:
                    self.mark_steps *= 2
                    for s in self.stretches:
                        s.thin(self.mark_steps)
                    self._marks = sum(len(s.marks) for s in self.stretches)
                continue
            if self._moved is None or self._moved[0] != level_hz:
                self._open, self._moved = None, (level_hz, point[2])
            if point[2] - self._moved[1] >= self.settle_s:
                self._open = _Stretch(level_hz, point, point)
                self.stretches.append(self._open)

    def interrupt(self) -> None:
        """The stretch running ends: the pin moved, a confirmation window or a pause began."""
        self._open, self._moved = None, None

    def shared(self) -> None:
        """Another job ran on the GPU: the rails measured both."""
        self.mixed = True
        self.interrupt()

    def window_at_pick(self, m: Measurement) -> None:
        """A window closed while the tuner confirmed its pick's near-ties (those at the final pick count)."""
        self.at_pick.append(m)

    def result(self, baseline: Measurement, best_hz: int, windows: list[Measurement],
               baseline_floor_rel: float = 0.0) -> dict | None:
        """The saving per step at ``best_hz`` against ``baseline``; ``windows``: the tuner's, for a job that ran no
        stretch at its pick (then the windows at it are the tuned side). ``baseline_floor_rel``: the least the
        baseline's own uncertainty is taken to be. None without a tuned side."""
        stretches = [s for s in self.stretches if s.level_hz == best_hz and s.steps > 0]
        confirm = [m for m in self.at_pick if m.level_hz == best_hz]
        steps = sum(s.steps for s in stretches) + sum(m.measured_steps for m in confirm)
        over = "steps after convergence"
        block_rel, blocks = 0.0, 0
        if stretches and not self.mixed and steps >= self.prior_steps:
            joules = sum(s.joules for s in stretches) + sum(m.joules_per_step * m.measured_steps for m in confirm)
            tuned_rel = self._stretches_rel(stretches, confirm, steps)
            block_rel, blocks = blocks_rel(stretches, baseline.measured_steps)
            if blocks:
                tuned_rel = max(tuned_rel, block_rel / math.sqrt(blocks))
        else:
            at_best = [m for m in windows if m.level_hz == best_hz]
            steps = sum(m.measured_steps for m in at_best)
            joules = sum(m.joules_per_step * m.measured_steps for m in at_best)
            over = "tuner windows"
            # The windows' own uncertainties, each weighing by its steps (a window without one: the prior).
            tuned_rel = math.sqrt(sum((m.measured_steps * max(m.noise_rel or 0.0, self.prior_rel)) ** 2
                                      for m in at_best)) / max(1, steps)
        if steps <= 0 or joules <= 0:
            return None
        tuned = joules / steps
        ratio = tuned / baseline.joules_per_step
        base_rel = max(baseline.noise_rel or 0.0, baseline_floor_rel, block_rel)
        # saved = 1 - tuned / baseline: its s.d. is the ratio times the two relative s.d.s in quadrature.
        err_rel = ratio * math.hypot(base_rel, tuned_rel)
        return {"saved_pct": round(100.0 * (1.0 - ratio), 2), "saved_rel": 1.0 - ratio,
                "saved_pct_err": round(100.0 * err_rel, 2), "basis": "default governor", "freq_hz": best_hz,
                "measured_steps": baseline.measured_steps + round(steps), "baseline_steps": baseline.measured_steps,
                "tuned_steps": round(steps), "tuned_over": over, "baseline_j_per_step": baseline.joules_per_step,
                "tuned_j_per_step": tuned, "tuned_rel": tuned_rel, "baseline_rel": base_rel,
                "blocks": blocks, "block_rel": block_rel}

    def _stretches_rel(self, stretches: list[_Stretch], confirm: list[Measurement], steps: float) -> float:
        """The relative s.d. of the tuned side's J/step: the steps' scatter and the meter's ends, in quadrature."""
        seconds = sum(s.seconds for s in stretches) + sum(m.duration_s or 0.0 for m in confirm)
        ends2 = 0.0
        if seconds > 0:
            ends2 = (self.meter_update_s / seconds) ** 2 * len(stretches) / 6.0
        # The prior: prior_rel for prior_steps steps (or prior_s seconds), shrinking as 1 / the steps (the seconds).
        prior2 = self.prior_rel ** 2 * self.prior_steps / steps
        if self.prior_s > 0 and seconds > 0:
            prior2 = min(prior2, self.prior_rel ** 2 * self.prior_s / seconds)
        intervals = Intervals()
        for s in stretches:
            intervals = intervals.merged(s.intervals)
        scatter = intervals.scatter()  # about the mean step over all the stretches
        pooled2 = (PRIOR_DOF * prior2 + scatter.dof * scatter.var / steps) / (PRIOR_DOF + scatter.dof)
        # The confirmation windows carry their own (their share of the steps each).
        windows2 = sum((m.measured_steps * (m.noise_rel or self.prior_rel)) ** 2 for m in confirm) / (steps * steps)
        return math.sqrt(ends2 + pooled2 + windows2)


def blocks_rel(stretches: list[_Stretch], block_steps: float) -> tuple[float, int]:
    """How far a segment of ``block_steps`` steps at the pick strays from the job's long-run J/step: the relative s.d.
    of the stretches' blocks of that length (scaled to exactly that length, as blocks run a little longer), and the
    number of blocks. (0.0, 0) with fewer than MIN_BLOCKS."""
    blocks = [b for s in stretches for b in s.blocks(max(1.0, block_steps))]
    if len(blocks) < MIN_BLOCKS:
        return 0.0, 0
    steps = sum(n for n, _ in blocks)
    mean = sum(j for _, j in blocks) / steps
    var = sum((j / n / mean - 1.0) ** 2 for n, j in blocks) / (len(blocks) - 1)
    return math.sqrt(var * steps / len(blocks) / max(1.0, block_steps)), len(blocks)
