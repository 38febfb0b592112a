"""The model pipeline's figures: LOOCV of the committed MLG tree and the held-out evaluation against the targets.

    python -m benchmarks.model_evaluation

Prints the per-workload table and the targets, and writes the summary to docs/benchmarks.md ("evaluate"). Targets:
trained MLG within 2 points of the oracle's average savings on the held-out set; no held-out workload above MAXN's
energy. Simulated data (model/data, governor/sim/energy.py): not a hardware measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.figures import machine, markdown_table, write_section
from governor.pipeline import dataset
from governor.pipeline import evaluate as ev
from governor.pipeline.policies import TuneSettings, build_policies, model_energy_j
from governor.policy.tree import DecisionTree

MODEL = Path(__file__).resolve().parent.parent / "model"
COLUMNS = {"ffg": "FFG", "paper": "paper's tree", "mlg": "trained MLG", "tune": "online tuner", "oracle": "oracle"}


def section(sweeps, summ: dict, names: list[str], tree: DecisionTree, settings: TuneSettings) -> str:
    """docs/benchmarks.md's "evaluate" section: savings against MAXN and distance from the noise-free optimum."""
    cols = [n for n in COLUMNS if n in names]
    header = ("", *(f"{COLUMNS[n]} ({summ[n]['freq_mhz']} MHz)" if n == "ffg" else COLUMNS[n] for n in cols))
    rows = [
        (f"average energy saved vs MAXN, all {len(sweeps)} workloads", *(f"{summ[n]['average']:.2f}%" for n in cols)),
        ("models > 70M", *(f"{summ[n]['big']:.2f}%" for n in cols)),
        ("models <= 70M", *(f"{summ[n]['small']:.2f}%" for n in cols)),
        ("chosen level vs the noise-free optimum, mean / worst",
         *(f"{summ[n]['true_regret_pct']:+.2f}% / {summ[n]['true_regret_worst_pct']:+.2f}%" for n in cols)),
        ("workloads above MAXN's energy", *(str(summ[n]["above_maxn"]) for n in cols)),
    ]
    m = tree.metadata
    tune = summ.get("tune")
    profiled = (f" The tuner's whole-job energy counts its profiling at the levels probed: "
                f"{tune['profiled_mean']:.0f} steps on average, {tune['profiled_max']} at most, of "
                f"{settings.job_steps}-step jobs (noise scale {settings.noise:g}, seed {settings.seed})."
                if tune else "")
    return ("## Held-out evaluation of the policies\n\n`python -m benchmarks.model_evaluation` (`make evaluate`): "
            f"each policy on the {len(sweeps)} held-out workloads of model/data/held-out.csv (10 models x QQP, RTE, "
            "CoLA, STS-B, MNLI, WNLI; simulated Orin, not a board's measurements), deciding through the daemon's own "
            "`Policy.decide`. The oracle is the cheapest row of the held-out CSV, itself measured over noisy "
            "steps, so it can miss the noise-free optimum." + profiled + f" Machine: {machine()} (the figures do "
            "not depend on it).\n\n" + "\n".join(markdown_table(header, rows)) + "\n\n"
            f"Trained MLG: LOOCV accuracy {m['loocv_accuracy']:.2f} against the smoothed label "
            f"({m['loocv_raw_optimum_hit_rate']:.2f} against the raw per-configuration minimum), mean energy regret "
            f"{m['loocv_mean_regret_pct']:.2f}%; {summ['oracle']['average'] - summ['mlg']['average']:.2f} points "
            "behind the oracle's average saving (target: within 2).\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    tree = DecisionTree.load(MODEL / "mlg-tree.json")
    m = tree.metadata
    print(f"MLG tree: {len(tree.nodes)} nodes, leaves {[f // 10**6 for f in tree.leaves_hz()]} MHz, "
          f"hyperparameters {m['hyperparameters']}")
    print(f"LOOCV on {m['data']}: accuracy {m['loocv_accuracy']:.3f} (smoothed label), "
          f"{m['loocv_raw_optimum_hit_rate']:.3f} (raw optimum); energy regret mean {m['loocv_mean_regret_pct']:.2f}%, "
          f"max {m['loocv_max_regret_pct']:.2f}%")
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")
    settings = TuneSettings()
    policies = build_policies(MODEL / "ffg.json", MODEL / "paper-tree.json", MODEL / "mlg-tree.json", tune=settings)
    names = [p.name for p in policies]
    results = ev.evaluate(sweeps, policies, settings.job_steps)
    truth = model_energy_j(sweeps)
    print()
    print(ev.table(sweeps, results, names, settings.job_steps, truth))
    summ = ev.summary(sweeps, results, names, truth)
    summ["ffg"]["freq_mhz"] = results[sweeps[0].workload]["ffg"].freq_hz // 10**6
    gap = summ["oracle"]["average"] - summ["mlg"]["average"]
    print()
    print(f"target: MLG within 2 points of the oracle ......... {gap:.2f} points: {'met' if gap <= 2 else 'MISSED'}")
    above = summ["mlg"]["above_maxn"]
    print(f"target: no held-out workload above MAXN (MLG) ..... {above} above: {'met' if above == 0 else 'MISSED'}")
    print(f"MLG vs FFG: {summ['mlg']['average'] - summ['ffg']['average']:+.2f} points; "
          f"MLG vs paper tree: {summ['mlg']['average'] - summ['paper']['average']:+.2f} points")
    if not args.no_doc:
        print(f"wrote {write_section('evaluate', section(sweeps, summ, names, tree, settings))}", file=sys.stderr)


if __name__ == "__main__":
    main()
