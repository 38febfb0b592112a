"""What the online tuner knows from its windows: each level's estimate, the z score of a difference, the energy
budget and what exploration has spent of it, and the step times that max_slowdown is judged by. ``OnlineTuner``
(governor.policy.tuner) holds one ``Estimates`` of its whole table and gives each ``Search`` a view of the levels it
searches (``subset``): the views share the windows and the budget spent, so a window counts in every search.

A job's energy per step drifts while it runs: on a real H200 a host-bound job's J/step over 100-step stretches moved by
3-4%, at a fixed clock, as the GPU waited more or less on the host (benchmarks/data/h200-meter-2000). Windows taken
hundreds of steps apart then differ by more than their own noise, and a search that compares them as independent
picks a level by when it was measured. So each level's estimate is not a mean of its windows but a Kalman filter's
(``_Drift``): a window at level i reads a_i + g(t) + noise, where a_i is the level's log J/step and g a drift shared by
every level, an Ornstein-Uhlenbeck process that forgets over ``drift_steps`` steps, its s.d. learnt from the
windows (``_Drifts``: filters of 0 to 3 x ``drift_rel``, and of windows noisier than they say, weighed by how well
each foresaw them). Two levels
measured close in time are compared nearly free of the drift, levels measured far apart with its uncertainty added,
and a level measured again later corrects the others' estimates. With ``drift_rel`` 0 it is the windows' mean,
each window weighted by its own uncertainty."""

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
# The drift s.d.s the estimates weigh, as multiples of drift_rel (_Drifts): none, a third, as given, three times.
DRIFT_SCALES = (0.0, 1.0 / 3.0, 1.0, 3.0)
# The window noises they weigh, as multiples of each window's own uncertainty (_Drifts).
NOISE_SCALES = (1.0, 1.5, 2.25)


@dataclass
class _Estimate:
    """Running sums of the windows measured at one level (its estimate is the filter's: ``_Drift``)."""

    n: int = 0
    sum_j: float = 0.0
    sum_log_j: float = 0.0
    sum_log_j2: float = 0.0
    sum_s: float = 0.0

    def add(self, joules: float, seconds: float) -> None:
        self.n += 1
        self.sum_j += joules
        self.sum_log_j += math.log(joules)
        self.sum_log_j2 += math.log(joules) ** 2
        self.sum_s += seconds


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
    drift_rel: float = 0.0
    drift_steps: float = 1.0
    confirm_contenders: int = 1


@dataclass
class _Spent:
    """What the job's windows have cost the exploration so far, in joules: one for the job, whatever the search."""

    j: float = 0.0


class _Drift:
    """One filter: the state is each measured level's log J/step (a_i) and the drift g, an Ornstein-Uhlenbeck process
    of s.d. ``sd`` that forgets over ``steps``, with their mean and covariance after the windows so far; a window's
    noise is its own times ``noise_scale``. Levels enter
    at their first window: a level never measured is known not at all, so its first window only says a_i = y - g,
    with g's uncertainty added (the limit of a diffuse prior, computed exactly). Keys are positions of the whole
    table; the drift's is G."""

    G = -1

    def __init__(self, sd: float, steps: float, noise_scale: float = 1.0):
        self.sd, self.steps, self.noise_scale = sd, steps, noise_scale
        self.mean: dict[int, float] = {self.G: 0.0}
        self.cov: dict[int, dict[int, float]] = {self.G: {self.G: sd * sd}}

    def advance(self, by_steps: float) -> None:
        """Let the drift evolve ``by_steps``: its mean decays towards 0, its variance towards sd^2, and its
        covariance with the levels fades by the same factor."""
        rho, g = math.exp(-by_steps / self.steps), self.G
        self.mean[g] *= rho
        for k in self.cov:
            if k != g:
                self.cov[k][g] *= rho
                self.cov[g][k] *= rho
        self.cov[g][g] = rho * rho * self.cov[g][g] + self.sd * self.sd * (1.0 - rho * rho)

    def add(self, k: int, log_j: float, var: float) -> float:
        """A window at level k read ``log_j`` with variance ``var`` (its own noise): the log likelihood this filter
        gave that reading (0 for a level's first window, which every filter explains alike)."""
        g, c = self.G, self.cov
        var *= self.noise_scale ** 2
        if k not in self.mean:
            self.mean[k] = log_j - self.mean[g]
            row = {m: -c[g][m] for m in c}
            row[k] = var + c[g][g]
            for m in c:
                c[m][k] = row[m]
            c[k] = row
            return 0.0
        h = {m: c[m][k] + c[m][g] for m in c}  # cov(state, a_k + g)
        total = h[k] + h[g] + var
        innovation = log_j - self.mean[k] - self.mean[g]
        for m in c:
            self.mean[m] += h[m] * innovation / total
        for m in c:
            row, hm = c[m], h[m] / total
            for n in c:
                row[n] -= hm * h[n]
        return -0.5 * (math.log(2.0 * math.pi * total) + innovation * innovation / total)


class _Drifts:
    """How large the drift is differs by job (a host-bound small model's moved by 6%, a larger one's by 3%, a job at
    a steady pace's not at all), and so does how well a window's own uncertainty (its sub-windows' scatter) tells its
    scatter from the next window's: on the H200's recorded steps, excursions of 10-15% lasting tens of steps make
    windows scatter by more than they say. So the estimates weigh filters of several drift s.d.s (DRIFT_SCALES x
    drift_rel) and window noises (NOISE_SCALES x each window's own), all equally likely a priori, by how well each
    foresaw the windows since (Bayesian model averaging over their predictive likelihoods): a job's repeated windows
    soon say which. The estimate is the mixture's mean and covariance (recomputed after each window). With drift_rel
    0, one filter: no drift, each window's own noise."""

    def __init__(self, settings: TunerSettings):
        drifts, noises = (DRIFT_SCALES, NOISE_SCALES) if settings.drift_rel > 0 else ((0.0,), (1.0,))
        self._filters = [_Drift(settings.drift_rel * d, settings.drift_steps, n) for d in drifts for n in noises]
        self._log_w = [0.0] * len(self._filters)
        self.at_step: float | None = None
        self._mixed: tuple[dict[int, float], dict[int, dict[int, float]], float] | None = None

    def advance(self, at_step: float) -> None:
        if self.at_step is not None and at_step > self.at_step:
            for f in self._filters:
                f.advance(at_step - self.at_step)
            self._mixed = None
        if self.at_step is None or at_step > self.at_step:
            self.at_step = at_step

    def add(self, k: int, log_j: float, var: float) -> None:
        self._log_w = [w + f.add(k, log_j, var) for w, f in zip(self._log_w, self._filters, strict=True)]
        top = max(self._log_w)
        self._log_w = [w - top for w in self._log_w]
        self._mixed = None

    def _mix(self) -> tuple[dict[int, float], dict[int, dict[int, float]], float]:
        if self._mixed is None:
            weights = [math.exp(w) for w in self._log_w]
            weights = [w / sum(weights) for w in weights]
            keys = list(self._filters[0].mean)
            mean = {k: math.fsum(w * f.mean[k] for w, f in zip(weights, self._filters, strict=True)) for k in keys}
            cov = {a: {b: math.fsum(w * (f.cov[a][b] + (f.mean[a] - mean[a]) * (f.mean[b] - mean[b]))
                                    for w, f in zip(weights, self._filters, strict=True)) for b in keys}
                   for a in keys}
            sd = math.sqrt(math.fsum(w * f.sd * f.sd for w, f in zip(weights, self._filters, strict=True)))
            self._mixed = (mean, cov, sd)
        return self._mixed

    @property
    def mean(self) -> dict[int, float]:
        return self._mix()[0]

    @property
    def cov(self) -> dict[int, dict[int, float]]:
        return self._mix()[1]

    @property
    def sd_rel(self) -> float:
        """The drift's s.d. as the windows so far weigh it (rms over the filters)."""
        return self._mix()[2]

    def predict(self, k: int) -> tuple[float, float]:
        """(mean, variance) of a_k + g: what a window at level k (measured before) is expected to read now, but for
        its own noise."""
        g, c, m = _Drift.G, self.cov, self.mean
        return m[k] + m[g], c[k][k] + 2.0 * c[k][g] + c[g][g]


@dataclass(eq=False)
class Estimates:
    """The windows of ``levels_hz`` (each level's ``_Estimate``) and what follows from them under ``settings``.
    Positions index ``levels_hz``; ``start`` is the start's position, a candidate before anything is known."""

    levels_hz: tuple[int, ...]
    start: int
    settings: TunerSettings
    _est: list[_Estimate] = field(default_factory=list)
    _spent: _Spent = field(default_factory=_Spent)
    _drift: _Drifts | None = None
    _table: tuple[int, ...] = ()  # each position's position in the whole table (the filter's keys)

    def __post_init__(self) -> None:
        if not self._est:
            self._est = [_Estimate() for _ in self.levels_hz]
        if self._drift is None:
            self._drift = _Drifts(self.settings)
        if not self._table:
            self._table = tuple(range(len(self.levels_hz)))

    def subset(self, positions: Sequence[int], start: int) -> Estimates:
        """A view of the levels at ``positions`` (``start`` one of them) sharing these windows and the budget spent."""
        return Estimates(tuple(self.levels_hz[i] for i in positions), list(positions).index(start), self.settings,
                         [self._est[i] for i in positions], self._spent, self._drift,
                         tuple(self._table[i] for i in positions))

    def add(self, i: int, joules: float, seconds: float, noise_rel: float, *, charge: bool,
            at_step: float | None = None) -> None:
        """Record a window measured at level i, ``at_step`` steps into the job (its middle; None: at the last
        window's moment); with ``charge``, count its cost against the exploration budget."""
        if charge:
            self._spent.j += self._window_cost_j(i, joules)
        self._est[i].add(joules, seconds)
        if at_step is not None:
            self.drift.advance(float(at_step))
        self.drift.add(self._table[i], math.log(joules), noise_rel * noise_rel)

    @property
    def drift(self) -> _Drifts:
        """The filters behind the estimates (``drift.sd_rel``: the drift as the windows weigh it)."""
        assert self._drift is not None, "set in __post_init__"
        return self._drift

    def predict(self, i: int, at_step: float | None = None) -> tuple[float, float]:
        """(log J/step, its variance) that a window at measured level i is expected to read ``at_step`` (None: at
        the last window's time), but for its own noise: the level's estimate plus the drift's, now."""
        if at_step is not None:
            self.drift.advance(float(at_step))
        return self.drift.predict(self._table[i])

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
        """The variance of level i's estimate (of its log joules per step, the drift at its mean)."""
        k = self._table[i]
        return self.drift.cov[k][k]

    def scatter_rel(self, i: int) -> float | None:
        """The sample s.d. of level i's windows (of their log joules per step); None under three windows."""
        e = self._est[i]
        if e.n < 3:
            return None
        return math.sqrt(max(0.0, e.sum_log_j2 - e.sum_log_j ** 2 / e.n) / (e.n - 1))

    def sd_diff(self, a: int, b: int) -> float:
        """The s.d. of log E_a - log E_b: their windows' noise, and the drift between when each was measured."""
        c, ka, kb = self.drift.cov, self._table[a], self._table[b]
        return math.sqrt(max(0.0, c[ka][ka] + c[kb][kb] - 2.0 * c[ka][kb]))

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

    def log_energy(self) -> dict[int, float]:
        """The estimates the search compares: each measured level's log energy per step (log: the noise is relative,
        so it is even there), the filter's, at the drift's mean. No smoothing across levels: a quadratic through the
        levels near the bottom pools their windows on a smooth U, but real curves have bumps and isolated minima
        smaller than a window's noise, which such a fit erases (docs/tuner.md)."""
        mean = self.drift.mean
        return {i: mean[k] for i, k in enumerate(self._table) if k in mean}

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
