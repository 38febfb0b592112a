"""FROZEN COPY of the tuner (governor/policy/tuner.py) before the energy-budgeted search (branch tuner at ec37816), so that
benchmarks/bench_tuner.py can report that tuner beside the new one on the same curves and seeds. Do not edit; the
governor does not import it. The original docstring follows.

Online energy tuner: measure energy per training step at a few GPU levels while the job runs, and pin the minimum.

Why online: the MLG tree picks the energy-optimal level for only 62% of workloads (the paper), and a level or two off
the bottom of the U-shaped energy curve costs several percent. Measuring the job itself removes the model's error; the
cost is a few windows at levels that are not the optimum, a fraction of a percent of a 2,000-step job.

Algorithm: noise-aware descent from the start level, then confirm; estimates smoothed by the U's local shape.
A "window" is one measurement of mean energy and time per step at one level (``observe``); the budget is
``max_probes`` windows (6: with 1 warm-up and 4 measured steps each, at most 30 profiled steps).

1. Measure the start level: MLG's pick, usually at or next to the optimum, so the search starts near the bottom.
2. With ``max_slowdown`` set, measure the top level once: it is the fastest level, and its step time is the reference
   the slowdown is measured against. We measure it rather than extrapolate to it from levels near the bottom of the
   U: extrapolating ``a + b/f`` from two windows to 1.3 GHz multiplies their noise about 2.4 times, and host- or
   launch-bound steps flatten out near the top anyway; one window at the top costs a few steps at higher power.
   Step time is then estimated for every level by a weighted least-squares quadratic in 1/f through all measured
   levels (time is smooth and convex in 1/f), which pools the windows so that no single one decides the slowdown.
   A level is feasible when its estimate is within ``(1 + max_slowdown)`` of the top's; the feasible levels are all
   those from a lowest one up. If the start is infeasible the search restarts at that lowest feasible level: the
   unconstrained optimum is then below it and, the curve being U-shaped, the constrained one is at or just above it.
   The level just below the boundary is explored, and re-measured while it is cheaper than the incumbent, as long as
   it is within noise of the limit: a level of energy is at stake there (the U is steep below the usual boundary).
3. Descent: the incumbent is the measured feasible level with the least estimated energy. While one of its two
   neighbours is unmeasured, measure it (the lower first). The U shape is what makes this cheap: a neighbour that is
   worse means the minimum is not beyond it, so the walk goes one way, stops at the first rise, and never sweeps the
   table.
4. Confirm: with both neighbours measured, compare each with the incumbent by a z score from ``noise_rel`` (relative
   standard deviation of one window) and the windows behind each estimate. A neighbour within ``z_confirm`` is a
   close contender: first measure the level beyond it if that is unmeasured (the minimum may be there), otherwise
   measure again whichever of the pair has fewer windows. Any measurement can move the incumbent, and the descent
   resumes from the new one: "step, then confirm", so that one noisy window neither stops the walk early nor sends
   it the wrong way.
5. Stop when both neighbours are clearly worse or the budget is spent, and pick the incumbent.

Estimates: log energy per step (the noise is relative, so it is even in log units). Near its minimum a smooth U is a
parabola, so once four or more levels lie within SMOOTH_RADIUS of the raw incumbent, a weighted least-squares quadratic
through them replaces their means: every window then informs every nearby level, instead of one noisy window deciding
a comparison alone. On the simulated Orin this cuts the tuner's mean error 2-3 times at the same budget (docs/tuner.md).

Never worse than the start: the start is always measured, and a level replaces it only when its estimate is lower.
Smoothing moves an estimate only towards a convex fit of its neighbours, so the chosen level's own windows never read
worse than the start's by more than noise (tests/pure/test_tuning.py checks this over random curves and noise).

Why not golden-section or ternary search over level indices: with 11 levels they need about as many windows as the
descent before they have bracketed anything, their first probes are at the ends of the table (the costliest levels to
visit), and they ignore that the start is usually within a level or two of the optimum; comparing two single windows
a few percent apart is also exactly what noise gets wrong. Why not fit a global model of the curve and jump to its
minimum: its shape depends on the voltage table and on how utilization moves with the clock, so a global fit is
biased; a local quadratic through measured levels only, used to estimate them and never to extrapolate, is far less
so (a U is a parabola near its bottom whatever sets its ends).

Nothing here touches hardware or clocks: the daemon (and the benchmark, and ``ftgov evaluate``) feed it measurements.
``TuningSession`` turns a job's progress reports and a cumulative rail-energy counter into those measurements, with
warm-up steps discarded after each change of level.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Optional

from governor.policy.estimates import _Estimate, _weighted_quadratic
from governor.policy.tuner import _check_levels
# The estimates and the measurement windows are the same code as today's (only the search differs): shared, not
# copied. Drive this tuner with governor.policy.windows.TuningSession; set_job below takes what that session tells it.
from governor.policy.windows import TuningError, _count, _positive

# A probe is DEFAULT_WARMUP_STEPS discarded steps after a change of level, then DEFAULT_WINDOW_STEPS measured steps:
# 5 steps in all, so DEFAULT_MAX_PROBES probes profile at most 30 steps (its budget). One warm-up step is
# enough to leave the step during which the clock changed out of the window (a devfreq write takes effect within
# milliseconds; unverified on a real Orin), and four measured steps average out most of the step-to-step noise.
DEFAULT_WARMUP_STEPS = 1
DEFAULT_WINDOW_STEPS = 4
DEFAULT_MAX_PROBES = 6
DEFAULT_NOISE_REL = 0.03  # relative s.d. of one window's joules per step: "a few percent"
DEFAULT_Z_CONFIRM = 2.0
# Levels either side of the incumbent that the quadratic smoothing uses: wide enough to pool the 4-5 levels a search
# measures, narrow enough that the U's asymmetric far ends do not bend the fit.
SMOOTH_RADIUS = 3


@dataclass(frozen=True)
class _Plan:
    phase: str  # start | fastest | anchor | descend | expand | confirm | done
    index: Optional[int]  # level index to measure next; None when done
    reason: str


class OnlineTuner:
    """Finds the level with the least energy per step from one measurement window at a time.

    Call ``next_level_hz()`` for the level to run the next window at, run it, then ``observe(level_hz, joules_per_step,
    seconds_per_step)``. ``observe`` accepts any level of the table (if the daemon could not pin the one asked for, it
    reports the one that ran); the next level is re-planned from every measurement so far. Once ``converged``, the
    decision is frozen: ``next_level_hz()`` and ``best_hz`` return the chosen level, and later observations are kept in
    ``state()`` but change nothing. Re-tuning (new job features) means a new tuner.

    ``noise_rel`` is the relative standard deviation of one window's energy per step; ``max_probes`` bounds the windows
    (with a report every step and no eval in between, profiling costs at most ``max_probes`` x (warm-up + window)
    steps); ``z_confirm`` is how many standard deviations make a difference "clear".
    """

    def __init__(self, levels_hz: Iterable[int], start_hz: int, max_slowdown: Optional[float] = None, *,
                 noise_rel: float = DEFAULT_NOISE_REL, max_probes: int = DEFAULT_MAX_PROBES,
                 z_confirm: float = DEFAULT_Z_CONFIRM):
        self.levels_hz = _check_levels(levels_hz)
        if isinstance(start_hz, bool) or start_hz not in self.levels_hz:
            raise TuningError(f"start_hz {start_hz!r} is not one of the levels {list(self.levels_hz)}")
        self.start_hz = int(start_hz)
        self.max_slowdown = None if max_slowdown is None else _positive(max_slowdown, "max_slowdown")
        self.noise_rel = _positive(noise_rel, "noise_rel")
        self.max_probes = _count(max_probes, "max_probes", 1)
        self.z_confirm = _positive(z_confirm, "z_confirm")
        self._start = self.levels_hz.index(start_hz)
        self._est = [_Estimate() for _ in self.levels_hz]
        self._probes = 0
        self._final: Optional[int] = None
        self._plan = self._replan()

    # --- the interface -------------------------------------------------------------------------------------------

    def next_level_hz(self) -> int:
        """The level to measure next; the chosen level once converged."""
        return self.levels_hz[self._final if self._final is not None else self._plan.index]

    def observe(self, level_hz: int, joules_per_step: float, seconds_per_step: float) -> None:
        """Record one measurement window: mean energy (J) and duration (s) per step at level_hz."""
        if isinstance(level_hz, bool) or level_hz not in self.levels_hz:
            raise TuningError(f"level_hz {level_hz!r} is not one of the levels {list(self.levels_hz)}")
        joules = _positive(joules_per_step, "joules_per_step")
        seconds = _positive(seconds_per_step, "seconds_per_step")
        self._est[self.levels_hz.index(level_hz)].add(joules, seconds)
        self._probes += 1
        if self._final is None:
            self._plan = self._replan()

    @property
    def converged(self) -> bool:
        return self._final is not None

    @property
    def best_hz(self) -> int:
        """The chosen level once converged; before that, the best measured so far (the start when nothing is)."""
        if self._final is not None:
            return self.levels_hz[self._final]
        best = self._incumbent(self._log_energy())
        return self.levels_hz[self._start if best is None else best]

    @property
    def probes(self) -> int:
        return self._probes

    def set_job(self, total_steps: Optional[int] = None, probe_steps: Optional[int] = None) -> None:
        """What governor.policy.windows.TuningSession tells a tuner of the job; this one has no energy budget, so
        neither changes its search (added so that it runs under today's session)."""

    def state(self) -> dict:
        """What the daemon's ``status`` shows and its log records after each probe (JSON-ready)."""
        fit = self._seconds()
        log_j = self._log_energy()
        estimates = [{"freq_hz": hz, "windows": e.n, "joules_per_step": e.sum_j / e.n,
                      "smoothed_joules_per_step": math.exp(log_j[i]), "seconds_per_step": e.sum_s / e.n,
                      "feasible": self._feasible(i, fit)}
                     for i, (hz, e) in enumerate(zip(self.levels_hz, self._est)) if e.n]
        return {
            "phase": "done" if self.converged else self._plan.phase,
            "reason": self._plan.reason,
            "probes": self._probes,
            "max_probes": self.max_probes,
            "start_hz": self.start_hz,
            "best_hz": self.best_hz,
            "next_hz": self.next_level_hz(),
            "converged": self.converged,
            "max_slowdown": self.max_slowdown,
            "fastest_seconds_per_step": None if fit is None else fit[-1],
            "estimates": estimates,
        }

    # --- planning ------------------------------------------------------------------------------------------------

    def _replan(self) -> _Plan:
        plan = self._search()
        if plan.index is not None and self._probes < self.max_probes:
            return plan
        reason = plan.reason if plan.index is None else f"probe budget of {self.max_probes} windows spent"
        best = self._incumbent(self._log_energy())
        if best is None:  # only infeasible levels measured and the budget is gone: keep the start
            best, reason = self._start, reason + "; nothing feasible measured: keeping the start"
        self._final = best
        return _Plan("done", None, reason)

    def _search(self) -> _Plan:
        top = len(self.levels_hz) - 1
        if not self._est[self._start].n:
            return _Plan("start", self._start, "measure the start level")
        if self.max_slowdown is not None and not self._est[top].n:
            return _Plan("fastest", top, "measure the fastest level: the reference for max_slowdown")
        fit = self._seconds()
        lo = self._lowest_feasible(fit)
        if not self._feasible(self._start, fit) and not self._est[lo].n:
            return _Plan("anchor", lo, "the start is slower than max_slowdown allows: restart at the lowest feasible level")
        log_j = self._log_energy()
        best = self._incumbent(log_j)
        if best is None:  # no feasible level measured: only possible when the table has a single level
            return _Plan("done", None, "no feasible level measured")
        # A level just below the feasible ones may still be feasible, within the noise of the time fit: worth a look.
        lowest = lo - 1 if lo > 0 and self._feasible(lo - 1, fit, slack=self.noise_rel) else lo
        for nb in (best - 1, best + 1):
            if lowest <= nb <= top and not self._est[nb].n:
                return _Plan("descend", nb, f"incumbent {self.levels_hz[best]} Hz: measure its neighbour")
        below = best - 1
        if (self.max_slowdown is not None and below >= 0 and self._est[below].n
                and log_j[below] < log_j[best] and not self._feasible(below, fit)
                and self._feasible(below, fit, slack=self.noise_rel)):
            again = below if self._est[below].n <= self._est[top].n else top
            return _Plan("confirm", again, f"{self.levels_hz[below]} Hz is cheaper and within noise of the slowdown "
                                           "limit: measure again")
        weakest = self._least_certain_neighbour(best, lo, log_j)
        if weakest is None:
            return _Plan("done", None, "both neighbours of the incumbent are clearly worse")
        # A close contender: first look past it, since the minimum may lie there and a fourth level lets the
        # smoothing pool the windows; once that is known, measure the closer pair again.
        beyond = weakest + (weakest - best)
        if lowest <= beyond <= top and not self._est[beyond].n:
            return _Plan("expand", beyond, f"{self.levels_hz[weakest]} Hz is within noise of {self.levels_hz[best]} Hz: "
                                            "measure the level beyond it")
        again = weakest if self._est[weakest].n < self._est[best].n else best
        return _Plan("confirm", again,
                     f"{self.levels_hz[weakest]} Hz is within noise of {self.levels_hz[best]} Hz: measure again")

    def _incumbent(self, log_j: dict[int, float]) -> Optional[int]:
        """The measured feasible level with the least estimated energy per step."""
        fit = self._seconds()
        return min((i for i in log_j if self._feasible(i, fit)), key=log_j.get, default=None)

    def _least_certain_neighbour(self, best: int, lo: int, log_j: dict[int, float]) -> Optional[int]:
        """The neighbour of the incumbent whose difference from it is smallest in noise units, if below z_confirm."""
        weakest, weakest_z = None, self.z_confirm
        for nb in (best - 1, best + 1):
            if lo <= nb < len(self.levels_hz) and self._est[nb].n:
                z = self._z(nb, best, log_j)
                if z < weakest_z:
                    weakest, weakest_z = nb, z
        return weakest

    def _z(self, a: int, b: int, log_j: dict[int, float]) -> float:
        """(log E_a - log E_b) in standard deviations of that difference, from the windows behind each."""
        sd = self.noise_rel * math.sqrt(1.0 / self._est[a].n + 1.0 / self._est[b].n)
        return (log_j[a] - log_j[b]) / sd

    # --- estimates -----------------------------------------------------------------------------------------------

    def _raw_log_energy(self) -> dict[int, float]:
        """Mean log energy per step of each measured level (log: the noise is relative, so it is even there)."""
        return {i: e.sum_log_j / e.n for i, e in enumerate(self._est) if e.n}

    def _log_energy(self) -> dict[int, float]:
        """Log energy per step of each measured level, smoothed by a quadratic near the incumbent.

        Around its minimum a smooth U is a parabola, so a weighted least-squares quadratic through the levels within
        SMOOTH_RADIUS of the raw incumbent pools their windows: the noise of one window no longer decides alone.
        Needs four levels to smooth anything (three it interpolates); a fit that is not convex is noise: not used.
        """
        raw = self._raw_log_energy()
        centre = self._incumbent(raw)
        if centre is None:
            return raw
        near = [i for i in raw if abs(i - centre) <= SMOOTH_RADIUS]
        if len(near) < 4:
            return raw
        ghz = {i: (self.levels_hz[i] - self.levels_hz[centre]) / 1e9 for i in near}
        coef = _weighted_quadratic([(ghz[i], raw[i], self._est[i].n) for i in near])
        if coef is None or coef[2] <= 0:
            return raw
        c0, c1, c2 = coef
        return {**raw, **{i: c0 + c1 * ghz[i] + c2 * ghz[i] ** 2 for i in near}}

    # --- step time, for max_slowdown ------------------------------------------------------------------------------

    def _seconds(self) -> Optional[list[float]]:
        """Estimated step time of every level; None before two levels are measured.

        Time is a smooth, convex, falling function of 1/f: ``a + b/f`` for a compute-bound step, flattening near the
        top clock for a host- or launch-bound one, where a global ``a + b/f`` fit misplaces the feasibility boundary
        by a level. With three or more levels measured, a weighted least-squares quadratic in 1/f pools every window,
        so that neither the top's one window nor the boundary level's decides the slowdown alone; with two, the line
        through them. Below the slowest measured level this extrapolates, optimistically when the fit bends: that only
        decides what to explore, and an explored level enters the fit.
        """
        pts = [(1e9 / hz, e.sum_s / e.n, e.n) for hz, e in zip(self.levels_hz, self._est) if e.n]
        if len(pts) < 2:
            return None
        coef = _weighted_quadratic(pts) if len(pts) >= 3 else None
        if coef is None:
            (xa, ta, _), (xb, tb, _) = sorted(pts)[:2]
            coef = (ta - (tb - ta) / (xb - xa) * xa, (tb - ta) / (xb - xa), 0.0)
        return [coef[0] + coef[1] * (1e9 / hz) + coef[2] * (1e9 / hz) ** 2 for hz in self.levels_hz]

    def _feasible(self, i: int, seconds: Optional[list[float]], slack: float = 0.0) -> bool:
        """Whether level i is within max_slowdown of the fastest level (with some slack: worth exploring)."""
        if self.max_slowdown is None:
            return True
        top = len(self.levels_hz) - 1
        if seconds is None or not self._est[top].n:  # nothing known yet: only the start and the top are candidates
            return i in (top, self._start)
        return seconds[i] <= (1.0 + self.max_slowdown) * (1.0 + slack) * seconds[top]

    def _lowest_feasible(self, seconds: Optional[list[float]]) -> int:
        return next(i for i in range(len(self.levels_hz)) if self._feasible(i, seconds) or i == len(self.levels_hz) - 1)
