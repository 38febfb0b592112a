"""benchmarks/tuner_tradeoffs.py: each variant's window settings reach the jobs' windows, and its rows count the
runs beyond each tail."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import bench_tuner
from benchmarks.tuner_curves import DEFAULT_DATA, real_curves
from benchmarks.tuner_tradeoffs import TAILS, row
from governor.config import TunerConfig


def test_a_looser_target_reaches_the_windows_and_shortens_them():
    curves = real_curves(DEFAULT_DATA)[:2]
    args = SimpleNamespace(seeds=1, job_steps=2000, noise_rel=0.03)

    def steps_per_window(config):
        runs = bench_tuner.window_runs(curves, args, None, "nvml-replay", "time", config, tuners=("follow",))
        return sum(r.window_steps for r in runs) / len(runs)

    assert steps_per_window(TunerConfig(window_target_rel=0.04)) < 0.8 * steps_per_window(TunerConfig())


def test_rows_count_the_runs_beyond_each_tail():
    runs = [bench_tuner.Run("c", "top", "follow", lv, 0.01, 10, 0.0, 0.0, 0.0, meter="nvml-replay", rule="time",
                            window_steps=20.0)
            for lv in [0.0] * 96 + [0.035, 0.045, 0.07, 0.2]]
    got = row("defaults", "real", runs)
    assert got[:3] == ("defaults", "real", 100)
    assert got[4:4 + len(TAILS)] == (4, 3, 2)  # beyond 3%, 4%, 6%
    assert got[-1] == "20.0"


def test_a_variants_search_knobs_reach_the_tuner_and_the_kind_keeps_its_own_without_one():
    levels = real_curves(DEFAULT_DATA)[0].levels_hz

    def knobs(kind, config=None):
        s = bench_tuner.make_tuner(kind, levels, levels[-1], None, 0.03, 2000, config).settings
        return s.confirm_contenders, s.explore_budget_frac

    assert knobs("follow", TunerConfig(explore_budget_frac=0.012, confirm_contenders=1)) == (1, 0.012)
    assert knobs("follow") == (2, 0.015)  # as the daemon runs it
    assert knobs("new") == (1, 0.015)  # the tuner's own defaults
