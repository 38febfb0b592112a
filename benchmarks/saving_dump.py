"""Experiment (docs/exp-saving-estimator.md): run meter_saving's jobs and dump, per job, what a saving estimator could
use (the baseline's parts, the stretches at the pick with their marks, the search's windows, the curve's truth), as
JSON lines, so that estimators are compared offline on the very same jobs.

    python -m benchmarks.saving_dump --meter nvml-edges nvml-replay --out /tmp/dump.jsonl [--seeds 2] [--every 1]
        [--job-steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

from benchmarks.meter_saving import IDLE_S
from benchmarks.tuner_curves import DEFAULT_DATA, real_curves
from governor.config import TunerConfig
from governor.sim.tuned_job import SavingRun, run_tuned_job


def _m(m, at=None):
    return {"level": m.level_hz, "j": m.joules_per_step, "s": m.seconds_per_step, "n": m.measured_steps,
            "noise": m.noise_rel, "dur": m.duration_s, **({} if at is None else {"at": at})}


def dump_job(k: int, meter: str, seed: int, job_steps: int) -> dict:
    curve = real_curves(DEFAULT_DATA)[k]
    levels = curve.levels_hz
    start = len(levels) // 2
    job = run_tuned_job(curve, levels[start], job_steps, meter=meter, seed=seed, config=TunerConfig(), rule="time",
                        saving=SavingRun(idle_s=IDLE_S, settle=True), must_converge=False)
    saving = job.saving()
    parts = job.baseline_parts
    ms = job.measured
    return {
        "curve": k, "name": curve.name, "meter": meter, "seed": seed, "job_steps": job_steps,
        "levels": list(levels), "E": list(curve.energy_j), "t": list(curve.time_s), "best_hz": job.best_hz,
        "true": 1 - curve.energy_at(job.best_hz) / curve.energy_j[-1],
        "saving": saving,
        "parts": [] if parts is None else [_m(m, a) for m, a in zip(parts.measured, parts.at_steps, strict=True)],
        "pooled_parts": None if parts is None else parts.pooled_parts, "added": None if parts is None else parts.added,
        "stretches": [] if ms is None else [
            {"level": s.level_hz, "first": s.first, "last": s.last, "marks": s.marks, "first_held": s.first_held,
             "last_held": s.last_held} for s in ms.stretches],
        "at_pick": [] if ms is None else [_m(m) for m in ms.at_pick],
        "windows": [_m(m, a) for m, a in zip(job.windows, job.window_at_steps, strict=True)],
        "default_steps": job.default_steps, "true_energy_j": job.true_energy_j,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--meter", nargs="+", default=["nvml-edges", "nvml-replay"])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--job-steps", type=int, default=2000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    n = len(real_curves(DEFAULT_DATA))
    cells = [(k, meter, 7919 * seed + k, args.job_steps) for meter in args.meter
             for k in range(0, n, args.every) for seed in range(args.seeds)]
    with open(args.out, "w") as f, ProcessPoolExecutor(max_workers=args.workers) as pool:
        for row in pool.map(dump_job, *zip(*cells, strict=True), chunksize=4):
            f.write(json.dumps(row) + "\n")
            f.flush()
    print(f"{len(cells)} jobs to {args.out} (pid {os.getpid()})")


if __name__ == "__main__":
    main()
