"""Tuning windows against real meter readings: the H200 traces (benchmarks/data/h200-meter) replayed through the
daemon's own window code (governor.policy.windows), and the same on the simulated NVML meter (governor.sim.meters).

    .venv/bin/python -m benchmarks.meter_windows [--seeds N]

Prints, and writes into docs/benchmarks.md (its own section, replaced on each run):
- the scatter (coefficient of variation) of J/step over consecutive windows of k steps, ending at step ends, and of
  windows whose edges sit on the counter's updates, on each real trace and on the simulated meter;
- the windows the noise-sized rule (WindowRule, the daemon's defaults) chooses on each real trace: their length in
  steps and seconds, and the spread of successive windows at that length;
- the windows of a group whose ranks span nodes (governor.client.group) on the same traces: sized a window behind
  by the same rule and read at step ends, against the fixed 8-step windows groups had;
- the lengths the rule chooses for 25 ms and 0.5 s steps on the simulated meters (NVML, and an INA3221 refreshed
  every 140 ms), over several seeds: median and p99.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.figures import publish
from governor.client.group import (
    GROUP_WARMUP_STEPS,
    GROUP_WINDOW_STEPS,
    SUB_WINDOWS,
    rank_window_noise,
    read_steps,
)
from governor.daemon.observing import successive_spread as successive
from governor.policy.windows import ProbeWindow, TuningError, WindowRule, edge_joules_per_step, steps_at
from governor.sim.meters import (
    H200_LONG_TRACES,
    H200_RUNS,
    H200_TRACES,
    NVML_UPDATE_S,
    STEP_TIME_CV,
    PowerTrace,
    UpdateClock,
    append_step,
    averaged_power_w,
    held_energy_j,
    read_h200,
    step_times_s,
)

TRACE_DIR = H200_TRACES  # shipped in the repo, as the LoudVA curves are
MODELS = H200_RUNS
# Two causal LMs of GPT-2's shapes, 2,000 steps each (README there): the window rule checked off the BERT shapes.
H200_GPT_TRACES = H200_TRACES.parent / "h200-meter-gpt"
GPT_RUNS = ("gpt2-small-L12H768", "gpt2-medium-L24H1024")
STEP_WINDOWS = (4, 8, 16, 32)
EDGE_WINDOWS_S = (0.2, 1.0, 2.0)
INA_UPDATE_S = 0.140  # the simulated tree's hwmon update_interval
SECTION = "## Tuning windows on real meter readings"


@dataclass
class Trace:
    """One run's readings: reports (steps, energy_j, time_s), at step ends or at the rails' sampler's reads (the
    steps counted fractionally), and the counter's update instants (time_s, energy_j)."""

    name: str
    reports: list[tuple[float, float, float]]
    updates: list[tuple[float, float]]

    @property
    def step_ends(self) -> list[tuple[int, float]]:
        return [(n, t) for n, _, t in self.reports]


def load_h200(name: str, directory: Path = TRACE_DIR) -> Trace:
    """A real trace: the step file's reports; the update instants are the first 5 ms sample showing a new counter."""
    reports, updates = read_h200(name, directory)
    return Trace(name, list(reports), updates)


def _steps(mean_step_s: float, power_w: float, steps: int, seed: int, cv: float) -> tuple[PowerTrace, list[float]]:
    """A job's steps with the measured scatter and power in phases: the trace and each step's end."""
    trace = PowerTrace(0.0)
    times = step_times_s(mean_step_s, seed, cv)
    ends = []
    for _ in range(steps):
        append_step(trace, next(times), power_w)
        ends.append(trace.end_s)
    return trace, ends


def simulated_nvml(mean_step_s: float, power_w: float, steps: int, seed: int,
                   update_s: float = NVML_UPDATE_S, cv: float = STEP_TIME_CV) -> Trace:
    """A job on the simulated meter: steps with the measured scatter, power in phases, an NVML-style counter read at
    every step's end (and known at each of its updates)."""
    clock = UpdateClock(update_s, seed=seed, origin_s=(seed * 0.0371) % update_s)
    trace, ends = _steps(mean_step_s, power_w, steps, seed, cv)
    reports = [(0, held_energy_j(trace, clock, 0.0), 0.0)]
    reports += [(i + 1, held_energy_j(trace, clock, t), t) for i, t in enumerate(ends)]
    updates = []
    k = 1
    while clock.instant(k) < trace.end_s:
        updates.append((clock.instant(k), trace.energy_j(clock.instant(k))))
        k += 1
    return Trace(f"simulated {mean_step_s * 1000:.0f} ms", reports, updates)


def simulated_ina(mean_step_s: float, power_w: float, steps: int, seed: int,
                  update_s: float = INA_UPDATE_S, cv: float = STEP_TIME_CV) -> Trace:
    """A job on a simulated Jetson: the INA3221's averaged power, refreshed every ``update_s``, read by the daemon's
    sampler once a refresh (at a phase of its own, unrelated to the steps) and integrated over its reads (trapezoids).
    Each read is an edge of the windows, the steps at it counted fractionally between the step ends around it, as
    governor.daemon.energy.MeterFeed counts them for every client."""
    clock = UpdateClock(update_s, jitter_s=0.0, origin_s=(seed * 0.0371) % update_s)
    trace, ends = _steps(mean_step_s, power_w, steps, seed, cv)
    step_ends = [(0, 0.0), *((i + 1, t) for i, t in enumerate(ends))]
    energy, last_t, last_w = 0.0, 0.0, averaged_power_w(trace, clock, 0.0)
    reports = [(0.0, 0.0, 0.0)]
    t = ((seed * 0.0613) % update_s) or update_s  # the sampler's first read
    while t < ends[-1]:
        w = averaged_power_w(trace, clock, t)
        energy += (t - last_t) * (w + last_w) / 2.0
        last_t, last_w = t, w
        reports.append((steps_at(t, step_ends), energy, t))
        t += update_s
    return Trace(f"simulated INA3221 {mean_step_s * 1000:.0f} ms", reports, [])


def on_updates(trace: Trace) -> Trace:
    """The same run read at the counter's update instants (its exact value there), the steps at each counted
    fractionally between the step ends around it: the points the daemon's windows take from a client that sends
    step_end_s (governor.daemon.energy.MeterFeed)."""
    ends = trace.step_ends
    first, last = ends[0][1], ends[-1][1]
    reports = [(steps_at(t, ends), e, t) for t, e in trace.updates if first < t < last]
    return Trace(trace.name, reports, trace.updates)


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def consecutive(reports: list[tuple[int, float, float]], window) -> list:
    """Measurements of consecutive windows over the reports, each opened by ``window(steps, prior)`` at the report that
    closed the one before (no warm-up: the level does not change), ``prior`` the steps' scatter in the windows so far,
    pooled as the daemon's TuningSession pools it. A window the daemon refuses (the counter did not move over it:
    TuningError, which stops a job's tuning) is None."""
    out = []
    prior = None
    w = window(reports[0][0], prior)
    for n, e, t in reports:
        try:
            m = w.feed(n, e, t)
        except TuningError:
            out.append(None)
            w = window(n, prior)
            w.feed(n, e, t)
            continue
        if m is not None:
            out.append(m)
            prior = w.scatter_with(prior)
            w = window(n, prior)
            w.feed(n, e, t)
    return out


def step_window_cv(trace: Trace, k: int) -> float:
    """A refused window counts as what its counter read, 0 J: the scatter a fixed window of k steps really has."""
    ms = consecutive(trace.reports, lambda n, _: ProbeWindow(None, n, 0, k))
    return cv([0.0 if m is None else m.joules_per_step for m in ms])


def refused_windows(trace: Trace, k: int) -> int:
    return sum(m is None for m in consecutive(trace.reports, lambda n, _: ProbeWindow(None, n, 0, k)))


def edge_window_cv(trace: Trace, length_s: float) -> float:
    every = max(1, round(length_s / NVML_UPDATE_S))
    first, last = trace.reports[0][2], trace.reports[-1][2]
    edges = [u for u in trace.updates if first < u[0] < last][::every]
    return cv([edge_joules_per_step(a, b, trace.step_ends) for a, b in zip(edges, edges[1:], strict=False)])


def rule_traces() -> list[tuple[str, Trace]]:
    """The H200 traces the window rule is judged on, labelled: the issue's three of 400 steps, the same shapes over
    2,000 steps, and the two GPT-2-shaped runs of 2,000 steps."""
    return ([(name, load_h200(name)) for name in MODELS]
            + [(f"{name} (2,000 steps)", load_h200(name, H200_LONG_TRACES)) for name in MODELS]
            + [(f"{name} (2,000 steps)", load_h200(name, H200_GPT_TRACES)) for name in GPT_RUNS])


def rule_windows(trace: Trace, rule: WindowRule | None = None) -> list:
    rule = rule or WindowRule()
    return consecutive(trace.reports, lambda n, prior: ProbeWindow(None, n, 0, rule=rule, step_prior=prior))


def successive_spread(trace: Trace, rule: WindowRule | None = None) -> tuple[float, list]:
    """The spread of successive windows: the RMS difference of J/step between consecutive windows over sqrt 2 (one
    window's s.d. if they were independent; a slow drift of the job does not count), relative to the mean. Pooled
    over chains of consecutive windows opened at every other report of the first window, so that a 400-step trace
    gives hundreds of pairs, not a handful. Returns it and the windows of all chains."""
    rule = rule or WindowRule()
    t0, closed = trace.reports[0][2], rule_windows(trace, rule)[0]
    first = sum(r[2] <= t0 + closed.duration_s for r in trace.reports) - 1  # the first window's reports
    squares, windows = [], []
    for offset in range(0, first, 2):
        ms = [m for m in rule_windows(Trace(trace.name, trace.reports[offset:], trace.updates), rule) if m]
        windows += ms
        squares += [(b.joules_per_step - a.joules_per_step) ** 2 for a, b in zip(ms, ms[1:], strict=False)]
    mean = statistics.fmean(m.joules_per_step for m in windows)
    return math.sqrt(statistics.fmean(squares) / 2.0) / mean, windows


def behind_windows(trace: Trace, rule: WindowRule | None,
                   offset: int = 0) -> list[tuple[float, float, float | None, float]]:
    """The windows of a group whose ranks span nodes (governor.client.group) on one trace, as one rank measures
    them: each edged at step counts fixed when it opens (GROUP_WARMUP_STEPS after the last one, as after a move),
    read at step ends (the counter as it holds then) at its edges and SUB_WINDOWS - 1 times inside; with ``rule``,
    the first sized by the time of the GROUP_WINDOW_STEPS steps before the first edge, each next one a window behind
    (WindowRule.next_steps); without, every one GROUP_WINDOW_STEPS long. (J/step, seconds, own uncertainty or None,
    s/step) of each; the run begins at report ``offset``."""
    reports = trace.reports[offset:]
    out: list[tuple[float, float, float | None, float]] = []
    i, n = GROUP_WARMUP_STEPS, GROUP_WINDOW_STEPS
    if rule is not None:  # the first edge comes GROUP_WINDOW_STEPS after the first step, which time the first window
        (n0, _, t0), (n1, _, t1) = reports[0], reports[GROUP_WINDOW_STEPS]
        i, n = GROUP_WINDOW_STEPS + GROUP_WARMUP_STEPS, rule.next_steps((t1 - t0) / (n1 - n0), n1 - n0, None,
                                                                        least=GROUP_WINDOW_STEPS)
    noise, prior = None, None
    while i + n < len(reports):
        reads = [reports[j] for j in (i, *read_steps(i, n), i + n)]
        (n0, e0, t0), (n1, e1, t1) = reads[0], reads[-1]
        if rule is not None:
            noise, prior = rank_window_noise(reads, rule, prior)
        step_s = (t1 - t0) / (n1 - n0)
        out.append(((e1 - e0) / (n1 - n0), t1 - t0, noise, step_s))
        i += n + GROUP_WARMUP_STEPS
        n = GROUP_WINDOW_STEPS if rule is None else rule.next_steps(step_s, n1 - n0, noise, least=GROUP_WINDOW_STEPS)
    return out


def behind_spread(trace: Trace, rule: WindowRule | None) -> tuple[float, list]:
    """successive_spread's figure for ``behind_windows``: pooled over chains opened at every other report of the
    first GROUP_WINDOW_STEPS x 4; with a rule, each chain's first window left out (sized by time alone, the
    rule's shortest, as a single job's first window is). Returns it and the windows of all chains."""
    squares, windows = [], []
    for offset in range(0, 4 * GROUP_WINDOW_STEPS, 2):
        ws = behind_windows(trace, rule, offset)
        ws = ws[1:] if rule is not None else ws  # the first is the rule's shortest (a single job's is too: "least")
        windows += ws
        squares += [(b[0] - a[0]) ** 2 for a, b in zip(ws, ws[1:], strict=False)]
    if not squares:
        return math.nan, windows  # a trace too short for two windows at the length the rule asks
    mean = statistics.fmean(w[0] for w in windows)
    return math.sqrt(statistics.fmean(squares) / 2.0) / mean, windows


def rule_row(label: str, trace: Trace, rule: WindowRule) -> str:
    """A row of the rule's table: its windows on ``trace``, their length and the spread of successive ones."""
    spread, ms = successive_spread(trace, rule)
    return (f"| {label} | {len(ms)} | {_median_p99([m.measured_steps for m in ms], '.0f')} | "
            f"{_median_p99([m.duration_s for m in ms], '.2f')} | {100 * spread:.1f}% | "
            f"{100 * statistics.median(m.noise_rel for m in ms):.1f}% |")


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _median_p99(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} / {percentile(values, 99):{fmt}}"


def median_step_s(trace: Trace) -> float:
    return statistics.median(b[2] - a[2] for a, b in zip(trace.reports, trace.reports[1:], strict=False))


def mean_power_w(trace: Trace) -> float:
    (_, e0, t0), (_, e1, t1) = trace.reports[0], trace.reports[-1]
    return (e1 - e0) / (t1 - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="simulated runs per configuration")
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    if not TRACE_DIR.is_dir():
        print(f"no traces at {TRACE_DIR}", file=sys.stderr)
        return 2
    lines = [SECTION, "",
             "`python -m benchmarks.meter_windows` (`make bench`). Real: the three H200 traces (one run "
             "of 400 steps each; the window rule's table also on the three runs of 2,000 steps, "
             "benchmarks/data/h200-meter-2000, and on two causal LMs of GPT-2's shapes, 2,000 steps each, "
             "h200-meter-gpt). Simulated: "
             f"`governor.sim.meters`, {args.seeds} seeded runs per row.", ""]
    traces = rule_traces()
    real = [trace for _, trace in traces[:len(MODELS)]]  # the three, 400 steps each
    lines += ["### Scatter of J/step over consecutive windows (coefficient of variation)", "",
              "| trace | median step | " + " | ".join(f"{k} steps" for k in STEP_WINDOWS) + " | "
              + " | ".join(f"edges on updates, {s:g} s" for s in EDGE_WINDOWS_S) + " |",
              "|---|---:|" + "---:|" * (len(STEP_WINDOWS) + len(EDGE_WINDOWS_S))]
    for trace in real:
        step_s = median_step_s(trace)
        sim = [simulated_nvml(step_s, mean_power_w(trace), 400, seed) for seed in range(args.seeds)]
        for label, runs in ((trace.name + " (real)", [trace]),
                            (f"simulated NVML (mean of {args.seeds} runs)", sim)):
            row = ([statistics.fmean(step_window_cv(t, k) for t in runs) for k in STEP_WINDOWS]
                   + [statistics.fmean(edge_window_cv(t, x) for t in runs) for x in EDGE_WINDOWS_S])
            lines.append(f"| {label} | {step_s * 1000:.1f} ms | " + " | ".join(f"{100 * v:.1f}%" for v in row) + " |")
    rule = WindowRule()
    lines += ["", f"### The noise-sized window rule (WindowRule defaults: target {rule.target_rel:.0%}, at least "
              f"{rule.min_s:g} s, {rule.min_updates} meter updates and {rule.min_steps} steps, at most "
              f"{rule.max_s:g} s)", "",
              "On the real traces. Spread of successive windows: the RMS difference of J/step between consecutive "
              "windows over sqrt 2, relative to the mean, pooled over chains of windows opened at every other report "
              "of the first window (windows: all chains' windows; they overlap between chains).", "",
              "| trace | windows | steps per window, median / p99 | seconds, median / p99 | spread of successive "
              "windows | own uncertainty, median |", "|---|---:|---|---|---:|---:|"]
    for label, trace in traces:
        lines.append(rule_row(label, trace, rule))
    lines += ["", "The same runs read at the counter's update instants, as the daemon reads them for a client that "
              "sends step_end_s (governor.daemon.energy.MeterFeed): each point the counter's exact value at an update, "
              "the steps counted fractionally between the step ends around it; the rule's windows count no held "
              "ends there (WindowRule.held_ends). Spread as above, the chains opened at every other point of the "
              "first window.", "",
              "| trace | windows | steps per window, median / p99 | seconds, median / p99 | spread of successive "
              "windows | own uncertainty, median |", "|---|---:|---|---|---:|---:|"]
    for label, trace in traces:
        lines.append(rule_row(label, on_updates(trace), rule.on_updates()))
    lines += ["", "### A group whose ranks span nodes: windows sized a window behind, read at step ends", "",
              "governor.client.group's windows on one rank, replayed on the real traces (`behind_windows`): edged at "
              "step counts fixed when they open, the counter read (as it holds) at the edges and "
              f"{SUB_WINDOWS - 1} times inside, a warm-up step between windows; fixed: every window "
              f"{GROUP_WINDOW_STEPS} steps (what groups had before); sized: by the same WindowRule a window behind "
              "(WindowRule.next_steps: the last one's step time and own uncertainty), the first by the time of the "
              f"{GROUP_WINDOW_STEPS} steps before it (the rule's shortest: left out of the figures, as a single "
              "job's first window would be). Spread as above. -: the trace is too short for two windows at "
              "the length asked.", "",
              "| trace | fixed: spread of successive windows | fixed: seconds, median | sized: windows | sized: steps "
              "per window, median / p99 | sized: seconds, median / p99 | sized: spread of successive windows | "
              "sized: own uncertainty, median |", "|---|---:|---:|---:|---|---|---:|---:|"]
    for label, trace in traces:
        fixed, fixed_ws = behind_spread(trace, None)
        sized, ws = behind_spread(trace, rule)
        cells = ["-"] * 4
        if ws:
            noises = [w[2] for w in ws if w[2] is not None]
            cells = [_median_p99([round(w[1] / w[3]) for w in ws], ".0f"), _median_p99([w[1] for w in ws], ".2f"),
                     "-" if math.isnan(sized) else f"{100 * sized:.1f}%",
                     f"{100 * statistics.median(noises):.1f}%" if noises else "-"]
        lines.append(f"| {label} | {100 * fixed:.1f}% | {statistics.median(w[1] for w in fixed_ws):.2f} | {len(ws)} | "
                     + " | ".join(cells) + " |")
    lines += ["", f"On the simulated meters ({args.seeds} runs each, 2,000 steps of 25 ms or 400 of 0.5 s, 300 W, "
              "power in two phases a step; step scatter: the steps' coefficient of variation, 15% as on the H200; "
              "the rule counts the held counter's ends only where it is read at step ends (WindowRule.held_ends); "
              "windows pooled over the runs; spread: of successive windows within a run, median and p99 over the "
              "runs; error / stated s.d.: each window's J/step against 300 W times the mean step, over the "
              "uncertainty it states, rms (1: honest; each run's first window left out):", "",
              "| meter | step | step scatter | windows | steps per window, median / p99 | seconds, median / p99 | "
              "spread, median / p99 | error / stated s.d., rms |", "|---|---:|---:|---:|---|---|---|---:|"]
    meters = (("NVML counter (100 ms), read at step ends", simulated_nvml, NVML_UPDATE_S, False),
              ("NVML counter (100 ms), edges on its updates", simulated_nvml, NVML_UPDATE_S, True),
              ("INA3221 (140 ms average), the sampler's samples", simulated_ina, INA_UPDATE_S, True))
    for meter, make, update_s, edged in meters:
        for step_s, step_cv in ((0.025, STEP_TIME_CV), (0.5, STEP_TIME_CV), (0.5, 0.03)):
            r = WindowRule(meter_update_s=update_s)
            r = r.on_updates() if edged else r
            runs = []
            for seed in range(args.seeds):
                trace = make(step_s, 300.0, 2000 if step_s < 0.1 else 400, seed, update_s, step_cv)
                runs.append(rule_windows(on_updates(trace) if edged and trace.updates else trace, r))
            ms = [m for run in runs for m in run]
            spreads = [successive([m.joules_per_step for m in run]) for run in runs if len(run) > 2]
            # Each window's error against the expected J/step (300 W x the mean step), in its own stated s.d.; a
            # run's first window left out (it opens on the sensor's reading from before the job).
            z = [(m.joules_per_step / (300.0 * step_s) - 1) / m.noise_rel for run in runs for m in run[1:]]
            lines.append(f"| {meter} | {step_s * 1000:g} ms | {step_cv:.0%} | {len(ms)} | "
                         f"{_median_p99([m.measured_steps for m in ms], '.0f')} | "
                         f"{_median_p99([m.duration_s for m in ms], '.2f')} | "
                         f"{100 * statistics.median(spreads):.1f}% / {100 * percentile(spreads, 99):.1f}% | "
                         f"{math.sqrt(statistics.fmean(x * x for x in z)):.2f} |")
    text = "\n".join(lines) + "\n"
    publish("meter-windows", text, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
