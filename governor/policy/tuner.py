"""Online energy tuner: measure energy per training step at a few GPU levels while the job runs, and pin the minimum.

The MLG tree picks the energy-optimal level for only part of the workloads, and a level or two off the bottom of the
energy curve costs several percent; measuring the job itself removes the model's error. The search assumes nothing
about where it starts (MLG's pick, the top clock, the bottom) or about the curve's shape, and its cost is bounded in
energy, not in windows.

A "window" is one measurement of mean energy and time per step at one level (``observe``); a probe is a window plus
its warm-up steps (``probe_steps``, 5 by default). Estimates are the mean log energy per step of each level's windows
(the noise is relative); comparisons are z scores from ``noise_rel`` and the windows behind each estimate. After
every window the next one is re-planned from all of them.

A table of up to GRID_LEVELS (15) levels is searched whole (governor/policy/search.py); a larger one first on a grid
of about GRID_LEVELS of its levels, then between the grid's pick and its grid neighbours when one of them is
unmeasured or more than REFINE_NOISE x ``noise_rel`` above the pick. Every search sees every window so far; one
budget and one safety cap cover them all. The rules and the reasons for each: docs/tuner.md.

Nothing here touches hardware: the daemon, the benchmarks and ``ftgov evaluate`` feed it measurements.
``TuningSession`` turns a job's progress reports and a cumulative energy counter into those measurements, discarding
the warm-up steps after each change of level.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from governor.policy.estimates import ASSUMED_TOTAL_STEPS, FEASIBLE_Z, Estimates, TunerSettings
from governor.policy.followup import DEFAULT_DRIFT_Z, DEFAULT_MAX_FOLLOW_WINDOWS, FollowPlan, FollowUp
from governor.policy.search import DEFAULT_CONFIRM_CONTENDERS, MAX_CONFIRM_WINDOWS, Search
from governor.policy.windows import (
    DEFAULT_WARMUP_STEPS,
    DEFAULT_WINDOW_STEPS,
    Measurement,
    ProbeWindow,
    Reference,
    TuningError,
    TuningSession,
    WindowRule,
    _count,
    _positive,
)

__all__ = ["ASSUMED_TOTAL_STEPS", "CONFIRM_CONTENDERS_ON", "DEFAULT_CONFIRM_CONTENDERS", "DEFAULT_DRIFT_STEPS",
           "DEFAULT_DRIFT_Z", "DEFAULT_MAX_FOLLOW_WINDOWS", "DRIFT_REL_ON", "DEFAULT_WARMUP_STEPS",
           "DEFAULT_WINDOW_STEPS", "FEASIBLE_Z", "MAX_CONFIRM_WINDOWS", "Measurement", "OnlineTuner", "ProbeWindow",
           "Reference", "TuningError", "TuningSession", "WindowRule"]

# A safety cap only: the energy budget and the search's own stopping rules end it long before on any curve we know of;
# this bounds the time a job can spend off its best level if a measurement source misbehaves.
DEFAULT_MAX_PROBES = 40
DEFAULT_NOISE_REL = 0.03  # relative s.d. of one window's joules per step: "a few percent"
DEFAULT_Z_CONFIRM = 2.0
# Exploration may cost at most this fraction of the job's energy (windows above the incumbent, counted in joules).
DEFAULT_EXPLORE_BUDGET_FRAC = 0.015
# Windows each of two levels within noise of each other get at least before the tuner may stop telling them apart;
# CONFIRM_TOL_NOISE decides when it does. Two is enough for levels a few percent apart; a tie gets more.
DEFAULT_CONFIRM_WINDOWS = 2
# A table of more levels than this is searched on a grid of about this many first, then around the grid's pick: the
# search is measured on tables of 10-15 levels (the Jetson curves), where it needs every level, and a Jetson's devfreq
# table has at most 15 entries (the nvgpu driver's limit), so on a Jetson the whole table is searched as one.
GRID_LEVELS = 15
# The levels between the grid's pick and a grid neighbour are searched when that neighbour is more than this many
# noise_rel above the pick (in log energy). On a V-shaped minimum a level between them can be up to half the
# neighbour's rise below the pick (on a smooth U a quarter of it at most): at 2 x noise_rel, one window's noise.
# Measured on the Jetson curves spread over 8 times their levels (bench_tuner's "fine" set, mid-table start): 1 x
# noise_rel +5 windows for -0.1% mean; 4 x -7 windows for +0.2% mean.
REFINE_NOISE = 2.0
# The drift of a job's energy per step the estimates allow for (governor.policy.estimates, _Drifts), as the daemon's
# tuner.drift_rel sets it (the tuner's own default is 0, off, so that its interface keeps its meaning): the s.d. of log
# J/step the filters are scaled by, and the steps over which it forgets. Measured on the H200's 2,000-step runs at a
# fixed clock: 20-step stretches next to each other differ by 2-4% rms, 1,200 steps apart by 3-6%, and the small
# model's J/step moves by 10-15% within tens of steps (benchmarks/data/h200-meter-2000); the filters weigh 0 to 3 x
# drift_rel, so the size is learnt, and a short memory (50 steps, not the 150-200 of the slow rise) follows the fast
# moves.
DRIFT_REL_ON = 0.03
DEFAULT_DRIFT_STEPS = 50.0
# Near-ties of the pick the search measures again as the daemon's tuner.confirm_contenders sets it (the tuner's own
# default is 1, so that its interface keeps its meaning): on a real meter the second contender is often the level an
# excursion misread once. Measured on the H200's replayed steps (docs/benchmarks.md, "tuner-tradeoffs"): the Jetson
# curves' level p99 3.07% with one, 2.74% with two, for +0.02 points of whole job; on a drift-free meter no change.
CONFIRM_CONTENDERS_ON = 2


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"the setting {name} (TunerSettings)")


class OnlineTuner:
    """Finds the level with the least energy per step from one measurement window at a time.

    Call ``next_level_hz()`` for the level to run the next window at, run it, then ``observe(level_hz, joules_per_step,
    seconds_per_step)``. ``observe`` accepts any level of the table (if the daemon could not pin the one asked for, it
    reports the one that ran); the next level is re-planned from every measurement so far. Once ``converged``, the
    decision is frozen: ``next_level_hz()`` and ``best_hz`` return the chosen level, and later observations are kept in
    ``state()`` but change nothing. Re-tuning (new job features) means a new tuner.

    ``noise_rel`` is the relative standard deviation of one window's energy per step; ``z_confirm`` is how many
    standard deviations make a difference "clear". ``explore_budget_frac`` bounds the energy exploration may cost, as a
    fraction of the job's energy: ``total_steps`` steps (from the first window to the end of the job; None: unknown,
    ASSUMED_TOTAL_STEPS is assumed) at the incumbent's energy per step; a job of known length that has no more than
    a window's steps left ends the search (nothing after that window would run what it tells). ``probe_steps`` is
    what one window costs in steps (warm-up included; TuningSession sets it from its own window). ``confirm_windows``
    is the fewest windows two levels within noise of each other get before the tuner may stop telling them apart;
    ``confirm_contenders`` how many of the levels within noise of the incumbent (the closest in noise units first)
    the search measures again so (the start, while within noise, besides). ``max_probes`` is a safety cap on the
    windows.

    With ``follow_up`` (off by default; the daemon's tuner.follow_up turns it on) the pick is provisional
    (governor.policy.followup): once the search has chosen, ``converged`` is True and ``best_hz`` the pick, but windows
    go on. While ``confirming``, ``next_level_hz()`` may name a near-tie of the pick worth a window for the steps the
    job has left (``set_job(steps_left=)``; else the tuner counts them down from total_steps), and the pick moves to the
    lowest of them; then the pick itself, watched: a window there that leaves the pick's interval by ``drift_z``
    standard deviations twice in a row starts a new search from the pick, the windows before forgotten (``converged`` is
    False again; ``re_searches`` counts them). ``max_follow_windows`` caps the windows away from the pick. Without it,
    the decision is frozen at convergence: later observations are kept in ``state()`` and change nothing.

    Each window may come with its own uncertainty (``observe``'s ``noise_rel``: a WindowRule's windows carry it);
    ``noise_rel`` is then the prior for a window that has none and, with ``noise_floor_rel`` (default: noise_rel),
    the least any window is taken to scatter by.
    """

    def __init__(self, levels_hz: Iterable[int], start_hz: int, max_slowdown: float | None = None, *,
                 noise_rel: float = DEFAULT_NOISE_REL, max_probes: int = DEFAULT_MAX_PROBES,
                 z_confirm: float = DEFAULT_Z_CONFIRM, explore_budget_frac: float = DEFAULT_EXPLORE_BUDGET_FRAC,
                 total_steps: int | None = None, probe_steps: int = DEFAULT_WARMUP_STEPS + DEFAULT_WINDOW_STEPS,
                 confirm_windows: int = DEFAULT_CONFIRM_WINDOWS, noise_floor_rel: float | None = None,
                 follow_up: bool = False, drift_z: float = DEFAULT_DRIFT_Z,
                 max_follow_windows: int = DEFAULT_MAX_FOLLOW_WINDOWS, drift_rel: float = 0.0,
                 drift_steps: float = DEFAULT_DRIFT_STEPS,
                 confirm_contenders: int = DEFAULT_CONFIRM_CONTENDERS):
        self.levels_hz = _check_levels(levels_hz)
        if isinstance(start_hz, bool) or start_hz not in self.levels_hz:
            raise TuningError(f"start_hz {start_hz!r} is not one of the levels {list(self.levels_hz)}")
        self.start_hz = int(start_hz)
        self.settings = TunerSettings(
            max_slowdown=None if max_slowdown is None else _positive(max_slowdown, "max_slowdown"),
            noise_rel=_positive(noise_rel, "noise_rel"),
            z_confirm=_positive(z_confirm, "z_confirm"),
            explore_budget_frac=_positive(explore_budget_frac, "explore_budget_frac"),
            total_steps=None if total_steps is None else _count(total_steps, "total_steps", 1),
            probe_steps=_count(probe_steps, "probe_steps", 1),
            confirm_windows=_count(confirm_windows, "confirm_windows", 1),
            max_probes=_count(max_probes, "max_probes", 1),
            drift_rel=_positive(drift_rel, "drift_rel", zero=True),
            drift_steps=_positive(drift_steps, "drift_steps"),
            confirm_contenders=_count(confirm_contenders, "confirm_contenders", 1))
        self.noise_floor_rel = self.noise_rel if noise_floor_rel is None else _positive(noise_floor_rel,
                                                                                       "noise_floor_rel")
        self.follow_up = bool(follow_up)
        self.drift_z = _positive(drift_z, "drift_z")
        self.max_follow_windows = _count(max_follow_windows, "max_follow_windows", 0)
        self.estimates = Estimates(self.levels_hz, self.levels_hz.index(start_hz), self.settings)
        self._probes = 0
        self._probe_base = 0  # the windows before the search running now (a re-search after drift)
        self.re_searches = 0
        self._final: int | None = None
        self._follow: FollowUp | None = None
        self._follow_plan: FollowPlan | None = None
        self._steps_left: int | None = None  # as last told (set_job); None: counted down from total_steps
        self._steps_since = 0.0  # steps of the windows since then (probe_steps each)
        self._at_step = 0.0  # when the last window was measured (observe's at_step, else probe_steps after the last)
        self._stage = 1
        self._search = self._new_search(list(range(len(self.levels_hz))), self.estimates.start)
        self._settle()

    max_slowdown = _setting("max_slowdown")
    noise_rel = _setting("noise_rel")
    z_confirm = _setting("z_confirm")
    explore_budget_frac = _setting("explore_budget_frac")
    total_steps = _setting("total_steps")
    probe_steps = _setting("probe_steps")
    confirm_windows = _setting("confirm_windows")
    confirm_contenders = _setting("confirm_contenders")
    max_probes = _setting("max_probes")

    @property
    def explore_spent_j(self) -> float:
        """What the windows so far cost the exploration (joules; Estimates._window_cost_j)."""
        return self.estimates.explore_spent_j

    # --- the interface -------------------------------------------------------------------------------------------

    def next_level_hz(self) -> int:
        """The level to measure next; the chosen level once converged."""
        if self._follow_plan is not None:
            return self.levels_hz[self._follow_plan.index]
        if self._final is not None:
            return self.levels_hz[self._final]
        index = self._search.plan.index
        assert index is not None, "a search that has chosen is followed by another, or by _final (_settle)"
        return self.levels_hz[self._search.levels[index]]

    def observe(self, level_hz: int, joules_per_step: float, seconds_per_step: float, *,
                noise_rel: float | None = None, at_step: float | None = None, steps_left: int | None = None) -> None:
        """Record one measurement window: mean energy (J) and duration (s) per step at level_hz; ``noise_rel`` is
        the window's own relative uncertainty (None: the tuner's noise_rel), never taken below noise_floor_rel;
        ``at_step`` is when it was measured, in the job's steps (its middle; None: probe_steps after the last window),
        which the drift between windows is reckoned from; ``steps_left``, the steps the job has left after it, as
        ``set_job(steps_left=)`` takes them (None: counted down by probe_steps), for the plan made after it."""
        if isinstance(level_hz, bool) or level_hz not in self.levels_hz:
            raise TuningError(f"level_hz {level_hz!r} is not one of the levels {list(self.levels_hz)}")
        joules = _positive(joules_per_step, "joules_per_step")
        seconds = _positive(seconds_per_step, "seconds_per_step")
        i = self.levels_hz.index(level_hz)
        noise = max(self.noise_floor_rel, self.noise_rel if noise_rel is None else _positive(noise_rel, "noise_rel"))
        self._probes += 1
        if steps_left is None:
            self._steps_since += self.probe_steps
        else:
            self._steps_left, self._steps_since = _count(steps_left, "steps_left", 0), 0.0
        self._at_step = self._at_step + self.probe_steps if at_step is None else float(at_step)
        follow = self._follow
        if follow is not None and i in follow.members:
            drifted = follow.drifted(i, joules, noise, at_step)
            self.estimates.add(i, joules, seconds, noise, charge=False, at_step=self._at_step)
            if drifted:
                self._search_again(i, joules, seconds, noise)
                return
            follow.windows_away += i != follow.pick
            if not follow.suspect:  # a window out of its interval moves no pick before the next says why
                follow.repick()
            self._final = follow.pick
            self._plan_follow()
            return
        self.estimates.add(i, joules, seconds, noise, charge=self._final is None, at_step=self._at_step)
        if self._final is None:
            self._search.replan(self._probes - self._probe_base, self._known_steps_left)
            self._settle()

    def set_job(self, total_steps: int | None = None, probe_steps: int | None = None,
                steps_left: int | None = None) -> None:
        """Tell the tuner, once it exists, how long the job is and what a window costs (TuningSession does);
        ``steps_left``, the steps the job has left now, prices the follow-up's windows (None: counted down from
        total_steps by the windows' steps)."""
        if total_steps is not None:
            self.settings.total_steps = _count(total_steps, "total_steps", 1)
            if self._steps_left is None:
                self._steps_since = 0.0
        if probe_steps is not None:
            self.settings.probe_steps = _count(probe_steps, "probe_steps", 1)
        if steps_left is not None:
            self._steps_left, self._steps_since = _count(steps_left, "steps_left", 0), 0.0
        if self._final is None:
            self._search.replan(self._probes - self._probe_base, self._known_steps_left)
            self._settle()
        elif self._follow is not None:
            self._plan_follow()

    def set_steps_left(self, steps_left: int) -> None:
        """The job's length was told (or changed), ``steps_left`` steps to go: a search's budget is re-priced over
        them (a length at its end ends it); a converged tuner's follow-up is priced by them."""
        if self.converged:
            self.set_job(steps_left=steps_left)
        else:
            self.set_job(total_steps=max(1, steps_left), steps_left=steps_left)

    def window_reference(self, level_hz: int) -> Reference | None:
        """The estimate a window at ``level_hz`` opened now will be compared with, so that it may close as soon as
        that comparison is clear (WindowRule.decide_z): while searching, the incumbent's (``exploring`` in the
        search's exploring phases, search.EXPLORING_PHASES); while confirming, the pick's. None for a window at that
        level itself (it is compared with levels near it, or watched for drift),
        before anything is measured, once converged without follow_up, and with max_slowdown (a level's step time
        against the top's decides there too, and a window closed once its energy is decided may leave that open)."""
        if self.max_slowdown is not None:
            return None
        i = self.levels_hz.index(level_hz)
        log_j = self.estimates.log_energy()
        if self._final is not None:
            ref = None if self._follow is None else self._follow.pick
        else:
            ref = self.estimates.incumbent(log_j)
        if ref is None or ref == i:
            return None
        mean, var = self.estimates.predict(ref)  # as a window now would read it: the drift's now added
        return Reference(math.exp(mean), math.sqrt(var), exploring=self._final is None and self._search.plan.exploring)

    @property
    def converged(self) -> bool:
        """The search has picked (``best_hz``); with follow_up, windows may go on (``confirming``, watching)."""
        return self._final is not None

    @property
    def confirming(self) -> bool:
        """Converged, and a near-tie of the pick is still worth windows for the steps left (follow_up)."""
        return self._follow_plan is not None and self._follow_plan.confirming

    @property
    def steps_left(self) -> float:
        """The steps the job has left, as last told (set_job) less the windows' steps since; else total_steps (or
        ASSUMED_TOTAL_STEPS) less the windows' steps since it was given."""
        told = self._steps_left
        if told is None:
            told = self.total_steps if self.total_steps is not None else ASSUMED_TOTAL_STEPS
        return max(0.0, told - self._steps_since)

    @property
    def _known_steps_left(self) -> float | None:
        """steps_left when the job's length is known (told, or total_steps given); None when only assumed."""
        return None if self._steps_left is None and self.total_steps is None else self.steps_left

    @property
    def best_hz(self) -> int:
        """The chosen level once converged (the pick, which confirming may move); before that, the best measured so
        far (the start when nothing is)."""
        if self._final is not None:
            return self.levels_hz[self._final]
        best = self.estimates.incumbent(self.estimates.log_energy())
        return self.levels_hz[self.estimates.start if best is None else best]

    @property
    def probes(self) -> int:
        return self._probes

    def state(self) -> dict:
        """What the daemon's ``status`` shows and its log records after each probe (JSON-ready)."""
        est = self.estimates
        fit = est.seconds()
        log_j = est.log_energy()
        best = est.incumbent(log_j)
        estimates = [{"freq_hz": hz, "windows": est.windows(i), "joules_per_step": est.mean_joules(i),
                      "smoothed_joules_per_step": math.exp(log_j[i]), "seconds_per_step": est.mean_seconds(i),
                      "feasible": est.feasible(i, fit)}
                     for i, hz in enumerate(self.levels_hz) if est.windows(i)]
        follow = self._follow
        return {
            "phase": "done" if self.converged else self._search.plan.phase,
            "confirming": self.confirming,
            "re_searches": self.re_searches,
            "follow_up": None if follow is None or self._follow_plan is None else {
                "pick_hz": self.levels_hz[follow.pick],
                "contenders_hz": [self.levels_hz[i] for i in follow.contenders],
                "windows_away": follow.windows_away, "steps_left": round(self.steps_left),
                "reason": self._follow_plan.reason},
            "reason": self._search.plan.reason,
            "stage": self._stage,
            "searching_hz": [self.levels_hz[self._search.span[0]], self.levels_hz[self._search.span[-1]]],
            "probes": self._probes,
            "search_probes": self._probes - self._probe_base,  # what max_probes caps: this search's windows
            "max_probes": self.max_probes,
            "start_hz": self.start_hz,
            "best_hz": self.best_hz,
            "next_hz": self.next_level_hz(),
            "converged": self.converged,
            "max_slowdown": self.max_slowdown,
            "fastest_seconds_per_step": None if fit is None else fit[-1],
            "total_steps": self.total_steps,
            "steps_left": None if (left := self._known_steps_left) is None else round(left),  # None: length unknown
            "explore_budget_j": None if best is None else est.budget_j(log_j, best),
            "explore_spent_j": self.explore_spent_j,
            "drift_rel": est.drift.sd_rel,
            "estimates": estimates,
        }

    # --- the levels searched ---------------------------------------------------------------------------------------

    def _new_search(self, span: list[int], start: int) -> Search:
        """A search of ``span`` (contiguous indices of the table) from ``start``: of all of it when it has at most
        GRID_LEVELS levels, else of a grid of it (evenly spaced by position, aligned on the start, with both ends).
        With max_slowdown the top level, the reference, is always one of the levels searched."""
        n = len(span)
        levels = list(span)
        if n > GRID_LEVELS:
            stride = math.ceil((n - 1) / (GRID_LEVELS - 1))
            at = span.index(start)
            levels = [span[k] for k in sorted({*range(at % stride, n, stride), 0, n - 1})]
        top = len(self.levels_hz) - 1
        if self.max_slowdown is not None and top not in levels:
            levels.append(top)
        return Search(self.settings, self.estimates.subset(levels, start), levels, span,
                      self._probes - self._probe_base, self._known_steps_left)

    def _settle(self) -> None:
        """When a search has chosen, search the levels around its choice if they can matter, else converge (and,
        with follow_up, begin following the pick)."""
        while self._final is None and self._search.chosen is not None:
            pick = self._search.chosen
            span = self._between(pick)
            if span is None:
                self._final = pick
                if self.follow_up:
                    self._follow = FollowUp(self.estimates, pick, self.z_confirm, self.drift_z,
                                            self.max_follow_windows)
                    self._plan_follow()
            else:
                self._stage += 1
                self._search = self._new_search(span, pick)

    def _plan_follow(self) -> None:
        assert self._follow is not None, "a follow-up plan is of a pick being followed"
        self._follow_plan = self._follow.plan(self.steps_left, self.probe_steps)

    def _search_again(self, i: int, joules: float, seconds: float, noise: float) -> None:
        """The curve moved under the pick (level i): a new search from it over the steps left, its exploration
        budget afresh, the windows before forgotten but this one (the pick's first of the new curve)."""
        self.re_searches += 1
        left = max(1, round(self.steps_left))
        self.settings.total_steps = left
        self._steps_left, self._steps_since = left, 0.0
        self.estimates = Estimates(self.levels_hz, i, self.settings)
        self.estimates.add(i, joules, seconds, noise, charge=False, at_step=self._at_step)
        self._final, self._follow, self._follow_plan = None, None, None
        self._probe_base = self._probes - 1
        self._stage = 1
        self._search = self._new_search(list(range(len(self.levels_hz))), i)
        self._settle()

    def _between(self, pick: int) -> list[int] | None:
        """The levels between a grid's pick and its grid neighbours, when a search of them can matter: some are
        unmeasured, a window is left under the safety cap, and a neighbour is unmeasured or more than REFINE_NOISE x
        noise_rel above the pick. None otherwise (and when the search was of every level of its span)."""
        span = self._search.span
        grid = [i for i in self._search.levels if span[0] <= i <= span[-1]]
        if len(grid) == len(span) or self._probes - self._probe_base >= self.max_probes:
            return None
        lo = max((i for i in grid if i < pick), default=pick)
        hi = min((i for i in grid if i > pick), default=pick)
        if all(self.estimates.windows(i) for i in range(lo, hi + 1)):
            return None
        log_j = self.estimates.log_energy()
        if all(i in log_j and log_j[i] - log_j[pick] <= REFINE_NOISE * self.noise_rel for i in (lo, hi) if i != pick):
            return None
        return list(range(lo, hi + 1))


def _check_levels(levels_hz: Iterable[int]) -> tuple[int, ...]:
    levels = tuple(levels_hz)
    if not levels:
        raise TuningError("levels_hz is empty")
    for hz in levels:
        if not isinstance(hz, numbers.Integral) or isinstance(hz, bool) or hz <= 0:
            raise TuningError(f"levels_hz must be positive integers (Hz), got {hz!r}")
    levels = tuple(int(hz) for hz in levels)
    if any(a >= b for a, b in zip(levels, levels[1:], strict=False)):
        raise TuningError(f"levels_hz must be strictly ascending, got {list(levels)}")
    return levels
