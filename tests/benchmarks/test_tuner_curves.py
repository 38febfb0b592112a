"""The tuner benchmarks' real curves ship in the repository: `make bench` runs from any clone."""

from pathlib import Path

from benchmarks import tuner_curves

REPO = Path(__file__).resolve().parents[2]


def test_the_real_curves_are_read_from_the_repository_with_their_licence():
    assert tuner_curves.DEFAULT_DATA.is_relative_to(REPO)  # not ../shared, which a clone elsewhere does not have
    curves = tuner_curves.real_curves()
    assert len(curves) == 146  # 128 AGX Xavier and 18 Xavier NX batch sizes
    assert sum(c.name.startswith("agx-xavier/") for c in curves) == 128
    agx_b1 = next(c for c in curves if c.name == "agx-xavier/b1")
    best = agx_b1.best_index()
    assert (agx_b1.levels_hz[best], round(agx_b1.energy_j[best], 3)) == (1_032_750_000, 0.542)  # its README: 1033 MHz
    assert (tuner_curves.DEFAULT_DATA / "LICENSE.LoudVA").read_text().startswith("MIT License")
    assert "LoudVA" in (tuner_curves.DEFAULT_DATA / "README.md").read_text()
