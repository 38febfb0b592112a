"""governor.units: the one formatter of frequencies, used by the daemon's log and the CLI alike."""

import ast
from pathlib import Path

from governor.units import figure, mhz, rounded

REPO = Path(__file__).resolve().parents[1]


def test_mhz_formats_a_pin_and_its_absence():
    assert mhz(714_000_000) == "714 MHz"
    assert mhz(1_300_500_000, unit=False) == "1300.5"
    assert mhz(None) == "-"
    assert mhz(None, none="no pin") == "no pin"  # what the daemon's log writes for a job or a GPU without a pin


def test_mhz_is_defined_once():
    """A second wrapper drifts from the first: every caller uses governor.units.mhz and says what none reads as."""
    defined = [str(path.relative_to(REPO)) for path in sorted((REPO / "governor").rglob("*.py"))
               for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name == "mhz"]
    assert defined == ["governor/units.py"]


def test_a_figure_that_rounds_to_zero_is_never_written_minus_zero():
    """"saved -0%" reads as a loss that is not there."""
    assert [figure(v, ".1f") for v in (-0.04, -0.0, 0.04, -0.06)] == ["0.0", "0.0", "0.0", "-0.1"]
    assert [figure(v, "g") for v in (-0.0, -1e-7, -2.5)] == ["0", "-1e-07", "-2.5"]  # only what reads as zero
    assert str(rounded(-0.001, 2)) == "0.0" and rounded(-0.006, 2) == -0.01
