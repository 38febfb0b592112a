"""The baseline's warm-up gate on real cold starts: does it open where a job's first steps have settled, what would
its first part read without it, and what is left of a warm-up it misses in a baseline of five parts?

    python -m benchmarks.warmup_gate [--part-steps 20] [--part-s 1.0] [--no-doc]

Each recorded run (benchmarks/data/h100-warmup: a fresh process per model, no step dropped, the GPU idle before) is
replayed through the daemon's own gate (TunerConfig.new_warmup, governor.policy.measured_saving.WarmUp) fed the
step ends as a client reports them (at most one report in REPORT_GAP_S, as governor.client rate-limits progress).
The baseline's first part is ``--part-steps`` steps (a 2,000-step job's: baseline_max_share x 2,000 over 5 parts),
and at least ``--part-s`` seconds so that the counter's 100 ms updates do not decide it; its J/step (the counter
interpolated between its updates) is compared with the run's settled J/step, over its second half:

- from step 1: the part opened at the first report, as with baseline_warmup_max_s 0;
- from the gate: where the daemon opens it;
- the baseline of a 2,000-step job, five parts: the gated first part and four parts of the same rule from the run's
  settled half (the later parts' stand-ins; three where the half holds no more), pooled as they are, and as
  BaselineParts pools them (a first part that strays more than FIRST_PART_STRAY_Z s.d. from the others left out).

"settled" is the first step from which 10 steps' mean time is within 5% of the second half's: where the steps have
stopped speeding up, by a definition the gate does not use. Writes docs/benchmarks.md ("warmup-gate").
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.figures import markdown_table, publish
from governor.config import TunerConfig
from governor.policy.measured_saving import FIRST_PART_CHECK_PARTS, BaselineParts, pooled
from governor.policy.windows import Measurement
from governor.sim.meters import H200_TRACES, CounterBetweenUpdates, read_h200

WARMUP_TRACES = H200_TRACES.parent / "h100-warmup"
LATER_PARTS = 4  # a 2,000-step job's baseline: 5 parts
REPORT_GAP_S = 0.1  # governor.client sends progress at most 10 times a second
SETTLE_STEPS, SETTLE_REL = 10, 0.05


def runs(directory: Path = WARMUP_TRACES) -> list[tuple[Path, str]]:
    """(directory, run name) of every recorded cold start, in order: one folder per repetition."""
    return [(d, f.name.removesuffix("-steps.csv")) for d in sorted(p for p in directory.iterdir() if p.is_dir())
            for f in sorted(d.glob("*-steps.csv"))]


def gate(ends: list[tuple[int, float]], cfg: TunerConfig) -> int | None:
    """The step at which the daemon's gate opens, fed the step ends at the client's report rate; None: never."""
    warm, last_s = cfg.new_warmup(), None
    for step, t_s in ends:
        if last_s is not None and t_s - last_s < REPORT_GAP_S:
            continue
        last_s = t_s
        if warm.feed(step, t_s):
            return step
    return None


def part_j_per_step(ends: list[tuple[int, float]], energy: CounterBetweenUpdates, start: int, steps: int,
                    min_s: float) -> float | None:
    """J/step of a part opening at step ``start``'s end: ``steps`` steps and ``min_s`` seconds at least."""
    t0 = ends[start][1]
    for step, t_s in ends[start + steps:]:
        if t_s - t0 >= min_s:
            return (energy(t_s) - energy(t0)) / (step - ends[start][0])
    return None


def settled(ends: list[tuple[int, float]], ref_step_s: float) -> int | None:
    for i in range(len(ends) - SETTLE_STEPS):
        mean_s = (ends[i + SETTLE_STEPS][1] - ends[i][1]) / (ends[i + SETTLE_STEPS][0] - ends[i][0])
        if abs(mean_s / ref_step_s - 1) <= SETTLE_REL:
            return ends[i][0]
    return None


def replay(directory: Path, name: str, cfg: TunerConfig, part_steps: int, part_s: float) -> dict:
    reports, updates = read_h200(name, directory)
    energy = CounterBetweenUpdates(name, updates)
    ends = [(step, t_s) for step, _, t_s in reports if updates[0][0] <= t_s <= updates[-1][0]]
    half = len(ends) // 2
    (n0, t0), (n1, t1) = ends[half], ends[-1]
    ref_j, ref_s = (energy(t1) - energy(t0)) / (n1 - n0), (t1 - t0) / (n1 - n0)
    first_s = reports[1][2] - reports[0][2]  # step 1, from the first report's step 0: CUDA's and the model's start
    opened = gate(ends, cfg)
    at = next((i for i, (step, _) in enumerate(ends) if step == opened), None)
    no_gate = part_j_per_step(ends, energy, 0, part_steps, part_s)
    gated = None if at is None else part_j_per_step(ends, energy, at, part_steps, part_s)
    spans = [b - a for (_, a), (_, b) in zip(ends, ends[1:], strict=False)]
    settled_parts, i = [], half  # parts of the same rule one after another over the second half: their own scatter
    while (j := part_j_per_step(ends, energy, i, part_steps, part_s)) is not None:
        settled_parts.append(j / ref_j - 1)
        i = next(k for k in range(i + part_steps, len(ends)) if ends[k][1] - ends[i][1] >= part_s)
    baseline = all_parts = None
    later = settled_parts[:LATER_PARTS]
    if gated is not None and len(later) >= FIRST_PART_CHECK_PARTS:
        parts = BaselineParts(1 + len(later), None, None)
        for k, rel in enumerate([gated / ref_j - 1, *later]):
            # Each part's own uncertainty: what parts of this rule scatter by in the settled half.
            m = Measurement(None, 1.0 + rel, ref_s, part_steps, part_steps + 1, noise_rel=statistics.pstdev(later))
            parts.first(m, part_steps) if k == 0 else parts.add(m, part_steps * (k + 1))
        baseline = parts.baseline.joules_per_step - 1
        all_parts = pooled(parts.measured).joules_per_step - 1
    return {"run": f"{name} ({directory.name})", "steps": n1 - ends[0][0], "median_s": statistics.median(spans),
            "first_x": first_s / ref_s, "settled": settled(ends, ref_s), "gate": opened,
            "baseline": baseline, "all_parts": all_parts,
            "gate_s": None if at is None else ends[at][1] - ends[0][1],
            "no_gate": None if no_gate is None else no_gate / ref_j - 1,
            "gated": None if gated is None else gated / ref_j - 1,
            "part_sd": statistics.pstdev(settled_parts) if len(settled_parts) > 1 else None}


def _pct(value: float | None, sign: str = "+") -> str:
    return "-" if value is None else f"{100 * value:{sign}.1f}%"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part-steps", type=int, default=20, help="the first part's steps (a 2,000-step job's: 20)")
    p.add_argument("--part-s", type=float, default=1.0, help="the first part's seconds at least")
    p.add_argument("--traces", type=Path, default=WARMUP_TRACES)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    cfg = TunerConfig()
    rows = [replay(d, name, cfg, args.part_steps, args.part_s) for d, name in runs(args.traces)]
    table = [(r["run"], r["steps"], f"{1000 * r['median_s']:.0f} ms", f"{r['first_x']:.0f}x",
              "-" if r["settled"] is None else r["settled"],
              "never" if r["gate"] is None else f"{r['gate']} ({r['gate_s']:.1f} s)",
              _pct(r["no_gate"]), _pct(r["gated"]), _pct(r["part_sd"], ""), _pct(r["all_parts"]),
              _pct(r["baseline"])) for r in rows]
    worst = {key: max((abs(r[key]) for r in rows if r[key] is not None), default=None)
             for key in ("no_gate", "gated", "all_parts", "baseline")}
    late = [r for r in rows if r["gate"] is not None and r["settled"] is not None and r["gate"] < r["settled"]]
    lines = ["## The baseline's warm-up gate on real cold starts", "",
             f"`python -m benchmarks.warmup_gate` (`make bench`): {len(rows)} cold starts recorded on an H100 "
             f"({args.traces.relative_to(args.traces.parents[2])}: a fresh process per model, no step dropped), "
             "replayed through the daemon's gate (TunerConfig's defaults) fed the step ends at the client's report "
             f"rate. The first part: {args.part_steps} steps and {args.part_s:g} s at least; its J/step against the "
             "run's second half. Settled: the first step from which 10 steps' mean time is within 5% of the second "
             "half's.", "",
             *markdown_table(("run", "steps", "median step", "step 1 / a settled step", "settled at step",
                              "gate opens at step", "first part from step 1", "first part from the gate",
                              "parts in the second half: s.d.", "5-part baseline: all pooled",
                              "5-part baseline: a stray first part left out"), table),
             "", f"The first part's J/step off the settled runs' by {_pct(worst['no_gate'], '')} at most from step 1, "
             f"{_pct(worst['gated'], '')} from the gate (one run each: a range, not a quantile); parts of the same "
             "length in a settled half scatter as their column says. The gate opened before the steps had settled "
             f"in {len(late)} of {len(rows)} runs. A 2,000-step job's baseline of five parts, the four later ones "
             f"standing in from the settled half (three where it holds no more): off by "
             f"{_pct(worst['all_parts'], '')} at most pooled as they are, {_pct(worst['baseline'], '')} as "
             "BaselineParts pools them (FIRST_PART_STRAY_Z). These runs are "
             "H100s', recorded with scripts/record_meter.py --warmup 0 (benchmarks/data/h100-warmup/README.md)."]
    publish("warmup-gate", "\n".join(lines), doc=not args.no_doc)


if __name__ == "__main__":
    main()
