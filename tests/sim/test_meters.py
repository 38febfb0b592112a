"""The simulated meters (governor/sim/meters.py's MeteredSteps, read through the daemon's windows by
governor.sim.tuned_job.level_windows: bench_tuner's and tuner_bound's --meter) on a flat curve: their windows read the
curve's J/step on average, and NVML's 4-step windows on 26 ms steps scatter as the H200's did (13-32%, issue 23)."""

from __future__ import annotations

import statistics

import pytest

from governor.sim.tuned_job import level_windows, window_rule

STEP_S = 0.026
POWER_W = 300.0
J_PER_STEP = POWER_W * STEP_S


@pytest.mark.parametrize("meter", ["nvml", "ina3221"])
def test_windows_read_the_curves_energy_per_step_on_average(meter):
    """400 windows of 4 steps: their mean J/step within 2% of the curve's (the s.d. of that mean is about 1%)."""
    ms = level_windows(meter, J_PER_STEP, STEP_S, seed=3, windows=400)
    assert statistics.fmean(m.joules_per_step for m in ms) == pytest.approx(J_PER_STEP, rel=0.02)


def test_nvml_four_step_windows_scatter_as_the_h200s_did():
    for seed in range(3):
        j = [m.joules_per_step for m in level_windows("nvml", J_PER_STEP, STEP_S, seed=seed, windows=300)]
        assert 0.13 <= statistics.stdev(j) / statistics.fmean(j) <= 0.32


def test_windows_sized_by_the_rule_are_long_and_carry_their_noise():
    ms = level_windows("nvml", J_PER_STEP, STEP_S, seed=1, windows=20, rule=window_rule("nvml"))
    j = [m.joules_per_step for m in ms]
    assert statistics.fmean(m.measured_steps for m in ms) > 30
    assert statistics.stdev(j) / statistics.fmean(j) < 0.05
    assert all(m.noise_rel is not None for m in ms)


def test_edge_steps_give_the_counters_exact_value_at_its_updates_with_the_steps_run_by_then():
    """nvml-edges reads NVML's counter as the daemon does when the client sends step_end_s: at update instants, an
    edge each 0.5 s, each with the energy there and the steps counted between the step's ends."""
    from governor.sim.meters import EdgeSteps

    steps = EdgeSteps(seed=3)
    got = []
    for _ in range(400):  # 26 ms steps at 300 W
        n0, t0 = steps.steps, steps.time_s
        points = steps.points(300.0 * 0.026, 0.026)
        n1, t1 = steps.steps, steps.time_s
        for n, e, t in points:
            assert t0 < t <= t1 and n == pytest.approx(n0 + (n1 - n0) * (t - t0) / (t1 - t0))
            assert e == pytest.approx(steps.trace.energy_j(t))  # the counter's value at its update: exact
            assert t == pytest.approx(steps.clock.last_at(t))  # on an update instant
        got += points
    times = [t for _, _, t in got]
    assert len(got) >= 18 and all(0.49 < b - a < 0.51 for a, b in zip(times, times[1:], strict=False)), times


@pytest.mark.parametrize("step_s", [0.03, 0.28, 0.7])
def test_a_jobs_energy_on_the_ina3221_is_the_truth_whatever_its_steps(step_s):
    """The daemon's own meter of a job takes its sampler's reads alone: reads at the steps' ends, integrated, bent
    the energy by 1-2% on steps of 0.2-0.7 s (in phase with the sensor's 140 ms average). From an idle board."""
    from governor.sim.meters import MeteredSteps

    for seed in range(3):
        m = MeteredSteps("ina3221", seed)
        m.trace.append(5.0, POWER_W / 3)
        start_j = m.trace.energy_j(m.time_s)
        for _ in range(int(60 / step_s)):
            m.points(POWER_W * step_s, step_s)
        assert m.job_energy_j() == pytest.approx(m.trace.energy_j(m.time_s) - start_j, rel=0.004)


def test_a_step_sequence_is_each_steps_time_and_energy_over_the_runs_means_from_the_counters_updates():
    """A counter updating every 100 ms on a run whose power steps from 200 W to 400 W at 1 s, steps of 50 ms then
    100 ms: each step's energy is the counter interpolated between its updates, relative to the mean step's."""
    from governor.sim.meters import StepSequence

    def energy_j(t):
        return 200.0 * min(t, 1.0) + 400.0 * max(0.0, t - 1.0)

    updates = [(k / 10, energy_j(k / 10)) for k in range(21)]
    ends = [0.05 * k for k in range(21)] + [1.0 + 0.1 * k for k in range(1, 11)]
    seq = StepSequence.from_readings("two levels", ends, updates)
    assert len(seq) == 30
    mean_s, mean_j = 2.0 / 30, energy_j(2.0) / 30
    assert seq.time_rel[0] == pytest.approx(0.05 / mean_s) and seq.time_rel[-1] == pytest.approx(0.1 / mean_s)
    assert seq.energy_rel[0] == pytest.approx(10.0 / mean_j) and seq.energy_rel[-1] == pytest.approx(40.0 / mean_j)
    with pytest.raises(ValueError, match="updates"):
        StepSequence.from_readings("one update", ends, updates[:1])
    with pytest.raises(ValueError, match="steps within"):
        StepSequence.from_readings("no steps", [5.0, 6.0], updates)


def test_the_h200s_steps_correlate_as_the_models_do_not_and_the_replay_keeps_it():
    """The recorded runs' successive steps correlate (waits on the host, the SM clock held): lag-1 autocorrelation
    of their times +0.2 to +0.5, so their 50-step means drift by several percent, where independent steps of the same
    scatter would drift by about 2%. The replay meter's steps carry that, in the runs' order, at the level's J/step
    and s/step on average, and jump to a random point of a random run at a run's end (no period)."""
    from governor.sim.meters import ReplaySteps
    from governor.sim.tuned_job import h200_sequences

    def lag1(xs):
        m = statistics.fmean(xs)
        return sum((a - m) * (b - m) for a, b in zip(xs, xs[1:], strict=False)) / sum((x - m) ** 2 for x in xs)

    sequences = h200_sequences()
    assert sorted(len(s) // 100 for s in sequences) == [3, 3, 3, 19, 19, 19]  # 400 steps, 2,000 steps
    for s in sequences:
        assert 0.15 < lag1(s.time_rel) < 0.6
        blocks = [statistics.fmean(s.energy_rel[i:i + 50]) for i in range(0, len(s) - 49, 50)]
        assert max(blocks) - min(blocks) > 0.04
        assert statistics.fmean(s.time_rel) == pytest.approx(1.0) and statistics.fmean(s.energy_rel) == pytest.approx(1)
    steps = ReplaySteps(seed=5, sequences=sequences)
    first, start, direction = steps.sequence, steps._next, steps._direction
    durations, energies = [], []
    for _ in range(20_000):
        t0, e0 = steps.time_s, steps.trace.energy_j(steps.time_s)
        steps.points(J_PER_STEP, STEP_S)
        durations.append((steps.time_s - t0) / STEP_S)
        energies.append((steps.trace.energy_j(steps.time_s) - e0) / J_PER_STEP)
    ahead = [first.time_rel[start + direction * k] for k in range(10)]
    assert durations[:10] == pytest.approx(ahead)  # the run's own steps, in its order
    assert statistics.fmean(durations) == pytest.approx(1.0, abs=0.02)
    assert statistics.fmean(energies) == pytest.approx(1.0, abs=0.02)
    assert 0.15 < lag1(durations) < 0.6
    # No period: 4,000 steps apart (two passes of a 2,000-step run, five of a 400-step one) the replay differs.
    assert sum(abs(a - b) > 1e-9 for a, b in zip(durations, durations[4000:], strict=False)) > 10_000
