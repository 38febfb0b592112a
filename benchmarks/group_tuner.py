"""The tuner of a job group whose ranks span nodes (governor.client.group.GroupCoordinator, rank 0's) on a realistic
meter: its windows sized by the daemon's rule a window behind, against the fixed 8-step windows groups had (issue 23).

    python -m benchmarks.group_tuner [--seeds 2] [--job-steps 2000] [--every 1] [--workers N] [--no-doc]

The real GroupCoordinator runs, unchanged, in one simulated rank (the collectives a stand-in: one rank, no network):
each step runs at its GPU's level on one of the measured Jetson curves (benchmarks/data/loudva), read through
governor.sim.meters' NVML counter (100 ms updates, held between them; steps scattering by 15%, power in two phases),
which its daemon's job_energy returns as it holds at the step's end, with the step's end as the read's time; its
set_level moves the simulated GPU at once. Starts: the middle of the table, its top, its bottom. sized: the register
reply carries the daemon's window rule (tuner defaults, TunerConfig.window); fixed: it carries none (an older daemon,
or window_rule: steps), every window 8 steps. The tuner is rank 0's: governor/policy/tuner.py's defaults, told the
job's length (no follow-up after its pick: the group's tuning ends there).

Every step is charged at its level's noise-free J/step: "whole job vs optimum" is what the search cost and where it
ended, against the job run at the curve's minimum. Level vs min: the pick's J/step over the curve's least. Runs
beyond 6% with a 95% Wilson interval; p99 by nearest rank. Writes docs/benchmarks.md ("group-tuner").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

from benchmarks.bench_groups import SimulatedCollectives
from benchmarks.bench_tuner import wilson
from benchmarks.figures import machine, markdown_table, publish
from benchmarks.figures import pct as percentile
from benchmarks.tuner_curves import Curve, real_curves
from governor.config import TunerConfig
from governor.daemon.groups import RULE_FIELDS
from governor.sim.meters import NVML_UPDATE_S, MeteredSteps

STARTS = ("mid-table", "top", "bottom")
BEYOND = 0.06


class SimRank:
    """governor.client.Job as a GroupCoordinator sees it, on a simulated GPU: its daemon's job_energy reads the
    counter as it held at the last step's end (and that end as the read's time), set_level moves the GPU at once.
    ``calls`` counts the calls to its daemon by method."""

    def __init__(self, curve: Curve, start_hz: int, window: dict | None, total_steps: int):
        self.job_id, self.disabled, self.total_steps = 1, False, total_steps
        self.registration = {"levels_hz": list(curve.levels_hz), "freq_hz": start_hz, "window": window}
        self.compute_total_s, self.compute_steps_total = 0.0, 0  # no compute times told: no trim
        self._conn = self
        self._talking = contextlib.nullcontext()  # one thread: nothing to wait for
        self.level_hz = start_hz
        self.read: tuple[float, float] = (0.0, 0.0)  # (energy_j, time_s) at the last step's end
        self.calls: collections.Counter[str] = collections.Counter()

    def call(self, method: str, job_id: int, **params) -> dict:
        self.calls[method] += 1
        if method == "job_energy":
            return {"job_id": job_id, "energy_j": self.read[0], "at_s": self.read[1]}
        if method == "set_level":
            self.level_hz = params["freq_hz"]
            return {"job_id": job_id, "freq_hz": self.level_hz, "deferred": False}
        raise ValueError(method)


def one_rank(curve: Curve, start_hz: int, job_steps: int, sized: bool):
    """A SimRank of ``curve`` at ``start_hz`` and the real GroupCoordinator over it (one rank, simulated collectives,
    the rank's simulated time as its clock); sized: its register reply carries the daemon's window rule on NVML's
    counter."""
    from governor.client.group import GroupCoordinator

    rule = TunerConfig().window(NVML_UPDATE_S) if sized else None
    window = None if rule is None else {name: getattr(rule, name) for name in RULE_FIELDS}
    rank = SimRank(curve, start_hz, window, job_steps)
    return rank, GroupCoordinator(rank, SimulatedCollectives(1), clock=lambda: rank.read[1])


def run_group(curve: Curve, start: str, seed: int, job_steps: int, sized: bool) -> dict:
    levels = curve.levels_hz
    start_hz = levels[{"mid-table": len(levels) // 2, "top": len(levels) - 1, "bottom": 0}[start]]
    rank, coordinator = one_rank(curve, start_hz, job_steps, sized)
    meter = MeteredSteps("nvml", seed)
    clean_j = 0.0
    for n in range(1, job_steps + 1):
        joules, seconds = curve.expected(rank.level_hz)
        _, energy_j, time_s = meter.step(joules, seconds)
        rank.read = (energy_j, time_s)
        clean_j += joules
        coordinator.step(n)
    least = min(curve.energy_j)
    tuner = coordinator.tuner
    pick = rank.level_hz if tuner is None or not tuner.converged else tuner.best_hz
    return {"level": curve.energy_at(pick) / least - 1, "whole": clean_j / (job_steps * least) - 1,
            "windows": coordinator.windows, "closed_early": coordinator.closed_early,
            "converged": bool(tuner is not None and tuner.converged),
            "window_s": [] if coordinator.last_window is None else [coordinator.last_window["seconds"]]}


def rows(curves: list[Curve], args) -> list[tuple]:
    out = []
    for sized in (False, True):
        for start in STARTS:
            cells = [(c, start, 7919 * seed + k, args.job_steps, sized)
                     for k, c in enumerate(curves) for seed in range(args.seeds)]
            with ProcessPoolExecutor(max_workers=args.workers) as pool:
                runs = list(pool.map(run_group, *zip(*cells, strict=True), chunksize=8))
            level = [100 * r["level"] for r in runs]
            whole = [100 * r["whole"] for r in runs]
            beyond = sum(r["level"] > BEYOND for r in runs)
            lo, hi = wilson(beyond, len(runs))
            out.append(("sized by the rule, a window behind" if sized else "fixed, 8 steps", start, len(runs),
                        f"+{statistics.mean(level):.2f}% / +{percentile(level, 99):.2f}%",
                        f"{beyond} ({100 * beyond / len(runs):.2f}%, {100 * lo:.2f}-{100 * hi:.2f}%)",
                        f"+{statistics.mean(whole):.2f}% / +{percentile(whole, 99):.2f}%",
                        f"{statistics.mean(r['windows'] for r in runs):.1f}",
                        f"{statistics.mean(r['closed_early'] for r in runs):.1f}",
                        f"{sum(not r['converged'] for r in runs)}"))
            print(out[-1], file=sys.stderr)
    return out


HEADER = ("windows", "start", "runs", "level vs min: mean / p99", f"runs beyond {BEYOND:.0%} (95% Wilson)",
          "whole job vs optimum: mean / p99", "windows per run, mean",
          "of them closed early, mean", "searches longer than the job")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--job-steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=1, help="every Nth curve only")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    curves = real_curves()[::args.every]
    table = rows(curves, args)
    lines = ["## The tuner of a group across nodes on a realistic meter", "",
             f"`python -m benchmarks.group_tuner --seeds {args.seeds} --job-steps {args.job_steps}"
             + (f" --every {args.every}" if args.every > 1 else "") + f"` on {machine()}: "
             f"{len(curves)} of the measured Jetson curves, {args.seeds} seed(s) each, from three starts, jobs of "
             f"{args.job_steps} steps, as benchmarks/group_tuner.py says (the real GroupCoordinator in one simulated "
             "rank; NVML's counter read at step ends; every step charged at its level's noise-free J/step).", "",
             *markdown_table(HEADER, table)]
    publish("group-tuner", "\n".join(lines) + "\n", doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
