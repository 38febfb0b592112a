"""`ftgov evaluate`: energy and time of each policy on the held-out workloads, savings against MAXN, plots.

Every policy is scored on the same measurements: its picked level's row of the held-out CSV (per-step energy over
VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0, and per-step time), MAXN's own row for MAXN. The online tuner ("tune":
MLG's pick, then governor/policy/tuner.py on noisy windows from the energy model, as the daemon runs it) is scored
over a whole job of --job-steps steps: the steps it spent at each level while profiling, at those levels' rows, and
the rest at the level it converged on. ``--json`` prints

    {"workloads": [{"name", "model", "task",
                    "policies": {"maxn"|"ffg"|"paper"|"mlg"|"tune"|"oracle": {"freq_hz", "energy_j", "time_s"}}}],
     "average_savings_pct": {policy: number}}

with energy_j and time_s per training step (averaged over the whole job for "tune", exploration included), freq_hz
null for MAXN, and for "tune" one more field, "profiled_steps" (the steps before it converged, warm-up included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from governor import data
from governor.pipeline import dataset
from governor.pipeline.dataset import Sweep
from governor.pipeline.policies import EvaluatedPolicy, Pick, Probe, TuneSettings, build_policies, model_energy_j
from governor.units import mhz

SMALL_MODEL_PARAMS_M = 70.5  # the paper's line: "models > 70M" vs "<= 70M"


@dataclass(frozen=True)
class Outcome:
    freq_hz: int | None
    energy_j: float  # per step, probe steps amortised in when a policy spent any
    time_s: float
    profiled_steps: int | None = None  # for a policy that explores (the tuner): steps spent before settling


def score(sweep: Sweep, pick: Pick, steps: int = TuneSettings.job_steps) -> Outcome:
    """Per-step energy and time of a pick; probing steps (an online tuner's) are charged over `steps` steps."""
    if pick.freq_hz is None:
        return Outcome(None, sweep.maxn_energy_j, sweep.maxn_time_s)
    spent = pick.profiled_steps
    if spent > steps:
        raise ValueError(f"{spent} probe steps exceed the {steps}-step job")
    energy = (sum(n * sweep.energy_j[f] for f, n in pick.probe_steps.items())
              + (steps - spent) * sweep.energy_j[pick.freq_hz]) / steps
    time_s = (sum(n * sweep.time_s[f] for f, n in pick.probe_steps.items())
              + (steps - spent) * sweep.time_s[pick.freq_hz]) / steps
    return Outcome(pick.freq_hz, energy, time_s, spent if pick.probe_steps else None)


def evaluate(sweeps: list[Sweep], policies: list[EvaluatedPolicy],
             job_steps: int = TuneSettings.job_steps) -> dict[str, dict[str, Outcome]]:
    """workload -> policy name -> outcome; probing is charged over a job of `job_steps` steps."""
    results = {}
    for s in sweeps:
        def probe(freq_hz: int, s=s) -> Probe:
            return Probe(freq_hz, s.energy_j[freq_hz], s.time_s[freq_hz], s.gpu_util_pct[freq_hz])
        results[s.workload] = {p.name: score(s, p.pick(s, probe), job_steps) for p in policies}
    return results


def savings_pct(sweep: Sweep, outcome: Outcome) -> float:
    return sweep.savings_pct(outcome.energy_j)


def summary(sweeps: list[Sweep], results, names: list[str], truth: dict | None = None) -> dict:
    """Averages the report needs beyond the JSON: by model size, worst case, workloads above MAXN, distance from the
    oracle; with ``truth`` (workload -> level -> noise-free energy per step, see policies.model_energy_j), how far
    each policy's level is from the noise-free optimum."""
    out = {}
    for name in names:
        sav = [savings_pct(s, results[s.workload][name]) for s in sweeps]
        big = [v for s, v in zip(sweeps, sav, strict=False) if s.params_m > SMALL_MODEL_PARAMS_M]
        small = [v for s, v in zip(sweeps, sav, strict=False) if s.params_m <= SMALL_MODEL_PARAMS_M]
        slow = [results[s.workload][name].time_s / s.maxn_time_s - 1 for s in sweeps]
        regret = [100 * (results[s.workload][name].energy_j / s.energy_j[s.optimum_hz] - 1) for s in sweeps]
        profiled = [results[s.workload][name].profiled_steps for s in sweeps]
        probing = None not in profiled
        out[name] = {"average": statistics.mean(sav), "big": statistics.mean(big) if big else None,
                     "small": statistics.mean(small) if small else None, "worst": min(sav),
                     "above_maxn": sum(v < 0 for v in sav), "slowdown_pct": 100 * statistics.mean(slow),
                     "vs_oracle_pct": statistics.mean(regret), "vs_oracle_worst_pct": max(regret),
                     "on_oracle_level": sum(results[s.workload][name].freq_hz == s.optimum_hz for s in sweeps),
                     "profiled_mean": statistics.mean(profiled) if probing else None,
                     "profiled_max": max(profiled) if probing else None,
                     "true_regret_pct": None, "true_regret_worst_pct": None}
        if truth is not None and name != "maxn":
            true = [100 * (truth[s.workload][results[s.workload][name].freq_hz] / min(truth[s.workload].values()) - 1)
                    for s in sweeps]
            out[name].update(true_regret_pct=statistics.mean(true), true_regret_worst_pct=max(true))
    return out


def _policy_json(o: Outcome) -> dict:
    doc = {"freq_hz": o.freq_hz, "energy_j": round(o.energy_j, 6), "time_s": round(o.time_s, 6)}
    if o.profiled_steps is not None:
        doc["profiled_steps"] = o.profiled_steps
    return doc


def to_json(sweeps: list[Sweep], results, names: list[str]) -> dict:
    return {
        "workloads": [
            {"name": s.workload, "model": s.model, "task": s.task,
             "policies": {n: _policy_json(results[s.workload][n]) for n in names}}
            for s in sweeps],
        "average_savings_pct": {n: round(statistics.mean(savings_pct(s, results[s.workload][n]) for s in sweeps), 3)
                                for n in names},
    }


def table(sweeps: list[Sweep], results, names: list[str], job_steps: int = TuneSettings.job_steps,
          truth: dict | None = None) -> str:
    picked = [n for n in names if n != "maxn"]
    probing = {n for n in picked if all(results[s.workload][n].profiled_steps is not None for s in sweeps)}

    def width(n: str) -> int:  # a policy that explores gets a column for its profiled steps
        return 16 + 6 * (n in probing)

    head = f"{'workload':<20} {'MAXN J/step':>11} {'s/step':>7} " + " ".join(
        f"{n + ' MHz/save%' + ('/steps' if n in probing else ''):>{width(n)}}" for n in picked)
    lines = [head, "-" * len(head)]
    for s in sweeps:
        r = results[s.workload]
        cells = " ".join(f"{mhz(r[n].freq_hz, none='maxn', unit=False):>6} {savings_pct(s, r[n]):>8.1f}%"
                         + (f" {r[n].profiled_steps:>5}" if n in probing else "") for n in picked)
        lines.append(f"{s.workload:<20} {r['maxn'].energy_j:>11.3f} {r['maxn'].time_s:>7.3f} {cells}")
    lines.append("-" * len(head))
    summ = summary(sweeps, results, names, truth)
    rows = [("average savings vs MAXN", "average", "{:.2f}%"), ("  models > 70M", "big", "{:.2f}%"),
            ("  models <= 70M", "small", "{:.2f}%"), ("worst workload", "worst", "{:.2f}%"),
            ("workloads above MAXN", "above_maxn", "{}"), ("time vs MAXN", "slowdown_pct", "{:+.1f}%"),
            ("energy vs oracle, mean", "vs_oracle_pct", "{:+.2f}%"),
            ("energy vs oracle, worst", "vs_oracle_worst_pct", "{:+.2f}%"),
            ("on the oracle's level", "on_oracle_level", "{}"),
            ("profiled steps, mean", "profiled_mean", "{:.1f}"), ("profiled steps, max", "profiled_max", "{}")]
    if truth is not None:
        rows += [("level vs noise-free optimum, mean", "true_regret_pct", "{:+.2f}%"),
                 ("level vs noise-free optimum, worst", "true_regret_worst_pct", "{:+.2f}%")]
    for label, key, fmt in rows:
        vals = " ".join(f"{fmt.format(summ[n][key]) if summ[n][key] is not None else '-':>{width(n)}}"
                        for n in picked)
        lines.append(f"{label:<40} {vals}")
    lines.append(f"energy per step over VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0; {len(sweeps)} workloads")
    if truth is not None:
        lines.append("noise-free optimum: the energy model without noise; the oracle is the argmin of the measured "
                     "(noisy) rows, so it can miss it")
    if probing:
        lines.append(f"{', '.join(sorted(probing))}: whole {job_steps}-step job, profiling steps at the levels "
                     "probed; steps = profiled steps (warm-up included) before converging")
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from governor.argtypes import at_least

    p = subparsers.add_parser("evaluate", help="compare MAXN, FFG, the paper's tree, the trained MLG, the online "
                              "tuner and the oracle",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=data.path(data.HELD_OUT),
                   help="held-out characterization CSV (default: the one shipped with ftgov)")
    p.add_argument("--mlg-tree", type=Path, default=data.path(data.MLG_TREE), help="default: the shipped tree")
    p.add_argument("--paper-tree", type=Path, default=data.path(data.PAPER_TREE))
    p.add_argument("--ffg", type=Path, default=data.path(data.FFG),
                   help="JSON with the FFG level, {\"freq_hz\": N} (default: the shipped one)")
    p.add_argument("--out", type=Path, help="directory for the PNG plots (none when omitted)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--job-steps", type=at_least(1), default=TuneSettings.job_steps,
                   help="training steps per job, over which the tuner's profiling is charged (default %(default)s)")
    p.add_argument("--noise", type=at_least(0.0, float), default=TuneSettings.noise,
                   help="the energy model's noise scale for the tuner's measurement windows (default %(default)s, "
                        "the nominal one the held-out set was generated with; 0.71 gives 3%% per-step jitter)")
    p.add_argument("--seed", type=int, default=TuneSettings.seed, help="seed of the tuner's measurement noise")
    p.add_argument("--no-tune", dest="tune", action="store_false", help="leave the online tuner out")
    p.set_defaults(func=run)
    return p


def run(args, extra_policies: list[EvaluatedPolicy] | None = None) -> int:
    """extra_policies: more policies to compare (an online tuner), placed before the oracle."""
    sweeps = dataset.load(args.data)
    tune = TuneSettings(job_steps=args.job_steps, noise=args.noise, seed=args.seed) if args.tune else None
    policies = build_policies(args.ffg, args.paper_tree, args.mlg_tree, extra=extra_policies, tune=tune)
    names = [p.name for p in policies]
    results = evaluate(sweeps, policies, args.job_steps)
    if args.json:
        json.dump(to_json(sweeps, results, names), sys.stdout, indent=2)
        print()
    else:
        print(table(sweeps, results, names, args.job_steps, model_energy_j(sweeps)))
    if args.out:
        from governor.pipeline import plots

        written = plots.write_all(sweeps, results, names, args.out)
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0
