"""PNG plots for `ftgov evaluate`: energy-vs-frequency per workload with each policy's pick, and savings bars.

matplotlib with the Agg backend (no display needed), imported only here.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from governor.pipeline.dataset import Sweep
from governor.safefile import open_file

# One look per policy, kept across both plots; other policies fall back to the cycle.
STYLE = {
    "ffg": {"color": "#1f77b4", "marker": "s", "size": 70},
    "paper": {"color": "#ff7f0e", "marker": "^", "size": 60},
    "mlg": {"color": "#2ca02c", "marker": "o", "size": 45},
    "tune": {"color": "#9467bd", "marker": "D", "size": 28},  # its bar is the whole job, profiling included
    "oracle": {"color": "#d62728", "marker": "*", "size": 40},
}
FALLBACK_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _style(name: str, i: int) -> dict:
    return STYLE.get(name, {"color": FALLBACK_COLORS[i % len(FALLBACK_COLORS)], "marker": "D", "size": 40})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> None:
    """The figure as a PNG at ``path``, through the checked directory (governor/safefile.py): root may run this."""
    with open_file(path, text=False) as f:
        fig.savefig(f, format="png", dpi=110)


def energy_curves(sweeps: list[Sweep], results, names: list[str], path: Path, title: str) -> Path:
    """Small multiples, one model per row and one task per column: energy relative to MAXN vs clock."""
    plt = _pyplot()
    models = list(dict.fromkeys(s.model for s in sweeps))
    tasks = list(dict.fromkeys(s.task for s in sweeps))
    by_key = {(s.model, s.task): s for s in sweeps}
    fig, axes = plt.subplots(len(models), len(tasks), figsize=(2.6 * len(tasks), 2.0 * len(models) + 0.8),
                             sharex=True, sharey=True, squeeze=False)
    picked = [n for n in names if n != "maxn"]
    rel_all = [s.energy_j[f] / s.maxn_energy_j for s in sweeps for f in s.levels_hz]
    y_lo, y_hi = min(0.9, min(rel_all)) - 0.05, min(max(1.1, max(rel_all)), 1.6) + 0.05
    for r, model in enumerate(models):
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            s = by_key.get((model, task))
            if s is None:
                ax.set_axis_off()
                continue
            mhz = [f / 1e6 for f in s.levels_hz]
            rel = [s.energy_j[f] / s.maxn_energy_j for f in s.levels_hz]
            ax.plot(mhz, rel, color="0.35", lw=1.2, zorder=1)
            ax.axhline(1.0, color="0.5", ls="--", lw=0.8, zorder=0)
            for i, name in enumerate(picked):
                hz = results[s.workload][name].freq_hz
                st = _style(name, i)
                ax.scatter([hz / 1e6], [s.energy_j[hz] / s.maxn_energy_j], s=st["size"], marker=st["marker"],
                           facecolor=st["color"], edgecolor="white", linewidth=0.6, zorder=2 + i)
            ax.grid(alpha=0.25, lw=0.5)
            ax.set_ylim(y_lo, y_hi)
            if r == 0:
                ax.set_title(task.upper(), fontsize=10)
            if c == 0:
                ax.set_ylabel(f"{model}\nE / E(MAXN)", fontsize=8)
            if r == len(models) - 1:
                ax.set_xlabel("GPU clock (MHz)", fontsize=8)
            ax.tick_params(labelsize=7)
    handles = [plt.Line2D([], [], color="0.35", lw=1.2, label="energy per step"),
               plt.Line2D([], [], color="0.5", ls="--", lw=0.8, label="MAXN")]
    for i, name in enumerate(picked):
        st = _style(name, i)
        handles.append(plt.Line2D([], [], ls="", marker=st["marker"], color=st["color"], markersize=7,
                                  label=f"{name} pick"))
    fig.suptitle(title, y=0.995, fontsize=11)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.975), ncol=len(handles), fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    save_png(fig, path)
    plt.close(fig)
    return path


def savings_bars(sweeps: list[Sweep], results, names: list[str], path: Path) -> Path:
    """Horizontal grouped bars: savings vs MAXN per workload, the average on top."""
    plt = _pyplot()
    picked = [n for n in names if n != "maxn"]
    rows = [("average", {n: statistics.mean(s.savings_pct(results[s.workload][n].energy_j) for s in sweeps)
                         for n in picked})]
    rows += [(s.workload, {n: s.savings_pct(results[s.workload][n].energy_j) for n in picked}) for s in sweeps]
    height = 0.8 / len(picked)
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.5))
    for i, name in enumerate(picked):
        st = _style(name, i)
        ys = [k + (i - (len(picked) - 1) / 2) * height for k in range(len(rows))]
        ax.barh(ys, [v[name] for _, v in rows], height=height, color=st["color"], label=name)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=7)
    ax.get_yticklabels()[0].set_fontweight("bold")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, no empty margins
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("energy saved vs MAXN (%)  (per step, VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(picked), fontsize=8, frameon=False)
    ax.set_title("Savings against MAXN on the held-out workloads", fontsize=11, pad=22)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path


def write_all(sweeps: list[Sweep], results, names: list[str], out_dir: Path) -> list[Path]:
    written = []
    families = list(dict.fromkeys(s.model.split("-")[0] for s in sweeps))
    for family in families:
        members = [s for s in sweeps if s.model.split("-")[0] == family]
        written.append(energy_curves(members, results, names, out_dir / f"energy-vs-frequency-{family}.png",
                                     f"{family}: energy per step relative to MAXN, with each policy's pick"))
    written.append(savings_bars(sweeps, results, names, out_dir / "savings.png"))
    return written
