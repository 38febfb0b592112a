"""Proof on the simulator that the board's measurement store teaches the tree (`make learn`, about 30 s).

The board: the simulated Orin with a different calibration of the energy model (governor.sim.learning.BOARD: a GPU
whose voltage floor holds up to 900 MHz, as another speed bin or DVFS table might; invented for the proof, unverified
on hardware). The shipped tree (model/mlg-tree.json) was trained on the default calibration, so on this board it is
wrong by a level or two, as a real board's tree would be. The daemon's decisions start from it (or from the paper's
tree, --start paper).

A stream of tuned jobs runs on the board: each is a workload from a pool of the board's users' jobs (every model of
the catalogue at a few sequence lengths, none of them a held-out workload), starting at the tree's pick, tuned by the
daemon's OnlineTuner through a TuningSession on the noisy board model, exactly the windows the daemon would measure.
Each job is recorded through the daemon's own StoreWriter (the writer thread and Store.add it uses). After 0, 10,
25, 50, 100 and 200 jobs the tree is retrained from the store (governor.pipeline.retrain, the `ftgov model retrain`
code) and scored on the 60 held-out workloads (governor.pipeline.workloads.held_out_workloads) against the board's
noise-free energies: MLG's regret (energy at its pick over the optimum), and the tuner's, started from that tree.

Feeding the store directly instead of through a running daemon is a matter of speed (200 jobs in seconds); the daemon
end of the path (a tuned job landing in the store) is tests/daemon/test_store_daemon.py.

    python -m benchmarks.learn [--out out/learn] [--jobs 200] [--seed 0]

Writes learn.csv, learn.md (the table), learn.png (regret against jobs in the store), the store itself
(measurements.sqlite) and `ftgov report` of it (report/) under --out; the table goes to docs/benchmarks.md ("learn")
and the figure beside it, to docs/learn/learn.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.figures import BENCHMARKS_MD, machine, write_section
from governor.config import TunerConfig
from governor.daemon.recorder import StoreWriter
from governor.pipeline import dataset, retrain
from governor.pipeline.workloads import held_out_workloads
from governor.policy.tree import DecisionTree
from governor.sim.learning import JOB_STEPS, board_model, features_of, stream, tuned_job
from governor.store import measurements as store_mod

REPO = Path(__file__).resolve().parent.parent

CHECKPOINTS = (0, 10, 25, 50, 100, 200)


def held_out_regret(decide, board, cfg: TunerConfig, seed: int) -> dict:
    """Mean and max regret (%) of MLG's pick and of the tuner started from it, on the held-out workloads."""
    mlg, tune = [], []
    for i, w in enumerate(held_out_workloads()):
        e = {hz: board.expected(w, hz).energy_j for hz in board.levels_hz}
        opt = min(e.values())
        pick = decide(features_of(board, w))
        mlg.append(100 * (e[pick] / opt - 1))
        run = tuned_job(w, pick, 7919 * i + seed, cfg)
        tune.append(100 * (run.energy_j / (JOB_STEPS * opt) - 1))  # the whole job, exploration counted
    return {"mlg_mean": statistics.mean(mlg), "mlg_max": max(mlg), "tune_mean": statistics.mean(tune),
            "tune_max": max(tune)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "out" / "learn")
    p.add_argument("--jobs", type=int, default=CHECKPOINTS[-1])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="joblib workers for retraining's LOOCV")
    p.add_argument("--start", choices=("shipped", "paper"), default="shipped",
                   help="the wrong tree the daemon starts with (default: the shipped tree, trained on another "
                        "calibration)")
    p.add_argument("--no-doc", action="store_true", help="leave docs/benchmarks.md and docs/learn/ alone (other seeds "
                   "and starts, for docs/store.md)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    board = board_model()
    cfg = TunerConfig()
    sweeps = dataset.load(REPO / "model" / "data" / "characterization.csv")
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    paper = DecisionTree.load(REPO / "model" / "paper-tree.json")
    levels = board.levels_hz
    start_tree = shipped if args.start == "shipped" else paper
    start_decide = retrain.tree_decider(start_tree, levels)
    store_path = args.out / "measurements.sqlite"
    for old in args.out.glob("measurements.sqlite*"):
        old.unlink()
    writer = StoreWriter(store_path)
    rows = []
    baseline = {"paper": held_out_regret(retrain.tree_decider(paper, levels), board, cfg, args.seed),
                "shipped": held_out_regret(retrain.tree_decider(shipped, levels), board, cfg, args.seed)}
    checkpoints = [c for c in CHECKPOINTS if c <= args.jobs]
    done = 0
    for n in checkpoints:
        for rec in stream(start_decide, n - done, args.seed, cfg, first_index=done):
            writer.submit(rec)  # the daemon's writer thread and Store.add
        done = n
        writer.join_queue()
        conn = store_mod.open_read_only(store_path)
        records = store_mod.read_jobs(conn)
        conn.close()
        result = retrain.retrain(records, sweeps, args.seed, start_tree, args.workers)
        tree_path = args.out / f"tree-{n}.json"
        retrain.export_tree(result, tree_path, {"benchmark": "benchmarks/learn.py", "jobs": n})
        tree = DecisionTree.load(tree_path)  # the daemon's reader, as the reloaded daemon would decide
        scores = held_out_regret(retrain.tree_decider(tree, levels), board, cfg, args.seed)
        r = result.report
        rows.append({"jobs": n, "labelled": r["labelled_curves"], **{k: round(v, 3) for k, v in scores.items()},
                     "board_before": (r["before"] or {}).get("mean_regret_pct"),
                     "board_after": r["after"]["mean_regret_pct"], "loocv_regret": r["loocv_mean_regret_pct"]})
        print(f"{n:4d} jobs, {r['labelled_curves']:3d} labelled: held-out MLG {scores['mlg_mean']:.2f}% "
              f"(max {scores['mlg_max']:.1f}%), tuner from it {scores['tune_mean']:.2f}%  "
              f"[{time.monotonic() - t0:.0f} s]", file=sys.stderr)
    writer.close()
    # What the per-level correction of the sweeps is worth: the same store, the sweeps left as shipped.
    plain = retrain.retrain(records, sweeps, args.seed, start_tree, args.workers, correct=False)
    retrain.export_tree(plain, args.out / "tree-uncorrected.json", {"benchmark": "benchmarks/learn.py"})
    ablation = held_out_regret(retrain.tree_decider(DecisionTree.load(args.out / "tree-uncorrected.json"), levels),
                               board, cfg, args.seed)
    table = _write(args.out, rows, baseline, ablation, args.start)
    if not args.no_doc:
        _write_section(table, args)
    from governor.cli import main as ftgov

    ftgov(["report", "--store", str(store_path), "--out", str(args.out / "report")])
    last = rows[-1]
    ok = last["mlg_mean"] < baseline["shipped"]["mlg_mean"] and last["mlg_mean"] < baseline[args.start]["mlg_mean"]
    print(f"retrained MLG {last['mlg_mean']:.2f}% vs shipped MLG {baseline['shipped']['mlg_mean']:.2f}% on the "
          f"held-out workloads ({ablation['mlg_mean']:.2f}% without the correction of the sweeps): "
          f"{'better' if ok else 'NOT better'} [{time.monotonic() - t0:.0f} s]; store {store_path}", file=sys.stderr)
    return 0 if ok else 1


def _write_section(table: str, args) -> None:
    """docs/benchmarks.md's "learn" section: the table, what was run, and its figure (copied to docs/learn/)."""
    figure = BENCHMARKS_MD.parent / "learn" / "learn.png"
    if (args.out / "learn.png").resolve() != figure.resolve():
        figure.parent.mkdir(exist_ok=True)
        shutil.copyfile(args.out / "learn.png", figure)
    text = (f"## The measurement store teaching the tree\n\n`python -m benchmarks.learn --jobs {args.jobs} --seed "
            f"{args.seed} --start {args.start}` (`make learn`): one stream of {args.jobs} tuned jobs on a simulated "
            "board the shipped tree was not trained for (governor.sim.learning.BOARD), the tree retrained from the "
            "store after each count of jobs in the first column and scored on the 60 held-out workloads; one seed. "
            f"Machine: {machine()} (the figures do not depend on it).\n\n{table}\n"
            "![held-out regret against jobs in the store](learn/learn.png)\n")
    print(f"wrote {write_section('learn', text)}", file=sys.stderr)


def _write(out: Path, rows: list[dict], baseline: dict, ablation: dict, start: str) -> str:
    """Writes learn.csv, learn.md, learn.json and learn.png under ``out``; returns the table (learn.md's text)."""
    import csv

    with (out / "learn.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    lines = ["| jobs in the store | labelled workloads | MLG regret, held-out (mean / max) | tuner from that tree "
             "(whole job) |", "|---:|---:|---:|---:|"]
    for name, b in (("paper tree", baseline["paper"]), ("shipped tree", baseline["shipped"])):
        lines.append(f"| {name} | - | {b['mlg_mean']:.2f}% / {b['mlg_max']:.1f}% | {b['tune_mean']:.2f}% |")
    for r in rows:
        lines.append(f"| {r['jobs']} | {r['labelled']} | {r['mlg_mean']:.2f}% / {r['mlg_max']:.1f}% | "
                     f"{r['tune_mean']:.2f}% |")
    lines.append(f"| {rows[-1]['jobs']}, sweeps not corrected | {rows[-1]['labelled']} | {ablation['mlg_mean']:.2f}% / "
                 f"{ablation['mlg_max']:.1f}% | {ablation['tune_mean']:.2f}% |")
    lines.append("")
    lines.append(f"Jobs started from the {start} tree; regret against the board's noise-free optimum, 60 held-out "
                 "workloads.")
    table = "\n".join(lines) + "\n"
    (out / "learn.md").write_text(table)
    (out / "learn.json").write_text(json.dumps({"start": start, "rows": rows, "baseline": baseline,
                                                "uncorrected": ablation}, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    xs = [max(r["jobs"], 1) for r in rows]
    ax.plot(xs, [r["mlg_mean"] for r in rows], "o-", label="MLG, retrained tree")
    ax.plot(xs, [r["tune_mean"] for r in rows], "s-", label="tuner from the retrained tree")
    ax.axhline(baseline["shipped"]["mlg_mean"], color="C3", ls="--", label="MLG, shipped tree")
    ax.axhline(baseline["paper"]["mlg_mean"], color="C7", ls=":", label="MLG, paper tree")
    ax.set_xscale("log")
    ax.set_xlabel("tuned jobs in the board's store (0 plotted at 1)")
    ax.set_ylabel("mean energy regret, held-out (%)")
    ax.set_title(f"Simulated board B, jobs started from the {start} tree", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learn.png", dpi=120)
    return table


if __name__ == "__main__":
    sys.exit(main())
