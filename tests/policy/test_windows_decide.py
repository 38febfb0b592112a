"""Windows that close once their comparison is decided (WindowRule.decide_z), the job's first window, the steps'
scatter carried from window to window, and the first stride of a walk that leaves an end of the table."""

from __future__ import annotations

import math

import pytest

from governor.policy.search import EXPLORING_PHASES
from governor.policy.tuner import OnlineTuner, ProbeWindow, Reference, TuningError, TuningSession, WindowRule
from governor.policy.windows import StepScatter, step_scatter, window_noise_rel
from governor.sim.meters import PowerTrace, UpdateClock, append_step, held_energy_j, step_times_s
from tests.policy.test_windows import nvml_job as windows_job

STEP_S = 0.1
POWER_W = 300.0
JOULES = STEP_S * POWER_W  # a step's energy at POWER_W


def nvml_job(steps: int, power_w: float = POWER_W, **kwargs):
    """Reports of a job of STEP_S steps at ``power_w`` on the simulated NVML meter (tests/policy/test_windows.py)."""
    return windows_job(STEP_S, steps, power_w=power_w, **kwargs)


def close(reports, rule, **window):
    w = ProbeWindow(None, 0, 0, rule=rule, **window)
    for report in reports:
        m = w.feed(*report)
        if m is not None:
            return m
    raise AssertionError("the window never closed")


@pytest.mark.parametrize("ratio", [1.6, 1 / 1.6])
def test_a_window_far_from_its_reference_closes_early(ratio):
    """40-60% away from a reference known to 2%: decided within a few steps, long before the rule's target."""
    rule = WindowRule()
    reports = nvml_job(400, POWER_W * ratio, seed=1)
    full = close(reports, rule)
    for seed in range(5):
        early = close(nvml_job(400, POWER_W * ratio, seed=seed), rule, reference=Reference(JOULES, 0.02))
        assert early.measured_steps < full.measured_steps / 2, (early, full)
        assert early.measured_steps >= rule.decide_min_steps
        assert early.duration_s >= rule.min_updates * rule.meter_update_s
        # What it says is the window's own uncertainty, larger than a full window's, and its estimate is within it.
        assert early.noise_rel > full.noise_rel
        assert abs(math.log(early.joules_per_step / (JOULES * ratio))) < 4 * early.noise_rel
        assert abs(math.log(early.joules_per_step / JOULES)) >= rule.decide_z * math.hypot(early.noise_rel, 0.02)


def test_a_near_tie_runs_to_the_rules_target():
    """2% from the reference: no early decision; the window is the one it would be without a reference."""
    rule = WindowRule()
    for seed in range(5):
        reports = nvml_job(400, POWER_W * 1.02, seed=seed)
        tie = close(reports, rule, reference=Reference(JOULES, 0.02))
        assert tie == close(reports, rule)
        assert tie.duration_s >= rule.shortest_s and (tie.noise_rel <= rule.target_rel or tie.duration_s >= rule.max_s)


def test_a_reference_known_loosely_decides_nothing_it_cannot_tell():
    """The reference's own uncertainty counts: 40% away from one known to 20% is not 3 s.d. of the difference."""
    rule = WindowRule()
    reports = nvml_job(400, POWER_W * 1.4, seed=2)
    assert close(reports, rule, reference=Reference(JOULES, 0.2)) == close(reports, rule)


def test_an_exploring_window_that_reads_above_closes_at_explore_z():
    """12% above a reference known to 2%: an exploring window closes once 1.5 s.d. of the difference say so, before
    the same window would at decide_z; reading 12% below, it keeps decide_z."""
    rule = WindowRule()
    for seed in range(5):
        above = nvml_job(400, POWER_W * 1.12, seed=seed)
        strict = close(above, rule, reference=Reference(JOULES, 0.02))
        loose = close(above, rule, reference=Reference(JOULES, 0.02, exploring=True))
        assert loose.measured_steps < strict.measured_steps, (loose, strict)
        gap = math.log(loose.joules_per_step / JOULES)
        assert gap >= rule.explore_z * math.hypot(loose.noise_rel, 0.02) and gap < rule.decide_z * math.hypot(
            loose.noise_rel, 0.02)
        below = nvml_job(400, POWER_W / 1.12, seed=seed)
        assert (close(below, rule, reference=Reference(JOULES, 0.02, exploring=True))
                == close(below, rule, reference=Reference(JOULES, 0.02)))


def test_explore_z_is_at_most_decide_z_and_positive():
    rule = WindowRule(decide_z=1.0, explore_z=2.0)
    reports = nvml_job(400, POWER_W * 1.12, seed=1)
    assert (close(reports, rule, reference=Reference(JOULES, 0.02, exploring=True))
            == close(reports, rule, reference=Reference(JOULES, 0.02)))
    with pytest.raises(TuningError, match="explore_z"):
        WindowRule(explore_z=0.0)


def test_decide_z_zero_never_closes_early():
    rule = WindowRule(decide_z=0.0)
    reports = nvml_job(400, POWER_W * 2.0, seed=3)
    assert close(reports, rule, reference=Reference(JOULES, 0.01)) == close(reports, rule)


def test_the_first_window_closes_at_the_rules_least_length():
    """Nothing measured to compare it with: the rule's minimums, whatever its uncertainty."""
    rule = WindowRule()
    m = close(nvml_job(400, seed=4), rule, least=True)
    assert m.duration_s == pytest.approx(rule.shortest_s, abs=2 * STEP_S)
    assert m.measured_steps >= max(rule.min_steps, rule.decide_min_steps)
    assert m.noise_rel > rule.target_rel  # ten steps that scatter by 15%


def test_the_jobs_step_scatter_keeps_a_few_calm_steps_from_closing_a_window():
    """Five long steps that happen to agree say little of the steps' scatter: the job's earlier windows, whose steps
    scattered by 15%, make the window's uncertainty what those steps would give."""
    calm = [(n, 30.0 * n, 1.0 * n + 0.001 * (n % 2)) for n in range(6)]  # 1 s steps within 0.1% of each other
    rule = WindowRule(prior_rel=1e-9)
    steady = window_noise_rel(calm, rule, StepScatter(1e-6, 200.0))  # a job whose windows showed calm steps
    prior = StepScatter(0.15 ** 2, 200.0)
    pooled = window_noise_rel(calm, rule, prior)
    assert steady < 0.015
    # 4 intervals of their own against the prior's 20 (STEP_PRIOR_MAX_DOF): most of 15% / sqrt(5) steps
    assert 0.8 * 0.15 / math.sqrt(5) < pooled < 0.15 / math.sqrt(5)
    # A job's first window, nothing shown yet: its steps are taken to scatter as the H200's did (UNKNOWN_STEPS,
    # two intervals' worth against its own four).
    assert 0.5 * 0.15 / math.sqrt(5) < window_noise_rel(calm, rule) < pooled


def test_the_unknown_steps_prior_fades_as_the_jobs_windows_show_their_steps():
    """UNKNOWN_STEPS guards a job's first windows; once its windows have shown STEP_PRIOR_MAX_DOF intervals of
    steps that run alike, they alone are the prior (on a real H100's 0.5 s steps a prior that never faded kept
    windows a third longer than their noise needed)."""
    from governor.policy.windows import STEP_PRIOR_MAX_DOF, UNKNOWN_STEPS, with_unknown_steps

    assert with_unknown_steps(None) == UNKNOWN_STEPS == with_unknown_steps(StepScatter(0.0, 0.0))
    calm = 0.03 ** 2
    early, later = (with_unknown_steps(StepScatter(calm, d)) for d in (4.0, STEP_PRIOR_MAX_DOF / 2))
    assert UNKNOWN_STEPS.var > early.var > later.var > calm
    assert with_unknown_steps(StepScatter(calm, STEP_PRIOR_MAX_DOF)) == StepScatter(calm, STEP_PRIOR_MAX_DOF)


def test_step_scatter_reads_the_steps_cv_off_the_intervals():
    reports = nvml_job(2000, seed=5, cv=0.15)
    s = step_scatter(reports)
    assert s.dof == 1999 and math.sqrt(s.var) == pytest.approx(0.15, rel=0.1)


LEVELS = tuple(300_000_000 + 100_000_000 * k for k in range(12))


def test_the_tuner_names_the_estimate_a_window_is_compared_with():
    tuner = OnlineTuner(LEVELS, LEVELS[6])
    assert tuner.window_reference(LEVELS[6]) is None  # nothing measured
    tuner.observe(LEVELS[6], 2.0, 0.1, noise_rel=0.05)
    ref = tuner.window_reference(LEVELS[5])
    # the search's next window walks down from the start: it only ranks that level against the incumbent
    assert tuner.state()["phase"] == "descend"
    assert ref == Reference(pytest.approx(2.0), pytest.approx(0.05), exploring=True)
    assert tuner.window_reference(LEVELS[6]) is None  # the incumbent's own window: compared with its neighbours
    assert OnlineTuner(LEVELS, LEVELS[6], max_slowdown=0.1).window_reference(LEVELS[5]) is None


def test_only_the_searchs_exploring_windows_compare_loosely():
    """Through a whole search and its follow-up: a window's reference is exploring exactly in the search's exploring
    phases (descend, beyond, far); refine, confirm and the follow-up's windows compare at decide_z."""
    energy = [2.2, 1.7, 1.4, 1.2, 1.08, 1.02, 1.0, 1.01, 1.04, 1.1, 1.18, 1.3]
    tuner = OnlineTuner(LEVELS, LEVELS[-1], follow_up=True, total_steps=100_000)
    seen = set()
    for _ in range(40):
        phase = tuner.state()["phase"]
        hz = tuner.next_level_hz()
        ref = tuner.window_reference(hz)
        if ref is not None:
            assert ref.exploring == (phase in EXPLORING_PHASES), (phase, ref)
            seen.add((phase, ref.exploring))
        tuner.observe(hz, energy[LEVELS.index(hz)], 0.1)
    assert tuner.converged and {p for p, _ in seen} >= {"descend", "refine", "confirm", "done"}, seen


def test_a_session_closes_windows_at_far_levels_early_and_near_ones_late():
    """One job on a steep curve through the daemon's session: the windows at levels far above the minimum it finds
    are shorter in time than those within a few percent of it."""
    energy = [2.2, 1.7, 1.4, 1.2, 1.08, 1.02, 1.0, 1.01, 1.04, 1.1, 1.18, 1.3]
    tuner = OnlineTuner(LEVELS, LEVELS[0], follow_up=False)
    clock, trace = UpdateClock(seed=6), PowerTrace(0.0)
    times = step_times_s(1.0, 6, 0.15)  # scaled per level below
    session = TuningSession(tuner, 0, 1, rule=WindowRule(), meter_update_s=0.1, total_steps=20_000)
    windows, n = [], 0
    while not session.converged and n < 20_000:
        i = LEVELS.index(session.measuring_hz)
        append_step(trace, STEP_S * next(times), POWER_W * energy[i])
        n += 1
        m = session.on_progress(n, held_energy_j(trace, clock, trace.end_s), trace.end_s)
        if m is not None:
            windows.append((energy[LEVELS.index(m.level_hz)], m.duration_s))
    assert session.converged and energy[LEVELS.index(tuner.best_hz)] <= 1.02
    far = [d for e, d in windows[1:] if e >= 1.15]  # the first (the start) closes at the least length
    near = [d for e, d in windows if e <= 1.02]
    assert far and near and max(far) < min(near), windows


def test_a_walk_from_an_end_of_the_table_strides_a_quarter_of_it():
    for start, first in ((0, 3), (len(LEVELS) - 1, len(LEVELS) - 1 - 3)):
        tuner = OnlineTuner(LEVELS, LEVELS[start])
        tuner.observe(LEVELS[start], 3.0, 0.1)
        assert tuner.next_level_hz() == LEVELS[first]  # ceil(11 / 4) levels on
