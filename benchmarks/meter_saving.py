"""The measured saving and a job's energy on realistic simulated meters, against the simulation's truth (issue 23).

    python -m benchmarks.meter_saving [--meter nvml ina3221 nvml-edges nvml-replay] [--window-rule steps time]
        [--seeds 2] [--job-steps 2000] [--no-settle] [--baseline-max-share F ...] [--baseline-parts N ...]
        [--top-step-s S] [--workers N] [--no-doc]

Each job runs one of the measured Jetson curves (benchmarks/data/loudva) through governor.sim.tuned_job's one loop
with a SavingRun, as the daemon runs a tuned job (governor/sim/meters.py: step times scattering by 15%, power in two
phases within a step; NVML's counter held between 100 ms updates, or the INA3221's 140 ms average over the daemon's
sampler; nvml-replay: NVML's counter read at its updates over the H200's recorded steps, replayed in order, with
their drift): the board idle for 5 s before it (at a third of the top level's power), the first steps at the start pin
(the middle of the table, standing in for MLG's pick) until they stop speeding up (two blocks: the simulated steps have
no warm-up), then unpinned, the baseline's first part at the default
governor (the top level; tuner.baseline_*), then the search and its follow-up through the daemon's TuningSession, the
baseline's later parts unpinned while converged (tuner.baseline_parts), windows waiting for the meter to settle after
each change of clock (tuner.settle_updates; --no-settle: none), to the job's end.

- measured saving: as unregister reports it (governor.policy.measured_saving, shared with the daemon's JobTuner):
  1 - (J/step over the steps run converged at the final pick, from the meter's settling after each move there) /
  (the baseline's parts' J/step), with its s.d. saved_pct_err; true saving: 1 - E(pick) / E(top) on the curve.
  Reported: measured - true in points, and how often that is within saved_pct_err and twice it (about 68% and 95% if
  it is honest).
- the baseline's cost: its parts' steps at the default governor (warm-ups included) instead of the pick, of the
  job's energy.
- the whole job, the baseline included: every step charged at its level's noise-free J/step (the baseline's at the
  top level, the search's windows at theirs, the rest at the pick), against the whole job at the curve's minimum: what
  bench_tuner's "whole job" says, plus what measuring the saving costs.
- the job's energy: as unregister reports it (the job's own meter: NVML's counter since the job began; the INA3221's
  readings over the daemon's sampler, EnergyMeter.total_j), against the true energy of its steps (the simulated power
  trace's, from the first step's beginning to the last's end).

Targets: the saving within 2 points of the truth, the energy within 2%: mean and p99 (nearest rank) of the absolute
error over every job, the number of jobs stated. Writes docs/benchmarks.md ("meter-saving"; another --job-steps,
"meter-saving-N"; --baseline-max-share, "-share"; --baseline-parts, "-parts"; --top-step-s, "-paced": every curve's
steps scaled so that its top level's takes S seconds, its power unchanged, as a large GPU's fine-tuning steps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from benchmarks.figures import machine, markdown_table, publish
from benchmarks.figures import pct as percentile
from benchmarks.tuner_curves import DEFAULT_DATA, Curve, paced, real_curves
from governor.config import TunerConfig
from governor.sim.meters import EDGE_METERS, METER_UPDATE_S
from governor.sim.tuned_job import SavingRun, run_tuned_job

METERS = (*METER_UPDATE_S, *EDGE_METERS)

IDLE_S = 5.0
DEFAULT_JOB_STEPS = 2000


def run_job(curve: Curve, meter: str, seed: int, job_steps: int, rule_name: str, settle: bool,
            config: TunerConfig | None = None) -> dict:
    """One tuned job on ``curve`` read through ``meter``: its measured and true saving, its energy error."""
    levels = curve.levels_hz
    top = len(levels) - 1
    start = len(levels) // 2
    job = run_tuned_job(curve, levels[start], job_steps, meter=meter, seed=seed, config=config or TunerConfig(),
                        rule=rule_name, saving=SavingRun(idle_s=IDLE_S, settle=settle), must_converge=False)
    saving = job.saving()
    true = 1 - curve.energy_at(job.best_hz) / curve.energy_j[top]
    at_default = job.default_steps  # the baseline's parts, warm-ups included (the first steps ran at the start pin)
    energy_err = None if job.reported_energy_j is None else job.reported_energy_j / job.true_energy_j - 1
    return {"measured": None if saving is None else saving["saved_rel"], "true": true, "energy_err": energy_err,
            "err": None if saving is None else saving["saved_pct_err"] / 100,
            "tuned_steps": 0 if saving is None else saving["tuned_steps"],
            "baseline_steps": 0 if saving is None else saving["baseline_steps"],
            "parts": 0 if saving is None else saving["baseline_parts"],
            "baseline_cost": at_default * (curve.energy_j[top] - curve.energy_at(job.best_hz)) / job.true_energy_j,
            "whole_job": job.clean_energy_j / (job_steps * min(curve.energy_j)) - 1,
            "step_s": curve.time_s[top]}


def rows_for(curves: list[Curve], meter: str, rule_name: str, args, config: TunerConfig) -> tuple:
    cells = [(c, meter, 7919 * seed + k, args.job_steps, rule_name, not args.no_settle, config)
             for k, c in enumerate(curves) for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:  # each job its own seed: the same rows on any count
        jobs = list(pool.map(run_job, *zip(*cells, strict=True), chunksize=8))
    measured = [j for j in jobs if j["measured"] is not None]
    saving = [100 * abs(j["measured"] - j["true"]) for j in measured]
    bias = [100 * (j["measured"] - j["true"]) for j in measured]
    within = [sum(abs(j["measured"] - j["true"]) <= k * j["err"] for j in measured) / len(measured) for k in (1, 2)]
    energy = [100 * abs(j["energy_err"]) for j in jobs if j["energy_err"] is not None]
    whole = [100 * j["whole_job"] for j in jobs]
    return (meter, "WindowRule" if rule_name == "time" else "1 + 4 steps", len(jobs), len(saving),
            f"{statistics.mean(bias):+.2f}", f"{statistics.mean(saving):.2f} / {percentile(saving, 99):.2f}",
            f"{100 * within[0]:.0f}% / {100 * within[1]:.0f}%",
            f"{statistics.median(j['baseline_steps'] for j in jobs):.0f} "
            f"({statistics.median(j['parts'] for j in jobs):.0f})",
            f"{100 * statistics.mean(j['baseline_cost'] for j in jobs):.2f}%",
            f"{statistics.mean(whole):.2f}% / {percentile(whole, 99):.2f}%",
            f"{statistics.mean(energy):.2f}% / {percentile(energy, 99):.2f}%" if energy else "-",
            f"{'met' if percentile(saving, 99) <= 2 else 'not met'}, "
            + (f"{'met' if percentile(energy, 99) <= 2 else 'not met'}" if energy else "-"))


HEADER = ("meter", "windows", "jobs", "with a saving", "measured - true saving, mean (points)",
          "abs(measured - true), mean / p99 (points)", "within saved_pct_err / twice it",
          "baseline's steps (parts), median", "baseline's cost, mean (of the job's energy)",
          "whole job vs optimum, the baseline included: mean / p99",
          "abs(job energy error), mean / p99", "p99 targets (2 points, 2%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meter", nargs="+", default=list(METERS), choices=list(METERS))
    p.add_argument("--window-rule", nargs="+", default=["steps", "time"], choices=["steps", "time"])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--job-steps", type=int, default=DEFAULT_JOB_STEPS,
                   help="another length writes a section of its own")
    p.add_argument("--every", type=int, default=1, help="every Nth curve only (long jobs' time)")
    p.add_argument("--no-settle", action="store_true", help="windows open right after the warm-up step, as before")
    p.add_argument("--baseline-max-share", nargs="+", type=float, default=None,
                   help="tuner.baseline_max_share values, each a row (a section of its own: the trade of the "
                        "baseline's length, its cost against the saving's error)")
    p.add_argument("--baseline-parts", nargs="+", type=int, default=None,
                   help="tuner.baseline_parts values, each a row (a section of its own: the baseline in one window at "
                   "the start or in parts spread over the job)")
    p.add_argument("--top-step-s", type=float, default=None,
                   help="scale every curve's steps so that its top level's takes this long (a section of its own)")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes the jobs run in")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args()
    curves = real_curves(args.data)[::args.every]
    if args.top_step_s is not None:
        curves = [paced(c, args.top_step_s) for c in curves]
    if args.baseline_max_share and args.baseline_parts:
        p.error("--baseline-max-share and --baseline-parts: one knob a section")
    knob, values = (("baseline_max_share", args.baseline_max_share) if args.baseline_max_share else
                    ("baseline_parts", args.baseline_parts) if args.baseline_parts else (None, None))
    t0 = time.monotonic()
    rows = []
    for meter in args.meter:
        for rule_name in args.window_rule:
            for value in values or [None]:
                config = TunerConfig() if knob is None else TunerConfig(**{knob: value})
                row = rows_for(curves, meter, rule_name, args, config)
                rows.append(row if knob is None else (*row[:2], f"{value:g}", *row[2:]))
                print("| " + " | ".join(str(c) for c in rows[-1]) + " |", flush=True)
    command = " ".join(["python -m benchmarks.meter_saving", *sys.argv[1:]]).replace(" --no-doc", "")
    text = (f"## Measured saving and job energy on simulated meters, jobs of {args.job_steps} steps\n\n`{command}`: "
            f"{len(curves)} of the measured Jetson curves"
            + ("" if args.top_step_s is None else
               f" (their steps scaled so that the top level's takes {1000 * args.top_step_s:g} ms, power unchanged)")
            + f", {args.seeds} seeds each, every job "
            "run as benchmarks/meter_saving.py says (an idle board, the first steps at the start pin until they stop "
            "speeding up, the baseline's "
            "first part unpinned at the top level, the search and its follow-up through the daemon's TuningSession, "
            "the baseline's later parts unpinned while converged, "
            + ("windows opened right after the warm-up step" if args.no_settle else
               "windows waiting for the meter to settle after each change of clock") +
            f"). p99 by nearest rank. {time.monotonic() - t0:.0f} s on {machine()}.\n\n"
            + "\n".join(markdown_table(HEADER if knob is None else (*HEADER[:2], knob, *HEADER[2:]), rows)) + "\n")
    key = "meter-saving" if args.job_steps == DEFAULT_JOB_STEPS else f"meter-saving-{args.job_steps}"
    if knob == "baseline_max_share":
        text = text.replace("## Measured saving and job energy", "## The baseline's share: measured saving", 1)
        key += "-share"
    elif knob == "baseline_parts":
        text = text.replace("## Measured saving and job energy", "## The baseline in parts: measured saving", 1)
        key += "-parts"
    if args.top_step_s is not None:
        key += "-paced"
    publish(key, text, doc=not args.no_doc)


if __name__ == "__main__":
    main()
