"""How many windows does a worst case take? The online tuner beside an oracle that is told, for free, which levels
of each curve lie within a band of its minimum, and only has to pick among them from noisy windows.

    python -m benchmarks.tuner_bound [--sets real adversarial] [--groups 12] [--noise-rel 0.03]
        [--meter gauss|nvml|ina3221|nvml-replay] [--window-rule steps|time] [--no-doc]

"Worst" in bench_tuner.py is the largest level regret over one group of 5 seeds (730 runs per start on the Jetson
curves, 210 on the adversarial shapes): an extreme of a few hundred noisy runs, which moves with the seeds. Here it
is taken over --groups disjoint groups of 5 seeds (group 0 is bench_tuner's seeds 0-4) and reported as its median
and range, for the tuner from each start (same curves and per-window simulation as bench_tuner: each window reads
the curve times (1 + N(0, noise))) and for the oracle.

The oracle knows the band (the levels within --band of the minimum, 10% by default: the basin a search must find
first), spends no window finding it or looking past walls, measures each level of it once and then re-measures, LUCB
style (Kalyanakrishnan et al., 2012), the pair (incumbent, contender) whose wrong choice could cost the most,
z x sd - difference in log energy, until that is at most tol x noise for every contender; it picks the least mean.
It is not a proof that no rule does better, but it has strictly more information than any tuner: the windows it
needs for a given worst case are what a search needs at least, on top of those that find the band from its start.
With ``--meter nvml`` or ``ina3221`` the tuner's windows are read through that simulated meter, 1 warm-up + 4 steps or
sized by the daemon's WindowRule (``--window-rule time``; governor/sim/meters.py), with ``nvml-replay`` through NVML's
counter over the H200's recorded steps; the oracle's stay Gaussian (at the tuner's noise_rel, its windows' floor).
Each row also gives the level regret's mean and p99 over all its runs.
A few minutes at 12 groups. Prints the table and writes it to docs/benchmarks.md ("tuner-bound"; a metered run,
"tuner-bound-METER").
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from benchmarks import bench_tuner
from benchmarks.bench_tuner import METERS
from benchmarks.figures import machine, pct, write_section
from benchmarks.tuner_curves import DEFAULT_DATA, Curve, adversarial_curves, real_curves

SEEDS_PER_GROUP = 5
# (z, tol in noise units) of the oracle's stopping rule, from lax to strict.
ORACLE_RULES = ((2.0, 1.2), (2.5, 1.2), (3.0, 1.5), (2.0, 0.8), (3.0, 1.0))
MAX_WINDOWS_PER_LEVEL = 30


def oracle_pick(curve: Curve, band: float, z: float, tol: float, noise: float, rng: random.Random) -> tuple[float, int]:
    """(level regret, windows) of one oracle run on ``curve``."""
    e_min = min(curve.energy_j)
    levels = [i for i, e in enumerate(curve.energy_j) if e <= e_min * (1 + band)]
    n = dict.fromkeys(levels, 0)
    sum_log = dict.fromkeys(levels, 0.0)

    def measure(i: int) -> None:
        n[i] += 1
        sum_log[i] += math.log(curve.energy_j[i] * (1 + rng.gauss(0, noise)))

    for i in levels:
        measure(i)
    while True:
        mean = {i: sum_log[i] / n[i] for i in levels}
        best = min(levels, key=mean.get)
        losses = [(z * noise * math.sqrt(1 / n[i] + 1 / n[best]) - (mean[i] - mean[best]), i)
                  for i in levels if i != best and min(n[i], n[best]) < MAX_WINDOWS_PER_LEVEL]
        loss, i = max(losses, default=(0.0, best))
        if loss <= tol * noise:
            return curve.energy_j[best] / e_min - 1, sum(n.values())
        measure(i if n[i] < n[best] else best)


def spread(worsts: list[float]) -> str:
    return f"{statistics.median(worsts):+.2%} ({min(worsts):+.2%} to {max(worsts):+.2%})"


def mean_p99(regrets: list[float]) -> str:
    return f"{statistics.mean(regrets):+.2%} / {pct(regrets, 99):+.2%} ({len(regrets)})"


def oracle_rows(name: str, curves: list[Curve], args) -> list[str]:
    rows = []
    for z, tol in ORACLE_RULES:
        windows, worsts, every = [], [], []
        for g in range(args.groups):
            regrets = []
            for ci, curve in enumerate(curves):
                for seed in range(g * SEEDS_PER_GROUP, (g + 1) * SEEDS_PER_GROUP):
                    regret, w = oracle_pick(curve, args.band, z, tol, args.noise_rel, random.Random(7919 * ci + seed))
                    regrets.append(regret)
                    windows.append(w)
            worsts.append(max(regrets))
            every += regrets
        rows.append(f"| {name} | oracle told the {args.band:.0%} band, z {z}, tol {tol} x noise | "
                    f"{statistics.mean(windows):.1f} | {spread(worsts)} | {mean_p99(every)} |")
    return rows


def tuner_rows(name: str, curves: list[Curve], args) -> list[str]:
    run_args = SimpleNamespace(seeds=args.groups * SEEDS_PER_GROUP, noise_rel=args.noise_rel, job_steps=2000)
    runs = bench_tuner.window_runs(curves, run_args, None, args.meter, args.window_rule)
    how = "" if args.meter == "gauss" else f" ({args.meter}, {'WindowRule' if args.window_rule == 'time' else '1 + 4'})"
    rows = []
    for start in dict.fromkeys(r.start for r in runs):
        rs = [r for r in runs if r.start == start]
        worsts = [max(r.level_regret for r in rs if r.seed // SEEDS_PER_GROUP == g) for g in range(args.groups)]
        windows = statistics.mean(r.windows for r in rs)
        rows.append(f"| {name} | tuner from {start}{how} | {windows:.1f} | {spread(worsts)} | "
                    f"{mean_p99([r.level_regret for r in rs])} |")
    return rows


def section(lines: list[str], args) -> str:
    """docs/benchmarks.md's "tuner-bound" section: the table's lines, what was run, on what."""
    meter = "" if args.meter == "gauss" else f" --meter {args.meter} --window-rule {args.window_rule}"
    tuner_windows = (f"{args.noise_rel:.0%} window noise" if args.meter == "gauss" else
                     f"its windows read through the simulated {args.meter} meter (governor/sim/meters.py), "
                     f"{'sized by WindowRule' if args.window_rule == 'time' else '1 warm-up + 4 steps'}")
    title = "The tuner against a bound" + ("" if args.meter == "gauss" else f", its windows on {args.meter}")
    return (f"## {title}\n\n`python -m benchmarks.tuner_bound --sets {' '.join(args.sets)} "
            f"--groups {args.groups}{meter}` (`make bench`): the tuner from each start over {args.groups} disjoint "
            f"groups of {SEEDS_PER_GROUP} seeds, {tuner_windows}, beside an oracle ({args.noise_rel:.0%} Gaussian "
            "window noise) told for free which "
            f"levels lie within {args.band:.0%} of each curve's minimum, which only has to pick among them (it "
            "measures each once, then re-measures the pair whose wrong choice could cost most until that is at most "
            "tol x noise). \"Worst\" is the largest level regret in one group of 5 seeds (what the tuner section's "
            "worst is); the table gives its median and range over the groups, and the level regret's mean and p99 "
            "over all the row's runs (their number in brackets). "
            f"Machine: {machine()} (the figures do not depend on it).\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["real", "adversarial"], choices=["real", "adversarial"])
    parser.add_argument("--groups", type=int, default=12, help="disjoint groups of 5 seeds")
    parser.add_argument("--band", type=float, default=0.10, help="the oracle is told the levels within this of the min")
    parser.add_argument("--noise-rel", type=float, default=0.03)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--meter", default="gauss", choices=["gauss", *METERS],
                        help="the tuner's windows: Gaussian noise, or read through a simulated meter")
    parser.add_argument("--window-rule", default="steps", choices=["steps", "time"],
                        help="1 warm-up + 4 steps, or sized by the daemon's WindowRule (meters only)")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = parser.parse_args()
    if args.meter == "gauss" and args.window_rule == "time":
        parser.error("--window-rule time needs a simulated meter (--meter nvml or ina3221)")
    print(f"{args.groups} groups of {SEEDS_PER_GROUP} seeds; window noise {args.noise_rel:.0%}; worst = largest level "
          "regret in a group, median over the groups (range)")
    print()
    lines = ["| set | who | windows, mean | worst in a group of 5 seeds: median (range) | level vs min: mean / p99 "
             "(runs) |", "|---|---|---|---|---|"]
    print("\n".join(lines))
    for name in args.sets:
        curves = real_curves(args.data) if name == "real" else adversarial_curves()
        for row in tuner_rows(name, curves, args) + oracle_rows(name, curves, args):
            print(row, flush=True)
            lines.append(row)
    # A metered run is a section of its own ("tuner-bound-nvml-replay"), beside the Gaussian one.
    name = "tuner-bound" if args.meter == "gauss" else f"tuner-bound-{args.meter}"
    if args.no_doc:
        print(section(lines, args))
    else:
        print(f"wrote {write_section(name, section(lines, args))}", file=sys.stderr)


if __name__ == "__main__":
    main()
