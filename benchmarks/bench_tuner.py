"""The online tuner on real, simulated and adversarial energy curves, from three starts, the original tuner beside
the new one.

    python -m benchmarks.bench_tuner [--sets real adversarial fine simulated] [--seeds 5]
        [--job-steps 2000] [--noise-rel 0.03] [--model-noise 0.71] [--max-slowdown 0.1]
        [--data benchmarks/data/loudva] [--worst N]
        [--meter gauss nvml ina3221 nvml-replay] [--window-rule steps time] [--tuners new follow]
        [--lengths N ...] [--no-doc]

Curve sets (benchmarks/tuner_curves.py):

- real: 146 measured Jetson AGX Xavier / Xavier NX curves (one per board and batch size; --data, default
  benchmarks/data/loudva, shipped in the repo). Starts: the middle of the table, its top, its bottom. The top level
  stands in for the default governor (the boards' default runs the GPU at or near its top clock under load).
- adversarial: shapes made in code (minimum at an end, flat bottoms, plateau then dip, two dips, spikes), on 11, 15
  and 25 levels; same starts.
- fine: the real curves on tables of 3 and 8 times as many levels (about 40 and 100, as a GPU listing dozens of
  clocks has), interpolated between the measured levels; same starts.
- simulated: the 60 held-out workloads on the simulated Orin, each a whole job run step by step through the noisy
  model at --model-noise (0.71: about 3% step-to-step energy noise) with a TuningSession exactly as
  governor/sim/tuned_job.py does. Starts: MLG's pick (model/mlg-tree.json), the top, the bottom. The default
  governor is the model's MAXN.

Real and adversarial curves are simulated per window: each window at a level returns the curve's J/step and s/step
times (1 + N(0, --noise-rel)). A job of --job-steps steps is the windows (1 warm-up + 4 measured steps after a change of
level, 4 when the level is re-measured in place) then the rest at the converged level. Every job is charged at the
noise-free energy per step of the levels it ran at, so "whole job vs optimum" is exactly the exploration cost plus
the converged level's regret, with no noise in the score.

With ``--meter nvml`` / ``ina3221`` (or ``--window-rule time``) the real, adversarial and fine curves are run instead
on each meter and window rule given: every step of a window simulated at the curve's power and read through that
simulated meter (governor/sim/meters.py), the windows closed by the daemon's TuningSession, of 1 warm-up + 4 steps
or sized by its WindowRule (the tuner then gets each window's own noise_rel). That run prints and writes its own
section ("tuner-meters"; "tuner-meters-replay" for ``--meter nvml-replay`` alone: NVML's counter over the H200's
recorded steps, replayed): per set, meter, rule and start, the runs, the level regret's mean and p99, the runs beyond
6% with a 95% Wilson interval, and the whole job vs the optimum (mean, p99). With --max-slowdown too, only the real
curves under that limit are run, into a section of their own ("tuner-meters-slowdown"): the level and the whole job
against the best level within the limit, and the runs that converged on a level over it.

The tuner is governor/policy/tuner.py with its defaults and ``total_steps`` set to the job's length ("new"), and
with its follow-up after the pick, as the daemon runs it ("follow": follow_up=True; its windows go on to the job's
end, or until it has only watched its pick for 20 windows, the rest charged at the pick). --lengths runs the meter
path at several job lengths in one section. After the real
and adversarial tables, its windows per phase of the search (the phase it was in when it asked for each window). The
last table is a summary, one row per set and start, written to docs/benchmarks.md ("tuner") with the first tuner's
recorded figures beside it (benchmarks/data/tuner-v1-figures.json: that tuner is in the history, not the tree). About
a minute for real + adversarial at 5 seeds, two for simulated.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.figures import machine, markdown_table, publish, write_section
from benchmarks.figures import pct as percentile
from benchmarks.tuner_curves import DEFAULT_DATA, Curve, adversarial_curves, fine_curves, real_curves
from governor.config import TunerConfig
from governor.policy import tuner as tuning
from governor.sim.meters import METER_UPDATE_S
from governor.sim.tuned_job import ModelBoard, run_tuned_job

METERS = (*METER_UPDATE_S, "nvml-replay")  # nvml-replay: the H200's recorded steps (governor.sim.meters.ReplaySteps)
# A search still open after this many steps is a bug in the tuner or in the simulation, not a slow curve.
MAX_STEPS = 200_000

TREE = Path(__file__).resolve().parent.parent / "model" / "mlg-tree.json"
TUNERS = ("new",)  # --tuners new follow: the tuner with its follow-up beside it
V1_FIGURES = Path(__file__).resolve().parent / "data" / "tuner-v1-figures.json"


@dataclass
class Run:
    curve: str
    start: str
    tuner: str
    level_regret: float  # noise-free E(converged) / E(optimum) - 1
    job_regret: float  # whole job (exploration counted) / (job_steps x E(optimum)) - 1
    windows: int
    vs_start: float  # noise-free E(converged) / E(start) - 1
    job_vs_start: float  # whole job / (job_steps x E(start)) - 1
    job_vs_default: float  # whole job / default governor's job - 1
    slowdown: float = 0.0  # noise-free t(converged) / t(top) - 1
    windows_by_phase: dict | None = None  # windows per phase of the search (window-driven sets only)
    seed: int = 0
    meter: str = "gauss"
    rule: str = "steps"
    outlasted: bool = False  # the search ran past the job's last step
    window_steps: float = 4.0  # measured steps per window, mean


def make_tuner(kind: str, levels_hz, start_hz: int, max_slowdown, noise_rel: float, job_steps: int,
               config: TunerConfig | None = None):
    """``new``: the tuner with its own defaults; ``follow``: as the daemon runs it, with the search and follow-up
    knobs of ``config`` (default: the daemon's TunerConfig: follow_up, drift_rel, confirm_contenders,
    explore_budget_frac). ``new`` with a ``config`` takes its confirm_contenders and explore_budget_frac only."""
    if kind == "follow":
        cfg = config or TunerConfig()
        return tuning.OnlineTuner(levels_hz, start_hz, max_slowdown, noise_rel=noise_rel, total_steps=job_steps,
                                  follow_up=cfg.follow_up, drift_rel=cfg.drift_rel,
                                  explore_budget_frac=cfg.explore_budget_frac,
                                  confirm_contenders=cfg.confirm_contenders)
    knobs = {} if config is None else {"explore_budget_frac": config.explore_budget_frac,
                                       "confirm_contenders": config.confirm_contenders}
    return tuning.OnlineTuner(levels_hz, start_hz, max_slowdown, noise_rel=noise_rel, total_steps=job_steps, **knobs)


def starts_for(curve: Curve) -> dict[str, int]:
    n = len(curve.levels_hz)
    return {"mid-table": curve.levels_hz[n // 2], "top": curve.levels_hz[-1], "bottom": curve.levels_hz[0]}


def window_runs(curves: list[Curve], args, max_slowdown: float | None, meter: str = "gauss",
                rule: str = "steps", config=None, tuners: tuple[str, ...] | None = None) -> list[Run]:
    """Every curve from its three starts, ``args.seeds`` seeds each; windows of Gaussian noise (``meter`` gauss) or
    read through a simulated meter (governor/sim/meters.py), of 1 warm-up + 4 steps or sized by the daemon's
    WindowRule (``rule`` time, meters only). ``config``: a TunerConfig whose window settings and search knobs
    (make_tuner) the jobs run with (default: the daemon's); ``tuners``: the kinds run (default TUNERS). The runs go
    to ``args.workers`` processes (default: one a CPU), each its own seed: the same rows on any count."""
    if meter == "gauss" and rule != "steps":
        raise ValueError("--window-rule time needs a simulated meter (nvml, ina3221): gauss windows have no steps")
    cells = [(curve, 1_000_003 * seed + 1009 * ci + si, start_name, start_hz, seed, kind)
             for ci, curve in enumerate(curves)
             for si, (start_name, start_hz) in enumerate(starts_for(curve).items())
             for seed in range(args.seeds) for kind in tuners or TUNERS]
    run = functools.partial(_window_run, args=args, max_slowdown=max_slowdown, meter=meter, rule=rule, config=config)
    workers = getattr(args, "workers", None) or os.cpu_count() or 1
    if workers == 1 or len(cells) < 2:
        return [run(*cell) for cell in cells]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run, *zip(*cells, strict=True), chunksize=4))


def _window_run(curve: Curve, job_seed: int, start_name: str, start_hz: int, seed: int, kind: str, *, args,
                max_slowdown: float | None, meter: str, rule: str, config) -> Run:
    """One of window_runs' jobs."""
    opt = curve.best_index(max_slowdown)
    e_opt = curve.energy_j[opt]
    tuner = make_tuner(kind, curve.levels_hz, start_hz, max_slowdown, args.noise_rel, args.job_steps, config)
    job = run_tuned_job(curve, start_hz, args.job_steps, meter=meter, seed=job_seed, noise_rel=args.noise_rel,
                        config=config, rule=rule, tuner=tuner, max_steps=MAX_STEPS)
    e = curve.energy_at(job.best_hz)
    job_j = job.clean_energy_j
    return Run(curve.name, start_name, kind, e / e_opt - 1, job_j / (args.job_steps * e_opt) - 1, job.probes,
               e / curve.energy_at(start_hz) - 1, job_j / (args.job_steps * curve.energy_at(start_hz)) - 1,
               job_j / (args.job_steps * curve.energy_j[-1]) - 1, curve.time_at(job.best_hz) / curve.time_s[-1] - 1,
               job.windows_by_phase, seed, meter, rule, job.outlasted, job.window_steps)


def simulated_runs(args) -> list[Run]:
    from governor.features import Features
    from governor.pipeline.workloads import held_out_workloads
    from governor.policy.tree import DecisionTree
    from governor.sim.energy import OrinEnergyModel

    tree = DecisionTree.load(TREE)
    clean = OrinEnergyModel()
    levels = clean.levels_hz
    runs = []
    for i, w in enumerate(held_out_workloads()):
        e = {hz: clean.expected(w, hz).energy_j for hz in levels}
        e_opt = min(e.values())
        maxn_j = clean.expected(w, None).energy_j
        util = clean.expected(w, None).gpu_util_pct
        mlg_hz = tree.decide(Features(model_type=w.model_type, num_layers=w.num_layers, hidden_size=w.hidden_size,
                                      seq_len=float(w.seq_len), gpu_util=round(util, 1))).freq_hz
        for start_name, start_hz in (("MLG", mlg_hz), ("top", levels[-1]), ("bottom", levels[0])):
            for seed in range(args.seeds):
                for kind in TUNERS:
                    board = ModelBoard(w, args.model_noise, 1000 * i + seed)
                    tuner = make_tuner(kind, levels, start_hz, None, args.noise_rel, args.job_steps)
                    job = run_tuned_job(board, start_hz, args.job_steps, tuner=tuner)
                    eb, job_j = e[job.best_hz], job.clean_energy_j
                    runs.append(Run(w.name, start_name, kind, eb / e_opt - 1, job_j / (args.job_steps * e_opt) - 1,
                                    job.probes, eb / e[start_hz] - 1, job_j / (args.job_steps * e[start_hz]) - 1,
                                    job_j / (args.job_steps * maxn_j) - 1))
    return runs


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def table(title: str, runs: list[Run], max_slowdown: float | None = None) -> None:
    print(f"### {title}")
    print()
    extra = (" | slowdown vs top, worst | runs over the limit by > 1 / > 3 points"
             if max_slowdown is not None else "")
    print("| start | tuner | level vs min: mean / p90 / worst | whole job vs optimum: mean / worst "
          "| windows: mean / max | level worse than start (runs), worst | whole job vs start, worst "
          "| whole job vs default, worst"
          f"{extra} |")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if extra else ""))
    for start in dict.fromkeys(r.start for r in runs):
        for kind in TUNERS:
            rs = [r for r in runs if r.start == start and r.tuner == kind]
            lv = [r.level_regret for r in rs]
            jb = [r.job_regret for r in rs]
            wn = [r.windows for r in rs]
            worse = [r.vs_start for r in rs if r.vs_start > 1e-12]
            row = (f"| {start} | {kind} | {pct(statistics.mean(lv))} / {pct(p90(lv))} / {pct(max(lv))} "
                   f"| {pct(statistics.mean(jb))} / {pct(max(jb))} | {statistics.mean(wn):.1f} / {max(wn)} "
                   f"| {len(worse)} of {len(rs)}, {pct(max(worse)) if worse else '-'} "
                   f"| {pct(max(r.job_vs_start for r in rs))} | {pct(max(r.job_vs_default for r in rs))}")
            if extra:
                over = [r.slowdown - max_slowdown for r in rs]
                row += (f" | {pct(max(r.slowdown for r in rs))} "
                        f"| {sum(o > 0.01 for o in over)} / {sum(o > 0.03 for o in over)} of {len(rs)}")
            print(row + " |")
    print()


def summary_rows(name: str, runs: list[Run], noise: float, tuners: tuple[str, ...] | None = None) -> list[str]:
    """One row per start of a set: the last tuner's figures with the first one's beside them (in brackets).
    ``noise`` is one window's relative s.d.: a level worse than the start by less is within noise of it."""
    tuners = tuners or TUNERS
    rows = []
    for start in dict.fromkeys(r.start for r in runs):
        by = {kind: [r for r in runs if r.start == start and r.tuner == kind] for kind in tuners}

        def cell(fmt, kinds=tuners, by=by):
            vals = [fmt(by[k]) for k in kinds if by[k]]
            return vals[-1] + (f" ({vals[0]})" if len(vals) > 1 else "")

        rows.append(" | ".join([
            f"| {name}", start,
            cell(lambda rs: "{} / {} / {}".format(*(pct(f(r.level_regret for r in rs)) for f in
                                                     (statistics.mean, lambda x: p90(list(x)), max)))),
            cell(lambda rs: pct(statistics.mean(r.job_regret for r in rs))),
            cell(lambda rs: f"{statistics.mean(r.windows for r in rs):.1f}"),
            cell(lambda rs: f"{sum(r.vs_start > 1e-12 for r in rs)} / {sum(r.vs_start > noise for r in rs)} "
                            f"of {len(rs)}, {pct(max(r.vs_start for r in rs))}"),
            cell(lambda rs: pct(max(r.job_vs_default for r in rs))),
        ]) + " |")
    return rows


SUMMARY_HEADER = ("| set | start | level vs min: mean / p90 / worst | whole job vs optimum, mean | windows, mean "
                  "| runs on a level worse than the start: any / by > one window's noise, worst "
                  "| whole job vs default, worst |\n|---|---|---|---|---|---|---|")


def print_summary(rows: list[str]) -> None:
    old = f" ({TUNERS[0]} in brackets)" if len(TUNERS) > 1 else ""
    print(f"### Summary: {TUNERS[-1]} tuner{old}")
    print()
    print(SUMMARY_HEADER)
    for row in rows:
        print(row)
    print()


def v1_rows() -> list[str]:
    """The first tuner's recorded figures (it is in the repository's history, not run here)."""
    doc = json.loads(V1_FIGURES.read_text())
    return [f"| {r['set']} | {r['start']} | {' / '.join(r['level_vs_min_mean_p90_worst'])} | "
            f"{r['whole_job_vs_optimum_mean']} | {r['windows_mean']:g} | {r['whole_job_vs_default_worst']} |"
            for r in doc["rows"]]


def section(rows: list[str], args) -> str:
    """docs/benchmarks.md's "tuner" section: governor/policy/tuner.py's summary rows, what was run, on what."""
    sets = " ".join(args.sets)
    slowdown = f" --max-slowdown {args.max_slowdown:g}" if args.max_slowdown is not None else ""
    return (f"## The online tuner on energy curves\n\n`python -m benchmarks.bench_tuner --sets {sets} --seeds "
            f"{args.seeds}{slowdown}` (`make bench`): governor/policy/tuner.py with its defaults, seeds 0-"
            f"{args.seeds - 1} per curve and start, "
            f"{args.job_steps}-step jobs, {args.noise_rel:.0%} window noise on the recorded and adversarial curves, "
            f"model noise {args.model_noise} on the simulated Orin. Sets: real (146 measured energy-vs-frequency "
            "curves of Jetson AGX Xavier and Xavier NX, `benchmarks/data/loudva`, by the LoudVA project, MIT), "
            "adversarial (42 shapes made in "
            "code: minimum at either end, flat bottoms, a plateau then a dip, two dips, a spike), fine (the real "
            "curves on tables of about 40 and 100 levels) and simulated (the 60 held-out workloads), each from "
            "three starts; \"of N\" is the number of runs a row covers. p90 and worst are over those runs. "
            f"Machine: {machine()} (the figures do not depend on it).\n\n{SUMMARY_HEADER}\n" + "\n".join(rows) + "\n"
            "\nThe first tuner (at most 6 windows, one level a step), recorded with the same sets, starts, 5 seeds and "
            "noise before it was replaced (benchmarks/data/tuner-v1-figures.json):\n\n| set | start | level vs min: "
            "mean / p90 / worst | whole job vs optimum, mean | windows, mean | whole job vs default, worst |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(v1_rows()) + "\n")


PHASES = ("start", "fastest", "anchor", "descend", "refine", "beyond", "far", "confirm")


def phase_table(title: str, runs: list[Run]) -> None:
    """Where the new tuner's windows go: mean windows per run in each phase of the search, per start."""
    runs = [r for r in runs if r.tuner == "new" and r.windows_by_phase is not None]
    if not runs:
        return
    print(f"#### {title}: windows per phase, mean per run (new tuner)")
    print()
    print("| start | " + " | ".join(PHASES) + " | total |")
    print("|---|" + "---|" * (len(PHASES) + 1))
    for start in dict.fromkeys(r.start for r in runs):
        rs = [r for r in runs if r.start == start]
        cells = [f"{statistics.mean(r.windows_by_phase.get(p, 0) for r in rs):.2f}" for p in PHASES]
        print(f"| {start} | " + " | ".join(cells) + f" | {statistics.mean(r.windows for r in rs):.2f} |")
    print()


def worst_cases(runs: list[Run], n: int) -> None:
    print("| curve | start | tuner | level vs min | windows |")
    print("|---|---|---|---|---|")
    for r in sorted((r for r in runs if r.tuner == TUNERS[-1]), key=lambda r: -r.level_regret)[:n]:
        print(f"| {r.curve} | {r.start} | {r.tuner} | {pct(r.level_regret)} | {r.windows} |")
    print()


BEYOND = 0.06  # a converged level this much above the curve's minimum is a run gone wrong (issue 23)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate of ``k`` in ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


METER_HEADER = ("set", "meter", "windows", "start", "runs", "level vs min: mean / p99",
                f"runs beyond {BEYOND:.0%} (95% Wilson)", "whole job vs optimum: mean / p99", "windows per run, mean",
                "steps per window, mean", "searches longer than the job")


def meter_rows(name: str, runs: list[Run]) -> list[tuple]:
    """One row per start: level and whole-job regret as mean and p99 (nearest rank), the rate beyond BEYOND."""
    rows = []
    for start in dict.fromkeys(r.start for r in runs):
        rs = [r for r in runs if r.start == start]
        lv = [r.level_regret for r in rs]
        jb = [r.job_regret for r in rs]
        k = sum(x > BEYOND for x in lv)
        lo, hi = wilson(k, len(rs))
        rows.append((name, rs[0].meter, "1 + 4 steps" if rs[0].rule == "steps" else "WindowRule", start, len(rs),
                     f"{pct(statistics.mean(lv))} / {pct(percentile(lv, 99))}",
                     f"{k} ({100 * k / len(rs):.2f}%, {100 * lo:.2f}-{100 * hi:.2f}%)",
                     f"{pct(statistics.mean(jb))} / {pct(percentile(jb, 99))}",
                     f"{statistics.mean(r.windows for r in rs):.1f}",
                     f"{statistics.mean(r.window_steps for r in rs):.1f}", sum(r.outlasted for r in rs)))
    return rows


# Issue 23's targets with realistic meters: (what, statistic, its limit).
def _p99(xs):
    return percentile(xs, 99)


TARGETS = (("level vs min", statistics.mean, 0.005), ("level vs min", _p99, 0.03),
           ("whole job vs optimum", statistics.mean, 0.015), ("whole job vs optimum", _p99, 0.05))
TARGET_HEADER = ("set", "meter", "windows", "runs", "level vs min, mean <= 0.5%", "level vs min, p99 <= 3%",
                 "whole job vs optimum, mean <= 1.5%", "whole job vs optimum, p99 <= 5%")


def target_row(name: str, runs: list[Run]) -> tuple:
    """One meter and window rule, its three starts pooled, against TARGETS: each figure and whether it is met."""
    cells = []
    for what, stat, limit in TARGETS:
        x = stat([r.level_regret if what == "level vs min" else r.job_regret for r in runs])
        cells.append(f"{pct(x)} ({'met' if x <= limit else 'not met'})")
    rule = "1 + 4 steps" if runs[0].rule == "steps" else "WindowRule"
    return (name, runs[0].meter, rule, len(runs), *cells)


def meter_section(rows: list[tuple], targets: list[tuple], args, title: str) -> str:
    """docs/benchmarks.md's "tuner-meters" section: the tuner's windows read through simulated meters."""
    return (f"## {title}\n\n`python -m benchmarks.bench_tuner "
            f"--sets {' '.join(args.sets)} "
            f"--meter {' '.join(args.meter)} --window-rule {' '.join(args.window_rule)} --seeds {args.seeds} "
            f"--tuners {' '.join(TUNERS)} --lengths {' '.join(str(n) for n in args.lengths or [args.job_steps])}`: "
            f"governor/policy/tuner.py with its defaults (noise_rel {args.noise_rel:g}; new: follow_up off, the "
            "pick frozen at convergence, one near-tie confirmed; follow: follow_up on and two near-ties confirmed, "
            "as the daemon runs it, its windows simulated until the job's end or until it has only watched its pick "
            "for 20 windows, the rest charged at the pick), seeds "
            f"0-{args.seeds - 1} per curve and start; \"runs\" is the number of runs a row covers. Sets: real, the "
            "146 measured Jetson curves (benchmarks/data/loudva); simulated, the 60 held-out workloads' noise-free "
            "curves on the simulated Orin (its default governor as the top level). "
            "gauss: each window the curve times (1 + N(0, noise_rel)); nvml and ina3221: every step simulated "
            "(governor/sim/meters.py: its time scattering by 15%, its power in two phases at the curve's J/s) and "
            "read through the meter (NVML's counter held between 100 ms updates, read at step ends; the INA3221's "
            "140 ms average, integrated over the daemon's sampler at each refresh, each sample an edge with the steps "
            "counted between step ends); nvml-replay: NVML's counter read at its update instants (an edge each 0.5 "
            "s, steps counted between step ends, as for a client that sends step_end_s) over steps replayed from the "
            "H200's recorded runs (benchmarks/data/h200-meter: each step the curve's J/step and s/step times a real "
            "step's energy and time relative to its run's means, in the run's order, from a seeded point of one of "
            "the three runs: their drift and correlation, which the model's independent steps lack), the windows "
            "closed by the daemon's TuningSession: 1 warm-up + 4 steps, or "
            "sized by WindowRule (its defaults; the tuner gets each window's own noise_rel); gauss has no steps to "
            "size, so no WindowRule row. Whole job: "
            "the row's steps, every profiled step (warm-up and long windows included) charged at its level's "
            "noise-free J/step, against the whole job at the curve's minimum; a search longer than the job is charged "
            "up to the job's end. p99 by nearest rank. "
            f"Machine: {machine()} (the figures do not depend on it).\n\n"
            + "\n".join(markdown_table(METER_HEADER, rows)) + "\n\nThe three starts pooled, against issue 23's targets "
            "(converged level: mean <= 0.5%, p99 <= 3%; whole job: mean <= 1.5%, p99 <= 5%):\n\n"
            + "\n".join(markdown_table(TARGET_HEADER, targets)) + "\n")


def model_curves() -> list[Curve]:
    """The 60 held-out workloads of the simulated Orin as curves: the energy model's noise-free J/step and s/step at
    each level (the default governor stands in as the top level, as for the measured curves)."""
    from governor.pipeline.workloads import held_out_workloads
    from governor.sim.energy import OrinEnergyModel

    model = OrinEnergyModel()
    levels = model.levels_hz
    return [Curve(f"sim/{w.name}", levels, tuple(model.expected(w, hz).energy_j for hz in levels),
                  tuple(model.expected(w, hz).time_s for hz in levels)) for w in held_out_workloads()]


def run_meters(args) -> None:
    if args.max_slowdown is not None:  # the real curves under the limit alone: a section of their own
        publish("tuner-meters-slowdown", slowdown_section(args), doc=not args.no_doc)
        return
    rows: list[tuple] = []
    targets: list[tuple] = []
    base_steps = args.job_steps
    for steps in args.lengths or [base_steps]:
        args.job_steps = steps
        for name in args.sets:
            curves = {"real": real_curves, "fine": fine_curves, "simulated": lambda _: model_curves()}.get(
                name, lambda _: adversarial_curves())(args.data)
            for meter in args.meter:
                # gauss has no steps to size: the Gaussian model draws a window's noise, not its steps
                for rule in ["steps"] if meter == "gauss" else args.window_rule:
                    runs = window_runs(curves, args, None, meter, rule)
                    for kind in TUNERS:
                        mine = [r for r in runs if r.tuner == kind]
                        label = f"{name}, {kind}, {steps} steps"
                        new = meter_rows(label, mine)
                        targets.append(target_row(label, mine))
                        for row in new:
                            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)
                        rows += new
    args.job_steps = base_steps
    if args.meter == ["nvml-replay"]:  # a section of its own beside the simulated meters'
        publish("tuner-meters-replay", meter_section(rows, targets, args, "The online tuner on the H200's recorded "
                                                     "steps (nvml-replay)"), doc=not args.no_doc)
    else:
        publish("tuner-meters", meter_section(rows, targets, args, "The online tuner on simulated meters"),
                doc=not args.no_doc)


SLOWDOWN_HEADER = ("meter", "windows", "start", "runs", "level vs the best within the limit: mean / p99",
                   "runs over the limit (95% Wilson), their slowdown mean", "whole job vs that level: mean / p99",
                   "windows per run, mean")


def slowdown_section(args) -> str:
    """docs/benchmarks.md's "tuner-meters-slowdown" section: max_slowdown with the windows read through simulated
    meters, where each window carries its own uncertainty and feasibility is judged by it."""
    curves = real_curves(args.data)
    rows = []
    for meter in args.meter:
        for rule in ["steps"] if meter == "gauss" else args.window_rule:
            runs = window_runs(curves, args, args.max_slowdown, meter, rule)
            for start in ("mid-table", "top", "bottom"):
                for kind in TUNERS:
                    rs = [r for r in runs if r.start == start and r.tuner == kind]
                    level = [100 * r.level_regret for r in rs]
                    job = [100 * r.job_regret for r in rs]
                    over = [r.slowdown for r in rs if r.slowdown > args.max_slowdown + 1e-9]
                    lo, hi = wilson(len(over), len(rs))
                    rows.append((meter, "WindowRule" if rule == "time" else "1 + 4 steps", f"{start} ({kind})",
                                 len(rs), f"{statistics.mean(level):+.2f}% / {percentile(level, 99):+.2f}%",
                                 f"{len(over)} ({100 * len(over) / len(rs):.1f}%, {100 * lo:.1f}-{100 * hi:.1f}%), "
                                 + (f"{100 * statistics.mean(over):.1f}%" if over else "-"),
                                 f"{statistics.mean(job):+.2f}% / {percentile(job, 99):+.2f}%",
                                 f"{statistics.mean(r.windows for r in rs):.1f}"))
    return ("## max_slowdown on simulated meters\n\n`python -m benchmarks.bench_tuner --sets real "
            f"--meter {' '.join(args.meter)} --window-rule {' '.join(args.window_rule)} --seeds {args.seeds} "
            f"--tuners {' '.join(TUNERS)} --max-slowdown {args.max_slowdown:g}`: the {len(curves)} measured Jetson "
            f"curves from three starts, seeds 0-{args.seeds - 1}, {args.job_steps}-step jobs, max_slowdown "
            f"{args.max_slowdown:g} (a level may be chosen only if its step time is within 1 + max_slowdown of the "
            "top's by one s.d. of that ratio, from both levels' windows' own uncertainties; noise_rel "
            f"{args.noise_rel:g} for a window without one and as their floor). Level and whole job against the best "
            "level within the limit; p99 by nearest rank. "
            f"Machine: {machine()} (the figures do not depend on it).\n\n"
            + "\n".join(markdown_table(SLOWDOWN_HEADER, rows)) + "\n")


def main() -> None:
    global TUNERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["real", "adversarial", "fine", "simulated"],
                        choices=["real", "adversarial", "fine", "simulated"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--job-steps", type=int, default=2000)
    parser.add_argument("--noise-rel", type=float, default=0.03, help="relative s.d. of one window's J/step and s/step "
                        "(real and adversarial); also the tuners' noise_rel")
    parser.add_argument("--model-noise", type=float, default=0.71, help="OrinEnergyModel noise scale (simulated)")
    parser.add_argument("--max-slowdown", type=float, default=None,
                        help="also run the real curves with this max_slowdown (their latency_s is the step time)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of jetson_inference_dvfs.csv")
    parser.add_argument("--worst", type=int, default=0, help="list the new tuner's N worst runs per set")
    parser.add_argument("--tuners", nargs="+", default=list(TUNERS), choices=["new", "follow"])
    parser.add_argument("--meter", nargs="+", default=["gauss"], choices=["gauss", *METERS],
                        help="how windows read energy: gauss (the curve times Gaussian noise), or every step through "
                        "a simulated nvml or ina3221 meter (governor/sim/meters.py), or nvml-replay (NVML's counter "
                        "over the H200's recorded steps; alone, a section of its own)")
    parser.add_argument("--window-rule", nargs="+", default=["steps"], choices=["steps", "time"],
                        help="windows of 1 warm-up + 4 steps, or sized by the daemon's WindowRule (meters only)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="with --meter: job lengths to run each set at (default: --job-steps)")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes the runs go to")
    args = parser.parse_args()
    TUNERS = tuple(args.tuners)
    if args.meter != ["gauss"] or args.window_rule != ["steps"] or args.lengths:
        if args.meter == ["gauss"]:
            parser.error("--window-rule time needs a simulated meter (--meter nvml or ina3221)")
        run_meters(args)
        return

    print(f"{args.seeds} seeds; window noise {args.noise_rel:.0%} (real, adversarial), model noise {args.model_noise} "
          f"(simulated); {args.job_steps}-step jobs; new = governor/policy/tuner.py")
    print()
    summary: list[str] = []
    newest: list[str] = []  # the summary rows of the last tuner alone, for docs/benchmarks.md
    for name in args.sets:
        if name == "real":
            curves = real_curves(args.data)
            runs = window_runs(curves, args, None)
            table(f"real Jetson curves ({len(curves)}; default governor = top level)", runs)
            phase_table("real", runs)
            summary += summary_rows("real", runs, args.noise_rel)
            newest += summary_rows("real", runs, args.noise_rel, TUNERS[-1:])
        elif name in ("adversarial", "fine"):
            curves = adversarial_curves() if name == "adversarial" else fine_curves(args.data)
            runs = window_runs(curves, args, None)
            what = "adversarial shapes" if name == "adversarial" else "real curves on finer tables (40 and 100 levels)"
            table(f"{what} ({len(curves)}; default governor = top level)", runs)
            phase_table(name, runs)
            summary += summary_rows(name, runs, args.noise_rel)
            newest += summary_rows(name, runs, args.noise_rel, TUNERS[-1:])
        else:
            runs = simulated_runs(args)
            table("simulated Orin, held-out workloads (60; default governor = MAXN)", runs)
            summary += summary_rows("simulated", runs, args.noise_rel)
            newest += summary_rows("simulated", runs, args.noise_rel, TUNERS[-1:])
        if args.worst:
            worst_cases(runs, args.worst)
    if args.max_slowdown is not None:
        curves = real_curves(args.data)
        runs = window_runs(curves, args, args.max_slowdown)
        table(f"real Jetson curves, max_slowdown {args.max_slowdown} (vs the best level within it)", runs,
              args.max_slowdown)
        summary += summary_rows(f"real, max_slowdown {args.max_slowdown}", runs, args.noise_rel)
        newest += summary_rows(f"real, max_slowdown {args.max_slowdown}", runs, args.noise_rel, TUNERS[-1:])
        if args.worst:
            worst_cases(runs, args.worst)
    print_summary(summary)
    if TUNERS[-1] == "new":
        print(f"wrote {write_section('tuner', section(newest, args))}", file=sys.stderr)


if __name__ == "__main__":
    main()
