"""Real NVML readings from an H200 (benchmarks/data/h200-meter) replayed through the daemon's own window code
(governor.policy.windows, via benchmarks/meter_windows.py), against the figures issue 23 measured from the same files;
then the simulated NVML meter (governor.sim.meters) put through the same code, to show it scatters like the real one.

Tolerance: each bound of the issue's ranges within 10% (relative) of the replay's least and greatest over the three
models: the issue's edge-aligned figures were taken with update instants found its own way (our instants are the first
5 ms sample showing a new counter value); the fixed-step figures reproduce to a tenth of a point."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.meter_windows import (
    EDGE_WINDOWS_S,
    GPT_RUNS,
    H200_GPT_TRACES,
    H200_LONG_TRACES,
    MODELS,
    STEP_WINDOWS,
    behind_spread,
    edge_window_cv,
    load_h200,
    mean_power_w,
    median_step_s,
    refused_windows,
    rule_windows,
    simulated_ina,
    simulated_nvml,
    step_window_cv,
    successive_spread,
)
from governor.policy.windows import WindowRule

TOLERANCE = 0.10
ISSUE_STEP_CV = {4: (0.13, 0.32), 8: (0.07, 0.20), 16: (0.05, 0.12), 32: (0.03, 0.07)}
ISSUE_EDGE_CV = {0.2: (0.05, 0.07), 1.0: (0.033, 0.043), 2.0: (0.024, 0.037)}
# The simulated meter's scatter of k-step windows against the real trace's at the same step length: within 40%
# (measured 0.78-1.34 over 8 seeds; the real traces' step times drift, the simulated ones are independent).
SIM_RATIO = (0.6, 1.4)


@pytest.fixture(scope="module")
def traces():
    return [load_h200(name) for name in MODELS]


def _within(values, bounds):
    lo, hi = bounds
    return (lo * (1 - TOLERANCE) <= min(values) <= lo * (1 + TOLERANCE)
            and hi * (1 - TOLERANCE) <= max(values) <= hi * (1 + TOLERANCE))


@pytest.mark.parametrize("k", STEP_WINDOWS)
def test_fixed_step_windows_scatter_as_the_issue_measured(traces, k):
    values = [step_window_cv(t, k) for t in traces]
    assert _within(values, ISSUE_STEP_CV[k]), (k, values)


def test_a_four_step_window_of_25_ms_steps_can_see_no_counter_update(traces):
    """The daemon refuses such a window (the counter did not advance) and stops tuning the job: what a fixed window
    of 4 steps does on NVML with steps under 100 ms."""
    assert refused_windows(traces[0], 4) > 0
    assert all(refused_windows(t, 16) == 0 for t in traces)


@pytest.mark.parametrize("length_s", EDGE_WINDOWS_S)
def test_windows_with_edges_on_the_counters_updates_scatter_as_the_issue_measured(traces, length_s):
    values = [edge_window_cv(t, length_s) for t in traces]
    assert _within(values, ISSUE_EDGE_CV[length_s]), (length_s, values)


def test_the_simulated_nvml_meter_scatters_like_the_real_one(traces):
    for trace in traces:
        step_s = median_step_s(trace)
        sims = [simulated_nvml(step_s, mean_power_w(trace), 400, seed) for seed in range(8)]
        for k in STEP_WINDOWS:
            ratio = statistics.fmean(step_window_cv(s, k) for s in sims) / step_window_cv(trace, k)
            assert SIM_RATIO[0] <= ratio <= SIM_RATIO[1], (trace.name, k, ratio)


def test_the_noise_sized_rule_chooses_windows_whose_successors_agree_within_3_5_percent_on_real_readings(traces):
    """The rule's windows on the real traces: more steps for shorter steps, and the spread of successive
    windows (RMS difference over sqrt 2, pooled over chains of windows) at most 3.5% on every trace."""
    steps = []
    for trace in traces:
        spread, ms = successive_spread(trace, WindowRule())
        assert len(ms) >= 30
        assert all(1.0 <= m.duration_s <= WindowRule().max_s for m in ms)
        assert spread <= 0.035, (trace.name, spread)
        steps.append(statistics.median(m.measured_steps for m in ms))
    assert steps == sorted(steps, reverse=True)  # 26, 46, 82 ms steps: fewer steps a window as steps lengthen


def test_the_rule_holds_on_causal_lm_traces_too():
    """Another model family (GPT-2's small and medium shapes, benchmarks/data/h200-meter-gpt): the same rule, the
    same 3.5%, and fewer steps a window for the longer steps (48 and 136 ms)."""
    steps = []
    for name in GPT_RUNS:
        spread, ms = successive_spread(load_h200(name, H200_GPT_TRACES), WindowRule())
        assert len(ms) >= 30 and spread <= 0.035, (name, spread)
        steps.append(statistics.median(m.measured_steps for m in ms))
    assert steps[0] > 2 * steps[1]


def test_a_group_across_nodes_sizes_its_windows_a_window_behind_to_the_rules_spread():
    """A group whose ranks span nodes edges its windows at step counts fixed in advance and reads the counter at step
    ends (governor.client.group): sized a window behind by the daemon's rule, successive windows on the 2,000-step
    BERT and GPT-2 runs agree within 3.5%, each at least the rule's shortest time; the fixed 8-step windows groups had
    spread by 7-20% on the BERT runs."""
    rule = WindowRule()
    for name, directory in [*((m, H200_LONG_TRACES) for m in MODELS), *((m, H200_GPT_TRACES) for m in GPT_RUNS)]:
        trace = load_h200(name, directory)
        sized, windows = behind_spread(trace, rule)
        assert len(windows) >= 30 and sized <= 0.035, (name, sized)
        assert all(w[1] >= rule.shortest_s for w in windows), name
        if name in MODELS:
            assert behind_spread(trace, None)[0] > 2 * sized, name


def test_fixed_windows_of_four_steps_spread_far_beyond_the_tuners_3_percent(traces):
    """The contrast the rule is for: the same measure on today's 4-step windows."""
    for trace in traces:
        ms = rule_windows(trace, WindowRule())
        assert ms
        assert step_window_cv(trace, 4) > 0.10


def test_the_simulated_ina3221_is_read_by_the_sampler_not_at_the_steps_ends():
    """The daemon reads the rails once a refresh, at instants of its own: the trace's reports are the sampler's, the
    steps at each counted fractionally, and the windows the rule closes on them measure the power in phases as its
    mean, 300 W (J/step over s/step: the steps scatter in time, and a step's energy with it)."""
    trace = simulated_ina(0.5, 300.0, 400, seed=4)
    times = [t for _, _, t in trace.reports]
    gaps = [b - a for a, b in zip(times[1:], times[2:], strict=False)]
    assert gaps and all(g == pytest.approx(0.14) for g in gaps)  # the sampler's pace, not the steps'
    assert any(n != int(n) for n, _, _ in trace.reports)
    windows = rule_windows(trace, WindowRule(meter_update_s=0.14))[1:]  # the first reads the sensor's lag
    assert len(windows) > 10
    for m in windows:
        assert m.joules_per_step / m.seconds_per_step == pytest.approx(300.0, rel=0.02), m
