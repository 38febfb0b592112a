"""After the search: the online tuner's follow-up while the job runs at its pick.

The search commits to a provisional level early; a few windows more at a near-tie cost almost nothing and keep
paying for the rest of the job, and the curve may move under the pin (a phase change, thermal drift). So:

- **Confirming near-ties.** The contenders are the measured feasible levels whose interval overlaps the pick's
  (within ``z_confirm`` s.d. of the difference). A window on a pair ``d`` apart (log energy) that removes ``sigma``
  from its level's estimate is worth ``steps_left x sigma x L(|d| / sigma)`` of the pick's energy, ``L(z) = phi(z) -
  z (1 - Phi(z))``; one at the pick costs nothing, one at a contender ``probe_steps x (E_c / E_pick - 1)``. A
  contender is confirmed while a run of 1, 2, 4, 8 or 16 windows there (LOOKAHEAD) is worth FOLLOW_GAIN times its cost
  and its own steps times ``noise_rel`` (MIN_GAIN_NOISE), so that a short job pays for none; the pair worth the most
  per window goes first, its fewer-measured level first. ``max_follow_windows`` caps the windows away from the pick.
- **Watching the pick.** A window at the pick that reads outside its interval by more than ``drift_z`` s.d. (the
  window's own, or the pick's windows' scatter when larger, and the estimate's) twice in a row on one side (the first
  may be a confirmation at a near-tie) means the curve moved: the tuner searches again from the pick, the windows
  before forgotten. The design and its figures: docs/tuner.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from governor.policy.estimates import Estimates

# One window must be expected to gain this many times what it costs: a window's value is an expectation over a normal
# posterior, and the noise the tuner assumes runs low on real meters (docs/tuner.md, windows).
FOLLOW_GAIN = 2.0
# The least a window must be expected to gain, in units of its own steps x noise_rel (relative energy): below it the
# decision it could change is worth less than the disturbance of a change of clock and back.
MIN_GAIN_NOISE = 1.0
# Runs of windows at a contender whose value is weighed (see plan).
LOOKAHEAD = (1, 2, 4, 8, 16)
DEFAULT_DRIFT_Z = 3.0
DRIFT_WINDOWS = 2  # consecutive windows beyond drift_z on one side
DEFAULT_MAX_FOLLOW_WINDOWS = 30


def _gain(z: float) -> float:
    """L(z) = phi(z) - z (1 - Phi(z)): the expected excess over z of a standard normal, the value of information."""
    return math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) - z * 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class FollowPlan:
    index: int  # the level to measure next (a position of the tuner's table)
    reason: str
    confirming: bool  # a window at a contender, or at the pick to tell a contender apart (else: watching)


class FollowUp:
    """The follow-up of one committed pick over the tuner's ``Estimates`` (positions index its table). ``plan`` is
    the next window; ``observe`` takes one and says whether the curve drifted."""

    def __init__(self, est: Estimates, pick: int, z_confirm: float, drift_z: float, max_windows: int):
        self.est = est
        self.pick = pick
        self.drift_z = drift_z
        self.max_windows = max_windows
        self.windows_away = 0  # windows at contenders so far
        self._drift_signs: list[int] = []
        # (level, expected log J/step, its variance, scatter) of the level a window was last judged against
        self._reference: tuple[int, float, float, float] | None = None
        log_j = est.log_energy()
        fit = est.seconds()
        # The levels that may be picked from now on: the pick and its near-ties when it was chosen.
        self.members = (pick, *(i for i in log_j if i != pick and est.feasible(i, fit)
                                and abs(est.z(i, pick, log_j)) < z_confirm))

    @property
    def contenders(self) -> tuple[int, ...]:
        return tuple(i for i in self.members if i != self.pick)

    def plan(self, steps_left: float, probe_steps: int) -> FollowPlan:
        """The next window: at the pair (the pick and a contender) whose run of windows is worth the most per window,
        value less cost, while one pays (confirming); else at the pick (watching)."""
        if self.suspect:
            return FollowPlan(self.pick, "the last window read outside its level's interval: measure the pick", False)
        if self.windows_away >= self.max_windows or steps_left <= 0:
            return FollowPlan(self.pick, "watching the pick: no confirmation left to pay for", False)
        log_j = self.est.log_energy()
        least = MIN_GAIN_NOISE * probe_steps * self.est.settings.noise_rel
        best: tuple[float, int, int] | None = None  # (value less cost, level, contender)
        room = self.max_windows - self.windows_away
        for c in self.contenders:
            d = abs(log_j[c] - log_j[self.pick])
            cost = probe_steps * max(0.0, math.exp(log_j[c] - log_j[self.pick]) - 1.0)
            # Worth it if some run of windows there is: one window alone rarely changes a decision that a few would
            # (a one-step value of information stops too early), so runs of LOOKAHEAD windows are priced too.
            nets = [(self._value(c, d, steps_left, m) - m * cost) / m for m in LOOKAHEAD
                    if m <= room and self._value(c, d, steps_left, m) >= max(m * least, FOLLOW_GAIN * m * cost)]
            if not nets:
                continue  # this pair is told apart for the steps left
            # The fewer-measured of the pair: the pick's windows are free, but a tie is told apart by both.
            at = c if self.est.windows(c) < self.est.windows(self.pick) else self.pick
            if best is None or max(nets) > best[0]:
                best = (max(nets), at, c)
        if best is None:
            return FollowPlan(self.pick, "watching the pick: every near-tie told apart for the steps left", False)
        _, at, c = best
        hz = self.est.levels_hz
        return FollowPlan(at, f"confirming {hz[c] / 1e6:.0f} MHz against the pick {hz[self.pick] / 1e6:.0f} MHz: "
                              "a window pays for the steps left", True)

    def _value(self, i: int, d: float, steps_left: float, m: int = 1) -> float:
        """What m more windows at level i are worth for a pair ``d`` apart, in steps' energy at the pick."""
        sigma = self._sigma_moved(i, m)
        return steps_left * sigma * _gain(d / sigma) if sigma > 0 else 0.0

    def _sigma_moved(self, i: int, m: int = 1) -> float:
        """The s.d. by which m more windows at level i move its estimate: sqrt(var(n) - var(n + m)), a window taken
        to scatter as its windows so far did on average."""
        n = self.est.windows(i)
        if not n:
            return 0.0
        var = self.est.var_mean(i)  # taken as (window variance) / n, as without drift
        return math.sqrt(max(0.0, var - var * n / (n + m)))

    @property
    def suspect(self) -> bool:
        """The last window read outside its level's interval: the next is the pick's, and the pick stays."""
        return bool(self._drift_signs) and self._drift_signs[-1] != 0

    def drifted(self, i: int, joules: float, noise_rel: float, at_step: float | None = None) -> bool:
        """Whether a window at level i, a member (before it is added to the estimates), measured ``at_step``, says
        the curve moved: a window outside its level's interval by drift_z, DRIFT_WINDOWS times in a row on one side
        (a confirmation window at a near-tie can be the first: the curve moves whatever level the job runs at). The
        interval is what the estimates expect a window to read then, the slow drift they allow for included: a
        jump, not that drift, is what searches again."""
        # The level's interval as it was before the first window out of it (which would widen it): its prediction,
        # and the scatter of its windows where larger than the window's own noise (a meter noisier than the window
        # says, a busy host's step times say, must not read as drift).
        if not self.suspect or self._reference is None or self._reference[0] != i:
            self._reference = (i, *self.est.predict(i, at_step), self.est.scatter_rel(i) or 0.0)
        _, mean, var_mean, scatter = self._reference
        noise = max(noise_rel, scatter)
        z = (math.log(joules) - mean) / math.sqrt(noise * noise + var_mean)
        sign = 0 if abs(z) < self.drift_z else (1 if z > 0 else -1)
        self._drift_signs = [*self._drift_signs, sign][-DRIFT_WINDOWS:]
        return len(self._drift_signs) == DRIFT_WINDOWS and sign != 0 and all(s == sign for s in self._drift_signs)

    def repick(self) -> None:
        """After a window: the pick is the lowest estimate among the pick and its contenders."""
        log_j = self.est.log_energy()
        pick = min(self.members, key=log_j.__getitem__)
        if pick != self.pick:
            self.pick, self._drift_signs = pick, []
