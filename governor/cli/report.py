"""`ftgov report --out DIR`: what the board measured and saved, as figures and a table.

- curves.png: per workload (jobs of the same features), the measured energy per step at each level the tuner visited,
  the minimum marked where the windows bracket it (what retraining takes as the label);
- savings.png: each job's measured saving over time, and the cumulative energy saved, by basis;
- summary.md and summary.csv: per workload, its jobs, levels measured, bracketed minimum, last pick, mean saving (by
  basis: against the default governor, against the tuner's start) and energy.

matplotlib is imported inside the command (`pip install 'ftgov[model]'`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections import Counter
from datetime import datetime, timedelta
from itertools import accumulate

from governor.argtypes import absolute_path
from governor.cli.history import SINCE_HELP, add_store_arguments, load, parse_since, saved_totals
from governor.errors import FtgovError
from governor.safefile import OutDir
from governor.text import isolated, printable
from governor.units import energy, energy_unit, figure, mhz

MAX_CURVE_PANELS = 12
# Every file a report writes. Common names: a directory that holds anything else (`--out .` in a project) keeps its
# own summary.md unless --force says to replace it.
REPORT_FILES = ("curves.png", "savings.png", "summary.md", "summary.csv")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="figures and a table of the board's measured curves and savings",
                       description="Draw the board's measured energy curves per workload and the savings over time "
                                   "(PNG), and write a summary table, from the measurement store.")
    add_store_arguments(p)
    p.add_argument("--out", type=absolute_path, required=True,
                   help="directory for curves.png, savings.png, summary.md/.csv")
    p.add_argument("--since", help=SINCE_HELP)
    p.add_argument("--force", action="store_true",
                   help="replace curves.png, savings.png, summary.md and summary.csv in a directory that holds other "
                        "files too (without it, only a directory of an earlier report has them replaced)")
    p.set_defaults(func=run)


def workloads(jobs) -> list[dict]:
    """Jobs grouped by features and GPU (its table of levels), the most frequent first; each with its pooled curve and
    bracketed minimum. A host's GPUs of different tables (an A100 beside an H100) give a workload each: one table for
    all left the other GPUs' windows out of every curve."""
    from governor.features import Features
    from governor.pipeline.board_data import board_curves, feature_key

    tables = _tables(jobs)
    by_table: dict[tuple, list] = {}
    for j in jobs:
        by_table.setdefault(tables[id(j)], []).append(j)
    curves = {(feature_key(c.features), table): c
              for table, members in by_table.items() for c in board_curves(members, table)}
    groups: dict[tuple, list] = {}
    for j in jobs:
        f = Features(model_type=j.model_type, num_layers=j.num_layers, hidden_size=j.hidden_size,
                     seq_len=float(j.seq_len), gpu_util=j.gpu_util if j.gpu_util is None else float(j.gpu_util))
        groups.setdefault((feature_key(f), tables[id(j)]), []).append(j)
    out = []
    for (key, table), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        names = Counter(printable(j.name) if j.name else "-" for j in members)
        gpus = Counter(printable(j.gpu_name) if j.gpu_name else "-" for j in members)
        out.append({"key": key, "name": names.most_common(1)[0][0], "gpu": gpus.most_common(1)[0][0],
                    "jobs": members, "curve": curves.get((key, table)),
                    **{f"mean_saved_vs_{short}": _mean_saved(members, basis) for basis, short in BASES},
                    "energy_j": sum(j.energy_j or 0.0 for j in members)})
    return out


def _tables(jobs) -> dict[int, tuple[int, ...]]:
    """Each job's table of levels (by id): its own; for a job an older store kept without one, the newest table of a
    job on a GPU of the same name, else the newest of all, else the levels its jobs' windows measured."""
    newest: dict[str | None, tuple[int, ...]] = {}
    for j in jobs:
        if j.levels_hz:
            newest[j.gpu_name] = newest[None] = tuple(json.loads(j.levels_hz))
    fallback = newest.get(None) or tuple(sorted({w.level_hz for j in jobs for w in j.windows
                                                 if w.level_hz is not None}))
    return {id(j): tuple(json.loads(j.levels_hz)) if j.levels_hz else newest.get(j.gpu_name, fallback) for j in jobs}


# A measured saving's basis (the store's saved_basis) and its short name in the summary's columns. The two are different
# figures (against the default governor, ftgov's saving; against the tuner's start, what tuning added to the tree's
# pick), kept apart as the store's totals keep them.
BASES = (("default governor", "default"), ("start level", "start"))
_BASIS_WORDS = {"default governor": "the default governor", "start level": "the tuner's start"}


def _mean_saved(jobs, basis: str) -> float | None:
    saved = [j.saved_rel for j in jobs if j.saved_rel is not None and j.saved_basis == basis]
    return sum(saved) / len(saved) if saved else None


def run(args: argparse.Namespace) -> int:
    try:
        jobs, totals = load(args, parse_since(args.since) if args.since else None, "report")
        if not jobs:
            raise FtgovError("the store holds no jobs" + (f" since {args.since}" if args.since else ""))
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise FtgovError("ftgov report needs matplotlib: pip install 'ftgov[model]'") from e
        # Root runs reports into directories members may own: every file goes in through the checked directory's
        # descriptor (governor/safefile.py), never by path.
        out = OutDir(args.out)
        if not args.force:
            _refuse_to_replace_others(out)
    except (FtgovError, OSError) as e:
        print(f"ftgov report: {e}", file=sys.stderr)
        return 1
    try:
        with out:
            groups = workloads(jobs)
            _curves(plt, groups, out)
            _savings(plt, jobs, out)
            _summary(groups, totals, out)
    except OSError as e:  # a directory of root's for a member, a full disk: the error's own name is a temp file's
        print(f"ftgov report: cannot write the report in {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{args.out}: curves.png, savings.png, summary.md, summary.csv ({len(jobs)} jobs, {len(groups)} workloads)")
    return 0


def _refuse_to_replace_others(out: OutDir) -> None:
    """An error where the report would replace a file of a directory that holds other files as well: those of the
    report's names there are then not an earlier report's, most likely (a project's own summary.md)."""
    try:
        entries = set(os.listdir(out.fd))
    except OSError as e:
        out.close()
        raise FtgovError(f"{out.path}: {e.strerror or e}") from e
    clash = [n for n in REPORT_FILES if n in entries]
    if clash and entries - set(REPORT_FILES):
        out.close()
        raise FtgovError(f"{out.path} holds other files, and {', '.join(clash)} would be replaced: give a new or "
                         f"empty directory for --out, or --force to replace them")


def _label(g: dict) -> str:
    model_type, layers, hidden, seq, util = g["key"]
    return f"{g['name'][:28]} ({g['gpu'][:24]})\n{model_type} L{layers} H{hidden} seq {seq:g} util {_util(util)}"


def _util(util_pct) -> str:
    return "-" if util_pct is None else f"{util_pct:g}%"  # registered without gpu_util and never measured


def _save(fig, out: OutDir, name: str) -> None:
    with out.open(name, text=False) as f:
        fig.savefig(f, format="png", dpi=110)


def _curves(plt, groups: list[dict], out: OutDir) -> None:
    shown = [g for g in groups if g["curve"] is not None][:MAX_CURVE_PANELS]
    cols = min(4, max(1, len(shown)))
    rows = max(1, -(-len(shown) // cols))
    # At least two panels wide, so that one panel's three-line title and the figure's title fit; constrained layout
    # makes room for the titles, which tight_layout does not do for the figure's.
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * max(cols, 2), 3.1 * rows + 0.4), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    if not shown:
        axes[0][0].text(0.5, 0.5, "no tuned jobs: no measured curves", ha="center", va="center")
    for ax, g in zip(axes.flat, shown, strict=False):
        c = g["curve"]
        mhz = [hz / 1e6 for hz in c.energy_j]
        ax.plot(mhz, list(c.energy_j.values()), "o-", ms=4)
        if c.label_hz is not None:
            ax.plot([c.label_hz / 1e6], [c.energy_j[c.label_hz]], "r*", ms=12, label="bracketed minimum")
            ax.legend(fontsize=6)
        # parse_math off: a job name is a client's string, and "$...$" in it would be typeset (or crash the report).
        ax.set_title(_label(g) + f"\n{c.jobs} tuned job(s)", fontsize=7, parse_math=False)
        ax.set_xlabel("GPU MHz", fontsize=7)
        ax.set_ylabel("J / step", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle("Measured energy per step (tuner windows, pooled per workload)", fontsize=9)
    _save(fig, out, "curves.png")
    plt.close(fig)


def _savings(plt, jobs, out: OutDir) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    measured = [j for j in jobs if j.saved_rel is not None]
    for basis, marker in (("default governor", "o"), ("start level", "^")):
        pts = [j for j in measured if j.saved_basis == basis]
        if pts:
            ax.plot([datetime.fromtimestamp(j.ended_at) for j in pts], [100 * j.saved_rel for j in pts], marker,
                    ls="none", ms=4, label=f"per job, vs the {basis}")
    ax.set_ylabel("energy saved per step (%)")
    ax.axhline(0, color="0.6", lw=0.8)
    ax2 = ax.twinx()
    # One curve a basis, as the store's totals keep them; the default governor's always (the time axis is its).
    cumulative = {basis: list(accumulate((j.saved_j or 0.0) if j.saved_basis == basis else 0.0 for j in jobs))
                  for basis, short in BASES if short == "default" or any(j.saved_basis == basis for j in jobs)}
    scale, unit = energy_unit(max((abs(c) for curve in cumulative.values() for c in curve), default=0.0))
    ended = [datetime.fromtimestamp(j.ended_at) for j in jobs]
    for (basis, curve), style in zip(cumulative.items(), ("C3-", "C2--"), strict=False):
        ax2.plot(ended, [c / scale for c in curve], style, label=f"cumulative saved vs {_BASIS_WORDS[basis]}")
    ax2.set_ylabel(f"cumulative saved ({unit})")
    ax.set_xlim(*_time_limits(ended))
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(handles, labels, fontsize=7, loc="upper left")
    ax.set_title("Measured savings over time", fontsize=9)
    fig.autofmt_xdate()
    fig.tight_layout()
    _save(fig, out, "savings.png")
    plt.close(fig)


def _time_limits(times: list[datetime]) -> tuple[datetime, datetime]:
    """The x range around the jobs: their span and 5% either side, at least an hour in all. Left to matplotlib, a
    single date (or none on one of the twin axes) spans years."""
    first, last = min(times), max(times)
    pad = max((last - first) * 0.05, (timedelta(hours=1) - (last - first)) / 2)
    return first - pad, last + pad


def _cell(text: str) -> str:
    """A client's string as a CSV cell a spreadsheet shows as text: one starting with = + - @ (or a tab or CR) would
    be read as a formula, so it gets a leading apostrophe (the usual guard against CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _md_cell(row: dict, key: str) -> str:
    text = str(row[key]).replace("|", "\\|")
    return isolated(text) if key == "workload" else text  # a right-to-left name cannot reorder the row


SUMMARY_FIELDS = ("workload", "gpu", "model_type", "num_layers", "hidden_size", "seq_len", "gpu_util", "jobs",
                  "tuned_jobs", "levels_measured", "bracketed_minimum_mhz", "last_pick_mhz",
                  "mean_saved_vs_default_pct", "mean_saved_vs_start_pct", "energy_j")


def _summary(groups: list[dict], totals: dict, out: OutDir) -> None:
    rows = []
    for g in groups:
        c, members = g["curve"], g["jobs"]
        model_type, layers, hidden, seq, util = g["key"]
        last = members[-1].freq_hz
        rows.append({"workload": _cell(g["name"]), "gpu": _cell(g["gpu"]), "model_type": model_type,
                     "num_layers": layers, "hidden_size": hidden, "seq_len": seq,
                     "gpu_util": "" if util is None else util,
                     "jobs": len(members),
                     "tuned_jobs": sum(1 for j in members if j.windows),
                     "levels_measured": len(c.energy_j) if c else 0,
                     "bracketed_minimum_mhz": mhz(c.label_hz, unit=False) if c and c.label_hz else "",
                     "last_pick_mhz": mhz(last, unit=False) if last else "",
                     **{f"mean_saved_vs_{short}_pct": "" if g[f"mean_saved_vs_{short}"] is None
                        else figure(100 * g[f"mean_saved_vs_{short}"], ".2f") for _, short in BASES},
                     "energy_j": f"{g['energy_j']:.1f}"})
    with out.open("summary.csv") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    md = ["| " + " | ".join(SUMMARY_FIELDS) + " |", "|" + "---|" * len(SUMMARY_FIELDS)]
    md += ["| " + " | ".join(_md_cell(r, k) for k in SUMMARY_FIELDS) + " |" for r in rows]
    md.append("")
    md.append(f"{totals['jobs']} jobs recorded in all: {energy(totals['energy_j'])}; {saved_totals(totals)}.")
    out.write_text("summary.md", "\n".join(md) + "\n")
