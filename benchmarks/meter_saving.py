"""The measured saving and a job's energy on realistic simulated meters, against the simulation's truth (issue 23).

    python -m benchmarks.meter_saving [--meter nvml ina3221] [--window-rule steps time] [--seeds 2]
        [--job-steps 2000] [--no-settle] [--no-doc]

Each job runs one of the measured Jetson curves (benchmarks/data/loudva) step by step through a simulated meter
(governor/sim/meters.py: step times scattering by 15%, power in two phases within a step; NVML's counter held
between 100 ms updates, or the INA3221's 140 ms average integrated over the daemon's sampler and a read at each step's
end) as the daemon runs a tuned job: the board idle for 5 s before it (at a third of the top level's power), the
first step at the start pin (the middle of the table, standing in for MLG's pick), then unpinned, the baseline window
at the default governor (the top level), then the search and its follow-up through the daemon's TuningSession, with
its windows and the baseline waiting for the meter to settle after each change of clock (tuner.settle_updates:
1 update of NVML's counter, 2 of the INA3221's; --no-settle: none, as before), to the job's end.

- measured saving: 1 - (J/step over the steps run at the final pick after the first convergence, each stretch from
  the first report after the pin moved there) / (the baseline window's J/step), as JobTuner.saving counts it; true
  saving: 1 - E(pick) / E(top) on the curve. Reported: measured - true, in points.
- the job's energy: the meter's reading from the first report to the last, against the true energy of the steps
  between them. Reported: the relative error.

Targets: the saving within 2 points of the truth, the energy within 2%: mean and p99 (nearest rank) of the absolute
error over every job, the number of jobs stated. Writes docs/benchmarks.md ("meter-saving").
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from benchmarks.figures import machine, markdown_table, publish
from benchmarks.figures import pct as percentile
from benchmarks.tuner_curves import DEFAULT_DATA, Curve, real_curves
from governor.config import TunerConfig
from governor.policy.tuner import OnlineTuner
from governor.policy.windows import AVERAGE_SETTLE_UPDATES, COUNTER_SETTLE_UPDATES, ProbeWindow, TuningSession
from governor.sim.meters import EDGE_METERS, METER_UPDATE_S, EdgeSteps, MeteredSteps
from governor.sim.tuned_job import window_rule

METERS = (*METER_UPDATE_S, *EDGE_METERS)

IDLE_S = 5.0
BASELINE_MAX_S = 30.0
IDLE_SHARE = 1 / 3  # the idle board's power, of the top level's


def settle_s(meter: str, update_s: float) -> float:
    return (COUNTER_SETTLE_UPDATES if meter == "nvml" else AVERAGE_SETTLE_UPDATES) * update_s


def run_job(curve: Curve, meter: str, seed: int, job_steps: int, rule_name: str, settle: bool,
            baseline_target: float | None = None) -> dict:
    """One tuned job on ``curve`` read through ``meter``: its measured and true saving, its energy error."""
    levels = curve.levels_hz
    top = len(levels) - 1
    edges = meter in EDGE_METERS
    steps = EdgeSteps(seed) if edges else MeteredSteps(meter, seed)
    steps.trace.append(IDLE_S, IDLE_SHARE * curve.energy_j[top] / curve.time_s[top])
    rule = window_rule(meter) if rule_name == "time" else None
    wait_s = settle_s(EDGE_METERS.get(meter, meter), steps.update_s) if settle else 0.0
    true_j = 0.0
    pending: list[tuple] = []  # nvml-edges: the edges a step gave, fed one at a time

    def step(i: int) -> tuple:
        """The next report: a step's end, or with nvml-edges the next edge (the steps run until one comes)."""
        nonlocal true_j
        while edges and not pending:
            true_j += curve.energy_j[i]
            pending.extend(steps.points(curve.energy_j[i], curve.time_s[i]))
        if edges:
            return pending.pop(0)
        true_j += curve.energy_j[i]
        return steps.step(curve.energy_j[i], curve.time_s[i])

    start = len(levels) // 2
    first = step(start)  # the first report: the daemon unpins for the baseline window here
    # The daemon's baseline window: its rule, at least baseline_min_steps long (TunerConfig.baseline_window_rule).
    base_rule = TunerConfig(window_rule="time").baseline_window_rule(steps.update_s) if rule is not None else None
    if rule is not None and baseline_target is not None:
        base_rule = dataclasses.replace(rule, target_rel=baseline_target, max_s=BASELINE_MAX_S)
    window = ProbeWindow(None, first[0], 1, 4, rule=base_rule, meter_update_s=steps.update_s, settle_s=wait_s)
    window.feed(*first)
    baseline = None
    report = first
    while baseline is None:
        report = step(top)
        baseline = window.feed(*report)
    tuner = OnlineTuner(levels, levels[start], total_steps=job_steps, follow_up=True)
    session = TuningSession(tuner, int(report[0]), total_steps=job_steps, rule=rule, meter_update_s=steps.update_s,
                            settle_s=wait_s)
    hz = session.measuring_hz
    pinned_at: list[tuple[int, tuple]] = []  # (level index, the first report after the pin moved there)
    after: list[tuple[int, tuple, tuple]] = []  # converged stretches: (level, first report, last report)
    moved = True
    while report[0] < job_steps:
        i = levels.index(hz)
        report = step(i)
        if tuner.converged:
            if moved or not after or after[-1][0] != i:
                after.append((i, report, report))
            else:
                after[-1] = (i, after[-1][1], report)
        moved = False
        if session.on_progress(*report) is not None:
            nxt = session.measuring_hz if session.measuring else tuner.best_hz
            moved = nxt != hz
            hz = nxt
            pinned_at.append((levels.index(hz), report))
    pick = levels.index(tuner.best_hz)
    stretches = [(b[0] - a[0], b[1] - a[1]) for i, a, b in after if i == pick and b[0] > a[0]]
    tuned_steps = sum(n for n, _ in stretches)
    measured = None
    if tuned_steps:
        measured = 1 - sum(j for _, j in stretches) / tuned_steps / baseline.joules_per_step
    true = 1 - curve.energy_j[pick] / curve.energy_j[top]
    meter_j = report[1] - first[1]
    true_job_j = true_j - curve.energy_j[start]  # the steps after the first report
    # With edges the reports end at update instants inside steps: the job's energy is checked on the step-end meters.
    energy_err = None if edges else meter_j / true_job_j - 1
    return {"measured": measured, "true": true, "energy_err": energy_err, "tuned_steps": tuned_steps}


def rows_for(curves: list[Curve], meter: str, rule_name: str, args) -> tuple:
    jobs = [run_job(c, meter, 7919 * seed + k, args.job_steps, rule_name, not args.no_settle, args.baseline_target)
            for k, c in enumerate(curves) for seed in range(args.seeds)]
    saving = [100 * abs(j["measured"] - j["true"]) for j in jobs if j["measured"] is not None]
    bias = [100 * (j["measured"] - j["true"]) for j in jobs if j["measured"] is not None]
    energy = [100 * abs(j["energy_err"]) for j in jobs if j["energy_err"] is not None]
    return (meter, "WindowRule" if rule_name == "time" else "1 + 4 steps", len(jobs), len(saving),
            f"{statistics.mean(bias):+.2f}", f"{statistics.mean(saving):.2f} / {percentile(saving, 99):.2f}",
            f"{statistics.mean(energy):.2f}% / {percentile(energy, 99):.2f}%" if energy else "-",
            f"{'met' if percentile(saving, 99) <= 2 else 'not met'}, "
            + (f"{'met' if percentile(energy, 99) <= 2 else 'not met'}" if energy else "-"))


HEADER = ("meter", "windows", "jobs", "with a saving", "measured - true saving, mean (points)",
          "abs(measured - true), mean / p99 (points)", "abs(job energy error), mean / p99",
          "p99 targets (2 points, 2%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meter", nargs="+", default=list(METERS), choices=list(METERS))
    p.add_argument("--window-rule", nargs="+", default=["steps", "time"], choices=["steps", "time"])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--job-steps", type=int, default=2000)
    p.add_argument("--no-settle", action="store_true", help="windows open right after the warm-up step, as before")
    p.add_argument("--baseline-target", type=float, default=None,
                   help="WindowRule: the baseline window's own target_rel (its cap BASELINE_MAX_S)")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    curves = real_curves(args.data)
    t0 = time.monotonic()
    rows = []
    for meter in args.meter:
        for rule_name in args.window_rule:
            rows.append(rows_for(curves, meter, rule_name, args))
            print("| " + " | ".join(str(c) for c in rows[-1]) + " |", flush=True)
    text = ("## Measured saving and job energy on simulated meters\n\n`python -m benchmarks.meter_saving --seeds "
            f"{args.seeds} --job-steps {args.job_steps}{' --no-settle' if args.no_settle else ''}`: the "
            f"{len(curves)} measured Jetson curves, {args.seeds} seeds each, every job run as "
            "benchmarks/meter_saving.py says (an idle board, the first step at the start pin, the baseline window "
            "unpinned at the top level, the search and its follow-up through the daemon's TuningSession, "
            + ("windows opened right after the warm-up step" if args.no_settle else
               "windows waiting for the meter to settle after each change of clock") +
            f"). p99 by nearest rank. {time.monotonic() - t0:.0f} s on {machine()}.\n\n"
            + "\n".join(markdown_table(HEADER, rows)) + "\n")
    publish("meter-saving", text, doc=not args.no_doc)


if __name__ == "__main__":
    main()
