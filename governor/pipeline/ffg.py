"""The `ffg` stage: FFG's single frequency, the one level with the least total energy per step summed over every
characterized configuration (`make model` writes governor/data/ffg.json, the package data the daemon loads).

A sum of joules weighs each configuration by its energy, as a board running all of them for the same number of steps
would; the mean relative energy (each configuration against its own MAXN) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from governor.pipeline import dataset
from governor.pipeline.outputs import write_if_changed
from governor.units import mhz


def run_ffg(data: Path, out: Path) -> int:
    """Write ffg.json from the characterization CSV; returns the chosen level (Hz)."""
    sweeps = dataset.load(data)
    levels = sweeps[0].levels_hz
    total = {f: sum(s.energy_j[f] for s in sweeps) for f in levels}
    relative = {f: sum(s.energy_j[f] / s.maxn_energy_j for s in sweeps) / len(sweeps) for f in levels}
    best = min(levels, key=lambda f: (total[f], f))
    meta = dataset.meta(data)
    doc = {
        "freq_hz": best,
        "criterion": "least total energy per step, summed over the characterization configurations",
        "data": data.name, "data_sha256": dataset.sha256(data), "data_source": meta.get("source", "unknown"),
        "energy_model": meta.get("energy_model"), "configurations": len(sweeps),
        "total_energy_per_step_j": {str(f): round(total[f], 4) for f in levels},
        "mean_energy_vs_maxn": {str(f): round(relative[f], 4) for f in levels},
        "best_by_mean_relative_energy_hz": min(levels, key=lambda f: (relative[f], f)),
    }
    write_if_changed(out, json.dumps(doc, indent=2) + "\n")
    return best


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("ffg", help="derive FFG's single frequency from the characterization data",
                              description=__doc__.split("\n\n")[0])
    dataset.add_data_argument(p, "characterization CSV")
    dataset.add_file_argument(p, "--out", "ffg.json", "where to write it")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    best = run_ffg(args.data, args.out)
    print(f"{args.out}: FFG at {mhz(best)}", file=sys.stderr)
    return 0
