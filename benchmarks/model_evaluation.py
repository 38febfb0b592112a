"""The model pipeline's figures: LOOCV of the committed MLG tree and the held-out evaluation against the targets.

    python -m benchmarks.model_evaluation

Targets: trained MLG within 2 points of the oracle's average savings on the held-out set; no held-out
workload above MAXN's energy. Simulated data (model/data, governor/sim/energy.py): not a hardware measurement.
"""

from __future__ import annotations

from pathlib import Path

from governor.pipeline import dataset
from governor.pipeline import evaluate as ev
from governor.pipeline.policies import build_policies
from governor.policy.tree import DecisionTree

MODEL = Path(__file__).resolve().parent.parent / "model"


def main() -> None:
    tree = DecisionTree.load(MODEL / "mlg-tree.json")
    m = tree.metadata
    print(f"MLG tree: {len(tree.nodes)} nodes, leaves {[f // 10**6 for f in tree.leaves_hz()]} MHz, "
          f"hyperparameters {m['hyperparameters']}")
    print(f"LOOCV on {m['data']}: accuracy {m['loocv_accuracy']:.3f} (smoothed label), "
          f"{m['loocv_raw_optimum_hit_rate']:.3f} (raw optimum); energy regret mean {m['loocv_mean_regret_pct']:.2f}%, "
          f"max {m['loocv_max_regret_pct']:.2f}%")
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")
    policies = build_policies(MODEL / "ffg.json", MODEL / "paper-tree.json", MODEL / "mlg-tree.json")
    names = [p.name for p in policies]
    results = ev.evaluate(sweeps, policies)
    print()
    print(ev.table(sweeps, results, names))
    summ = ev.summary(sweeps, results, names)
    gap = summ["oracle"]["average"] - summ["mlg"]["average"]
    print()
    print(f"target: MLG within 2 points of the oracle ......... {gap:.2f} points: {'met' if gap <= 2 else 'MISSED'}")
    above = summ["mlg"]["above_maxn"]
    print(f"target: no held-out workload above MAXN (MLG) ..... {above} above: {'met' if above == 0 else 'MISSED'}")
    print(f"MLG vs FFG: {summ['mlg']['average'] - summ['ffg']['average']:+.2f} points; "
          f"MLG vs paper tree: {summ['mlg']['average'] - summ['paper']['average']:+.2f} points")


if __name__ == "__main__":
    main()
