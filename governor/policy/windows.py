"""Measurement windows: a job's progress reports and a cumulative energy counter turned into the per-step energy and
time of one GPU level, for the online tuner (governor.policy.tuner). Written once for the daemon, ``ftgov evaluate``
and the benchmarks, so that warm-up and window arithmetic cannot drift between them."""

from __future__ import annotations

import bisect
import math
import numbers
from dataclasses import dataclass, replace
from typing import Protocol, cast

from governor.errors import FtgovError


class Tuner(Protocol):
    """What a TuningSession asks of its tuner (governor.policy.tuner.OnlineTuner): the windows know nothing else of
    the search, so the tuner may import them without a circle."""

    @property
    def converged(self) -> bool: ...

    follow_up: bool  # windows go on after converged (governor.policy.followup)

    def next_level_hz(self) -> int: ...

    def observe(self, level_hz: int, joules_per_step: float, seconds_per_step: float, *,
                noise_rel: float | None = None, at_step: float | None = None,
                steps_left: int | None = None) -> None: ...

    def set_job(self, total_steps: int | None = None, probe_steps: int | None = None,
                steps_left: int | None = None) -> None: ...

    def set_steps_left(self, steps_left: int) -> None: ...

    def window_reference(self, level_hz: int) -> Reference | None: ...

# A probe is DEFAULT_WARMUP_STEPS discarded steps after a change of level, then DEFAULT_WINDOW_STEPS measured steps.
# One warm-up step is enough to leave the step during which the clock changed out of the window (a devfreq write takes
# effect within milliseconds; unverified on a real Orin), and four measured steps average out most of the step noise.
DEFAULT_WARMUP_STEPS = 1
DEFAULT_WINDOW_STEPS = 4
# NVML's energy counter moves every 100 ms (measured on an H200: governor.sim.meters); a Jetson's INA3221 refreshes
# every hwmon update_interval (140 ms in the simulated tree; unverified on a board).
NVML_COUNTER_UPDATE_S = 0.100
# How long a meter takes to show a change of clock (or an unpin) fully, in its updates: NVML's counter is exact at
# its next update; an INA3221 reading is the mean over the update_interval before its last refresh, so a reading
# wholly after the change comes at most two intervals after it.
COUNTER_SETTLE_UPDATES = 1
AVERAGE_SETTLE_UPDATES = 2
# A stretch out of training (a job's phase other than train) shorter than this is training: a loop that reports `data`
# around each batch's loading, or evaluates every step or two, is measured as the same loop without phase reports is,
# its data loading inside its steps; a longer one (an evaluation, a checkpoint save) is cut out of the windows. The
# daemon's windows and pin (governor.daemon.phases, which holds it for the re-pin interval where that is longer), its
# cut of a pause the job does not report (governor.daemon.energy.GAP_MIN_S), and the windows of a group whose ranks
# span nodes (governor.client.group) follow it.
SHORT_PHASE_S = 1.0
# A counter that holds between updates reads the same across a window shorter than one update (4 steps of 26 ms):
# such a window stays open until the counter moves. One that has not moved for this many updates is stalled.
STALL_UPDATES = 10


class TuningError(FtgovError, ValueError):
    """A bad argument or measurement given to the tuner (unknown level, non-positive or non-finite value)."""


def _positive(value, name: str, *, zero: bool = False) -> float:
    """A finite number > 0 (``zero``: >= 0)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or (value == 0 and not zero)):
        raise TuningError(f"{name} must be a finite number {'>=' if zero else '>'} 0, got {value!r}")
    return float(value)


def _steps(value) -> float:
    """A step count: an integer from a report, or a fraction where a window's edge falls inside a step."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise TuningError(f"steps must be a finite number >= 0, got {value!r}")
    return cast(float, value)  # an int stays an int: whole steps are reported as such


def _count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TuningError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Measurement:
    """One closed measurement window, ready for ``OnlineTuner.observe``."""

    level_hz: int | None  # None: measured at no pin (an observed job's window at the default governor)
    joules_per_step: float
    seconds_per_step: float
    measured_steps: int  # steps inside the window (rounded where its edges fall inside steps)
    profiled_steps: int  # steps from the start of the probe to the end of the window: warm-up included
    noise_rel: float | None = None  # the window's own relative uncertainty (s.d.) of joules_per_step; None: unknown
    duration_s: float | None = None


@dataclass(frozen=True)
class Reference:
    """What a window will be compared with once it closes (``Tuner.window_reference``): another level's estimate of
    joules per step and its relative uncertainty (s.d. of its log), as the tuner holds them when the window opens.
    ``exploring``: the window is one the search only ranks against it (a level away from the incumbent, while the
    search looks for the curve's bottom), so that reading above it may close at WindowRule.explore_z."""

    joules_per_step: float
    sd_rel: float
    exploring: bool = False


@dataclass(frozen=True)
class WindowRule:
    """Windows sized by time and by their own noise, for any step length.

    A window spans at least ``min_s`` seconds, ``min_updates`` of the meter's updates (``meter_update_s`` apart) and
    ``min_steps`` steps; it then closes at the first report where its own uncertainty (``window_noise_rel``) is at
    most ``target_rel``, or at ``max_s`` whatever it is. Short steps thus get long windows in steps (25 ms steps:
    about 3 s, 115 steps, on a 100 ms counter), long steps short ones (0.5 s steps scattering by 3%: 6 steps); steps
    that scatter by 15% need 20 at 0.5 s, and meet the cap (docs/benchmarks.md).

    ``held_ends``: the window's ends are reads of a counter that holds between updates, made at any instant (a
    report's arrival): each is up to one update stale, an error the rule counts (``window_noise_rel``'s ends). False
    where its ends sit on the meter's own updates or samples (``on_updates``: NVML's counter at its update instants,
    found by UpdateEdges; the rails' sampler): the energy there is the meter's own, and what is left at an end (the
    steps counted fractionally inside a step) the sub-windows' scatter carries, their inner edges being of the same
    kind. Counted there anyway, the held ends were 1.6 of the 2% a 2.6 s window stated on the H200's GPT-2 medium,
    whose successive windows agree within 0.3%, and made windows on edges 1.3-2x longer than their noise needs
    (docs/benchmarks.md, "meter-windows").

    ``target_rel`` is 2%, under the tuner's 3%: on the real H200 traces the estimate runs low by about a third (their
    steps drift, step time and power in anti-phase), and at 2% successive windows there agree within 2.2-3.4%.

    ``prior_rel`` is what a window of ``min_s`` is assumed to scatter by before its own reports say otherwise (the
    tuner's noise_rel); it is pooled with the scatter of the window's ``sub_windows`` parts as PRIOR_DOF readings,
    so that a window of few steps, whose parts say little, cannot close on a lucky calm stretch.

    A window that is compared with a ``Reference`` (the tuner's incumbent, say) closes early once it is decided:
    its estimate differs from the reference's by ``decide_z`` standard deviations of the difference (the window's
    own uncertainty and the reference's), after at least ``decide_min_steps`` steps (the steps' scatter is read off
    their intervals, so a few are needed before it means anything) and ``min_updates`` of the meter's updates. More
    steps there would only sharpen a comparison the tuner already calls clear (its z_confirm, 2, is under
    decide_z: the margin pays for looking at every report), and a window far from the minimum costs its steps at an
    expensive level. A near-tie never reaches it and runs to ``target_rel`` or ``max_s``. ``decide_z`` 0: never.

    A window the search is exploring with (``Reference.exploring``) that reads *above* its reference closes at
    ``explore_z`` (at most decide_z) instead: every one of its steps is spent above the incumbent, at a level the
    search only ranks, and the levels near the bottom are measured again later with decide_z (the search's refine and
    confirm windows, and the follow-up's). Read below, it keeps decide_z: that level is the search's next incumbent,
    and its steps cost nothing above it. On the H200's replayed steps explore_z 1.5 cut what those windows cost by a
    third, the converged levels as before (docs/tuner.md, docs/benchmarks.md "tuner-tradeoffs").
    """

    target_rel: float = 0.02
    min_s: float = 1.0
    max_s: float = 10.0
    min_updates: int = 5
    meter_update_s: float = NVML_COUNTER_UPDATE_S
    min_steps: int = 2
    sub_windows: int = 4
    prior_rel: float = 0.03
    max_steps: int | None = None  # a cap in steps as well (the baseline window's share of a job of known length)
    decide_z: float = 3.0
    decide_min_steps: int = 4
    explore_z: float = 1.5
    held_ends: bool = True

    def __post_init__(self):
        for name in ("target_rel", "min_s", "max_s", "prior_rel"):
            _positive(getattr(self, name), name)
        if isinstance(self.meter_update_s, bool) or not self.meter_update_s >= 0:
            raise TuningError(f"meter_update_s must be a number >= 0, got {self.meter_update_s!r}")
        _count(self.min_updates, "min_updates", 0)
        _count(self.min_steps, "min_steps", 1)
        _count(self.sub_windows, "sub_windows", 2)
        _count(self.decide_min_steps, "decide_min_steps", 2)
        if isinstance(self.decide_z, bool) or not self.decide_z >= 0:
            raise TuningError(f"decide_z must be a number >= 0, got {self.decide_z!r}")
        if isinstance(self.explore_z, bool) or not self.explore_z > 0:
            raise TuningError(f"explore_z must be a number > 0, got {self.explore_z!r}")
        if self.max_s < self.min_s:
            raise TuningError(f"max_s ({self.max_s}) must be at least min_s ({self.min_s})")
        if self.max_steps is not None and _count(self.max_steps, "max_steps", 1) < self.min_steps:
            raise TuningError(f"max_steps ({self.max_steps}) must be at least min_steps ({self.min_steps})")

    def on_updates(self) -> WindowRule:
        """This rule for windows whose ends sit on the meter's updates or samples (``held_ends`` False)."""
        return replace(self, held_ends=False) if self.held_ends else self

    @property
    def shortest_s(self) -> float:
        return max(self.min_s, self.min_updates * self.meter_update_s)

    def next_steps(self, seconds_per_step: float, steps: float, noise_rel: float | None, least: int = 1) -> int:
        """For windows sized in steps before they open (a group whose ranks span nodes edges at step counts agreed in
        advance: governor.client.group), the rule a window behind: the next window's steps from the last one's
        ``steps`` at ``seconds_per_step`` with its relative uncertainty ``noise_rel`` (None: unknown). At least
        shortest_s and min_steps; as long as the last one's scatter says target_rel needs (the noise falls as one over
        the root of the steps); at most max_s (and max_steps); never under ``least``."""
        if not seconds_per_step > 0:
            return max(least, self.min_steps)
        n = max(self.min_steps, math.ceil(self.shortest_s / seconds_per_step))
        if noise_rel is not None and math.isfinite(noise_rel):
            n = max(n, math.ceil(steps * (noise_rel / self.target_rel) ** 2))
        cap = math.floor(self.max_s / seconds_per_step)
        if self.max_steps is not None:
            cap = min(cap, self.max_steps)
        return max(least, min(n, cap))

    def long_enough(self, steps: float, seconds: float) -> bool:
        """Whether a window of ``steps`` steps over ``seconds`` spans the rule's least (steps, time, updates)."""
        return steps >= self.min_steps and seconds >= self.shortest_s

    def closes(self, steps: float, seconds: float, noise_rel: float) -> bool:
        """Whether a window of ``steps`` steps over ``seconds``, of relative uncertainty ``noise_rel``, closes on its
        own: long enough, and its uncertainty at the target or its time or steps at the cap."""
        capped = self.max_steps is not None and steps >= self.max_steps
        return self.long_enough(steps, seconds) and not (noise_rel > self.target_rel and seconds < self.max_s
                                                          and not capped)

    def may_decide(self, steps: float, seconds: float) -> bool:
        """Whether a window of ``steps`` steps over ``seconds`` may be decided early (the class's docstring)."""
        return (bool(self.decide_z) and steps >= self.decide_min_steps
                and seconds >= self.min_updates * self.meter_update_s)

    def differs(self, joules_per_step: float, noise_rel: float, reference: Reference) -> bool:
        """Whether a window's estimate, of relative uncertainty ``noise_rel``, is ``decide_z`` standard deviations of
        the difference away from ``reference`` (``explore_z`` above an exploring reference)."""
        diff = math.log(joules_per_step) - math.log(reference.joules_per_step)
        z = min(self.explore_z, self.decide_z) if reference.exploring and diff > 0 else self.decide_z
        return abs(diff) >= z * math.sqrt(noise_rel * noise_rel + reference.sd_rel * reference.sd_rel)


def summed_noise_rel(parts: list[tuple[float, float | None]]) -> float | None:
    """The relative uncertainty of a sum of J/step, from its parts ``(joules_per_step, noise_rel)`` (a job group's
    ranks): their J/step-weighted mean, as if the parts' errors moved together. A synchronous run's ranks run the same
    steps, so theirs partly do: this is the upper bound, not the root of the summed squares. None where a part has
    none."""
    total = sum(j for j, _ in parts)
    if not parts or total <= 0 or any(u is None for _, u in parts):
        return None
    return sum(j * cast(float, u) for j, u in parts) / total


# The prior counts as this many sub-window readings of the window's scatter.
PRIOR_DOF = 2.0


@dataclass(frozen=True)
class StepScatter:
    """The steps' scatter as read off intervals between reports: the relative variance of one step's time (``var``)
    and the degrees of freedom behind it (``dof``)."""

    var: float
    dof: float

    def pooled(self, other: StepScatter | None, max_dof: float) -> StepScatter:
        """This one pooled with ``other`` (a prior), which counts for at most ``max_dof`` degrees of freedom."""
        if other is None or other.dof <= 0:
            return self
        prior = min(other.dof, max_dof)
        dof = self.dof + prior
        return StepScatter((self.dof * self.var + prior * other.var) / dof, dof)


@dataclass
class Intervals:
    """Sums over intervals between reports, each of ``m`` steps in ``dt`` seconds, that give the steps' scatter: kept
    as sums, so that a long stretch of reports (governor.policy.measured_saving) costs nothing to carry.

    An interval may hold part of a step: between two samples of the rails' sampler (or two counter updates) that fall
    within one step, the steps are counted fractionally at that step's own pace, so the pieces of one step tell no
    more of the scatter than the whole step does. Each interval counts as min(m, 1) of an observation (``whole``):
    a step read in five pieces is one, and the variance is over the observations, not the pieces."""

    steps: float = 0.0
    seconds: float = 0.0
    sq_per_step: float = 0.0  # the sum of dt^2 / m
    whole: float = 0.0  # the sum of min(m, 1): the observations the intervals are worth

    def add(self, m: float, dt: float) -> None:
        self.steps += m
        self.seconds += dt
        self.sq_per_step += dt * dt / m
        self.whole += min(m, 1.0)

    def merged(self, other: Intervals) -> Intervals:
        return Intervals(self.steps + other.steps, self.seconds + other.seconds, self.sq_per_step + other.sq_per_step,
                         self.whole + other.whole)

    def scatter(self, step_s: float | None = None) -> StepScatter:
        """The relative variance of one step's time about ``step_s`` (default: the intervals' mean): an interval of
        m steps has m times less variance per step than one step, sum of m (dt/m - step_s)^2 over the observations
        (``whole``) less one."""
        step_s = self.seconds / self.steps if step_s is None and self.steps > 0 else step_s
        if self.whole < 2 or not step_s or step_s <= 0:
            return StepScatter(0.0, 0.0)
        var = self.sq_per_step - 2 * step_s * self.seconds + step_s * step_s * self.steps
        return StepScatter(max(0.0, var) / (self.whole - 1) / step_s ** 2, self.whole - 1)


def step_scatter(reports: list[tuple[float, float, float]]) -> StepScatter:
    """The relative variance of one step's time from the intervals between reports ``(steps, energy_j, time_s)``,
    about the mean step from the first report to the last."""
    (n0, _, t0), (n1, _, t1) = reports[0], reports[-1]
    if n1 <= n0 or t1 <= t0:
        return StepScatter(0.0, 0.0)
    intervals = Intervals()
    for a, b in zip(reports, reports[1:], strict=False):
        if b[0] > a[0]:
            intervals.add(b[0] - a[0], b[2] - a[2])
    return intervals.scatter((t1 - t0) / (n1 - n0))


# A job's steps scatter alike from one window to the next: the scatter of its windows so far is a prior for the next
# one's, worth at most this many intervals, so that a window of a few long steps cannot close (or be decided) on a
# lucky calm stretch of them, while a window of many steps is judged on its own.
STEP_PRIOR_MAX_DOF = 20.0


# Until a job's own steps say otherwise, they are taken to scatter as the H200's did (a coefficient of variation of
# 14-17%, the most any trace showed), worth PRIOR_DOF intervals: a window of three long steps that happened to run
# alike cannot close on them. Without it, where no held ends bound a short window's uncertainty (WindowRule.held_ends),
# windows of 3-4 steps of 0.5 s closed at 2% whose J/step was 7-18% off (a simulated INA3221 and NVML's edges).
STEP_CV_PRIOR = 0.15
UNKNOWN_STEPS = StepScatter(STEP_CV_PRIOR ** 2, PRIOR_DOF)


def with_unknown_steps(step_prior: StepScatter | None) -> StepScatter:
    """The job's steps' scatter so far (``step_prior``, None: nothing yet) with UNKNOWN_STEPS pooled in, at a weight
    that fades to none as the job's own reach STEP_PRIOR_MAX_DOF intervals."""
    if step_prior is None or step_prior.dof <= 0:
        return UNKNOWN_STEPS
    weight = PRIOR_DOF * max(0.0, 1.0 - step_prior.dof / STEP_PRIOR_MAX_DOF)
    return step_prior.pooled(UNKNOWN_STEPS, weight) if weight > 0 else step_prior


def window_noise_rel(reports: list[tuple[float, float, float]], rule: WindowRule,
                     step_prior: StepScatter | None = None) -> float:
    """The relative uncertainty (s.d.) of a window's joules per step, from its reports ``(steps, energy_j, time_s)``,
    first (where it opened) to last. Three parts:

    - the meter's ends: a counter that holds between updates is read up to one update stale at each end, an error
      uniform over one update's energy: s.d. ``meter_update_s / (duration x sqrt 6)`` of the whole (none where the
      ends sit on the meter's updates or samples: ``WindowRule.held_ends``);
    - the steps' own scatter: at a steady power a window's energy per step is its mean step time, whose relative s.d.
      is the steps' coefficient of variation over sqrt(steps), that CV read off the intervals between reports
      (``step_scatter``), pooled with ``step_prior`` (the job's earlier windows: STEP_PRIOR_MAX_DOF), itself pooled
      with UNKNOWN_STEPS (whose weight fades as the job's windows add theirs);
    - anything else (the clock or the power moving): the scatter of the window's sub-windows (split at the reports
      nearest to equal times) less the ends' share, which each sub-window carries ``sub_windows`` times over, pooled
      with the prior (``prior_rel`` for a window of ``min_s``, shrinking as 1/duration) as PRIOR_DOF readings. It
      replaces the steps' part when larger, since it contains it.
    """
    (n0, e0, t0), (n1, e1, t1) = reports[0], reports[-1]
    duration, steps, joules = t1 - t0, n1 - n0, e1 - e0
    if duration <= 0 or steps <= 0 or joules <= 0:
        return math.inf
    mean = joules / steps
    ends2 = (rule.meter_update_s / duration) ** 2 / 6.0 if rule.held_ends else 0.0
    prior = with_unknown_steps(step_prior)
    steps2 = step_scatter(reports).pooled(prior, STEP_PRIOR_MAX_DOF).var / steps
    prior2 = rule.prior_rel ** 2 * rule.min_s / duration
    edges = [0]
    for k in range(1, rule.sub_windows):
        at = t0 + duration * k / rule.sub_windows
        i = min(range(edges[-1] + 1, len(reports)), key=lambda j: abs(reports[j][2] - at), default=None)
        if i is not None and i < len(reports) - 1:
            edges.append(i)
    edges.append(len(reports) - 1)
    parts = [(reports[b][0] - reports[a][0], reports[b][1] - reports[a][1])
             for a, b in zip(edges, edges[1:], strict=False)]
    parts = [(n, j) for n, j in parts if n > 0]
    b = len(parts)
    rest2 = 0.0
    if b >= 2:
        spread2 = sum(n * n * (j / n - mean) ** 2 for n, j in parts) / (steps * steps) * b / (b - 1) / (mean * mean)
        rest2 = max(0.0, spread2 - b * ends2)
    pooled2 = (PRIOR_DOF * prior2 + max(0, b - 1) * rest2) / (PRIOR_DOF + max(0, b - 1))
    return math.sqrt(ends2 + max(steps2, pooled2))


class ProbeWindow:
    """One probe at one level, fed by a job's progress reports.

    ``steps`` is the job's total step count (the ``progress`` notification), ``energy_j`` a cumulative energy counter
    (the rails integrated from any origin) and ``time_s`` a monotonic clock, all read when the report arrives: only
    their differences are used. The first ``warmup_steps`` steps after ``begin_steps`` are discarded (the step during
    which the clock changed); the window then closes at the first report at least ``window_steps`` steps later. Reports
    may skip steps: the window is then longer, and the per-step figures use the steps that really passed. A report of
    any phase but "train" (eval, checkpoint, data loading) pauses the open window: the first train report after it
    stands where the last one before it did (the steps, energy and time between are cut out), and the window goes on
    from there. A job that evaluates every few seconds would otherwise never finish a window of the rule's length (seen
    on an H100: an HF Trainer evaluating every 100 steps of 44 ms closed one window in 800 steps).

    With a ``rule`` (WindowRule) the window is sized by time and by its own noise instead of ``window_steps``, and its
    measurement carries that noise (``Measurement.noise_rel``).

    ``meter_update_s``: how often the energy counter moves (0: an exact meter). A window of ``window_steps`` across
    which such a counter has not moved stays open until it has, for up to STALL_UPDATES updates (a rule's window
    stays open anyway: its uncertainty is infinite until the counter moves, and it closes at ``max_s``).

    ``settle_s``: after a change of level (a window with warm-up steps) the window opens only once this long has
    passed since its first report as well, so that the meter shows the new level wholly (COUNTER_SETTLE_UPDATES or
    AVERAGE_SETTLE_UPDATES of its updates); the steps meanwhile are warm-up too.

    ``reference``: with a rule, the estimate this window will be compared with; the window closes as soon as that
    comparison is decided (``WindowRule.differs``), its uncertainty whatever it is then. ``least``: with a rule, the
    window closes at the rule's least length (``min_s``, ``min_updates``, ``min_steps`` and ``decide_min_steps``)
    whatever its uncertainty: a job's first window, which nothing measured can be compared with yet (TuningSession).
    ``step_prior``: the scatter of the job's steps in its windows so far (``window_noise_rel``).
    """

    def __init__(self, level_hz: int | None, begin_steps: float, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                 window_steps: int = DEFAULT_WINDOW_STEPS, *, rule: WindowRule | None = None,
                 meter_update_s: float = 0.0, settle_s: float = 0.0, reference: Reference | None = None,
                 least: bool = False, step_prior: StepScatter | None = None):
        self.level_hz = level_hz
        self.reference = reference
        self.least = least
        self.step_prior = step_prior
        self.scatter: StepScatter | None = None  # with a rule, once closed: its steps' own scatter
        self.begin_steps = _steps(begin_steps)
        self.warmup_steps = _count(warmup_steps, "warmup_steps", 0)
        self.settle_s = float(settle_s) if self.warmup_steps else 0.0  # the same level going on has nothing to settle
        self._first_s: float | None = None  # the time of the first report fed
        self.window_steps = _count(window_steps, "window_steps", 1)
        self.rule = rule
        self.stall_s = STALL_UPDATES * float(meter_update_s)
        self._last_steps = self.begin_steps
        self._mark: tuple[float, float, float] | None = None  # (steps, energy_j, time_s) where the window opened
        self._reports: list[tuple[float, float, float]] = []  # with a rule: every report since the mark
        # A pause (a report out of training) cuts its stretch out: what is subtracted from the reports after it, the
        # last report before it (both as the window counts them), and whether one is under way.
        self._cut = (0.0, 0.0, 0.0)
        self._last: tuple[float, float, float] | None = None
        self._paused = False
        self.measurement: Measurement | None = None

    def feed(self, steps: float, energy_j: float, time_s: float, phase: str = "train") -> Measurement | None:
        """Take one progress report; return the measurement when this report closes the window."""
        if self.measurement is not None:
            raise TuningError("this window is already closed: start a new one")
        steps = _steps(steps)
        if steps < self._last_steps:
            raise TuningError(f"steps went backwards: {steps} after {self._last_steps}")
        self._last_steps = steps
        if phase != "train":
            self._paused = self._mark is not None
            return None
        if self._paused:  # back to training: this report stands where the last one before the pause did
            assert self._last is not None, "a pause follows a report"
            self._cut = (steps - self._last[0], float(energy_j) - self._last[1], float(time_s) - self._last[2])
            self._paused = False
            return None
        steps, energy_j, time_s = steps - self._cut[0], float(energy_j) - self._cut[1], float(time_s) - self._cut[2]
        if self._first_s is None:
            self._first_s = float(time_s)
        if self._mark is None:
            if (steps >= self.begin_steps + self.warmup_steps
                    and float(time_s) - self._first_s >= self.settle_s):
                self._mark = (steps, float(energy_j), float(time_s))
                self._reports = [self._mark]
                self._last = self._mark
            return None
        self._last = (steps, float(energy_j), float(time_s))
        mark_steps, mark_j, mark_s = self._mark
        n = steps - mark_steps
        joules, seconds = float(energy_j) - mark_j, float(time_s) - mark_s
        noise = None
        if self.rule is None:
            if n < self.window_steps:
                return None
            if joules == 0 and 0 < seconds < self.stall_s:
                return None  # the counter has not updated since the window opened
        else:
            if steps > self._reports[-1][0]:
                self._reports.append((steps, float(energy_j), float(time_s)))
            early = self.reference is not None and joules > 0 and self.rule.may_decide(n, seconds)
            full = self.rule.long_enough(n, seconds)
            if not (early or full):
                return None
            noise = window_noise_rel(self._reports, self.rule, self.step_prior)
            decided = ((early and self.rule.differs(joules / n, noise, cast(Reference, self.reference)))
                       or (self.least and full and n >= self.rule.decide_min_steps))
            if not decided and not self.rule.closes(n, seconds, noise):
                return None
        if not (math.isfinite(joules) and joules > 0 and math.isfinite(seconds) and seconds > 0):
            stalled = f" (stalled: it updates every {self.stall_s / STALL_UPDATES:g} s)" if self.stall_s else ""
            raise TuningError(f"window at {self.level_hz} Hz measured {joules!r} J in {seconds!r} s: the energy "
                              f"counter{stalled} or the clock did not advance")
        if noise is not None and not math.isfinite(noise):
            noise = None
        if self.rule is not None:
            self.scatter = step_scatter(self._reports)
        self.measurement = Measurement(self.level_hz, joules / n, seconds / n, round(n),
                                       round(steps - self.begin_steps), noise, seconds)
        return self.measurement

    def scatter_with(self, prior: StepScatter | None) -> StepScatter | None:
        """``prior`` (the steps' scatter in the job's windows so far) with this closed window's pooled in: the next
        window's step_prior."""
        if self.scatter is None or self.scatter.dof <= 0:
            return prior
        return self.scatter.pooled(prior, math.inf)


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
    ``warmup_steps`` discarded steps first. A tuner that follows its pick up (``tuner.follow_up``) gets windows after
    it has converged too, and the steps the job has left after each (when ``total_steps`` is known).
    """

    def __init__(self, tuner: Tuner, steps: int, warmup_steps: int = DEFAULT_WARMUP_STEPS,
                 window_steps: int = DEFAULT_WINDOW_STEPS, *, total_steps: int | None = None,
                 rule: WindowRule | None = None, meter_update_s: float = 0.0, settle_s: float = 0.0):
        self.tuner = tuner
        self.meter_update_s = meter_update_s
        self.settle_s = settle_s  # after a change of level, the meter's (ProbeWindow)
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self.rule = rule
        self._window_steps_seen = (0, 0)  # with a rule: the windows kept and their steps, for the tuner's costs
        self._kept = 0  # windows given to the tuner
        self._scatter: StepScatter | None = None  # with a rule: the steps' scatter in the windows kept, pooled
        self.profiled_steps = 0
        self.bursts = 0  # windows dropped as reports read in a burst (BURST_FACTOR)
        self._fastest_s_per_step: float | None = None  # of the windows kept
        self._measuring_hz: int  # the open window's level: set by _new_window
        self._bursts_in_a_row = 0
        # The tuner's budget is priced in windows of this session's size, over the steps the job has left.
        remaining = None
        self._end_steps = None if total_steps is None else int(total_steps)
        if total_steps is not None:
            remaining = max(1, _count(total_steps, "total_steps", 0) - _count(steps, "steps", 0))
        tuner.set_job(total_steps=remaining, probe_steps=max(1, warmup_steps + window_steps))
        self._window = self._new_window(tuner.next_level_hz(), steps, warmup_steps)

    def set_total_steps(self, total_steps: int, steps: int) -> None:
        """The job's length told after the session began (or changed), ``steps`` the count now: a search's budget
        is re-priced over the steps left, and those steps end it or price the follow-up's windows."""
        self._end_steps = int(total_steps)
        searching = not self.tuner.converged
        self.tuner.set_steps_left(max(0, self._end_steps - steps))
        if searching and self.tuner.converged and self.measuring and self.tuner.next_level_hz() != self._measuring_hz:
            # The length ended the search: the window open at another level is no window of what is pinned now.
            self._window = self._new_window(self.tuner.next_level_hz(), steps, self.warmup_steps)

    def _new_window(self, level_hz: int, steps: float, warmup_steps: int) -> ProbeWindow:
        self._measuring_hz = level_hz  # the window's level, known to be a pinned one here
        reference = self.tuner.window_reference(level_hz) if self.rule is not None else None
        # The first window has nothing measured to be compared with: the windows after it are compared with it and
        # run until that comparison is clear, and the search measures the start again while it is within noise of
        # the incumbent, so its precision is bought only where it matters (near the minimum, where windows are cheap).
        return ProbeWindow(level_hz, steps, warmup_steps, self.window_steps, rule=self.rule,
                           meter_update_s=self.meter_update_s, settle_s=self.settle_s, reference=reference,
                           least=not self._kept, step_prior=self._scatter)

    def ends_on_updates(self) -> None:
        """The points fed from now on sit on the meter's updates or samples (the daemon's MeterFeed found the
        counter's update instants): windows opened from here count no held ends (WindowRule.held_ends); the one
        open keeps its rule, its first end may be a held read."""
        if self.rule is not None:
            self.rule = self.rule.on_updates()

    def reopen(self, steps: float) -> None:
        """Begin the warm-up of a window at a new level at ``steps`` instead: its level was pinned when that step was
        reported, after the points (a meter's update instants) fed up to it. A window that goes on at the same level
        needs none and is left as it is."""
        w = self._window
        if w.warmup_steps and w._mark is None and steps > w.begin_steps:
            self._window = self._new_window(self._measuring_hz, steps, w.warmup_steps)

    @property
    def step_scatter(self) -> StepScatter | None:
        """The steps' scatter in the windows kept so far, pooled: the prior of the job's other windows (the baseline's
        later parts)."""
        return self._scatter

    @property
    def level_hz(self) -> int:
        """The level the tuner wants next (the job is pinned there once the open window closes)."""
        return self.tuner.next_level_hz()

    @property
    def measuring_hz(self) -> int:
        """The level the open window measures: what the job must be pinned at while it is open."""
        return self._measuring_hz

    @property
    def converged(self) -> bool:
        return self.tuner.converged

    def repinned(self, steps: float) -> None:
        """The job reached the open window's level only now, at ``steps`` (its pin waited): the window starts over
        from here, warm-up first, as after any change of clock."""
        self._window = self._new_window(self._measuring_hz, steps, self.warmup_steps)

    @property
    def measuring(self) -> bool:
        """Windows are still measured: the search runs, or the tuner follows its pick up."""
        return not self.tuner.converged or self.tuner.follow_up

    def on_progress(self, steps: float, energy_j: float, time_s: float, phase: str = "train") -> Measurement | None:
        if not self.measuring:
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
            self._window = self._new_window(self._measuring_hz, steps, self.warmup_steps)
            return None
        # Kept: a backlog is drained by then, so windows this fast in a row are the job's steps, and the windows kept
        # before were the slow ones (a stall in the first): the fastest kept is the reference from now on.
        self._bursts_in_a_row = 0
        self._kept += 1
        self._scatter = self._window.scatter_with(self._scatter)
        self._fastest_s_per_step = m.seconds_per_step if fastest is None else min(fastest, m.seconds_per_step)
        if self.rule is not None:
            # A window's length in steps is known only once windows have run: what the next one will cost is priced
            # from the mean of those so far.
            windows, steps_seen = self._window_steps_seen
            self._window_steps_seen = (windows + 1, steps_seen + m.measured_steps)
            mean_steps = round((steps_seen + m.measured_steps) / (windows + 1))
            self.tuner.set_job(probe_steps=max(1, self.warmup_steps + mean_steps))
        # The job's own count of the steps left, when its length is known: the windows' steps alone undercount it.
        left = None if self._end_steps is None else max(0, self._end_steps - math.ceil(steps))
        self.tuner.observe(self._measuring_hz, m.joules_per_step, m.seconds_per_step, noise_rel=m.noise_rel,
                           at_step=steps - m.measured_steps / 2, steps_left=left)
        self.profiled_steps += m.profiled_steps
        if self.measuring:
            nxt = self.tuner.next_level_hz()
            warmup = 0 if nxt == m.level_hz else self.warmup_steps
            self._window = self._new_window(nxt, steps, warmup)
            if warmup == 0:  # the same level goes on running: this report opens the next window at once
                self._window.feed(steps, energy_j, time_s, phase)
        return m


class UpdateEdges:
    """A meter's update instants and the energy at each, from reads of it: where a window's edges go (issue 23).

    ``period_s`` > 0: a counter that holds between updates ``period_s`` apart (NVML's, 100 ms). A read whose value
    differs from the one before saw an update in between; the updates lie on a grid of the period whose phase is
    the intersection of those intervals (each widened by the instants' ``jitter_s``), so reads at a job's own pace
    find it to a few ms within a second, at no cost but the reads the daemon makes anyway. An update's energy is
    exact: the value the counter moved to.

    ``period_s`` 0: every read is a sample (the rails integrated by the daemon's sampler) and its own instant.

    Edges wait in order until ``take_until`` hands them out: a caller takes those before a step end it knows.
    """

    MAX_PENDING = 256  # edges no report has claimed (a job whose reports stopped): the oldest are dropped
    SCAN_S = 0.010  # reads this far apart while the phase is unknown: an update between two gives it to ~14 ms
    FINE_S = 0.010  # a phase known this well is followed, not narrowed further
    CHECK_EVERY = 4  # and every 4th of those, the reads that see a drifting grid
    MIN_GAP_S = 0.0005  # a timer read no sooner than this after the last

    def __init__(self, period_s: float, jitter_s: float = 0.002, every_s: float = 0.0):
        self.period_s = float(period_s)
        self.jitter_s = float(jitter_s)
        # The timer's reads (next_read_s) follow a known grid at one update in ``stride``: edges ``every_s`` apart.
        self.stride = 1
        self.pace(every_s)
        self._last: tuple[float, float] | None = None  # (time_s, energy_j) of the last read
        self._phase: tuple[float, float] | None = None  # (start, width) of the phase's interval, mod period_s
        self._pending: list[tuple[float, float]] = []
        self._plan: list[float] = []  # the timer's next reads (next_read_s), for the phase they were planned on
        self._plan_phase: tuple[float, float] | None = None
        self._strides = 0

    @property
    def phase_width_s(self) -> float | None:
        """How well the update instants are known (the width of the phase's interval); None: not yet."""
        return None if self._phase is None else self._phase[1]

    @property
    def reads_per_stride(self) -> float:
        """The timer's reads per edge once the grid is followed: one, and two more every CHECK_EVERY-th."""
        return 1 + 2 / self.CHECK_EVERY

    def pace(self, every_s: float) -> None:
        """Edges ``every_s`` apart from the next plan on (the reader's cost may ask for fewer reads)."""
        if self.period_s > 0:  # at least every_s: a stride rounded down would read more often than the pace asks
            self.stride = max(1, math.ceil(every_s / self.period_s - 1e-9))

    def read(self, t_s: float, energy_j: float) -> None:
        last, self._last = self._last, (t_s, energy_j)
        if self.period_s <= 0:
            self._add(t_s, energy_j)
            return
        if last is None or energy_j == last[1] or t_s <= last[0]:
            return
        self._narrow(last[0], t_s)
        self._add(self._instant(last[0], t_s), energy_j)

    def next_read_s(self, now_s: float) -> float:
        """When a read tells most about the grid, after ``now_s`` (the daemon's timer reads then: issue 23 item 3).

        A read costs: NVML's energy counter took 3.9-9.5 ms of CPU a read on an H200 (power and clock reads, 8 us),
        so the reads are few. No phase yet: one every SCAN_S, so that two straddle an update. A phase wider than
        FINE_S: reads just before its next interval, three inside (each narrows it) and one just after. Then one read
        just after every ``stride``-th update (the update's value: an edge; time windows take one each 0.5 s, or
        fewer where the reader's cost asks for it: ``pace``), and every CHECK_EVERY-th time two more (just after the
        update before it, just before its own), which see a grid that drifted: 1.5 reads per stride. Outside the
        interval means by more than the instants' jitter, or an update seen there would still overlap it (each
        bracket is widened by jitter_s) and a grid that
        drifted would never be let go.
        """
        if self._phase is None or self.period_s <= 0:
            return now_s + self.SCAN_S
        if self._plan_phase != self._phase or not self._plan or self._plan[-1] <= now_s + self.MIN_GAP_S:
            self._plan, self._plan_phase = self._new_plan(now_s), self._phase
        while self._plan[0] <= now_s + self.MIN_GAP_S:
            self._plan.pop(0)
        return self._plan.pop(0)

    def _new_plan(self, now_s: float) -> list[float]:
        assert self._phase is not None
        p, (lo, w), guard_s = self.period_s, self._phase, self.jitter_s + self.MIN_GAP_S
        fine = w <= self.FINE_S
        after_s = now_s + (self.stride - 0.5) * p if fine else now_s + self.MIN_GAP_S - w - guard_s
        base = lo + math.ceil((after_s - lo) / p) * p  # the interval's first occurrence from after_s on
        if not fine:
            return [base - guard_s, *(base + w * i / 4 for i in (1, 2, 3)), base + w + guard_s]
        self._strides += 1
        if self._strides % self.CHECK_EVERY:
            return [base + w + guard_s]
        return [base - p + w + guard_s, base - guard_s, base + w + guard_s]

    def last_update_s(self, t_s: float) -> float | None:
        """The counter's last update at or before ``t_s`` (the middle of the phase's interval); None while the grid
        is not known."""
        if self._phase is None or self.period_s <= 0:
            return None
        lo, width = self._phase
        return t_s - (t_s - (lo + width / 2)) % self.period_s

    def take_until(self, t_s: float) -> list[tuple[float, float]]:
        """The edges ``(time_s, energy_j)`` at or before ``t_s``, oldest first, removed."""
        i = bisect.bisect_right(self._pending, (t_s, math.inf))
        out, self._pending = self._pending[:i], self._pending[i:]
        return out

    def _add(self, t_s: float, energy_j: float) -> None:
        if self._pending and t_s <= self._pending[-1][0]:
            return  # no later than the last: a phase estimate that moved, not a new update
        self._pending.append((t_s, energy_j))
        del self._pending[:-self.MAX_PENDING]

    def _narrow(self, a_s: float, b_s: float) -> None:
        p = self.period_s
        width = b_s - a_s + 2 * self.jitter_s
        if width >= p:
            return  # an update somewhere in a whole period: no news of the phase
        start = (a_s - self.jitter_s) % p
        if self._phase is None:
            self._phase = (start, width)
            return
        lo, w = self._phase
        d = (start - lo) % p
        best = None
        for off in (d, d - p):
            s, e = max(0.0, off), min(w, off + width)
            if e >= s and (best is None or e - s > best[1] - best[0]):
                best = (s, e)
        # Disjoint: the instants moved (the clocks drift apart over hours): start again from this interval.
        self._phase = (start, width) if best is None else ((lo + best[0]) % p, best[1] - best[0])

    def _instant(self, a_s: float, b_s: float) -> float:
        """The update instant seen between reads at ``a_s`` and ``b_s``: the last grid point in the interval."""
        p, (lo, w) = self.period_s, self._phase if self._phase is not None else ((b_s % self.period_s), 0.0)
        centre = lo + w / 2
        t = centre + math.floor((b_s + self.jitter_s - centre) / p) * p
        return t if t > a_s - self.jitter_s else b_s


def steps_at(t_s: float, reports: list[tuple[int, float]]) -> float:
    """The job's step count at ``t_s``, counted fractionally from its step-end reports ``(steps, time_s)`` (in time
    order): a step's share is the part of its time that has passed, between the reports around ``t_s``."""
    times = [t for _, t in reports]
    i = bisect.bisect_right(times, t_s)
    if i == 0 or i == len(reports):
        raise TuningError(f"{t_s} s is outside the step reports ({times[0] if times else None} to "
                          f"{times[-1] if times else None} s)")
    (n0, t0), (n1, t1) = reports[i - 1], reports[i]
    return n0 + (n1 - n0) * (t_s - t0) / (t1 - t0)


def edge_joules_per_step(start: tuple[float, float], end: tuple[float, float],
                         reports: list[tuple[int, float]]) -> float:
    """Joules per step of a window whose edges sit on an energy counter's update instants ``(time_s, energy_j)``:
    the counter's own difference, over the steps run between those instants (``steps_at``). A held counter's
    readings are exact at its updates, so only the steps' partial counting remains as error at the edges."""
    steps = steps_at(end[0], reports) - steps_at(start[0], reports)
    joules = end[1] - start[1]
    if not (steps > 0 and joules > 0):
        raise TuningError(f"window {start[0]}-{end[0]} s measured {joules!r} J over {steps!r} steps")
    return joules / steps
