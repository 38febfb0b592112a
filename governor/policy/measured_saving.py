"""A tuned job's measured saving: its energy per step at the level the tuner picked against its baseline window at the
default governor, with the saving's own uncertainty (saved_pct, saved_pct_err). Written once for the daemon
(governor.daemon.tuning) and the simulated jobs (governor.sim.tuned_job), so that the benchmarks measure what unregister
reports.

The tuned side is every step run converged at the pick: stretches, each from the first report after the pin moved
there and the meter settled (the steps before are its warm-up), and the windows measured at the pick while the tuner
confirmed its near-ties. Its uncertainty is reckoned as a window's (governor.policy.windows.window_noise_rel): the
steps' scatter, read off the intervals between the stretches' reports (at a steady power a stretch's J/step is its mean
step time), pooled with the prior, and the meter's ends, an update's energy at each end of each stretch read off a
counter that holds between updates (none where the points sit on the meter's updates or samples).

Both parts assume that steps scatter independently. A real GPU's do not: on the H200 successive steps correlate and
their means drift by several percent over tens of steps (the GPU waiting on the host: not its clock), so a
baseline window of 100 steps may sit well off the job's long-run J/step while its own scatter looks small. The
stretches at the pick show how far: cut into blocks as long as the baseline window (in steps), their J/step scatter by
what a segment of the baseline's length scatters by in this job, drift and meter ends included. That is the least the
baseline's uncertainty is taken to be, and the blocks' scatter over the square root of their number (batch means) the
least the tuned side's is. Drift that is not stationary (a job whose first steps run differently from the rest)
escapes it.

Better than stating the drift is to cancel it: the baseline's steps are taken in parts (``BaselineParts``,
tuner.baseline_parts), the first at the job's start and the others at the default governor spread over the job while
it runs converged, so that the baseline and the tuned side average over the same drift. On the H200's 2,000-step runs
100 baseline steps in one stretch at the start are 2.7-4.5% off the run's mean J/step, in 5 spread parts 1.0-2.3%
(docs/benchmarks.md, "baseline-drift").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from governor.policy.estimates import ASSUMED_TOTAL_STEPS
from governor.policy.windows import PRIOR_DOF, Intervals, Measurement
from governor.units import rounded

Point = tuple[float, float, float]  # (steps, energy_j, time_s), as windows take them
T = TypeVar("T")

# Windows kept one by one (KeptWindows); past these, each level's later windows are pooled into one entry. With
# tuner.follow_up a converged job's windows go on at its pick for as long as it runs (one every 1-10 s: up to 86,000
# a day), and each was kept in the root daemon's memory (and written to the store as a row).
WINDOWS_KEPT = 256

# The stretches keep a point every so many steps (marks) to cut blocks from: at first every MARK_STEPS, the spacing
# doubling whenever they hold more than MAX_MARKS, so that a long job's stay bounded. The baseline's uncertainty takes
# the blocks' scatter into account once there are MIN_BLOCKS of them.
MARK_STEPS = 2.0
MAX_MARKS = 4096
MIN_BLOCKS = 5
# The baseline's first part waits for the job's warm-up (WarmUp): two successive blocks of its steps, each at least
# WARMUP_BLOCK_STEPS steps and WARMUP_BLOCK_S seconds, the later no more than WARMUP_FASTER_REL faster than the earlier.
WARMUP_BLOCK_STEPS = 5
WARMUP_BLOCK_S = 0.5
WARMUP_FASTER_REL = 0.10
# The most parts a baseline is measured in, those a drift asked for included (BaselineParts): tuner.baseline_parts'
# own bound.
MAX_PARTS = 50
# The first part, measured right after the warm-up gate opened, is left out of the baseline where it lies more than
# FIRST_PART_STRAY_Z standard deviations (its own uncertainty and the later parts' scatter) from the later parts, of
# which there are FIRST_PART_CHECK_PARTS at least: a warm-up that fades slower than WarmUp's blocks can tell (on a
# real H100's cold start, steps 30% slower for 100 steps, the first part 24-31% dear: docs/benchmarks.md,
# "warmup-gate"). The later parts' scatter, from as few as three, may come out small by chance (a t tail): at 5 s.d.,
# parts of 1% noise that drift by 2-3% lose a sound first part in 0.05-0.5% of jobs (tests/policy/
# test_measured_saving.py), and none without drift. Not for fixed-step windows, which know no uncertainty of their own.
FIRST_PART_STRAY_Z = 5.0
FIRST_PART_CHECK_PARTS = 3


@dataclass
class _Stretch:
    """Steps run converged at one pinned level: its first and last point, and its intervals (the steps' scatter)."""

    level_hz: int
    first: Point
    last: Point
    first_held: bool = True  # the first point is a read of a counter that holds between updates (the last: below)
    last_held: bool = True
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
        # Windows closed while confirming near-ties, at whatever level (a long job's later ones pooled by level).
        self.at_pick: KeptWindows[Measurement] = KeptWindows(lambda m: m, pooled_pair)
        self.mixed = False  # a stretch ran while another job shared the GPU: no measurement of this one
        self._open: _Stretch | None = None
        self._moved: tuple[int, float] | None = None  # (level_hz, time_s of its first point): settling
        self.mark_steps = MARK_STEPS
        self._marks = 0

    def converged_at(self, level_hz: int, points: list[Point], on_updates: bool = False) -> None:
        """A report's points, run converged and pinned at ``level_hz``; ``on_updates``: they sit on the meter's
        updates or samples (governor.policy.windows.WindowRule.held_ends), where a stretch's end has no held
        counter's staleness to count."""
        for point in points:
            if self._open is not None and self._open.level_hz == level_hz:
                before = len(self._open.marks)
                self._open.extend(point, self.mark_steps)
                self._open.last_held = not on_updates
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
                self._open = _Stretch(level_hz, point, point, first_held=not on_updates, last_held=not on_updates)
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
               baseline_floor_rel: float = 0.0, baseline_parts: int = 1) -> dict | None:
        """The saving per step at ``best_hz`` against ``baseline``; ``windows``: the tuner's, for a job that ran no
        stretch at its pick (then the windows at it are the tuned side). ``baseline_floor_rel``: the least the
        baseline's own uncertainty is taken to be; ``baseline_parts``: the parts it was measured in, spread over the
        job (BaselineParts.baseline). None without a tuned side."""
        stretches = [s for s in self.stretches if s.level_hz == best_hz and s.steps > 0]
        confirm = [m for m in self.at_pick if m.level_hz == best_hz]
        steps = sum(s.steps for s in stretches) + sum(m.measured_steps for m in confirm)
        over = "steps after convergence"
        block_rel, blocks = 0.0, 0
        if stretches and not self.mixed and steps >= self.prior_steps:
            joules = sum(s.joules for s in stretches) + sum(m.joules_per_step * m.measured_steps for m in confirm)
            tuned_rel = self._stretches_rel(stretches, confirm, steps)
            parts = max(1, baseline_parts)
            block_rel, blocks = blocks_rel(stretches, baseline.measured_steps / parts)
            if blocks:
                tuned_rel = max(tuned_rel, block_rel / math.sqrt(blocks))
                block_rel /= math.sqrt(parts)  # parts far apart stray from the mean independently
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
        return {"saved_pct": rounded(100.0 * (1.0 - ratio), 2), "saved_rel": 1.0 - ratio,
                "saved_pct_err": rounded(100.0 * err_rel, 2), "basis": "default governor", "freq_hz": best_hz,
                "measured_steps": baseline.measured_steps + round(steps), "baseline_steps": baseline.measured_steps,
                "tuned_steps": round(steps), "tuned_over": over, "baseline_j_per_step": baseline.joules_per_step,
                "tuned_j_per_step": tuned, "tuned_rel": tuned_rel, "baseline_rel": base_rel,
                "baseline_parts": baseline_parts, "blocks": blocks, "block_rel": block_rel}

    def _stretches_rel(self, stretches: list[_Stretch], confirm: list[Measurement], steps: float) -> float:
        """The relative s.d. of the tuned side's J/step: the steps' scatter and the meter's ends, in quadrature (each
        end read off a held counter up to one update stale: one update's energy over sqrt 12)."""
        seconds = sum(s.seconds for s in stretches) + sum(m.duration_s or 0.0 for m in confirm)
        ends2 = 0.0
        if seconds > 0:
            held = sum(s.first_held + s.last_held for s in stretches)
            ends2 = (self.meter_update_s / seconds) ** 2 * held / 12.0
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


def parts_scatter(parts: list[Measurement], mean: float) -> float:
    """The parts' J/step's relative s.d. about ``mean`` (two parts at least)."""
    return math.sqrt(sum((m.joules_per_step / mean - 1.0) ** 2 for m in parts) / (len(parts) - 1))


def pooled(parts: list[Measurement], spans: list[float] | None = None) -> Measurement:
    """One measurement of the default governor from its ``parts``, each a window at no pin: J/step and s/step over all
    their steps; its uncertainty the parts' own in quadrature (each weighing by its steps) or, from three parts, the
    scatter of their J/step over the square root of their number (batch means) when that is larger: parts far apart
    show the drift that each one's own scatter does not.

    ``spans``: the stretch of the job each part stands for (BaselineParts.spans), which then weigh the parts instead
    of their steps: parts added late in a job that drifts (BaselineParts) are closer together than the first ones, and
    weighing them by their steps would lean the baseline towards the job's end."""
    if not parts:
        raise ValueError("no baseline parts to pool")
    if len(parts) == 1:
        return parts[0]
    steps = sum(m.measured_steps for m in parts)
    weights = [float(m.measured_steps) for m in parts] if spans is None else list(spans)
    if len(weights) != len(parts) or not all(w > 0 for w in weights):
        raise ValueError(f"parts' weights must be one positive number a part, got {weights!r}")
    total = math.fsum(weights)
    mean = math.fsum(w * m.joules_per_step for w, m in zip(weights, parts, strict=True)) / total
    own = [m.noise_rel for m in parts]
    noise = (None if any(n is None for n in own)
             else math.sqrt(math.fsum((w * (m.noise_rel or 0.0)) ** 2 for w, m in zip(weights, parts, strict=True)))
             / total)
    if len(parts) >= 3:
        spread = parts_scatter(parts, mean)
        # The weighted mean of parts that stray independently: the spread times sqrt(sum w^2) / sum w (1/sqrt(n)
        # for equal weights).
        noise = max(noise or 0.0, spread * math.sqrt(math.fsum(w * w for w in weights)) / total)
    durations = [m.duration_s for m in parts]
    return Measurement(None, mean,
                       math.fsum(w * m.seconds_per_step for w, m in zip(weights, parts, strict=True)) / total, steps,
                       sum(m.profiled_steps for m in parts), noise,
                       None if any(d is None for d in durations) else sum(d for d in durations if d is not None))


def pooled_pair(a: Measurement, b: Measurement) -> Measurement:
    """Two windows at one level as one (pooled: J and s a step over their steps, their uncertainties in quadrature)."""
    return dataclasses.replace(pooled([a, b]), level_hz=a.level_hz)


class KeptWindows(Generic[T]):
    """A job's closed windows, oldest first: the first ``kept`` as they closed, then one entry a level, after them,
    pooling that level's later windows with ``merge``. ``measurement`` gives an entry's Measurement (entries may carry
    more: the daemon's, the gpu_util measured with it). ``last_pinned``: the latest window at a pinned level itself."""

    def __init__(self, measurement: Callable[[T], Measurement], merge: Callable[[T, T], T],
                 entries: Iterable[T] = (), kept: int = WINDOWS_KEPT):
        self._measurement, self._merge, self.kept = measurement, merge, kept
        self._entries: list[T] = list(entries)
        self._pooled_at: dict[int | None, int] = {}  # level -> the index of the entry pooling its later windows
        self.last_pinned = next((measurement(e) for e in reversed(self._entries)
                                 if measurement(e).level_hz is not None), None)

    def append(self, entry: T) -> None:
        m = self._measurement(entry)
        if m.level_hz is not None:
            self.last_pinned = m
        at = self._pooled_at.get(m.level_hz)
        if at is not None:
            self._entries[at] = self._merge(self._entries[at], entry)
            return
        if len(self._entries) >= self.kept:
            self._pooled_at[m.level_hz] = len(self._entries)
        self._entries.append(entry)

    def first(self, entry: T) -> None:
        """An entry that heads the list whenever it comes (a baseline's first part)."""
        self._entries.insert(0, entry)
        self._pooled_at = {level: i + 1 for level, i in self._pooled_at.items()}

    def __iter__(self) -> Iterator[T]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class WarmUp:
    """Whether a job's steps have stopped speeding up, so that the baseline's first part may open (the daemon's
    JobTuner and the simulated jobs alike). A job's first steps often run slower than the rest (caches filling,
    kernels autotuned or compiled, a data loader's first batches): a baseline over them reads the default governor
    dearer than it is, and a newcomer's short tuned job "saved" 40% with its power flat, all of it from its slow first
    steps. Fed the job's step-end points (steps, seconds); over once two successive blocks (WARMUP_BLOCK_STEPS steps and
    WARMUP_BLOCK_S seconds each at least) show the later no more than WARMUP_FASTER_REL faster than the earlier, or
    after ``max_s`` seconds of waiting whatever the steps do (0: over at once); ``block_s`` 0 for blocks of steps alone
    (fixed-step windows, whose simulated jobs run in compressed time). A job that slows down is over: it is not
    warming up. Steps that scatter (15% a step) may hold it a block or two longer; a warm-up that fades slower
    than a block's difference can tell is not seen."""

    def __init__(self, max_s: float, block_s: float = WARMUP_BLOCK_S):
        self.max_s, self.block_s = max_s, block_s
        self.over = max_s <= 0
        self._points: list[tuple[float, float]] = []
        self._first_s: float | None = None

    def feed(self, steps: float, time_s: float) -> bool:
        """A step-end point; whether the warm-up is over (it stays over)."""
        if self.over:
            return True
        if self._points and (steps <= self._points[-1][0] or time_s <= self._points[-1][1]):
            return False
        self._points.append((steps, time_s))
        self._first_s = time_s if self._first_s is None else self._first_s
        if time_s - self._first_s >= self.max_s:
            self.over = True
            return True
        later = self._block(len(self._points) - 1)
        earlier = None if later is None else self._block(later[0])
        if later is None or earlier is None:
            return False
        self.over = later[1] >= (1.0 - WARMUP_FASTER_REL) * earlier[1]
        self._points = self._points[earlier[0]:]  # what the next blocks may need, bounded
        return self.over

    def _block(self, end: int) -> tuple[int, float] | None:
        """The shortest block of points ending at index ``end``: its first point's index and its seconds a step."""
        n_end, t_end = self._points[end]
        for i in range(end - 1, -1, -1):
            n, t = self._points[i]
            if n_end - n >= WARMUP_BLOCK_STEPS and t_end - t >= self.block_s:
                return i, (t_end - t) / (n_end - n)
        return None


class BaselineParts:
    """The baseline measured in ``parts`` parts (tuner.baseline_parts): the first at the job's start, the others at
    the default governor spread over the job while it runs converged (the daemon's JobTuner and the simulated jobs
    follow this one schedule).

    Once the first part is measured (``first``), the others share what is left of ``budget_steps`` (the baseline's
    cap in steps, baseline_max_share of the job: None for fixed-step windows, then every part is one window) at most
    one first part's length each, and fall due at equal steps over the job's ``total_steps`` (None: unknown, taken as
    the tuner's ASSUMED_TOTAL_STEPS) from where the first ended. A part runs only while the job runs converged at its
    pick: one that runs late (a search that took longer) spreads those left over the steps left, so that they do not
    bunch up behind it; none is due once the job is past its length.

    Parts that disagree by more than their own scatter say that the job drifts, and then their number, not their
    length, is what narrows the baseline (on the H200's runs, 100-step segments scatter by 2.7-4.4% and 400-step ones
    hardly less). So from three parts on, while the pooled baseline's uncertainty is above ``target_rel`` (the
    baseline's target, tuner.baseline_target_rel), more parts are planned, as many as that scatter says the target
    needs and the budget left pays for (parts as long as the longest so far), at most MAX_PARTS in all, spread over the
    steps left; the pooled baseline then weighs each part by the stretch of the job it stands for (``spans``), as
    the added parts lie closer together than the planned ones.

    A job whose length is told, or changes, after the first part (``replan``: a client that sends total_steps with
    its progress, a run extended or cut short) has the parts not measured yet planned again over the steps it has
    left, as many as its new length's plan has beyond those measured and its new budget pays for; the parts measured
    stay, and they too then weigh by the stretch each stands for."""

    def __init__(self, parts: int, budget_steps: int | None, total_steps: int | None,
                 target_rel: float | None = None):
        if parts < 1:
            raise ValueError(f"baseline parts must be at least 1, got {parts!r}")
        self.parts, self.budget_steps, self.total_steps = parts, budget_steps, total_steps
        self.target_rel = target_rel
        self.measured: list[Measurement] = []
        self.at_steps: list[float] = []  # the job's step at each measured part's middle
        self.due_at: list[float] = []
        self.added = 0  # parts planned beyond ``parts`` for a drift they showed
        self.uneven = False  # parts measured before the job's length changed (replan): not spread evenly over it

    @property
    def _total(self) -> float:
        return ASSUMED_TOTAL_STEPS if self.total_steps is None else self.total_steps

    def first(self, m: Measurement, steps: float) -> None:
        """The first part closed at job step ``steps``: the others are planned."""
        self.measured, self.at_steps = [m], [steps - m.measured_steps / 2.0]
        self.due_at = self._plan(steps)

    def replan(self, plan: BaselineParts, steps: float, measuring: bool = False) -> None:
        """The job's length was told, or changed, at job step ``steps``: ``plan`` is the schedule for its new length
        (TunerConfig.new_baseline_parts). The parts measured stay (none is measured again); those not measured yet are
        planned as ``first`` plans them, over the steps left: as many as the new length's plan has beyond those
        measured, within what its budget has left. ``measuring``: a part is being measured now, the one due first; it
        counts as measured (a part's length of the budget) and stays due."""
        self.parts, self.budget_steps, self.total_steps = plan.parts, plan.budget_steps, plan.total_steps
        if not self.measured:
            return
        running = self.due_at[:1] if measuring else []
        self.due_at = running + self._plan(steps, len(running))
        # The parts measured so far were spread over the old length: each now weighs by the stretch it stands for.
        self.uneven = self.uneven or len(self.measured) + len(running) > 1
        if not running:  # a part being measured asks for more, for a drift, once it closes (add)
            self._more(steps)

    def _plan(self, steps: float, running: int = 0) -> list[float]:
        """The steps the parts not measured yet fall due at, evenly from job step ``steps`` to the job's end: the plan's
        parts less those measured and ``running``, at most what is left of the budget pays for (a part as long as the
        longest so far)."""
        longest = max(m.measured_steps for m in self.measured)
        more = max(0, self.parts - len(self.measured) - running)
        if self.budget_steps is not None and more:
            left = self.budget_steps - sum(m.measured_steps for m in self.measured) - running * longest
            more = min(more, max(0, round(left / max(1, longest))))
        span = max(0.0, self._total - steps)
        return [steps + span * k / (more + 1) for k in range(1, more + 1)] if span > 0 else []

    def due(self, steps: float) -> bool:
        """Whether a part is due at job step ``steps``, the job running converged at its pick. A part due since
        before the one after it (it waited for a search) runs now and spreads the rest over the steps left."""
        if not self.due_at or steps < self.due_at[0]:
            return False
        if steps >= self._total:
            self.due_at = []
            return False
        if len(self.due_at) > 1 and steps >= self.due_at[1]:
            n = len(self.due_at)
            self.due_at = [steps + (self._total - steps) * k / n for k in range(n)]
        return True

    def add(self, m: Measurement, steps: float) -> None:
        """A later part closed at job step ``steps``."""
        self.measured.append(m)
        self.at_steps.append(steps - m.measured_steps / 2.0)
        if self.due_at:
            self.due_at.pop(0)
        self._more(steps)

    def skip(self) -> None:
        """The part due could not be measured (the GPU shared, the window failed): the next one's turn."""
        if self.due_at:
            self.due_at.pop(0)

    def _more(self, steps: float) -> None:
        """More parts, where those so far scatter by more than the baseline's target allows and the budget pays."""
        k = len(self.measured)
        if self.target_rel is None or self.budget_steps is None or k < 3:
            return
        # What one part strays by: the parts' scatter about their mean, or their own uncertainty if larger. The
        # mean of n parts strays by that over sqrt(n): the target wants (scatter / target)^2 of them.
        scatter = parts_scatter(self.measured, sum(m.joules_per_step for m in self.measured) / k)
        own = [m.noise_rel for m in self.measured if m.noise_rel is not None]
        if own:
            scatter = max(scatter, math.sqrt(sum(n * n for n in own) / len(own)))
        spent = sum(m.measured_steps for m in self.measured)
        longest = max(m.measured_steps for m in self.measured)  # a part may run longer than the mean: the budget holds
        affordable = max(0, int((self.budget_steps - spent) // max(1, longest)))
        more = min(math.ceil((scatter / self.target_rel) ** 2) - k, affordable, MAX_PARTS - k)
        span = self._total - steps
        if more <= len(self.due_at) or span <= 0:
            return
        self.added += more - len(self.due_at)
        self.due_at = [steps + span * j / (more + 1) for j in range(1, more + 1)]

    @property
    def spans(self) -> list[float]:
        """The stretch of the job each measured part stands for: from halfway to the part before (the first: from
        the job's start) to halfway to the part after (the last: to the job's end)."""
        return self._spans(self.at_steps)

    def _spans(self, at: list[float]) -> list[float]:
        edges = [0.0] + [(a + b) / 2.0 for a, b in zip(at, at[1:], strict=False)] + [max(self._total, at[-1])]
        return [max(1.0, hi - lo) for lo, hi in zip(edges, edges[1:], strict=False)]

    @property
    def first_strays(self) -> bool:
        """Whether the first part lies too far from the later ones to stand for the job (FIRST_PART_STRAY_Z): a
        warm-up the gate did not see."""
        first, rest = self.measured[0] if self.measured else None, self.measured[1:]
        if first is None or len(rest) < FIRST_PART_CHECK_PARTS:
            return False
        if first.noise_rel is None or any(m.noise_rel is None for m in rest):
            return False  # fixed-step windows: without the parts' own uncertainty, a few parts' scatter is too unsure
        mean = sum(m.joules_per_step for m in rest) / len(rest)
        # One part strays from the mean of the n others by the parts' scatter times sqrt(1 + 1/n), its own noise added.
        # The scatter of a few parts may come out small by chance: their own uncertainty is its floor, as in _more.
        scatter = parts_scatter(rest, mean)
        scatter = max(scatter, math.sqrt(sum((m.noise_rel or 0.0) ** 2 for m in rest) / len(rest)))
        own = first.noise_rel or 0.0
        sd_rel = math.sqrt(scatter * scatter * (1.0 + 1.0 / len(rest)) + own * own)
        return sd_rel > 0 and abs(first.joules_per_step / mean - 1.0) > FIRST_PART_STRAY_Z * sd_rel

    @property
    def pooled_parts(self) -> int:
        """How many parts the baseline pools: those measured, less a first part that strays (first_strays)."""
        return len(self.measured) - self.first_strays

    @property
    def baseline(self) -> Measurement | None:
        if not self.measured:
            return None
        # Planned parts lie evenly over the job and weigh by their steps (the least scatter); added ones lie closer
        # together than those before them, as do those measured before a replan and those after it, and each part
        # then weighs by the stretch it stands for. Without a stray first part, the second stands for the job from its
        # start.
        skip = len(self.measured) - self.pooled_parts
        return pooled(self.measured[skip:], self._spans(self.at_steps[skip:]) if self.added or self.uneven else None)
