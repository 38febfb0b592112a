"""governor/daemon/scheduler.py's pure parts: the joined registrations' measured savings as one figure."""

import pytest

from governor.daemon.scheduler import PooledSaving


def pooled(savings: list[dict]) -> dict:
    out = PooledSaving()
    for saving in savings:
        out.add(saving)
    return out.summary()


def test_savings_are_weighted_by_the_steps_each_measured():
    out = pooled([{"saved_pct": 10.0, "saved_pct_err": 2.0, "measured_steps": 300},
                  {"saved_pct": 20.0, "saved_pct_err": 4.0, "measured_steps": 100}])
    assert out["saved_pct"] == 12.5
    assert out["saved_pct_err"] == pytest.approx(((2 * 300) ** 2 + (4 * 100) ** 2) ** 0.5 / 400, abs=0.01)


def test_no_measured_saving_is_none_and_one_without_an_error_leaves_the_error_unknown():
    assert pooled([]) == {"saved_pct": None, "saved_pct_err": None}
    assert pooled([{"saved_pct": None, "measured_steps": 0}]) == {"saved_pct": None, "saved_pct_err": None}
    out = pooled([{"saved_pct": 8.0, "saved_pct_err": None, "measured_steps": 50}])
    assert out == {"saved_pct": 8.0, "saved_pct_err": None}
    out = pooled([{"saved_pct": 8.0, "saved_pct_err": None, "measured_steps": 50},
                  {"saved_pct": 12.0, "saved_pct_err": 1.0, "measured_steps": 50}])
    assert out == {"saved_pct": 10.0, "saved_pct_err": None}


def test_a_hold_keeps_sums_not_the_jobs_savings():
    """A hold may see any number of short joined jobs end (a loop inside a batch job): what it keeps does not grow."""
    sums = PooledSaving()
    for i in range(10_000):
        sums.add({"saved_pct": 10.0 + i % 3, "saved_pct_err": 1.0, "measured_steps": 10})
    assert vars(sums).keys() == {"steps", "pct_steps", "err_steps_sq", "err_known"}
    assert sums.summary() == {"saved_pct": pytest.approx(11.0, abs=0.01), "saved_pct_err": pytest.approx(0.01)}
