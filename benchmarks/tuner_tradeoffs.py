"""What the tuner's settings trade: the follow tuner on the H200's replayed steps under variants of the daemon's
window and search settings, and the spread of successive windows on the H200 traces at each.

    python -m benchmarks.tuner_tradeoffs [--seeds 2] [--job-steps 2000] [--no-doc]

Issue 23's figures pull against each other here: shorter windows (a looser ``window_target_rel``, or an early decision
at a lower ``window_decide_z``, or of the search's exploring windows only, at a lower ``window_explore_z``) make the
search cheaper, so the whole job's mean falls, but more of its windows are
caught in the replayed steps' excursions, so more runs end on a level a few percent off the minimum, and successive
windows spread further apart; confirming a second near-tie (``confirm_contenders``, the daemon's 2 against the tuner's
own 1) costs a few windows and catches some of those runs; a smaller exploration budget (``explore_budget_frac``) caps
what the search may spend before it must pick. Each variant is one TunerConfig (the rest the daemon's defaults) for
the jobs of bench_tuner's nvml-replay section (the follow tuner, as the daemon runs it; seeds 0 to --seeds - 1 per
curve and start; the same job seeds, so the defaults' row repeats that section's follow rows at --job-steps, pooled
over the three starts). Writes docs/benchmarks.md's "tuner-tradeoffs" section. About 20 minutes on 2 CPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

from benchmarks import bench_tuner, meter_windows
from benchmarks.figures import machine, markdown_table, pct, publish
from benchmarks.tuner_curves import DEFAULT_DATA, real_curves
from governor.config import TunerConfig

# (label, TunerConfig settings): the daemon's defaults first.
VARIANTS: tuple[tuple[str, dict], ...] = (
    ("the daemon's defaults (target 2%, decide_z 3, explore_z 1.5, 2 contenders)", {}),
    ("window_target_rel 2.5%", {"window_target_rel": 0.025}),
    ("window_target_rel 3% (the tuner's noise_rel)", {"window_target_rel": 0.03}),
    ("window_decide_z 2", {"window_decide_z": 2.0}),
    ("window_explore_z 3 (exploring windows as strict as the rest)", {"window_explore_z": 3.0}),
    ("window_explore_z 1", {"window_explore_z": 1.0}),
    ("confirm_contenders 1 (the tuner's own)", {"confirm_contenders": 1}),
    ("explore_budget_frac 1.2%", {"explore_budget_frac": 0.012}),
)
SETS = ("real", "simulated")
SPREAD_LIMIT = 0.035  # issue 23: the spread of successive windows at the length the rule chooses
TAILS = (0.03, 0.04, 0.06)  # level vs the curve's minimum: runs beyond each

HEADER = ("settings", "set", "runs", "level vs min: mean / p99",
          *(f"runs beyond {t:.0%}" for t in TAILS), "whole job vs optimum: mean / p99", "windows per run, mean",
          "steps per window, mean")
SPREAD_HEADER = ("settings", "spread of successive windows on the eight H200 traces", f"over {SPREAD_LIMIT:.1%}")


def _runs(variant: int, set_name: str, seeds: int, job_steps: int) -> list[bench_tuner.Run]:
    curves = real_curves(DEFAULT_DATA) if set_name == "real" else bench_tuner.model_curves()
    args = SimpleNamespace(seeds=seeds, job_steps=job_steps, noise_rel=0.03)
    return bench_tuner.window_runs(curves, args, None, "nvml-replay", "time", TunerConfig(**VARIANTS[variant][1]),
                                   tuners=("follow",))


def row(label: str, set_name: str, runs: list[bench_tuner.Run]) -> tuple:
    level = [100 * r.level_regret for r in runs]
    job = [100 * r.job_regret for r in runs]
    return (label, set_name, len(runs), f"{statistics.mean(level):+.2f}% / {pct(level, 99):+.2f}%",
            *(sum(x > 100 * t for x in level) for t in TAILS),
            f"{statistics.mean(job):+.2f}% / {pct(job, 99):+.2f}%",
            f"{statistics.mean(r.windows for r in runs):.1f}", f"{statistics.mean(r.window_steps for r in runs):.1f}")


def spreads(settings: dict, traces: list[tuple[str, meter_windows.Trace]]) -> list[float]:
    """The spread of successive windows (meter_windows.successive_spread) on each of ``traces``
    (meter_windows.rule_traces), at the WindowRule these settings make."""
    rule = TunerConfig(**{**settings, "window_rule": "time"}).window(meter_windows.NVML_UPDATE_S)
    return [meter_windows.successive_spread(trace, rule)[0] for _, trace in traces]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--job-steps", type=int, default=2000)
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    began = time.monotonic()
    cells = [(v, s) for v in range(len(VARIANTS)) for s in SETS]
    with ProcessPoolExecutor(max_workers=min(len(cells), os.cpu_count() or 1)) as pool:
        runs = list(pool.map(_runs, *zip(*cells, strict=True), [args.seeds] * len(cells),
                             [args.job_steps] * len(cells)))
    rows = [row(VARIANTS[v][0], s, rs) for (v, s), rs in zip(cells, runs, strict=True)]
    traces = meter_windows.rule_traces()
    spread_rows = []
    for label, settings in VARIANTS:
        found = spreads(settings, traces)
        spread_rows.append((label, ", ".join(f"{100 * s:.1f}%" for s in found), sum(s > SPREAD_LIMIT for s in found)))
    seconds = time.monotonic() - began
    text = "\n".join([
        f"## What the window settings trade, on the H200's recorded steps (jobs of {args.job_steps} steps)", "",
        f"`python -m benchmarks.tuner_tradeoffs` (`make bench`): the follow tuner (as the daemon runs it) on the "
        f"nvml-replay meter, the jobs of the \"tuner-meters-replay\" section (seeds 0-{args.seeds - 1} per curve and "
        "start, the three starts pooled; real: the 146 measured Jetson curves, simulated: the 60 held-out workloads), "
        "each row under one change to the daemon's tuner settings. p99 by nearest rank. Runs beyond: the converged "
        f"level that much above the curve's minimum. {seconds:.0f} s on {machine()}.", "",
        *markdown_table(HEADER, rows), "",
        "The same settings' windows on the H200 traces (benchmarks/data/h200-meter, h200-meter-2000, h200-meter-gpt; "
        "meter_windows.successive_spread; in the order bert-small, bert-base, bert-large, then the same three over "
        f"2,000 steps, then GPT-2 small and medium), against issue 23's {SPREAD_LIMIT:.1%}:", "",
        *markdown_table(SPREAD_HEADER, spread_rows),
    ]) + "\n"
    publish("tuner-tradeoffs", text, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
