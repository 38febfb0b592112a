"""The tuner's estimates as an object of their own: a search is given the settings and a view of the estimates, and
the views of one job share its windows and what exploration has spent."""

from __future__ import annotations

import math

from governor.policy.estimates import Estimates, TunerSettings
from governor.policy.search import Search
from governor.policy.tuner import OnlineTuner

LEVELS = tuple(300_000_000 + k * 100_000_000 for k in range(11))


def settings(**changes) -> TunerSettings:
    values = dict(max_slowdown=None, noise_rel=0.03, z_confirm=2.0, explore_budget_frac=0.015, total_steps=2000,
                  probe_steps=5, confirm_windows=2, max_probes=40)
    return TunerSettings(**{**values, **changes})


def test_a_search_plans_from_the_settings_and_estimates_it_is_given():
    s = settings()
    est = Estimates(LEVELS, 5, s)
    search = Search(s, est.subset(range(11), 5), list(range(11)), list(range(11)), probes=0)
    assert (search.plan.phase, search.plan.index) == ("start", 5)
    est.add(5, 2.0, 1.0, 0.03, charge=True)
    search.replan(probes=1)
    assert search.plan.phase == "descend"
    s.max_probes = 1  # one settings object: the search reads the change
    search.replan(probes=1)
    assert search.chosen == 5 and search.plan.reason.startswith("safety cap of 1 windows reached")


def test_views_share_the_windows_and_the_budget_spent():
    est = Estimates(LEVELS, 0, settings())
    grid = est.subset([0, 4, 8], 4)
    assert grid.levels_hz == (LEVELS[0], LEVELS[4], LEVELS[8]) and grid.start == 1
    est.add(0, 3.0, 1.0, 0.03, charge=True)  # the first window: free
    grid.add(1, 2.0, 1.0, 0.03, charge=True)  # cheaper than the incumbent: free
    est.add(0, 3.0, 1.0, 0.03, charge=True)  # above the incumbent (level 4's 2.0)
    assert est.windows(4) == 1 and grid.windows(0) == 2
    assert math.isclose(est.explore_spent_j, 5 * (3.0 - 2.0)) and grid.explore_spent_j == est.explore_spent_j
    est.add(0, 9.0, 1.0, 0.03, charge=False)  # after convergence: recorded, not charged
    assert grid.windows(0) == 3 and grid.explore_spent_j == est.explore_spent_j
    assert math.isclose(est.explore_spent_j, 5.0)


def test_the_tuner_reads_its_settings_from_one_object():
    tuner = OnlineTuner(LEVELS, LEVELS[5], total_steps=100)
    tuner.set_job(total_steps=1000, probe_steps=10)
    assert tuner.settings.total_steps == tuner.total_steps == 1000
    assert tuner.settings.probe_steps == tuner.probe_steps == 10


def test_max_slowdown_judges_a_levels_step_time_by_its_windows_own_uncertainty():
    """A level 8% slower than the top under max_slowdown 0.1: feasible (it may be chosen) when its windows and the top's
    are precise, as a noise_rel of 3% would judge one window each; not when the windows say their own uncertainty is
    larger (short windows of scattering steps), so that a level is not chosen on a ratio its windows cannot tell."""
    top, slow = len(LEVELS) - 1, 4

    def judged(noise_rel: float) -> bool:
        est = Estimates(LEVELS, slow, settings(max_slowdown=0.10))
        est.add(top, 3.0, 1.00, noise_rel, charge=True)
        est.add(slow, 2.0, 1.08, noise_rel, charge=True)
        return est.feasible(slow, [1.0] * len(LEVELS))

    assert judged(0.005)  # 1.08 + 1 s.d. of 0.7% is within 1.10
    assert not judged(0.05)  # 1 s.d. is 7%: 1.08 may be well over 1.10
