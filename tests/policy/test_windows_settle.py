"""A window after a change of level opens only once the meter has settled (ProbeWindow's settle_s, issue 23): an
INA3221's average or NVML's held counter shows the old level for up to one or two updates after the change."""

from governor.policy.windows import ProbeWindow


def feed(window: ProbeWindow, step_s: float, steps: int, watts: float = 10.0):
    """Reports of one step each, ``step_s`` apart, at ``watts``; the measurement when one closes the window."""
    for k in range(1, steps + 1):
        m = window.feed(k, watts * step_s * k, step_s * k)
        if m is not None:
            return k, m
    return None


def test_the_window_opens_only_after_the_settling_time_as_well_as_the_warm_up():
    # 50 ms steps, 280 ms to settle (an INA3221's two 140 ms updates): the first report is at 50 ms, so the mark is
    # the first report at least 280 ms later (step 7 at 350 ms), then 4 measured steps.
    closed = feed(ProbeWindow(714_000_000, 0, warmup_steps=1, window_steps=4, settle_s=0.28), 0.05, 30)
    assert closed is not None and closed[0] == 11 and closed[1].measured_steps == 4
    assert closed[1].profiled_steps == 11
    plain = feed(ProbeWindow(714_000_000, 0, warmup_steps=1, window_steps=4), 0.05, 30)
    assert plain is not None and plain[0] == 5


def test_a_window_at_the_same_level_has_nothing_to_settle():
    closed = feed(ProbeWindow(714_000_000, 0, warmup_steps=0, window_steps=4, settle_s=0.28), 0.05, 30)
    assert closed is not None and closed[0] == 5  # opened at the first report, closed 4 steps later
