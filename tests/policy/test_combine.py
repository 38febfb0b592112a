"""policy.combine: the one rule for several jobs on one GPU."""

from hypothesis import given
from hypothesis import strategies as st

from governor.policy import combine


def test_the_highest_pick_wins():
    assert combine([612_000_000, 918_000_000, 714_000_000]) == 918_000_000


def test_jobs_that_pin_nothing_do_not_count():
    assert combine([None, 612_000_000, None]) == 612_000_000


def test_no_pins_means_the_baseline():
    assert combine([]) is None
    assert combine([None, None]) is None


@given(st.lists(st.one_of(st.none(), st.integers(1, 2_000_000_000))))
def test_no_job_is_slowed_below_its_own_pick(picks):
    target = combine(picks)
    pins = [p for p in picks if p is not None]
    assert (target is None) == (not pins)
    assert all(target >= p for p in pins)
    assert target is None or target in pins
