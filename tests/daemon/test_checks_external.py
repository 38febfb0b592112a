"""What the daemon restores after another tool changed the limits under its pin (governor.daemon.checks, reapply):
the bounds the tool wrote, the others the baseline's."""

from governor.backends.base import Limits
from governor.daemon.checks import after_external_change

MAXN = Limits(306_000_000, 1_300_500_000, (("power_limit_mw", 60_000),))
PIN = 714_000_000


def test_a_new_power_mode_is_what_is_restored():
    # nvpmodel writes both bounds: MODE_30W, 306..612 MHz as the kernel reads them.
    assert after_external_change(MAXN, 306_000_000, 612_000_000, PIN) == Limits(306_000_000, 612_000_000, MAXN.extra)


def test_a_bound_still_reading_the_pin_was_not_written():
    # A tool raised only the max: the min still reads the pin, and is the baseline's again.
    assert after_external_change(MAXN, PIN, 1_300_500_000, PIN) == MAXN
    # NVML cannot read a lock back: its reads are the lock, so nothing changes.
    assert after_external_change(MAXN, PIN, PIN, PIN) == MAXN


def test_a_min_clamped_to_a_lowered_max_is_not_taken_for_a_lock():
    # Only max_freq lowered under the pin's min: the kernel reads min := max (612..612); the min to restore is the
    # baseline's, not a lock at 612 MHz.
    assert after_external_change(MAXN, 612_000_000, 612_000_000, PIN) == Limits(306_000_000, 612_000_000, MAXN.extra)
