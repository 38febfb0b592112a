"""governor.sim.tuned_job: the one simulated tuned-job loop, on a noise-free curve read by each meter, and on the
energy model."""

from __future__ import annotations

import random

import pytest

from benchmarks.tuner_curves import Curve
from governor.config import TunerConfig
from governor.errors import FtgovError
from governor.pipeline.workloads import held_out_workloads
from governor.policy.tuner import OnlineTuner
from governor.sim.energy import OrinEnergyModel
from governor.sim.tuned_job import METERS, ModelBoard, SavingRun, run_tuned_job

LEVELS = tuple(300_000_000 + 100_000_000 * k for k in range(8))
ENERGY = (1.6, 1.3, 1.1, 1.0, 1.1, 1.3, 1.6, 2.0)  # J/step, the minimum at LEVELS[3]
V = Curve("v", LEVELS, ENERGY, tuple(0.3 / (hz / 1e9) for hz in LEVELS))


def test_an_exact_meter_on_a_noise_free_curve_reads_each_level_and_finds_the_minimum():
    job = run_tuned_job(V, LEVELS[-1], 2000)
    assert job.converged and job.best_hz == LEVELS[3]
    for m in job.windows:
        assert m.joules_per_step == pytest.approx(V.energy_at(m.level_hz))
        assert m.seconds_per_step == pytest.approx(V.time_at(m.level_hz))
        assert m.measured_steps == 4 and m.noise_rel is None
    assert job.windows[0].profiled_steps == 5  # 1 warm-up + 4 after the start's pin
    assert job.profiled_steps == sum(job.steps_at_hz.values()) == job.session.profiled_steps
    assert job.probes == len(job.windows) == sum(job.windows_by_phase.values())


def test_a_gauss_meter_gives_each_window_its_own_draw_in_energy_then_time():
    noise = 0.05
    job = run_tuned_job(V, LEVELS[-1], 2000, meter="gauss", seed=11, noise_rel=noise)
    rng = random.Random(11)
    for m in job.windows:
        e, t = 1 + rng.gauss(0, noise), 1 + rng.gauss(0, noise)
        assert m.joules_per_step == pytest.approx(V.energy_at(m.level_hz) * e, rel=1e-12)
        assert m.seconds_per_step == pytest.approx(V.time_at(m.level_hz) * t, rel=1e-12)


def test_the_whole_job_is_charged_at_noise_free_figures_the_rest_at_the_chosen_level():
    job = run_tuned_job(V, LEVELS[0], 2000, meter="ina3221", seed=2)
    searched_j = sum(n * V.energy_at(hz) for hz, n in job.steps_at_hz.items())
    searched_s = sum(n * V.time_at(hz) for hz, n in job.steps_at_hz.items())
    rest = 2000 - job.profiled_steps
    assert job.clean_energy_j == pytest.approx(searched_j + rest * V.energy_at(job.best_hz))
    assert job.clean_time_s == pytest.approx(searched_s + rest * V.time_at(job.best_hz))
    assert not job.outlasted


def test_a_search_longer_than_the_job_is_charged_up_to_the_jobs_end():
    """A search ends when the job has a window's steps left, but a window sized by time may outlast what is left:
    here the start's window alone (at least 1 s of 6-20 ms steps) outlasts a 60-step job."""
    fast = Curve("fast", LEVELS, ENERGY, tuple(0.006 / (hz / 1e9) for hz in LEVELS))
    job = run_tuned_job(fast, LEVELS[-1], 60, meter="nvml", rule="time", seed=0, max_steps=10_000)
    assert job.converged and job.outlasted and job.profiled_steps > 60
    # The windows in order, each its warm-up and measured steps at its level, cut at the job's 60th step.
    charged, left = 0.0, 60
    for m in job.windows:
        n = min(left, m.profiled_steps)
        charged, left = charged + n * fast.energy_at(m.level_hz), left - n
    assert job.clean_energy_j == pytest.approx(charged)
    assert job.clean_energy_j < sum(n * fast.energy_at(hz) for hz, n in job.steps_at_hz.items())


def test_a_job_too_short_raises_unless_told_to_end_with_it():
    """A job shorter than its start's window (1 + 4 steps) ends before the tuner has anything; one that has no more
    than a window's steps left after it ends the search there (10 steps: the start's window, then the pick)."""
    with pytest.raises(FtgovError, match="v: the tuner had not converged after 3 steps"):
        run_tuned_job(V, LEVELS[-1], 3)
    job = run_tuned_job(V, LEVELS[-1], 3, must_converge=False)
    assert not job.converged and job.profiled_steps == 3 and not job.windows
    job = run_tuned_job(V, LEVELS[-1], 10)
    assert job.converged and len(job.windows) == 1 and job.best_hz == LEVELS[-1] and not job.outlasted
    assert "no more than a window" in job.tuner.state()["reason"]


@pytest.mark.parametrize("meter", ["nvml", "ina3221"])
def test_windows_sized_by_time_carry_their_noise_and_by_steps_do_not(meter):
    by_time = run_tuned_job(V, LEVELS[-1], 20_000, meter=meter, seed=1, rule="time")
    by_steps = run_tuned_job(V, LEVELS[-1], 2000, meter=meter, seed=1, rule="steps")
    assert all(m.noise_rel is not None for m in by_time.windows) and by_time.window_steps > 4
    assert all(m.noise_rel is None for m in by_steps.windows)
    if meter == "nvml":  # read at each step's end: 4 steps exactly
        assert all(m.measured_steps == 4 for m in by_steps.windows) and by_steps.window_steps == 4.0
    else:  # the INA3221's sampler gives the edges: the window closes at the first sample past its 4 steps
        assert all(4 <= m.measured_steps <= 6 for m in by_steps.windows), [m.measured_steps for m in by_steps.windows]


def test_the_config_sets_the_windows_and_the_tuner():
    cfg = TunerConfig(window_rule="steps", window_steps=7, warmup_steps=2, max_slowdown=0.05)
    job = run_tuned_job(V, LEVELS[-1], 4000, config=cfg)
    assert job.windows[0].profiled_steps == 9 and all(m.measured_steps == 7 for m in job.windows)
    assert job.tuner.max_slowdown == 0.05


def test_the_same_seed_gives_the_same_job_and_another_seed_another():
    def run(seed):
        job = run_tuned_job(V, LEVELS[-1], 2000, meter="nvml", seed=seed)
        return [(m.level_hz, m.joules_per_step) for m in job.windows]

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="meter 'watts'"):
        run_tuned_job(V, LEVELS[-1], 2000, meter="watts")
    with pytest.raises(ValueError, match="rule 'often'"):
        run_tuned_job(V, LEVELS[-1], 2000, rule="often")
    with pytest.raises(ValueError, match="gauss"):
        run_tuned_job(V, LEVELS[-1], 2000, meter="gauss", rule="time")
    assert METERS == ("exact", "gauss", "nvml", "ina3221", "nvml-edges", "nvml-replay")


def test_on_the_energy_model_the_windows_scatter_with_its_noise_and_the_charge_is_noise_free():
    w = held_out_workloads()[0]
    clean = OrinEnergyModel()
    top = clean.levels_hz[-1]
    quiet = run_tuned_job(ModelBoard(w), top, 2000)
    noisy = run_tuned_job(ModelBoard(w, noise=1.0, seed=3), top, 2000)
    for m in quiet.windows:
        assert m.joules_per_step == pytest.approx(clean.expected(w, m.level_hz).energy_j)
    assert any(m.joules_per_step != pytest.approx(clean.expected(w, m.level_hz).energy_j, rel=1e-6)
               for m in noisy.windows)
    charged = sum(n * clean.expected(w, hz).energy_j for hz, n in noisy.steps_at_hz.items())
    charged += (2000 - noisy.profiled_steps) * clean.expected(w, noisy.best_hz).energy_j
    assert noisy.clean_energy_j == pytest.approx(charged)
    assert noisy.measured_energy_j != pytest.approx(sum(n * clean.expected(w, hz).energy_j
                                                         for hz, n in noisy.steps_at_hz.items()), rel=1e-6)


def test_a_job_is_charged_every_step_of_its_search():
    levels = tuple(300_000_000 + 100_000_000 * k for k in range(8))
    energy = (1.6, 1.3, 1.1, 1.0, 1.1, 1.3, 1.6, 2.0)
    curve = Curve("v", levels, energy, tuple(0.3 / (hz / 1e9) for hz in levels))
    tuner = OnlineTuner(levels, levels[-1], noise_rel=0.03, total_steps=2000)
    job = run_tuned_job(curve, levels[-1], 2000, meter="nvml", seed=0, rule="time", tuner=tuner, max_steps=200_000)
    assert job.best_hz == levels[3]
    searched = sum(n * curve.energy_at(hz) for hz, n in job.steps_at_hz.items())
    assert job.clean_energy_j == pytest.approx(searched + (2000 - job.profiled_steps) * 1.0)
    assert job.clean_energy_j > 2000 * 1.0


@pytest.mark.parametrize("meter", ["nvml", "ina3221"])
def test_a_saving_run_measures_the_baseline_unpinned_then_runs_every_step_of_the_job(meter):
    job = run_tuned_job(V, LEVELS[4], 2000, meter=meter, seed=5, saving=SavingRun())
    first = job.baseline
    assert first is not None and first.level_hz is None and job.baseline_steps > first.measured_steps
    # The baseline's other parts ran unpinned later, spread over the job (tuner.baseline_parts): together they span
    # at least baseline_min_steps and at most the budget (5% of the job), give or take a part's rounding.
    parts = job.baseline_parts
    assert parts is not None and 3 <= len(parts.measured) <= TunerConfig().baseline_parts
    base = parts.baseline
    assert TunerConfig().baseline_min_steps <= base.measured_steps <= 130
    assert base.joules_per_step == pytest.approx(ENERGY[-1], rel=0.1)  # the top level's, as the default governor's
    # The first steps at the start pin: two blocks of 5 (the simulated steps have no warm-up), then the first part.
    assert 2 * 5 <= job.start_pin_steps <= 3 * 5
    later = job.default_steps - (job.baseline_steps - job.start_pin_steps)  # the later parts' steps, warm-ups too
    assert later > 0 and job.baseline_steps + job.profiled_steps + later == 2000
    assert not job.outlasted and job.true_energy_j == pytest.approx(job.clean_energy_j, rel=0.02)
    assert job.reported_energy_j == pytest.approx(job.true_energy_j, rel=0.01)
    # The saving, as the daemon reports it: over the steps run converged at the pick, most of the job.
    saving = job.saving()
    assert job.best_hz == LEVELS[3] and saving["tuned_over"] == "steps after convergence"
    assert saving["tuned_steps"] > 1000
    assert abs(saving["saved_pct"] - 100 * (1 - ENERGY[3] / ENERGY[-1])) < 3 * saving["saved_pct_err"]


def test_a_saving_counts_the_baseline_parts_it_pooled():
    """A stray first part left out of the baseline is no part of it: the saving's blocks are a pooled part long, and
    its baseline_parts (which narrow the drift's share of the error) are those pooled."""
    from governor.policy.windows import Measurement

    job = run_tuned_job(V, LEVELS[4], 2000, meter="nvml", seed=5, saving=SavingRun())
    parts = job.baseline_parts
    assert parts is not None
    j = ENERGY[-1]
    parts.measured = [Measurement(None, j * f, 0.5, 20, 21, noise_rel=0.01) for f in (1.5, 1.0, 1.02, 0.99)]
    assert parts.first_strays
    saving = job.saving()
    assert saving["baseline_parts"] == 3
    assert saving == job.measured.result(parts.baseline, job.best_hz, job.windows, baseline_parts=3)


def test_a_saving_run_on_an_exact_meter_has_no_idle_board_to_read():
    with pytest.raises(ValueError, match="idle"):
        run_tuned_job(V, LEVELS[4], 2000, saving=SavingRun())
    job = run_tuned_job(V, LEVELS[4], 2000, saving=SavingRun(idle_s=0.0))
    assert job.baseline is not None and job.baseline.joules_per_step == pytest.approx(ENERGY[-1])
    assert job.baseline.measured_steps == 4  # the exact meter's windows are of steps
