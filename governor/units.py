"""How ftgov writes quantities for people: one formatter per unit, so that a log line, `ftgov status` and the
evaluation table say the same frequency the same way."""

from __future__ import annotations


def mhz(freq_hz: float | None, none: str = "-", unit: bool = True) -> str:
    """A frequency given in Hz, in MHz with no trailing zeros ("714 MHz", "1300.5 MHz"); ``none`` when there is no
    frequency (no pin, MAXN); ``unit=False`` leaves " MHz" off (a table whose header names the unit)."""
    if freq_hz is None:
        return none
    return f"{freq_hz / 1e6:g}" + (" MHz" if unit else "")
