"""governor/daemon/scheduler.py's pure parts: the joined registrations' measured savings as one figure."""

import pytest

from governor.daemon.scheduler import combined_saving


def test_savings_are_weighted_by_the_steps_each_measured():
    out = combined_saving([{"saved_pct": 10.0, "saved_pct_err": 2.0, "measured_steps": 300},
                           {"saved_pct": 20.0, "saved_pct_err": 4.0, "measured_steps": 100}])
    assert out["saved_pct"] == 12.5
    assert out["saved_pct_err"] == pytest.approx(((2 * 300) ** 2 + (4 * 100) ** 2) ** 0.5 / 400, abs=0.01)


def test_no_measured_saving_is_none_and_one_without_an_error_leaves_the_error_unknown():
    assert combined_saving([]) == {"saved_pct": None, "saved_pct_err": None}
    assert combined_saving([{"saved_pct": None, "measured_steps": 0}]) == {"saved_pct": None, "saved_pct_err": None}
    out = combined_saving([{"saved_pct": 8.0, "saved_pct_err": None, "measured_steps": 50}])
    assert out == {"saved_pct": 8.0, "saved_pct_err": None}
