"""The search's stages (governor.policy.search.Stage): the order they are asked in, which ones are exclusive, and
the stage each plan comes from."""

from __future__ import annotations

from governor.policy.estimates import Estimates, TunerSettings
from governor.policy.search import Search, Stage

LEVELS = tuple(300_000_000 + k * 100_000_000 for k in range(11))
ALL = list(range(11))


def settings(**changes) -> TunerSettings:
    values = dict(max_slowdown=None, noise_rel=0.03, z_confirm=2.0, explore_budget_frac=0.015, total_steps=2000,
                  probe_steps=5, confirm_windows=2, max_probes=40)
    return TunerSettings(**{**values, **changes})


def search_after(windows: list[tuple[int, float]], start: int = 5, **changes) -> Search:
    """A search of the whole table after windows (position, joules per step; one second a step each)."""
    s = settings(**changes)
    est = Estimates(LEVELS, start, s)
    for i, joules in windows:
        est.add(i, joules, 1.0, s.noise_rel, charge=True)
    return Search(s, est.subset(ALL, start), ALL, ALL, probes=len(windows))


def test_the_stages_are_asked_in_order_and_the_first_four_are_exclusive():
    assert [s.name for s in Stage] == ["START", "FASTEST", "ANCHOR", "NO_FEASIBLE", "LONE_DIP", "DESCEND_REFINE",
                                       "PAST_THE_RISE", "VALLEYS", "SLOWDOWN_LIMIT", "CONTENDERS", "DONE"]
    assert [s for s in Stage if s.exclusive] == [Stage.START, Stage.FASTEST, Stage.ANCHOR, Stage.NO_FEASIBLE]


def test_the_start_then_with_max_slowdown_the_top_come_before_anything_else():
    search = search_after([])
    assert (search.stage, search.plan.index) == (Stage.START, 5)
    search = search_after([(5, 2.0)], max_slowdown=0.1)
    assert (search.stage, search.plan.phase, search.plan.index) == (Stage.FASTEST, "fastest", 10)


def test_a_lone_dip_is_measured_again_before_the_walk_refines_around_it():
    dip = search_after([(3, 3.0), (5, 2.0), (7, 3.0)])
    assert (dip.stage, dip.plan.phase, dip.plan.index) == (Stage.LONE_DIP, "confirm", 5)
    confirmed = search_after([(3, 3.0), (5, 2.0), (7, 3.0), (5, 2.0)])
    assert (confirmed.stage, confirmed.plan.phase) == (Stage.DESCEND_REFINE, "refine")
    assert confirmed.plan.index in (4, 6)


def test_a_search_that_is_done_says_so():
    search = search_after([(5, 2.0)], max_probes=1)
    assert search.stage is Stage.DONE and search.chosen == 5
