"""How ftgov writes quantities for people: one formatter per unit, so that a log line, `ftgov status` and the
evaluation table say the same frequency the same way."""

from __future__ import annotations


def mhz(freq_hz: float | None, none: str = "-", unit: bool = True) -> str:
    """A frequency given in Hz, in MHz with no trailing zeros ("714 MHz", "1300.5 MHz"); ``none`` when there is no
    frequency (no pin, MAXN); ``unit=False`` leaves " MHz" off (a table whose header names the unit)."""
    if freq_hz is None:
        return none
    return f"{freq_hz / 1e6:g}" + (" MHz" if unit else "")


def rounded(value: float, ndigits: int) -> float:
    """``round(value, ndigits)``, with a value that rounds to zero from below as 0.0, not -0.0: a saving of -0.001%
    written "-0" reads as a loss that is not there."""
    return round(value, ndigits) + 0.0  # -0.0 + 0.0 is 0.0


def figure(value: float, spec: str) -> str:
    """``format(value, spec)`` for people, without the sign of a value that rounds to zero ("0.0%", not "-0.0%")."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and float(text) == 0 else text


# Energy units, largest first: a figure is written in the largest one it reaches.
ENERGY_UNITS = ((1e6, "MJ"), (1e3, "kJ"), (1.0, "J"))


def energy_unit(energy_j: float) -> tuple[float, str]:
    """(scale, unit) for writing ``energy_j``: J below 1 kJ, kJ below 1 MJ, then MJ (so that 21.3 J is not
    "0.0 kJ"). The value rounded to three figures decides, so 999.96 J is "1.00 kJ", not "1000.0 J"."""
    for scale, unit in ENERGY_UNITS:
        if round(abs(energy_j) / scale, 2) >= 1.0:
            return scale, unit
    return 1.0, "J"


def energy(energy_j: float | None, none: str = "-") -> str:
    """An energy given in J, in J, kJ or MJ by its size, with three significant figures or one decimal
    ("21.3 J", "4.50 kJ", "123 kJ", "0.00 J"); ``none`` when it is unknown (no rails)."""
    if energy_j is None:
        return none
    scale, unit = energy_unit(energy_j)
    value = energy_j / scale
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {unit}"
