"""The online tuner's search over one set of levels: the whole table when it is small, else a grid of it, then the
levels around the grid's pick (governor.policy.tuner decides which). Positions here index ``levels_hz``, the levels
searched; the windows behind them are the tuner's own (shared ``_Estimate`` objects), so a level measured in one
search is known to the next, and the budget counts every window of the job.

1. Measure the start (with ``max_slowdown``, the top level once too, the reference; a start too slow restarts at
   the lowest feasible level).
2. Descend: while a side of the incumbent has nothing measured, measure that side with doubling strides (the first
   from an end of the table a quarter of the way across), never more than half the way to the end of the table.
3. Refine: bisect the gap between the incumbent and its nearest measured level on each side.
4. Past the rise: walk on outward until the levels climb like a U's wall (``WALL_Z``), then look once as far again
   past it; a valley found there is walked like the incumbent.
5. Confirm the incumbent, its closest contender and the start while it is within noise, until they differ clearly
   or a wrong choice between them could cost at most CONFIRM_TOL_NOISE x ``noise_rel``.
6. Stop when nothing is left to do, the next window is not affordable (``explore_budget_frac`` x ``total_steps``
   x E_incumbent; a window costs what it spends above the incumbent of its moment) or the job ends within it (its
   length known), and pick the incumbent; the start is replaced only by a level lower by START_MARGIN_Z standard
   deviations.

With ``max_slowdown`` a level is feasible by its own windows (FEASIBLE_Z), never by the step-time fit, which only
says where to explore. The rules, the reasons for each and the guarantees: docs/tuner.md, "Algorithm".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

from governor.policy.estimates import Estimates, TunerSettings
from governor.units import mhz

# Contenders confirmed besides the incumbent (OnlineTuner's confirm_contenders): the closest one in noise units.
# Confirming every level within noise of a flat bottom costs windows and buys nothing: such levels are equal to within
# the noise, whichever is picked. Windows caught in a drifting job's excursions argue for two (docs/tuner.md, "What
# cannot be met, and why").
DEFAULT_CONFIRM_CONTENDERS = 1
# A run of rising levels is a wall once its outermost is this many z_confirm above the incumbent (one s.d. at the
# default): lower than "clearly", because the look past the wall, not this test, is what tells a hump from a wall.
WALL_Z = 0.5
# How far below the start (in s.d. of the difference) a level must read to replace it at the end: half an s.d. halved
# the runs that settle on a level worse than a mid-table start on the Jetson curves, for +0.07% of mean regret.
START_MARGIN_Z = 0.5
# The part of the budget left that one look past a wall may spend: it is a speculative window, often at a steep and
# costly level, and must not take what confirming the bottom needs.
FAR_SHARE = 0.25
# Two levels within noise of each other are told apart (step 5) once both have confirm_windows windows and what
# choosing the lower could cost, z_confirm standard deviations of their difference minus that difference, is at most
# CONFIRM_TOL_NOISE x noise_rel (3.6% at 3% noise): two windows each for levels 2.4% apart, five or six for a tie.
# In noise units, so that it holds for any curve and any noise; MAX_CONFIRM_WINDOWS caps a tie.
CONFIRM_TOL_NOISE = 1.2
MAX_CONFIRM_WINDOWS = 6
# A walk that leaves an end of the range has no other side to size its first stride by: it goes this fraction of the
# way across (rounded up). An energy curve's minimum lies inside the table, where the levels' energies are close; the
# ends are its steep walls, where each level costs most. One level at a time there costs a window at each of them and
# gives comparisons of neighbours a few percent apart, which need long windows; a quarter of the way gives one whose
# difference is decided early (WindowRule.decide_z), and refining walks back if the minimum is at the end after all.
END_STRIDE_FRAC = 0.25
# The phases whose windows the search only ranks against the incumbent: levels away from it, found on the way to the
# curve's bottom. Such a window reading above the incumbent may close on a looser test (WindowRule.explore_z): the
# levels that can matter are measured again by refine and confirm, which (with the start) keep the strict one.
EXPLORING_PHASES = frozenset({"descend", "beyond", "far"})


@dataclass(frozen=True)
class _Plan:
    phase: str  # start | fastest | anchor | descend | refine | beyond | far | confirm | done
    index: int | None  # level index to measure next; None when done
    reason: str
    free: bool = False  # measured whatever the budget says (the start, the reference for max_slowdown)
    share: float = 1.0  # the part of the budget left that this one window may spend

    @property
    def exploring(self) -> bool:
        return self.phase in EXPLORING_PHASES


class Stage(Enum):
    """The stages of a search, in the order they are asked for a window (``Search._candidates``). The first four are
    exclusive: while one has a window to measure, nothing else can be judged. The others offer theirs, most useful
    first, and the first affordable one is taken; DONE, last, ends the search."""

    START = "measure the start level"
    FASTEST = "with max_slowdown, measure the top level: the reference for the slowdown"
    ANCHOR = "a start slower than max_slowdown allows restarts at the lowest feasible level"
    NO_FEASIBLE = "no feasible level measured: end"
    LONE_DIP = "an incumbent clearly below both its measured neighbours on one window is measured again"
    DESCEND_REFINE = "descend towards the incumbent's unmeasured sides, then bisect the gaps next to it"
    PAST_THE_RISE = "walk on outward until the levels climb like a wall, then look once past the wall"
    VALLEYS = "a second dip not clearly worse than the incumbent is walked like it"
    SLOWDOWN_LIMIT = "a cheaper level within noise of the slowdown limit is measured again, with the top"
    CONTENDERS = "the closest contender and the start, while within noise of the incumbent, are measured again"
    DONE = "every side closed and every contender told apart"

    @property
    def exclusive(self) -> bool:
        return self in (Stage.START, Stage.FASTEST, Stage.ANCHOR, Stage.NO_FEASIBLE)


class _Now:
    """What the stages of one re-plan read: the estimates (``log_j``, log joules per step by position), the
    incumbent, the top position, and, computed when first asked, the step-time fit, the lowest feasible level
    ``lo`` and the lowest level worth exploring ``lowest``."""

    def __init__(self, est: Estimates, settings: TunerSettings, log_j: dict[int, float], best: int | None):
        self._est = est
        self._settings = settings
        self.log_j = log_j
        self.best = best
        self.top = len(est.levels_hz) - 1

    @property
    def incumbent(self) -> int:
        """The incumbent, for the stages after NO_FEASIBLE (which ends the search when there is none)."""
        assert self.best is not None, "asked for the incumbent before Stage.NO_FEASIBLE"
        return self.best

    @cached_property
    def fit(self) -> list[float] | None:
        return self._est.seconds()

    @cached_property
    def lo(self) -> int:
        return self._est.lowest_feasible(self.fit)

    @cached_property
    def lowest(self) -> int:
        """The lowest level worth measuring under max_slowdown. Below the lowest feasible level ``lo``: levels
        measured but feasible within noise (they may be re-measured), and then one unmeasured level if the fit says it
        may be feasible, or if the level above it is measured feasible: a fit of measured step times does not know
        the levels below them (real step times bend, even rise with the clock), so the walk down ends only at a
        measured level that is too slow."""
        lowest = self.lo
        if self._settings.max_slowdown is None:
            return lowest
        fit, slack = self.fit, self._settings.noise_rel
        while lowest > 0:
            below = lowest - 1
            if self._est.windows(below):
                if not self._est.feasible(below, fit, slack=slack):
                    break
                lowest = below
                continue
            if self._est.feasible(below, fit, slack=slack) or fit is None or (
                    self._est.windows(lowest) and self._est.feasible(lowest, fit, slack=slack)):
                lowest = below
            break
        return lowest


class Search:
    """The search over ``levels``, indices into the tuner's table, from ``est.start``: the next level to measure
    (``plan``), re-planned after every window (``replan``), and the position chosen once done (``choice``).
    ``est`` is the view of ``levels`` (``Estimates.subset``), positions here index it; ``span`` is the
    contiguous range of the table the search stands for: ``levels`` itself, or the range it is a grid of. ``probes``
    is how many windows the job has had (every search's): the safety cap ``settings.max_probes`` counts them all."""

    def __init__(self, settings: TunerSettings, estimates: Estimates, levels: list[int], span: list[int],
                 probes: int, steps_left: float | None = None):
        self.settings = settings
        self.est = estimates
        self.span = tuple(span)
        self.levels = tuple(levels)
        self._far_looks: set[int] = set()  # positions measured as a look past a wall: each side gets one
        self.choice: int | None = None
        self.stage = Stage.START  # the stage of the plan taken last; once chosen, DONE or NO_FEASIBLE
        self._stages: dict[Stage, Callable[[_Now], Iterator[_Plan]]] = {
            Stage.START: self._measure_start, Stage.FASTEST: self._measure_fastest, Stage.ANCHOR: self._anchor,
            Stage.NO_FEASIBLE: self._no_feasible, Stage.LONE_DIP: self._lone_dip,
            Stage.DESCEND_REFINE: self._walk_incumbent, Stage.PAST_THE_RISE: self._past_the_rise,
            Stage.VALLEYS: self._valleys, Stage.SLOWDOWN_LIMIT: self._slowdown_limit,
            Stage.CONTENDERS: self._contenders, Stage.DONE: self._done}
        self.plan = self._replan(probes, steps_left)

    def replan(self, probes: int, steps_left: float | None = None) -> None:
        """After a window (or a change of the job's length): plan the next one, or choose. ``steps_left``: the steps
        the job has left (None: unknown); a job that ends within the next window has no steps after it to run what
        that window would tell, and the search chooses instead (a free window, what the job runs anyway, is taken)."""
        if self.choice is None:
            self.plan = self._replan(probes, steps_left)

    @property
    def chosen(self) -> int | None:
        """The chosen level as an index of the tuner's table; None while searching."""
        return None if self.choice is None else self.levels[self.choice]

    def _replan(self, probes: int, steps_left: float | None = None) -> _Plan:
        log_j = self.est.log_energy()
        best = self.est.incumbent(log_j)
        skipped: tuple[str, int] | None = None  # the first plan not affordable: its phase and level
        ending = steps_left is not None and steps_left <= self.settings.probe_steps
        if probes < self.settings.max_probes:
            for stage, plan in self._candidates(log_j, best):
                if plan.index is None:
                    self.stage, reason = stage, plan.reason
                    break
                if ending and not plan.free:
                    self.stage = Stage.DONE
                    reason = (f"the job has {steps_left:.0f} step(s) left, no more than a window: nothing after "
                              f"a {plan.phase} window at {self._mhz(plan.index)} would use what it measures")
                    break
                # A window that is not free is priced against the incumbent: only stages after NO_FEASIBLE plan one.
                if plan.free or (best is not None and self.est.affordable(plan.index, log_j, best, plan.share)):
                    self.stage = stage
                    if plan.phase == "far":
                        self._far_looks.add(plan.index)
                    return plan
                skipped = skipped or (plan.phase, plan.index)
            else:
                self.stage, reason = Stage.DONE, "search complete"
            if skipped is not None:
                reason = (f"{reason}; not affordable within the exploration budget: {skipped[0]} "
                          f"{self.est.levels_hz[skipped[1]]} Hz")
        else:
            self.stage, reason = Stage.DONE, f"safety cap of {self.settings.max_probes} windows reached"
        start = self.est.start
        if best is None:  # only infeasible levels measured and no window left: keep the start
            best, reason = start, reason + "; nothing feasible measured: keeping the start"
        elif (best != start and start in log_j and self.est.feasible(start, self.est.seconds())
              and self.est.z(start, best, log_j) < START_MARGIN_Z):
            # The least of many noisy levels reads low: a level replaces the start, what the job runs untuned, only
            # when it is lower by more than START_MARGIN_Z standard deviations of the difference.
            reason += f"; {self._mhz(best)} is not clearly lower than the start: keeping the start"
            best = start
        self.choice = best
        return _Plan("done", None, reason)

    def _candidates(self, log_j: dict[int, float], best: int | None) -> Iterator[tuple[Stage, _Plan]]:
        """What to measure next, most useful first, stage by stage in ``Stage`` order; the first affordable one is
        taken (a plan with index None ends the search). Re-planned from all windows after each one, so any
        measurement can move the incumbent. An exclusive stage that has a plan is the only one asked."""
        now = _Now(self.est, self.settings, log_j, best)
        for stage in Stage:
            plans = self._stages[stage](now)
            if stage.exclusive:
                first = next(plans, None)
                if first is not None:
                    yield stage, first
                    return
            else:
                yield from ((stage, plan) for plan in plans)

    # --- the stages, in Stage order --------------------------------------------------------------------------------

    def _measure_start(self, now: _Now) -> Iterator[_Plan]:
        if not self.est.windows(self.est.start):
            yield _Plan("start", self.est.start, "measure the start level", free=True)

    def _measure_fastest(self, now: _Now) -> Iterator[_Plan]:
        if self.settings.max_slowdown is not None and not self.est.windows(now.top):
            yield _Plan("fastest", now.top, "measure the fastest level: the reference for max_slowdown", free=True)

    def _anchor(self, now: _Now) -> Iterator[_Plan]:
        slow = not self.est.feasible(self.est.start, now.fit, slack=self.settings.noise_rel)
        if slow and not self.est.windows(now.lo):
            yield _Plan("anchor", now.lo, "the start is slower than max_slowdown allows: restart at the lowest "
                                          "feasible level", free=True)

    def _no_feasible(self, now: _Now) -> Iterator[_Plan]:
        if now.best is None:  # only possible when the table has a single level
            yield _Plan("done", None, "no feasible level measured")

    def _lone_dip(self, now: _Now) -> Iterator[_Plan]:
        # One window clearly below the measured levels on both sides is as likely an outlier as a sharp dip, and
        # every wall and look past it would be judged against it: measure it again before walking from it.
        best = now.incumbent
        if self.est.windows(best) != 1:
            return
        near = [self._side(best, d, now.lowest, now.top) for d in (-1, 1)]
        if all(side and self.est.z(side[0], best, now.log_j) >= self.settings.z_confirm for side in near):
            yield _Plan("confirm", best, f"{self._mhz(best)} reads clearly below its measured neighbours on one "
                                         "window: measure it again before walking from it")

    def _walk_incumbent(self, now: _Now) -> Iterator[_Plan]:
        yield from self._local(now.incumbent, now.lowest, now.top, now.log_j)

    def _past_the_rise(self, now: _Now) -> Iterator[_Plan]:
        # A rise next to the incumbent may be a bump with another dip behind it (real curves have them). The walk
        # goes on outward while the levels past the incumbent do not yet climb like a U's wall (see _wall); at a wall
        # it looks once a stride further, as far past the wall as the wall is wide, unless a level past it is
        # measured already: a hump looks like a wall from inside, and only that look tells them apart. What it finds
        # lower than the wall is a valley (Stage.VALLEYS).
        best, lowest, top, log_j = now.incumbent, now.lowest, now.top, now.log_j
        for d in (-1, 1):
            nxt = self._next_unmeasured(best, d, lowest, top)
            if nxt is None:
                continue
            if not self._wall(best, d, nxt, log_j):
                yield _Plan("beyond", nxt, f"{self._mhz(best)} rises towards {self._mhz(nxt - d)}, not yet like a "
                                           f"wall: look past it at {self._mhz(nxt)}")
                continue
            if any((k - nxt) * d > 0 or k in self._far_looks for k in self._side(best, d, lowest, top)):
                continue  # past the wall is known already, or was looked at once (it may have become the wall)
            outer = nxt - d
            room = (outer - lowest) if d < 0 else (top - outer)
            far = outer + d * max(1, min(abs(outer - best), (room + 1) // 2))
            yield _Plan("far", far, f"energy climbs from {self._mhz(best)} to {self._mhz(outer)}: look as far "
                                    f"again, at {self._mhz(far)}, for a dip behind a hump", share=FAR_SHARE)

    def _valleys(self, now: _Now) -> Iterator[_Plan]:
        # A measured level lower than its measured neighbours and not clearly worse than the incumbent (a second dip
        # found past a hump) is walked like the incumbent, so its own minimum is found.
        best, lowest, top, log_j = now.incumbent, now.lowest, now.top, now.log_j
        valleys = sorted((log_j[v], v) for v in log_j
                         if v != best and lowest <= v <= top and self.est.feasible(v, now.fit)
                         and self.est.z(v, best, log_j) < self.settings.z_confirm
                         and all(log_j[s[0]] > log_j[v] for s in (self._side(v, -1, lowest, top),
                                                                   self._side(v, 1, lowest, top)) if s))
        for _, v in valleys:
            yield from self._local(v, lowest, top, log_j)

    def _slowdown_limit(self, now: _Now) -> Iterator[_Plan]:
        # A cheaper level that is too slow only within noise: its time and the top's are measured again (the
        # fewer-measured first) until it is feasible or clearly not, or both have MAX_CONFIRM_WINDOWS.
        if self.settings.max_slowdown is None:
            return
        best, top, log_j, fit = now.incumbent, now.top, now.log_j, now.fit
        for v in sorted((v for v in log_j if log_j[v] < log_j[best] and not self.est.feasible(v, fit)
                         and self.est.feasible(v, fit, slack=self.settings.noise_rel)), key=log_j.__getitem__):
            if min(self.est.windows(v), self.est.windows(top)) >= MAX_CONFIRM_WINDOWS:
                continue
            again = v if self.est.windows(v) <= self.est.windows(top) else top
            yield _Plan("confirm", again, f"{self._mhz(v)} is cheaper and within noise of the slowdown limit: "
                                          "measure again")

    def _contenders(self, now: _Now) -> Iterator[_Plan]:
        # Levels within noise of the incumbent are measured again, the fewer-measured of each pair first, until they
        # differ clearly or are told apart (_told_apart).
        best, log_j, start = now.incumbent, now.log_j, self.est.start
        contenders = sorted((self.est.z(i, best, log_j), i) for i in log_j
                            if i != best and now.lowest <= i <= now.top and self.est.feasible(i, now.fit))
        # The start is always among them while it is within noise: it is what the job would run without tuning,
        # and a level that beats it on few windows may only be lucky (the least of many noisy levels reads low).
        confirm = contenders[:self.settings.confirm_contenders]
        if start in log_j and start != best and self.est.feasible(start, now.fit):
            confirm.append((self.est.z(start, best, log_j), start))
        for z, i in confirm:
            if z >= self.settings.z_confirm or self._told_apart(i, best, log_j):
                continue
            again = i if self.est.windows(i) < self.est.windows(best) else best
            yield _Plan("confirm", again, f"{self._mhz(i)} is within noise of {self._mhz(best)}: measure again")

    def _done(self, now: _Now) -> Iterator[_Plan]:
        yield _Plan("done", None, "every side closed and every contender told apart")

    # --- what the stages share -------------------------------------------------------------------------------------

    def _told_apart(self, i: int, best: int, log_j: dict[int, float]) -> bool:
        """Whether two levels within noise need no more windows: both have confirm_windows, and choosing the lower
        could cost at most CONFIRM_TOL_NOISE x noise_rel at z_confirm standard deviations (a fixed window count
        leaves a tie at 3 windows each 2.4% apart in s.d., and one such tie in a few hundred picks a level 6-9% off)."""
        n = min(self.est.windows(i), self.est.windows(best))
        if n < self.settings.confirm_windows:
            return False
        sd = self.est.sd_diff(i, best)
        return (n >= MAX_CONFIRM_WINDOWS
                or self.settings.z_confirm * sd - abs(log_j[i] - log_j[best])
                <= CONFIRM_TOL_NOISE * self.settings.noise_rel)

    def _local(self, best: int, lowest: int, top: int, log_j: dict[int, float]) -> Iterator[_Plan]:
        """Descend, then refine, around a valley's bottom ``best`` until both its neighbours are measured."""
        sides = {d: self._side(best, d, lowest, top) for d in (-1, 1)}
        # 1. Descend: a side with nothing measured on it. The stride is twice the distance we came from the other
        # side (energy fell over it), so a start half a table away costs a few windows, not one per level; from an
        # end of the range, END_STRIDE_FRAC of the way across; never more than half the way to the end of the table,
        # so an end (often the costliest level) is only measured once the walk is next to it.
        order = sorted((-1, 1), key=lambda d: (not sides[-d], d))
        for d in order:
            if sides[d] or not lowest <= best + d <= top:
                continue
            other = sides[-d]
            room = (best - lowest) if d < 0 else (top - best)
            if other:
                stride = 2 * abs(other[0] - best)
            elif best == (top if d < 0 else lowest):  # leaving an end of the range
                stride = math.ceil(END_STRIDE_FRAC * room)
            else:
                stride = 1
            stride = max(1, min(stride, (room + 1) // 2))
            yield _Plan("descend", best + d * stride,
                        f"{self._mhz(best)}: energy falls towards it, measure {stride} level(s) "
                        f"{'below' if d < 0 else 'above'}")
        # 2. Refine: a gap between the bottom and its nearest measured level on a side; bisect the wider first.
        gaps = sorted(((abs(sides[d][0] - best), d) for d in (-1, 1) if sides[d] and abs(sides[d][0] - best) > 1),
                      reverse=True)
        for gap, d in gaps:
            yield _Plan("refine", best + d * (gap // 2),
                        f"the minimum lies between {self._mhz(sides[d][0])} and {self._mhz(best)}: bisect")

    def _side(self, best: int, d: int, lowest: int, top: int) -> list[int]:
        """Measured levels on side d of the incumbent, within the explorable range, nearest first."""
        stop = lowest - 1 if d < 0 else top + 1
        return [i for i in range(best + d, stop, d) if self.est.windows(i)]

    def _next_unmeasured(self, best: int, d: int, lowest: int, top: int) -> int | None:
        stop = lowest - 1 if d < 0 else top + 1
        return next((i for i in range(best + d, stop, d) if not self.est.windows(i)), None)

    def _wall(self, best: int, d: int, nxt: int, log_j: dict[int, float]) -> bool:
        """Whether the measured run from the incumbent to just before ``nxt`` climbs like a U's wall: two levels or
        more, the outermost the highest of them and at least WALL_Z x z_confirm standard deviations above the incumbent.
        A run whose outermost level is lower than one inside it is coming down a bump: the walk goes on."""
        run = list(range(best + d, nxt, d))
        if len(run) < 2:
            return False
        outer = run[-1]
        return (log_j[outer] >= max(log_j[i] for i in run)
                and self.est.z(outer, best, log_j) >= WALL_Z * self.settings.z_confirm)

    def _mhz(self, i: int) -> str:
        return mhz(self.est.levels_hz[i])
