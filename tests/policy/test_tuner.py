"""Pure tests of the online tuner against synthetic U-shaped energy curves with seeded noise."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.errors import FtgovError
from governor.policy.tuner import (
    DEFAULT_MAX_PROBES,
    DEFAULT_WARMUP_STEPS,
    DEFAULT_WINDOW_STEPS,
    OnlineTuner,
    ProbeWindow,
    TuningError,
    TuningSession,
    WindowRule,
)

# The JetPack 6 AGX Orin table (governor/sim/tree.py).
LEVELS = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000, 1122000000,
          1224000000, 1300500000)


class Curve:
    """A job on a synthetic GPU: t(f) = fixed + compute/f, energy = static power x time + dynamic energy rising with f.

    ``opt_ghz`` places the minimum of the continuous energy curve; ``depth`` sets how steep the U is.
    """

    def __init__(self, opt_ghz: float, fixed_s: float = 0.1, compute_s_ghz: float = 0.2, depth: float = 1.0):
        self.fixed_s, self.compute_s_ghz = fixed_s, compute_s_ghz
        self.static_w = 10.0 * depth
        # d/df [static * compute / f + k f^2] = 0 at opt_ghz  ->  k = static * compute / (2 opt^3)
        self.k = self.static_w * compute_s_ghz / (2 * opt_ghz ** 3)

    def seconds(self, hz: int) -> float:
        return self.fixed_s + self.compute_s_ghz / (hz / 1e9)

    def joules(self, hz: int) -> float:
        ghz = hz / 1e9
        return self.static_w * self.seconds(hz) + self.k * ghz ** 2 + 2.0

    def best(self, max_slowdown=None) -> int:
        feasible = [hz for hz in LEVELS
                    if max_slowdown is None or self.seconds(hz) <= (1 + max_slowdown) * self.seconds(LEVELS[-1])]
        return min(feasible, key=self.joules)


def run_tuner(curve: Curve, start_hz: int, rng: random.Random, noise: float, window_steps: int = 1,
              **kwargs) -> OnlineTuner:
    """Tune against the curve; each window averages window_steps steps, each with relative noise ``noise``."""
    if noise == 0.0:  # tell the tuner its measurements are exact, or it spends its budget confirming them
        kwargs.setdefault("noise_rel", 1e-9)
    tuner = OnlineTuner(LEVELS, start_hz, **kwargs)
    while not tuner.converged:
        hz = tuner.next_level_hz()
        joules = statistics.mean(curve.joules(hz) * (1 + rng.gauss(0, noise)) for _ in range(window_steps))
        seconds = statistics.mean(curve.seconds(hz) * (1 + rng.gauss(0, noise)) for _ in range(window_steps))
        tuner.observe(hz, joules, seconds)
    return tuner


def regret(curve: Curve, hz: int, max_slowdown=None) -> float:
    return curve.joules(hz) / curve.joules(curve.best(max_slowdown)) - 1


def test_noise_free_start_at_the_optimum_checks_past_the_first_rise_on_each_side():
    # Two rising levels make a wall on each side; then one look as far again past each wall, for a dip behind a hump.
    # The start, one window clearly below both its measured neighbours, is measured once more.
    curve = Curve(0.7)
    tuner = run_tuner(curve, curve.best(), random.Random(0), noise=0.0)
    assert tuner.best_hz == curve.best()
    assert tuner.probes == 8
    assert {LEVELS.index(e["freq_hz"]) for e in tuner.state()["estimates"]} == {1, 2, 3, 4, 5, 6, 8}


def test_noise_free_descent_walks_to_the_minimum_without_sweeping():
    curve = Curve(0.95)
    assert curve.best() == 918000000
    tuner = run_tuner(curve, 408000000, random.Random(0), noise=0.0)
    assert tuner.best_hz == 918000000
    measured = {e["freq_hz"] for e in tuner.state()["estimates"]}
    assert len(measured) < len(LEVELS)  # it walks and looks past the walls, but does not sweep the table
    assert tuner.state()["phase"] == "done" and "every side closed" in tuner.state()["reason"]


def tuning_regrets(noise: float, window_steps: int, seed: int) -> tuple[list[float], list[int]]:
    """Regret of the converged level over U curves with minima across the table, starts up to two levels off."""
    rng = random.Random(seed)
    regrets, probes = [], []
    for opt_ghz in (0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 1.05):
        for depth in (0.5, 1.0, 2.0):
            curve = Curve(opt_ghz, depth=depth)
            best_i = LEVELS.index(curve.best())
            for offset in (-2, -1, 0, 1, 2):
                start = LEVELS[min(max(best_i + offset, 0), len(LEVELS) - 1)]
                for _ in range(4):
                    tuner = run_tuner(curve, start, rng, noise, window_steps)
                    regrets.append(regret(curve, tuner.best_hz))
                    probes.append(tuner.probes)
    return regrets, probes


def test_converges_near_the_minimum_under_three_percent_step_noise():
    regrets, probes = tuning_regrets(noise=0.03, window_steps=DEFAULT_WINDOW_STEPS, seed=6)
    assert statistics.mean(regrets) < 0.005
    assert max(regrets) < 0.04
    assert statistics.mean(probes) <= 16 and max(probes) < 3 * len(LEVELS)


def test_converges_on_average_even_with_three_percent_noise_per_window():
    regrets, _ = tuning_regrets(noise=0.03, window_steps=1, seed=7)
    assert statistics.mean(regrets) < 0.01


@settings(max_examples=60, deadline=None)
@given(opt_ghz=st.floats(0.35, 1.25), start_i=st.integers(0, len(LEVELS) - 1), seed=st.integers(0, 2 ** 16),
       noise=st.floats(0.0, 0.06))
def test_never_settles_on_a_level_measured_clearly_worse_than_the_start(opt_ghz, start_i, seed, noise):
    curve, rng = Curve(opt_ghz), random.Random(seed)
    tuner = OnlineTuner(LEVELS, LEVELS[start_i])
    logs: dict[int, list[float]] = {}
    while not tuner.converged:
        hz = tuner.next_level_hz()
        joules = curve.joules(hz) * (1 + rng.gauss(0, noise))
        tuner.observe(hz, joules, curve.seconds(hz))
        logs.setdefault(hz, []).append(math.log(joules))
    best, start = logs[tuner.best_hz], logs[LEVELS[start_i]]
    margin = tuner.z_confirm * tuner.noise_rel * math.sqrt(1 / len(best) + 1 / len(start))
    assert statistics.mean(best) - statistics.mean(start) <= margin + 1e-12
    assert tuner.probes <= DEFAULT_MAX_PROBES


def test_noise_does_not_pull_it_far_from_a_start_at_the_optimum():
    rng = random.Random(2)
    for opt_ghz in (0.5, 0.7, 0.9):
        curve = Curve(opt_ghz)
        for _ in range(30):
            tuner = run_tuner(curve, curve.best(), rng, noise=0.03)
            assert curve.joules(tuner.best_hz) <= curve.joules(curve.best()) * 1.03


@pytest.mark.parametrize("max_slowdown", [0.05, 0.10, 0.25])
def test_max_slowdown_noise_free_picks_the_least_energy_feasible_level(max_slowdown):
    curve = Curve(0.6, fixed_s=0.05, compute_s_ghz=0.3)
    tuner = run_tuner(curve, 612000000, random.Random(0), noise=0.0, max_slowdown=max_slowdown, max_probes=20)
    assert tuner.best_hz == curve.best(max_slowdown)
    assert curve.best(max_slowdown) > curve.best()  # the constraint binds in these cases
    assert tuner.state()["fastest_seconds_per_step"] == pytest.approx(curve.seconds(LEVELS[-1]))


def test_max_slowdown_respected_within_noise():
    # 3% noise per step, 4-step windows: a window's time is off by 1.5%, the ratio of two windows by about 2.1%.
    rng = random.Random(3)
    slowdowns, regrets = [], []
    for opt_ghz in (0.5, 0.7, 0.9, 1.1):
        curve = Curve(opt_ghz, fixed_s=0.05, compute_s_ghz=0.3)
        for max_slowdown in (0.05, 0.10, 0.20):
            for _ in range(10):
                tuner = run_tuner(curve, curve.best(), rng, noise=0.03, window_steps=DEFAULT_WINDOW_STEPS,
                                  max_slowdown=max_slowdown)
                ratio = curve.seconds(tuner.best_hz) / curve.seconds(LEVELS[-1])
                assert ratio <= 1 + max_slowdown + 2 * 0.021
                assert tuner.probes <= DEFAULT_MAX_PROBES
                slowdowns.append(ratio - 1 - max_slowdown)
                regrets.append(regret(curve, tuner.best_hz, max_slowdown))
    assert statistics.mean(slowdowns) <= 0  # on average at or inside the limit
    assert statistics.mean(regrets) < 0.01


def test_infeasible_start_restarts_at_the_lowest_feasible_level():
    curve = Curve(0.5, fixed_s=0.05, compute_s_ghz=0.3)
    tuner = OnlineTuner(LEVELS, 510000000, max_slowdown=0.10)
    for expected_phase in ("start", "fastest", "anchor"):
        assert tuner.state()["phase"] == expected_phase
        hz = tuner.next_level_hz()
        tuner.observe(hz, curve.joules(hz), curve.seconds(hz))
    assert tuner.state()["estimates"][-2]["freq_hz"] == curve.best(0.10)


def test_converged_decision_is_frozen():
    curve = Curve(0.7)
    tuner = run_tuner(curve, 714000000, random.Random(0), noise=0.0)
    best, probes = tuner.best_hz, tuner.probes
    tuner.observe(306000000, 0.001, 0.001)  # far better than anything: would win if the search reopened
    assert tuner.converged and tuner.best_hz == best and tuner.next_level_hz() == best
    assert tuner.probes == probes + 1


def test_observing_a_level_other_than_the_one_asked_replans():
    tuner = OnlineTuner(LEVELS, 714000000)
    tuner.observe(714000000, 10.0, 1.0)
    assert tuner.next_level_hz() == 612000000
    tuner.observe(1020000000, 9.0, 0.8)  # the daemon ran another level: it counts
    assert tuner.best_hz == 1020000000
    # Energy fell from 714 to 1020 MHz: the walk goes on upward, at twice that stride but at most half-way to the top.
    assert tuner.next_level_hz() == 1224000000


def test_single_level_converges_at_once():
    tuner = OnlineTuner([1300500000], 1300500000)
    tuner.observe(1300500000, 5.0, 1.0)
    assert tuner.converged and tuner.best_hz == 1300500000


def test_state_is_json_ready():
    tuner = OnlineTuner(LEVELS, 714000000, max_slowdown=0.1)
    tuner.observe(714000000, 10.0, 0.72)
    tuner.observe(1300500000, 12.0, 0.7)
    state = json.loads(json.dumps(tuner.state()))
    assert state["phase"] == "descend" and state["probes"] == 2 and state["converged"] is False
    assert state["start_hz"] == 714000000 and state["best_hz"] == 714000000 and state["max_slowdown"] == 0.1
    assert [e["freq_hz"] for e in state["estimates"]] == [714000000, 1300500000]
    assert state["estimates"][0] == {"freq_hz": 714000000, "windows": 1, "joules_per_step": 10.0,
                                     "smoothed_joules_per_step": pytest.approx(10.0), "seconds_per_step": 0.72,
                                     "feasible": True}


@pytest.mark.parametrize("level_hz, joules, seconds", [
    (700000000, 1.0, 1.0),          # not a level
    (True, 1.0, 1.0),               # a boolean is not a frequency
    (714000000, 0.0, 1.0),
    (714000000, -1.0, 1.0),
    (714000000, math.nan, 1.0),
    (714000000, math.inf, 1.0),
    (714000000, 1.0, 0.0),
    (714000000, 1.0, math.nan),
    (714000000, "1.0", 1.0),
    (714000000, None, 1.0),
])
def test_bad_measurements_are_refused(level_hz, joules, seconds):
    tuner = OnlineTuner(LEVELS, 714000000)
    with pytest.raises(TuningError):
        tuner.observe(level_hz, joules, seconds)
    assert tuner.probes == 0


@pytest.mark.parametrize("kwargs", [
    {"levels_hz": [], "start_hz": 1},
    {"levels_hz": [2, 1], "start_hz": 1},
    {"levels_hz": [1, 1], "start_hz": 1},
    {"levels_hz": [0, 1], "start_hz": 1},
    {"levels_hz": [1.5, 2], "start_hz": 2},
    {"levels_hz": LEVELS, "start_hz": 700000000},
    {"levels_hz": LEVELS, "start_hz": 714000000, "max_slowdown": 0},
    {"levels_hz": LEVELS, "start_hz": 714000000, "max_slowdown": math.nan},
    {"levels_hz": LEVELS, "start_hz": 714000000, "noise_rel": 0},
    {"levels_hz": LEVELS, "start_hz": 714000000, "max_probes": 0},
    {"levels_hz": LEVELS, "start_hz": 714000000, "confirm_contenders": 0},
    {"levels_hz": LEVELS, "start_hz": 714000000, "confirm_contenders": 1.5},
])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(TuningError) as exc:
        OnlineTuner(**kwargs)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, FtgovError)


# --- windows from progress reports ---------------------------------------------------------------------------------


def test_window_discards_warm_up_steps():
    win = ProbeWindow(714000000, begin_steps=100, warmup_steps=1, window_steps=4)
    assert win.feed(101, energy_j=500.0, time_s=50.0) is None  # the warm-up step: 500 J, never counted
    for k in range(1, 4):
        assert win.feed(101 + k, 500.0 + 10.0 * k, 50.0 + k) is None
    m = win.feed(105, 540.0, 54.0)
    assert (m.joules_per_step, m.seconds_per_step, m.measured_steps, m.profiled_steps) == (10.0, 1.0, 4, 5)
    with pytest.raises(TuningError):
        win.feed(106, 550.0, 55.0)


def test_window_with_sparse_reports_uses_the_steps_that_passed():
    win = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=4)
    assert win.feed(10, 100.0, 10.0) is None
    m = win.feed(20, 300.0, 30.0)
    assert (m.joules_per_step, m.seconds_per_step, m.measured_steps, m.profiled_steps) == (20.0, 2.0, 10, 20)


def test_a_window_pauses_over_an_eval_phase_and_goes_on_after_it():
    """The evaluation's 480 J in 28 s land in no window, and the steps before it still count: a job evaluating every
    few seconds would otherwise never finish a window of the rule's length."""
    win = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=2)
    win.feed(1, 10.0, 1.0)
    win.feed(2, 20.0, 2.0)  # one step measured
    assert win.feed(2, 500.0, 30.0, phase="eval") is None  # eval energy must not land in a training window
    assert win.feed(2, 500.0, 30.0) is None  # back to training: stands where step 2 did
    m = win.feed(3, 510.0, 31.0)
    assert m.joules_per_step == 10.0 and m.seconds_per_step == 1.0 and m.measured_steps == 2
    # A pause before the window opened (in its warm-up) has nothing to cut.
    early = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=2)
    early.feed(0, 0.0, 0.0, phase="eval")
    early.feed(1, 300.0, 20.0)
    early.feed(2, 310.0, 21.0)
    assert early.feed(3, 320.0, 22.0).joules_per_step == 10.0


@pytest.mark.parametrize("reports", [
    [(5, 1.0, 1.0), (4, 2.0, 2.0)],                  # steps went backwards
    [(1, 1.0, 1.0), (2, 1.0, 2.0), (3, 1.0, 3.0)],   # energy counter stuck
    [(1, 5.0, 1.0), (2, 6.0, 2.0), (3, 4.0, 3.0)],   # energy counter went back
    [(1, 1.0, 1.0), (2, 2.0, 1.0), (3, 3.0, 1.0)],   # clock stuck
    [(-1, 1.0, 1.0)],
])
def test_window_refuses_impossible_reports(reports):
    win = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=2)
    with pytest.raises(TuningError):
        for steps, energy_j, time_s in reports:
            win.feed(steps, energy_j, time_s)


def run_session(curve: Curve, start_hz: int, rng: random.Random, noise: float, total_steps: int = 2000):
    """A whole job, one step at a time, as the daemon sees it: returns the session and the job's energy."""
    tuner = OnlineTuner(LEVELS, start_hz)
    session = TuningSession(tuner, steps=0)
    energy_j = time_s = 0.0
    pins = [session.level_hz]
    for step in range(1, total_steps + 1):
        hz = pins[-1]
        energy_j += curve.joules(hz) * (1 + rng.gauss(0, noise))
        time_s += curve.seconds(hz) * (1 + rng.gauss(0, noise))
        if session.on_progress(step, energy_j, time_s) is not None and session.level_hz != hz:
            pins.append(session.level_hz)
    return session, energy_j, pins


def test_session_ends_on_the_best_level_and_exploration_costs_little():
    curve = Curve(0.7)
    session, energy_j, pins = run_session(curve, 510000000, random.Random(0), noise=0.0)
    assert session.converged and pins[-1] == curve.best() == session.level_hz
    assert session.profiled_steps <= 20 * (DEFAULT_WARMUP_STEPS + DEFAULT_WINDOW_STEPS)
    assert energy_j < 2000 * curve.joules(510000000)
    assert energy_j <= 2000 * curve.joules(curve.best()) * 1.01


def test_session_re_measuring_the_same_level_skips_the_warm_up():
    tuner = OnlineTuner((612000000, 714000000), 714000000, max_probes=3)
    tuner.observe(612000000, 10.1, 1.0)  # within noise of what 714 MHz will measure: 714 MHz gets measured twice
    session = TuningSession(tuner, steps=0)
    closed = []
    for step in range(1, 20):
        m = session.on_progress(step, 10.0 * step, float(step))
        if m is not None:
            closed.append((step, m.level_hz, m.profiled_steps))
    assert closed == [(5, 714000000, 5), (9, 714000000, 4)]
    assert session.converged and session.profiled_steps == 9 and session.level_hz == 714000000


def test_a_session_told_its_ends_sit_on_the_meters_updates_opens_its_next_windows_so():
    """The daemon's MeterFeed found the counter's update instants: the window open keeps its held ends (its first
    edge may be a report's read), the ones opened after count none (WindowRule.held_ends)."""
    tuner = OnlineTuner((612000000, 714000000), 714000000)
    session = TuningSession(tuner, steps=0, rule=WindowRule(), meter_update_s=0.1)
    session.on_progress(0, 0.0, 0.0)
    session.ends_on_updates()
    assert session._window.rule.held_ends and session.rule.held_ends is False
    step = 0
    while session.on_progress(step := step + 1, 10.0 * step, 0.05 * step) is None:
        pass
    assert session._window.rule.held_ends is False
    # The steps' scatter of the windows kept: the prior the job's other windows take (the baseline's later parts).
    assert session.step_scatter is not None and session.step_scatter.dof > 0
    TuningSession(OnlineTuner(LEVELS, 714000000), steps=0).ends_on_updates()  # fixed-step windows: nothing to do


def test_session_drops_a_window_of_reports_read_in_a_burst():
    # The daemon was held up: the job's next reports arrive together, steps that ran before the new pin closing a
    # window in no time. Such a window is dropped and measured again, warm-up first.
    tuner = OnlineTuner((612000000, 714000000, 816000000), 714000000)
    session = TuningSession(tuner, steps=0)
    t, e = 0.0, 0.0
    closed = []
    for step in range(1, 6):  # 714 MHz, 30 ms and 0.45 J a step
        t, e = t + 0.03, e + 0.45
        closed.append(session.on_progress(step, e, t))
    assert closed[-1] is not None and session.level_hz != 714000000
    for step in range(6, 11):  # the burst: five reports within a millisecond
        t, e = t + 0.0002, e + 0.0001
        assert session.on_progress(step, e, t) is None
    assert session.bursts == 1 and tuner.probes == 1
    nxt = session.level_hz
    for step in range(11, 30):  # then steps in real time again, at the new level
        t, e = t + 0.03, e + 0.5
        if session.on_progress(step, e, t) is not None:
            break
    assert tuner.probes == 2
    measured = {x["freq_hz"]: x["joules_per_step"] for x in tuner.state()["estimates"]}
    assert measured[nxt] == pytest.approx(0.5)  # the real steps, not the burst's 0.00002 J


def test_a_stall_in_the_first_window_does_not_make_every_later_window_a_burst():
    # A slow first window (a stall, an eval the client did not report) is kept; the normal windows after it are far
    # more than BURST_FACTOR faster. After MAX_BURSTS_IN_A_ROW dropped they are kept: a backlog is one window.
    from governor.policy.windows import MAX_BURSTS_IN_A_ROW

    tuner = OnlineTuner((612000000, 714000000, 816000000), 714000000)
    session = TuningSession(tuner, steps=0)
    t = e = 0.0
    for step in range(1, 400):
        dt = 5.0 if step == 3 else 0.03  # a 5 s stall inside the first window
        t, e = t + dt, e + 0.45
        session.on_progress(step, e, t)
        if session.converged:
            break
    assert session.converged and session.bursts == MAX_BURSTS_IN_A_ROW, (session.bursts, tuner.state())


def test_a_window_across_which_a_held_counter_has_not_updated_stays_open_until_it_does():
    """4 steps of 26 ms inside one 100 ms update of NVML's counter read 0 J: not a stalled meter, a window too short
    to see an update; it closes at the first report after the counter moved."""
    win = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=4, meter_update_s=0.1)
    for k in range(1, 6):
        assert win.feed(k, 50.0, 10.0 + 0.026 * k) is None
    m = win.feed(6, 53.5, 10.0 + 0.026 * 6)
    assert m is not None and m.measured_steps == 5 and m.joules_per_step == pytest.approx(0.7)


def test_a_held_counter_that_does_not_move_for_ten_updates_is_a_stalled_meter():
    win = ProbeWindow(714000000, begin_steps=0, warmup_steps=1, window_steps=4, meter_update_s=0.1)
    for k in range(1, 40):
        assert win.feed(k, 50.0, 0.026 * k) is None
    with pytest.raises(TuningError, match="stalled"):
        win.feed(40, 50.0, 0.026 * 40 + 0.01)
