"""Windows sized by time and by their own noise (WindowRule), and the tuner weighing each window by its own
uncertainty."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from governor.policy.tuner import OnlineTuner, ProbeWindow, TuningError, TuningSession, WindowRule
from governor.policy.windows import (
    StepScatter,
    UpdateEdges,
    edge_joules_per_step,
    steps_at,
    summed_noise_rel,
    window_noise_rel,
)
from governor.sim import meters
from governor.sim.meters import PowerTrace, UpdateClock, append_step, held_energy_j, step_times_s


def nvml_job(step_s: float, steps: int, seed: int = 0, cv: float = 0.15, power_w: float = 300.0):
    """Reports (steps, energy_j, time_s) of a job on the simulated NVML meter, at every step's end."""
    clock, trace, times = UpdateClock(seed=seed), PowerTrace(0.0), step_times_s(step_s, seed, cv)
    reports = [(0, 0.0, 0.0)]
    for n in range(1, steps + 1):
        append_step(trace, next(times), power_w)
        reports.append((n, held_energy_j(trace, clock, trace.end_s), trace.end_s))
    return reports


def first_window(reports, rule, step_prior=None):
    w = ProbeWindow(None, 0, 0, rule=rule, step_prior=step_prior)
    for n, e, t in reports:
        m = w.feed(n, e, t)
        if m is not None:
            return m
    return None


def test_a_window_spans_its_minimum_time_updates_and_steps_before_it_may_close():
    rule = WindowRule(target_rel=0.5, min_s=1.0, min_updates=20, meter_update_s=0.1, min_steps=3)
    m = first_window(nvml_job(0.025, 400, cv=0.0), rule)  # any window is within 50%: the minimums decide
    assert m.duration_s == pytest.approx(2.0, abs=0.026)  # 20 updates of 100 ms, more than min_s
    m = first_window(nvml_job(0.9, 10, cv=0.0), WindowRule(target_rel=0.5, min_steps=3))
    assert m.measured_steps == 3


def test_short_steps_get_long_windows_in_steps_and_long_steps_short_ones():
    """Steps scattering by 2%, once the job's windows have shown it (their pooled scatter, the session's prior)."""
    rule = WindowRule(meter_update_s=0.14)
    known = StepScatter(0.02 ** 2, 40.0)
    short = first_window(nvml_job(0.025, 2000, cv=0.02), rule, known)
    long = first_window(nvml_job(0.5, 200, cv=0.02), rule, known)
    assert short.measured_steps >= 60 and long.measured_steps <= 8, (short, long)
    assert short.noise_rel <= rule.target_rel and long.noise_rel <= rule.target_rel
    # A job's first steps are taken to scatter as the H200's did until they say otherwise (UNKNOWN_STEPS): longer.
    assert first_window(nvml_job(0.5, 200, cv=0.02), rule).measured_steps > long.measured_steps


def test_a_few_long_steps_that_ran_alike_do_not_close_a_window_on_the_rails():
    """Windows on the meter's updates count no held ends: what keeps three calm steps of a job that has shown
    nothing yet from closing at the target is the prior on its steps (UNKNOWN_STEPS)."""
    rule = WindowRule(meter_update_s=0.14).on_updates()
    calm = [(n, 150.0 * n, 0.5 * n) for n in range(4)]  # three steps exactly alike, read exactly
    assert window_noise_rel(calm, rule) > 2 * rule.target_rel
    assert window_noise_rel(calm, rule, StepScatter(0.0, 0.0)) == window_noise_rel(calm, rule)


def test_noisier_steps_make_longer_windows_up_to_the_cap():
    rule = WindowRule(max_s=6.0)
    steady = first_window(nvml_job(0.3, 200, cv=0.02), rule)
    noisy = first_window(nvml_job(0.3, 200, cv=0.4), rule)
    assert noisy.measured_steps > steady.measured_steps
    capped = first_window(nvml_job(0.3, 200, cv=0.8), rule)
    assert capped.duration_s == pytest.approx(6.0, abs=1.0) and capped.noise_rel > rule.target_rel


def test_the_meters_ends_alone_give_the_stated_uncertainty():
    """An exact step clock and steady power: what is left is the held counter's ends, update / (T sqrt 6), and the
    prior, which shrinks with the window's length."""
    rule = WindowRule(prior_rel=1e-9)
    reports = [(n, 10.0 * n, 0.1 * n) for n in range(101)]  # 10 s, exact
    exact = StepScatter(0.0, 1000.0)  # the job's steps known to run alike
    assert window_noise_rel(reports, rule, exact) == pytest.approx(0.1 / (10.0 * math.sqrt(6)), rel=0.01)


def test_ends_on_the_meters_updates_count_no_held_counter():
    """Edges on the counter's update instants (or the rails' samples): the energy at each end is the meter's own, so
    the same exact, steady window states nothing for its ends; windows a session opens once told so are sized alike,
    and shorter on a steady job than with held ends."""
    held = WindowRule(prior_rel=1e-9)
    reports = [(n, 10.0 * n, 0.1 * n) for n in range(101)]
    assert held.on_updates().held_ends is False and held.on_updates().on_updates() == held.on_updates()
    exact = StepScatter(0.0, 1000.0)
    assert window_noise_rel(reports, held.on_updates(), exact) < 1e-3 < window_noise_rel(reports, held, exact)
    trace, times = PowerTrace(0.0), step_times_s(0.05, 0, 0.02)  # a steady job, its energy read exactly
    exact = [(0, 0.0, 0.0)]
    for n in range(1, 401):
        append_step(trace, next(times), 300.0)
        exact.append((n, trace.energy_j(trace.end_s), trace.end_s))
    rule = WindowRule()
    on_updates, held_ends = first_window(exact, rule.on_updates()), first_window(exact, rule)
    assert on_updates.duration_s < 0.8 * held_ends.duration_s
    assert on_updates.joules_per_step == pytest.approx(held_ends.joules_per_step, rel=0.02)


def test_a_counter_that_has_not_moved_yet_keeps_the_window_open():
    """Held counter, 25 ms steps: the first reports see no update; a rule window waits, it does not fail."""
    rule = WindowRule(min_s=0.05, min_updates=0, min_steps=2, target_rel=0.9, meter_update_s=0.01)
    w = ProbeWindow(None, 0, 0, rule=rule)
    w.feed(0, 5.0, 0.0)
    assert w.feed(2, 5.0, 0.05) is None and w.feed(3, 5.0, 0.075) is None
    assert w.feed(5, 6.0, 0.125) is not None


@pytest.mark.parametrize("bad", [{"target_rel": 0}, {"min_s": -1}, {"max_s": 0.5, "min_s": 1.0},
                                 {"sub_windows": 1}, {"meter_update_s": -0.1}, {"min_steps": 0}])
def test_bad_rules_are_refused_with_a_clear_error(bad):
    with pytest.raises(TuningError):
        WindowRule(**bad)


LEVELS = tuple(300_000_000 + 100_000_000 * k for k in range(10))
CURVE = dict(zip(LEVELS, (1.30, 1.18, 1.09, 1.04, 1.00, 1.03, 1.07, 1.13, 1.20, 1.28), strict=True))


def windows_to_converge(noise_rel, seed=0):
    """Windows the tuner takes on a fixed curve whose windows scatter by 3%, told each window's uncertainty."""
    rng = random.Random(seed)
    tuner = OnlineTuner(LEVELS, LEVELS[7])
    while not tuner.converged:
        hz = tuner.next_level_hz()
        tuner.observe(hz, CURVE[hz] * math.exp(rng.gauss(0, 0.03)), 0.1, noise_rel=noise_rel)
    return tuner.probes


def test_the_tuner_weighs_each_window_by_its_own_uncertainty():
    """Windows that say they are noisier than noise_rel are confirmed more; windows that say nothing, or less than
    the floor, count as noise_rel."""
    plain = [windows_to_converge(None, seed) for seed in range(10)]
    assert [windows_to_converge(0.01, seed) for seed in range(10)] == plain  # floored at noise_rel
    assert [windows_to_converge(0.03, seed) for seed in range(10)] == plain
    noisy = [windows_to_converge(0.09, seed) for seed in range(10)]
    assert sum(noisy) > sum(plain) + 10, (plain, noisy)


def test_a_session_with_a_rule_converges_and_prices_windows_by_the_steps_they_took():
    reports = nvml_job(0.025, 30000, seed=3)
    tuner = OnlineTuner(LEVELS, LEVELS[4])
    rule = WindowRule()
    session = TuningSession(tuner, 0, 1, rule=rule)
    windows = []
    for n, e, t in reports[1:]:
        m = session.on_progress(n, e, t)
        if m is not None:
            windows.append(m)
            # at least the rule's least time; a window decided early (exploring, above the incumbent) as few updates
            assert m.noise_rel is not None and m.duration_s >= rule.min_updates * rule.meter_update_s
        if session.converged:
            break
    assert session.converged and windows
    assert tuner.probe_steps > 40  # priced from the windows' own steps (about 2 s of 25 ms steps), not 4 + 1


def test_a_window_started_over_after_a_delayed_pin_keeps_the_rule():
    """A probe's pin may wait for the GPU's re-pin interval; the window then starts over where the pin lands. It
    must still be sized by the rule, not fall back to the fixed 4 steps (a 0.12 s window was seen in the daemon)."""
    rule = WindowRule(min_s=0.4, max_s=0.8, min_updates=1)
    session = TuningSession(OnlineTuner([510_000_000, 612_000_000, 714_000_000], 612_000_000), 0, 1, rule=rule)
    session.repinned(10)
    energy_j, closed = 0.0, None
    for step in range(11, 60):
        energy_j += 1.0
        closed = session.on_progress(step, energy_j, step * 0.03)
        if closed is not None:
            break
    assert closed is not None and closed.measured_steps * 0.03 >= 0.4 - 1e-9, closed


def test_update_edges_find_nvmls_update_instants_from_reads_at_the_steps_pace():
    """Reads at every step end (26 ms steps scattering by 15%) of the simulated NVML counter: each read that sees the
    counter move brackets an update; within a second the grid of updates is known to a few ms, and each edge's
    energy is the counter's exact value there."""
    clock = meters.UpdateClock(seed=3)
    trace = meters.PowerTrace(0.0)
    edges = UpdateEdges(meters.NVML_UPDATE_S, meters.NVML_UPDATE_JITTER_S)
    t = 0.0
    for step_s in itertools.islice(meters.step_times_s(0.026, seed=5), 150):
        meters.append_step(trace, step_s, 400.0)
        t += step_s
        edges.read(t, meters.held_energy_j(trace, clock, t))
    found = edges.take_until(t)
    assert len(found) >= 35 and edges.phase_width_s < 0.006
    late = [(s, e) for s, e in found if s > 1.0]
    for s, e in late:
        true_s = clock.last_at(s + 0.01)
        assert abs(s - true_s) <= 0.005 and e == pytest.approx(trace.energy_j(true_s)), (s, true_s)


def test_windows_on_update_instants_count_steps_from_their_ends_and_read_the_true_energy_per_step():
    clock = meters.UpdateClock(seed=1)
    trace = meters.PowerTrace(0.0)
    edges = UpdateEdges(meters.NVML_UPDATE_S, meters.NVML_UPDATE_JITTER_S)
    reports, t = [(0, 0.0)], 0.0
    for n, step_s in enumerate(itertools.islice(meters.step_times_s(0.026, seed=2), 400), start=1):
        meters.append_step(trace, step_s, 300.0 if n <= 200 else 450.0)
        t += step_s
        reports.append((n, t))
        edges.read(t, meters.held_energy_j(trace, clock, t))
    found = [(s, e) for s, e in edges.take_until(t) if 1.0 < s < t - 0.1]
    for (s0, e0), (s1, e1) in zip(found, found[2:], strict=False):  # 200 ms windows, edge to edge
        steps = steps_at(s1, reports) - steps_at(s0, reports)
        true_j = trace.energy_j(s1) - trace.energy_j(s0)
        assert edge_joules_per_step((s0, e0), (s1, e1), reports) == pytest.approx(true_j / steps, rel=0.04)


def _timed_reads(clock, trace, power_w: float, edges: UpdateEdges, t_s: float, until_s: float) -> tuple[float, int]:
    """Read the simulated NVML counter at the instants edges.next_read_s asks for, under a constant load."""
    reads = 0
    while t_s < until_s:
        nxt = edges.next_read_s(t_s)
        trace.append(nxt - t_s, power_w)
        t_s = nxt
        edges.read(t_s, meters.held_energy_j(trace, clock, t_s))
        reads += 1
    return t_s, reads


def test_timed_reads_find_the_update_grid_within_half_a_second_where_reports_at_its_pace_never_do():
    """Reports at the counter's own pace (10 a second, just after each update, as the HF callback's were on an H200)
    leave the grid unknown; the daemon's timer reads at the instants next_read_s gives find it to 10 ms within half
    a second, then follow it with about 3 reads a second (a read of NVML's counter costs milliseconds of CPU), each
    edge at its true instant with the counter's value, two a second."""
    clock = meters.UpdateClock(seed=4, origin_s=0.0371)
    paced = UpdateEdges(meters.NVML_UPDATE_S, meters.NVML_UPDATE_JITTER_S)
    trace = meters.PowerTrace(0.0)
    for k in range(1, 50):  # reports 100 ms apart, 1 ms after each update
        t = 0.0381 + 0.1 * k
        trace.append(t - trace.end_s, 300.0)
        paced.read(t, meters.held_energy_j(trace, clock, t))
    assert paced.phase_width_s is None or paced.phase_width_s > 0.01

    edges = UpdateEdges(meters.NVML_UPDATE_S, meters.NVML_UPDATE_JITTER_S, every_s=0.5)
    trace = meters.PowerTrace(0.0)
    t, _ = _timed_reads(clock, trace, 300.0, edges, 0.0, 0.5)
    assert edges.phase_width_s is not None and edges.phase_width_s <= 0.01
    edges.take_until(t)
    t, reads = _timed_reads(clock, trace, 300.0, edges, t, t + 10.0)
    assert reads <= 10 * 3.5, reads
    found = edges.take_until(t)
    assert len(found) >= 19, found
    for s, e in found:
        true_s = clock.last_at(s + 0.006)
        assert abs(s - true_s) <= 0.006 and e == pytest.approx(trace.energy_j(true_s)), (s, true_s)


def test_timed_reads_follow_a_grid_that_drifts():
    """The counter's clock and CLOCK_MONOTONIC drift apart (here 0.5 ms a second; the H200 traces' grid, fitted over
    33 s, moved 0.1 ms a second at most): the checking reads see the update outside the interval, the phase is
    found again, and the edges stay on the updates."""
    clock = meters.UpdateClock(period_s=0.10005, jitter_s=0.0005, seed=2)
    edges = UpdateEdges(meters.NVML_UPDATE_S, meters.NVML_UPDATE_JITTER_S, every_s=0.5)
    trace = meters.PowerTrace(0.0)
    t, _ = _timed_reads(clock, trace, 250.0, edges, 0.0, 60.0)
    late = [(s, e) for s, e in edges.take_until(t) if s > 20.0]
    assert len(late) >= 70, late
    off = sorted(abs(s - clock.last_at(s + 0.006)) for s, _ in late)
    assert off[int(0.9 * len(off))] <= 0.006, off


def test_a_rule_capped_in_steps_closes_there_whatever_its_uncertainty():
    """The baseline window's share of a job of known length (TunerConfig.baseline_max_share)."""
    rule = WindowRule(target_rel=0.001, min_s=0.5, max_s=100.0, min_steps=5, max_steps=40, meter_update_s=0.0)
    w = ProbeWindow(None, 0, 0, rule=rule)
    rng = random.Random(2)
    n, e, t, m = 0, 0.0, 0.0, None
    w.feed(n, e, t)
    while m is None:
        dt = rng.uniform(0.05, 0.15)
        n, e, t = n + 1, e + 10 * dt, t + dt
        m = w.feed(n, e, t)
    assert m.measured_steps == 40 and m.noise_rel > rule.target_rel
    with pytest.raises(TuningError, match="max_steps"):
        WindowRule(min_steps=10, max_steps=5)


def test_the_pieces_of_one_step_count_as_one_observation_of_the_steps_scatter():
    """The rails' sampler reads every 140 ms; steps of 0.5 s are read in pieces, each counted at its step's own pace.
    Five pieces of a step tell the scatter no more than the whole step: counted as five observations, a window of long
    steps read its noise as half what it was (its windows' errors were 2.1 times their stated s.d.)."""
    from governor.policy.windows import Intervals

    rng = random.Random(5)
    whole, pieces = Intervals(), Intervals()
    for _ in range(400):
        step_s = 0.5 * rng.gammavariate(1 / 0.15 ** 2, 0.15 ** 2)  # CV 15%
        whole.add(1.0, step_s)
        for _ in range(5):
            pieces.add(0.2, step_s / 5)
    assert whole.scatter().var ** 0.5 == pytest.approx(0.15, rel=0.15)
    assert pieces.scatter().var == pytest.approx(whole.scatter().var, rel=1e-9)
    assert pieces.scatter().dof == pytest.approx(whole.scatter().dof) and whole.scatter().dof == 399


def test_a_window_sized_before_it_opens_is_the_rules_a_window_behind():
    """WindowRule.next_steps (a group across nodes: the ranks agree on a window's end before it comes): at least the
    rule's shortest time and steps, as long as the last window's uncertainty says the target needs, within max_s."""
    rule = WindowRule(target_rel=0.02, min_s=1.0, max_s=10.0, min_updates=5, meter_update_s=0.1, min_steps=2)
    assert rule.next_steps(0.025, 8, None) == 40  # 1 s of 25 ms steps
    assert rule.next_steps(0.025, 40, 0.04) == 160  # twice the target: four times the steps
    assert rule.next_steps(0.025, 160, 0.01) == 40  # calmer than the target: back to the shortest
    assert rule.next_steps(0.025, 8, 0.5) == 400  # the cap: 10 s
    assert rule.next_steps(2.0, 8, 0.01, least=8) == 8  # never under least, even past max_s
    assert rule.next_steps(0.0, 8, 0.01) == 2  # no step time yet: the least
    assert WindowRule(max_steps=100).next_steps(0.025, 8, 0.5) == 100


def test_a_sums_uncertainty_is_its_parts_weighted_as_if_they_moved_together():
    assert summed_noise_rel([(1.0, 0.02), (3.0, 0.04)]) == pytest.approx((0.02 + 3 * 0.04) / 4)
    assert summed_noise_rel([(1.0, 0.02), (1.0, None)]) is None  # a part without one: unknown
    assert summed_noise_rel([]) is None
