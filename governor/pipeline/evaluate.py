"""`ftgov evaluate`: energy and time of each policy on the held-out workloads, savings against MAXN, plots.

Every policy is scored on the same measurements: its picked level's row of the held-out CSV (per-step energy over
VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0, and per-step time), MAXN's own row for MAXN. ``--json`` prints

    {"workloads": [{"name", "model", "task",
                    "policies": {"maxn"|"ffg"|"paper"|"mlg"|"oracle": {"freq_hz", "energy_j", "time_s"}}}],
     "average_savings_pct": {policy: number}}

with energy_j and time_s per training step and freq_hz null for MAXN.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from governor.pipeline import dataset
from governor.pipeline.dataset import Sweep
from governor.pipeline.policies import Pick, Policy, Probe, build_policies

MODEL_DIR = Path("model")
SMALL_MODEL_PARAMS_M = 70.5  # the paper's line: "models > 70M" vs "<= 70M"


@dataclass(frozen=True)
class Outcome:
    freq_hz: int | None
    energy_j: float  # per step, probe steps amortised in when a policy spent any
    time_s: float


def score(sweep: Sweep, pick: Pick, steps: int = 1000) -> Outcome:
    """Per-step energy and time of a pick; probing steps (an online tuner's) are charged over `steps` steps."""
    if pick.freq_hz is None:
        return Outcome(None, sweep.maxn_energy_j, sweep.maxn_time_s)
    spent = sum(pick.probe_steps.values())
    if spent > steps:
        raise ValueError(f"{spent} probe steps exceed the {steps}-step job")
    energy = (sum(n * sweep.energy_j[f] for f, n in pick.probe_steps.items())
              + (steps - spent) * sweep.energy_j[pick.freq_hz]) / steps
    time_s = (sum(n * sweep.time_s[f] for f, n in pick.probe_steps.items())
              + (steps - spent) * sweep.time_s[pick.freq_hz]) / steps
    return Outcome(pick.freq_hz, energy, time_s)


def evaluate(sweeps: list[Sweep], policies: list[Policy]) -> dict[str, dict[str, Outcome]]:
    """workload -> policy name -> outcome."""
    results = {}
    for s in sweeps:
        def probe(freq_hz: int, s=s) -> Probe:
            return Probe(freq_hz, s.energy_j[freq_hz], s.time_s[freq_hz], s.gpu_util_pct[freq_hz])
        results[s.workload] = {p.name: score(s, p.pick(s, probe)) for p in policies}
    return results


def savings_pct(sweep: Sweep, outcome: Outcome) -> float:
    return sweep.savings_pct(outcome.energy_j)


def summary(sweeps: list[Sweep], results, names: list[str]) -> dict:
    """Averages the report needs beyond the JSON: by model size, worst case, workloads above MAXN."""
    out = {}
    for name in names:
        sav = [savings_pct(s, results[s.workload][name]) for s in sweeps]
        big = [v for s, v in zip(sweeps, sav) if s.params_m > SMALL_MODEL_PARAMS_M]
        small = [v for s, v in zip(sweeps, sav) if s.params_m <= SMALL_MODEL_PARAMS_M]
        slow = [results[s.workload][name].time_s / s.maxn_time_s - 1 for s in sweeps]
        out[name] = {"average": statistics.mean(sav), "big": statistics.mean(big) if big else None,
                     "small": statistics.mean(small) if small else None, "worst": min(sav),
                     "above_maxn": sum(v < 0 for v in sav), "slowdown_pct": 100 * statistics.mean(slow)}
    return out


def to_json(sweeps: list[Sweep], results, names: list[str]) -> dict:
    return {
        "workloads": [
            {"name": s.workload, "model": s.model, "task": s.task,
             "policies": {n: {"freq_hz": results[s.workload][n].freq_hz,
                              "energy_j": round(results[s.workload][n].energy_j, 6),
                              "time_s": round(results[s.workload][n].time_s, 6)} for n in names}}
            for s in sweeps],
        "average_savings_pct": {n: round(statistics.mean(savings_pct(s, results[s.workload][n]) for s in sweeps), 3)
                                for n in names},
    }


def table(sweeps: list[Sweep], results, names: list[str]) -> str:
    picked = [n for n in names if n != "maxn"]
    head = f"{'workload':<20} {'MAXN J/step':>11} {'s/step':>7} " + " ".join(f"{n + ' MHz/save%':>16}" for n in picked)
    lines = [head, "-" * len(head)]
    for s in sweeps:
        r = results[s.workload]
        cells = " ".join(f"{_mhz(r[n].freq_hz):>6} {savings_pct(s, r[n]):>8.1f}%" for n in picked)
        lines.append(f"{s.workload:<20} {r['maxn'].energy_j:>11.3f} {r['maxn'].time_s:>7.3f} {cells}")
    lines.append("-" * len(head))
    summ = summary(sweeps, results, names)
    rows = [("average savings vs MAXN", "average", "{:.2f}%"), ("  models > 70M", "big", "{:.2f}%"),
            ("  models <= 70M", "small", "{:.2f}%"), ("worst workload", "worst", "{:.2f}%"),
            ("workloads above MAXN", "above_maxn", "{}"), ("time vs MAXN", "slowdown_pct", "{:+.1f}%")]
    for label, key, fmt in rows:
        vals = " ".join(f"{fmt.format(summ[n][key]) if summ[n][key] is not None else '-':>16}" for n in picked)
        lines.append(f"{label:<40} {vals}")
    lines.append(f"energy per step over VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0; {len(sweeps)} workloads")
    return "\n".join(lines)


def _mhz(hz: int | None) -> str:
    return "maxn" if hz is None else f"{hz / 1e6:.0f}"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("evaluate", help="compare MAXN, FFG, the paper's tree, the trained MLG and the oracle",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=MODEL_DIR / "data" / "held-out.csv", help="held-out characterization CSV")
    p.add_argument("--mlg-tree", type=Path, default=MODEL_DIR / "mlg-tree.json")
    p.add_argument("--paper-tree", type=Path, default=MODEL_DIR / "paper-tree.json")
    p.add_argument("--ffg", type=Path, default=MODEL_DIR / "ffg.json", help="JSON with the FFG level, {\"freq_hz\": N}")
    p.add_argument("--out", type=Path, help="directory for the PNG plots (none when omitted)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.set_defaults(func=run)
    return p


def run(args, extra_policies: list[Policy] | None = None) -> int:
    """extra_policies: more policies to compare (an online tuner), placed before the oracle."""
    sweeps = dataset.load(args.data)
    policies = build_policies(args.ffg, args.paper_tree, args.mlg_tree, extra=extra_policies)
    names = [p.name for p in policies]
    results = evaluate(sweeps, policies)
    if args.json:
        json.dump(to_json(sweeps, results, names), sys.stdout, indent=2)
        print()
    else:
        print(table(sweeps, results, names))
    if args.out:
        from governor.pipeline import plots

        written = plots.write_all(sweeps, results, names, args.out)
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0
