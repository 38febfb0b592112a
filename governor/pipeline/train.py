"""Train the MLG decision tree (the `fit` stage): choose hyperparameters by leave-one-out cross-validation on the
labels `dataset` wrote, fit on everything, save the estimator (joblib) and the CV report.

Hyperparameters are chosen by LOOCV energy regret (energy at the predicted level over the optimum's), not accuracy:
a near miss (816 MHz for a 714 MHz optimum on a flat U) costs a fraction of a percent, a far miss costs tens of
percent, and accuracy cannot tell them apart. Accuracy breaks ties, then the simpler tree. Both are reported. Regret
needs the whole energy curve, so fit reads the characterization CSV beside the labels.

scikit-learn and joblib are imported inside the functions: the daemon never imports this module.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from governor.errors import FtgovError
from governor.features import FEATURE_ORDER
from governor.pipeline import dataset
from governor.pipeline.dataset import Sweep, label_hz
from governor.safefile import open_file, write_file

# Small on purpose: 27 samples cannot support a finer search, and every extra point is one more way to overfit LOOCV.
PARAM_GRID = {
    "criterion": ("gini", "entropy"),
    "max_depth": (1, 2, 3, 4, 5, None),
    "min_samples_leaf": (1, 2, 3, 4, 5),
}


@dataclass(frozen=True)
class CvResult:
    params: dict
    accuracy: float  # LOOCV, fraction of configurations whose label (smoothed optimum) was predicted exactly
    mean_regret_pct: float  # LOOCV, mean over configurations of energy at the prediction over the optimum
    max_regret_pct: float
    predictions_hz: tuple[int, ...]  # per configuration, from the fold that held it out


Labels = dict[str, int]  # workload -> label level (Hz), as `dataset` wrote them


def design(sweeps: list[Sweep], labels: Labels | None = None):
    """(X, y): the five features in FEATURE_ORDER, encoded as the daemon encodes them; y = label level in Hz
    (``labels``, or dataset.label_hz of each sweep when None)."""
    import numpy as np

    X = np.array([s.features.vector() for s in sweeps], dtype=np.float64)
    y = np.array([labels[s.workload] if labels is not None else label_hz(s) for s in sweeps], dtype=np.int64)
    return X, y


def make_estimator(params: dict, seed: int):
    from sklearn.tree import DecisionTreeClassifier

    return DecisionTreeClassifier(random_state=seed, **params)


def loocv(sweeps: list[Sweep], params: dict, seed: int, labels: Labels | None = None) -> CvResult:
    """Leave each configuration out in turn, fit on the rest, predict it."""
    import numpy as np

    X, y = design(sweeps, labels)
    preds = []
    for i in range(len(sweeps)):
        keep = np.arange(len(sweeps)) != i
        est = make_estimator(params, seed).fit(X[keep], y[keep])
        preds.append(int(est.predict(X[i : i + 1])[0]))
    regrets = [s.regret_pct(p) for s, p in zip(sweeps, preds, strict=False)]
    accuracy = float(np.mean([p == label for p, label in zip(preds, y, strict=False)]))
    return CvResult(dict(params), accuracy, float(np.mean(regrets)), float(np.max(regrets)), tuple(preds))


def grid() -> list[dict]:
    keys = sorted(PARAM_GRID)
    return [dict(zip(keys, values, strict=False)) for values in itertools.product(*(PARAM_GRID[k] for k in keys))]


def search(sweeps: list[Sweep], seed: int, n_jobs: int = 1,
           labels: Labels | None = None) -> tuple[CvResult, list[CvResult]]:
    """LOOCV over the grid in parallel (joblib); the winner by (regret, -accuracy, simplicity, grid order)."""
    from joblib import Parallel, delayed

    candidates = grid()
    results = Parallel(n_jobs=n_jobs)(delayed(loocv)(sweeps, p, seed, labels) for p in candidates)

    return pick_best(results), list(results)


def pick_best(results):
    """The winner of a grid search by (regret, -accuracy, simplicity, grid order): for the fit stage and retrain
    alike. Each result has ``mean_regret_pct``, ``accuracy`` and ``params``."""
    def rank(item):
        i, r = item
        depth = r.params["max_depth"] if r.params["max_depth"] is not None else 99
        # rounded so that float noise in the last digit cannot reorder equal results between machines
        return (round(r.mean_regret_pct, 9), -round(r.accuracy, 9), depth, -r.params["min_samples_leaf"], i)

    return min(enumerate(results), key=rank)[1]


def fit(sweeps: list[Sweep], params: dict, seed: int, labels: Labels | None = None):
    X, y = design(sweeps, labels)
    return make_estimator(params, seed).fit(X, y)


def feature_names() -> list[str]:
    return list(FEATURE_ORDER)


def run_fit(data: Path, dataset_path: Path, estimator_path: Path, report_path: Path, seed: int, jobs: int) -> dict:
    """The `fit` stage: LOOCV search, fit on everything, write the estimator and the report; returns the report."""
    import joblib
    import sklearn

    sweeps = dataset.load(data)
    labels = dataset.read_labels(dataset_path, sweeps)
    best, results = search(sweeps, seed=seed, n_jobs=jobs, labels=labels)
    estimator = fit(sweeps, best.params, seed, labels)
    with open_file(estimator_path, text=False) as f:
        joblib.dump(estimator, f)
    report = {
        "data": str(data.name), "data_sha256": dataset.sha256(data), "seed": seed,
        "params": best.params, "loocv_accuracy": round(best.accuracy, 4),
        "loocv_mean_regret_pct": round(best.mean_regret_pct, 3), "loocv_max_regret_pct": round(best.max_regret_pct, 3),
        "loocv_predictions_hz": {s.workload: p for s, p in zip(sweeps, best.predictions_hz, strict=False)},
        "label_hz": {s.workload: labels[s.workload] for s in sweeps},
        "raw_optimum_hz": {s.workload: s.optimum_hz for s in sweeps},
        "loocv_raw_optimum_hit_rate": round(sum(p == s.optimum_hz
                                                for s, p in zip(sweeps, best.predictions_hz, strict=True))
                                            / len(sweeps), 4),
        "train_accuracy": round(float(estimator.score(*design(sweeps, labels))), 4),
        "n_leaves": int(estimator.get_n_leaves()), "depth": int(estimator.get_depth()),
        "grid_size": len(results), "sklearn_version": sklearn.__version__,
        "grid": [{"params": r.params, "accuracy": round(r.accuracy, 4), "mean_regret_pct": round(r.mean_regret_pct, 3)}
                 for r in results],
    }
    write_file(report_path, json.dumps(report, indent=2) + "\n")
    print(f"LOOCV over {len(sweeps)} configurations, {len(results)} hyperparameter sets; chosen {best.params}\n"
          f"  LOOCV accuracy {best.accuracy:.3f} (raw optimum hit {report['loocv_raw_optimum_hit_rate']:.3f}), "
          f"mean energy regret {best.mean_regret_pct:.2f}% (max {best.max_regret_pct:.2f}%); "
          f"tree: depth {report['depth']}, {report['n_leaves']} leaves", file=sys.stderr)
    return report


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("fit", help="choose the tree's hyperparameters by LOOCV energy regret and fit it",
                              description=__doc__.split("\n\n")[0])
    dataset.add_data_argument(p, "characterization CSV (the energy curves that score each fold), the one `dataset` "
                              "labelled")
    dataset.add_file_argument(p, "--dataset", "dataset.csv", "labels from `dataset`")
    dataset.add_file_argument(p, "--estimator", "mlg.joblib", "joblib file to write")
    dataset.add_file_argument(p, "--report", "cv-report.json", "CV report to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="joblib workers for the LOOCV search")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    if args.jobs < 1:
        raise FtgovError(f"--jobs must be >= 1, got {args.jobs}")
    run_fit(args.data, args.dataset, args.estimator, args.report, args.seed, args.jobs)
    return 0
