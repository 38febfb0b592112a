"""What the online tuner knows from its windows: each level's estimate, the z score of a difference, the energy
budget and what exploration has spent of it, and the step times that max_slowdown is judged by. ``OnlineTuner``
(governor.policy.tuner) holds one ``Estimates`` of its whole table and gives each ``Search`` a view of the levels it
searches (``subset``): the views share the windows and the budget spent, so a window counts in every search."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Job length assumed when the caller does not give one: a short fine-tuning run. Longer jobs would justify more
# exploration, so this errs on the side of exploring too little.
ASSUMED_TOTAL_STEPS = 2000
# A measured level may be chosen under max_slowdown only if its own step time over the top's, as measured, is within
# the limit by this many standard deviations of that ratio (from both levels' windows' own uncertainties).
FEASIBLE_Z = 1.0


@dataclass
class _Estimate:
    """Running sums of the windows measured at one level."""

    n: int = 0
    sum_j: float = 0.0
    sum_log_j: float = 0.0
    sum_log_j2: float = 0.0
    sum_s: float = 0.0
    sum_var: float = 0.0  # sum of the windows' variances (relative: of log joules per step)

    def add(self, joules: float, seconds: float, noise_rel: float) -> None:
        self.n += 1
        self.sum_j += joules
        self.sum_log_j += math.log(joules)
        self.sum_log_j2 += math.log(joules) ** 2
        self.sum_s += seconds
        self.sum_var += noise_rel * noise_rel

    @property
    def var_mean(self) -> float:
        """Variance of the mean log energy: each window's own, averaged over n windows."""
        return self.sum_var / (self.n * self.n)


@dataclass
class TunerSettings:
    """The tuner's settings that its estimates and searches read (``OnlineTuner`` documents each). One object, shared:
    ``OnlineTuner.set_job`` changes total_steps and probe_steps, and every reader sees the change."""

    max_slowdown: float | None
    noise_rel: float
    z_confirm: float
    explore_budget_frac: float
    total_steps: int | None
    probe_steps: int
    confirm_windows: int
    max_probes: int


@dataclass
class _Spent:
    """What the job's windows have cost the exploration so far, in joules: one for the job, whatever the search."""

    j: float = 0.0


@dataclass(eq=False)
class Estimates:
    """The windows of ``levels_hz`` (each level's ``_Estimate``) and what follows from them under ``settings``.
    Positions index ``levels_hz``; ``start`` is the start's position, a candidate before anything is known."""

    levels_hz: tuple[int, ...]
    start: int
    settings: TunerSettings
    _est: list[_Estimate] = field(default_factory=list)
    _spent: _Spent = field(default_factory=_Spent)

    def __post_init__(self) -> None:
        if not self._est:
            self._est = [_Estimate() for _ in self.levels_hz]

    def subset(self, positions: Sequence[int], start: int) -> Estimates:
        """A view of the levels at ``positions`` (``start`` one of them) sharing these windows and the budget spent."""
        return Estimates(tuple(self.levels_hz[i] for i in positions), list(positions).index(start), self.settings,
                         [self._est[i] for i in positions], self._spent)

    def add(self, i: int, joules: float, seconds: float, noise_rel: float, *, charge: bool) -> None:
        """Record a window measured at level i; with ``charge``, count its cost against the exploration budget."""
        if charge:
            self._spent.j += self._window_cost_j(i, joules)
        self._est[i].add(joules, seconds, noise_rel)

    def windows(self, i: int) -> int:
        """How many windows level i has."""
        return self._est[i].n

    def mean_joules(self, i: int) -> float:
        return self._est[i].sum_j / self._est[i].n

    def mean_seconds(self, i: int) -> float:
        return self._est[i].sum_s / self._est[i].n

    @property
    def explore_spent_j(self) -> float:
        """What the job's windows have cost the exploration (``_window_cost_j``), in every search."""
        return self._spent.j

    def incumbent(self, log_j: dict[int, float]) -> int | None:
        """The measured feasible level with the least estimated energy per step."""
        fit = self.seconds()
        return min((i for i in log_j if self.feasible(i, fit)), key=log_j.__getitem__, default=None)

    def z(self, a: int, b: int, log_j: dict[int, float]) -> float:
        """(log E_a - log E_b) in standard deviations of that difference, from the windows behind each (each with
        its own uncertainty; noise_rel for a window of unknown noise, and never less)."""
        return (log_j[a] - log_j[b]) / self.sd_diff(a, b)

    def var_mean(self, i: int) -> float:
        """The variance of level i's estimate (of its mean log joules per step)."""
        return self._est[i].var_mean

    def scatter_rel(self, i: int) -> float | None:
        """The sample s.d. of level i's windows (of their log joules per step); None under three windows."""
        e = self._est[i]
        if e.n < 3:
            return None
        return math.sqrt(max(0.0, e.sum_log_j2 - e.sum_log_j ** 2 / e.n) / (e.n - 1))

    def sd_diff(self, a: int, b: int) -> float:
        return math.sqrt(self._est[a].var_mean + self._est[b].var_mean)

    # --- the exploration budget ----------------------------------------------------------------------------------

    def budget_j(self, log_j: dict[int, float], best: int) -> float:
        steps = self.settings.total_steps if self.settings.total_steps is not None else ASSUMED_TOTAL_STEPS
        return self.settings.explore_budget_frac * steps * math.exp(log_j[best])

    def _window_cost_j(self, i: int, joules: float) -> float:
        """What a window just measured at level i cost the exploration: ``probe_steps`` x its energy per step above
        the incumbent of the moment (the best level known when it was taken). A window at the incumbent or below it
        costs nothing, and so does the first (there is no incumbent yet: it is the start, what the job runs anyway).
        Judged when taken, not against the final incumbent: a walk down from a start far above the minimum is what
        leaving the start costs, not exploration, and charged afterwards against the bottom it found, it would use the
        budget up before that bottom is refined (a start at 3x the minimum did, on a steep curve: docs/tuner.md)."""
        log_j = self.log_energy()
        best = self.incumbent(log_j)
        if best is None or i == best:
            return 0.0
        return self.settings.probe_steps * max(0.0, joules - math.exp(log_j[best]))

    def affordable(self, i: int, log_j: dict[int, float], best: int, share: float = 1.0) -> bool:
        cost_j = self.settings.probe_steps * max(0.0, math.exp(self._predict(i, log_j)) - math.exp(log_j[best]))
        return cost_j <= 0.0 or cost_j <= share * (self.budget_j(log_j, best) - self.explore_spent_j)

    def _predict(self, i: int, log_j: dict[int, float]) -> float:
        """Log energy expected at level i, for its cost: its estimate when measured; between two measured levels the
        line through them; beyond the measured ones the nearest, or the line through the two nearest when it rises
        outward (the pessimistic choice: the budget must not be spent on a hope)."""
        if i in log_j:
            return log_j[i]
        lower = [k for k in log_j if k < i]
        upper = [k for k in log_j if k > i]
        if lower and upper:
            a, b = max(lower), min(upper)
            return log_j[a] + (log_j[b] - log_j[a]) * (i - a) / (b - a)
        near = sorted(lower or upper, key=lambda k: abs(k - i))
        if len(near) < 2:
            return log_j[near[0]]
        a, b = near[0], near[1]
        return max(log_j[a], log_j[a] + (log_j[a] - log_j[b]) * abs(i - a) / abs(a - b))

    # --- estimates -----------------------------------------------------------------------------------------------

    def _raw_log_energy(self) -> dict[int, float]:
        """Mean log energy per step of each measured level (log: the noise is relative, so it is even there)."""
        return {i: e.sum_log_j / e.n for i, e in enumerate(self._est) if e.n}

    def log_energy(self) -> dict[int, float]:
        """The estimates the search compares: the raw means. No smoothing across levels: a quadratic through the
        levels near the bottom pools their windows on a smooth U, but real curves have bumps and isolated minima
        smaller than a window's noise, which such a fit erases (docs/tuner.md)."""
        return self._raw_log_energy()

    # --- step time, for max_slowdown ------------------------------------------------------------------------------

    def seconds(self) -> list[float] | None:
        """Estimated step time of every level; None before two levels are measured.

        Time is a smooth, convex, falling function of 1/f: ``a + b/f`` for a compute-bound step, flattening near the
        top clock for a host- or launch-bound one, where a global ``a + b/f`` fit misplaces the feasibility boundary
        by a level. With three or more levels measured, a weighted least-squares quadratic in 1/f pools every window,
        so that neither the top's one window nor the boundary level's decides the slowdown alone; with two, the line
        through them. Below the slowest measured level this extrapolates, optimistically when the fit bends: that only
        decides what to explore, and an explored level enters the fit.
        """
        pts = [(1e9 / hz, e.sum_s / e.n, e.n) for hz, e in zip(self.levels_hz, self._est, strict=False) if e.n]
        if len(pts) < 2:
            return None
        coef = _weighted_quadratic(pts) if len(pts) >= 3 else None
        if coef is None:
            (xa, ta, _), (xb, tb, _) = sorted(pts)[:2]
            coef = (ta - (tb - ta) / (xb - xa) * xa, (tb - ta) / (xb - xa), 0.0)
        return [coef[0] + coef[1] * (1e9 / hz) + coef[2] * (1e9 / hz) ** 2 for hz in self.levels_hz]

    def feasible(self, i: int, seconds: list[float] | None, slack: float = 0.0) -> bool:
        """Whether level i is within max_slowdown of the fastest level. A measured level is judged by its own
        windows against the top's: without slack, its time ratio must be within the limit by FEASIBLE_Z standard
        deviations of that ratio (it may be chosen); with slack, it must not be over the limit by z_confirm of them
        (not clearly too slow: worth measuring again). An unmeasured level is judged by the fit, times (1 + slack)
        with slack (worth exploring); a fit never makes a level chosen, since only measured levels are."""
        if self.settings.max_slowdown is None:
            return True
        top = len(self.levels_hz) - 1
        if seconds is None or not self._est[top].n:  # nothing known yet: only the start and the top are candidates
            return i in (top, self.start)
        limit = math.log1p(self.settings.max_slowdown) + math.log1p(slack)
        e, et = self._est[i], self._est[top]
        if e.n:
            if i == top:
                return True
            ratio = math.log((e.sum_s / e.n) / (et.sum_s / et.n))
            # The windows' own uncertainties (noise_rel for a window without one): a window's is mostly its steps'
            # scatter in time (governor.policy.windows.window_noise_rel), what this ratio's own noise is.
            sd = self.sd_diff(i, top)
            z = -self.settings.z_confirm if slack else FEASIBLE_Z
            return ratio + z * sd <= math.log1p(self.settings.max_slowdown)
        return seconds[i] <= math.exp(limit) * seconds[top]

    def lowest_feasible(self, seconds: list[float] | None) -> int:
        return next(i for i in range(len(self.levels_hz)) if self.feasible(i, seconds) or i == len(self.levels_hz) - 1)


def _weighted_quadratic(points: list[tuple[float, float, int]]) -> tuple[float, float, float] | None:
    """(c0, c1, c2) minimising sum n (y - c0 - c1 x - c2 x^2)^2 over (x, y, n); None when singular."""
    m = [[0.0] * 4 for _ in range(3)]  # the normal equations, augmented
    for x, y, n in points:
        powers = (1.0, x, x * x)
        for r in range(3):
            for c in range(3):
                m[r][c] += n * powers[r] * powers[c]
            m[r][3] += n * powers[r] * y
    for col in range(3):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=False)]
    return m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]
