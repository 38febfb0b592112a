"""Train the MLG decision tree: label each configuration with its energy-optimal level, choose hyperparameters by
leave-one-out cross-validation, fit on everything.

The label is the optimum of the measured energy curve after a 3-point smoothing across neighbouring levels (weights
1-2-1 on log energy). The floor of a U is flat to within run-to-run noise (1-3 %), so the raw argmin flips between
neighbours by chance and a tree fitted to it learns the noise; the smoothed optimum is the centre of the floor.
Regret is always measured against the raw energies (docs/energy-model.md has the figures).

Hyperparameters are chosen by LOOCV energy regret (energy at the predicted level over the optimum's), not accuracy:
a near miss (816 MHz for a 714 MHz optimum on a flat U) costs a fraction of a percent, a far miss costs tens of
percent, and accuracy cannot tell them apart. Accuracy breaks ties, then the simpler tree. Both are reported.

scikit-learn and joblib are imported inside the functions: the daemon never imports this module.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from governor.features import FEATURE_ORDER
from governor.pipeline.dataset import Sweep

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


SMOOTHING = (1.0, 2.0, 1.0)


def label_hz(sweep: Sweep) -> int:
    """The level at the minimum of the smoothed log-energy curve (weights renormalised at the ends of the table)."""
    levels = sweep.levels_hz
    log_e = [math.log(sweep.energy_j[f]) for f in levels]
    smoothed = []
    for i in range(len(levels)):
        pairs = [(w, log_e[j]) for j, w in zip((i - 1, i, i + 1), SMOOTHING) if 0 <= j < len(levels)]
        smoothed.append(sum(w * v for w, v in pairs) / sum(w for w, _ in pairs))
    return levels[min(range(len(levels)), key=lambda i: (smoothed[i], i))]


def design(sweeps: list[Sweep]):
    """(X, y): the five features in FEATURE_ORDER, encoded as the daemon encodes them; y = label level in Hz."""
    import numpy as np

    X = np.array([s.features.vector() for s in sweeps], dtype=np.float64)
    y = np.array([label_hz(s) for s in sweeps], dtype=np.int64)
    return X, y


def make_estimator(params: dict, seed: int):
    from sklearn.tree import DecisionTreeClassifier

    return DecisionTreeClassifier(random_state=seed, **params)


def loocv(sweeps: list[Sweep], params: dict, seed: int) -> CvResult:
    """Leave each configuration out in turn, fit on the rest, predict it."""
    import numpy as np

    X, y = design(sweeps)
    preds = []
    for i in range(len(sweeps)):
        keep = np.arange(len(sweeps)) != i
        est = make_estimator(params, seed).fit(X[keep], y[keep])
        preds.append(int(est.predict(X[i : i + 1])[0]))
    regrets = [s.regret_pct(p) for s, p in zip(sweeps, preds)]
    accuracy = float(np.mean([p == label for p, label in zip(preds, y)]))
    return CvResult(dict(params), accuracy, float(np.mean(regrets)), float(np.max(regrets)), tuple(preds))


def grid() -> list[dict]:
    keys = sorted(PARAM_GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*(PARAM_GRID[k] for k in keys))]


def search(sweeps: list[Sweep], seed: int, n_jobs: int = 1) -> tuple[CvResult, list[CvResult]]:
    """LOOCV over the grid in parallel (joblib); the winner by (regret, -accuracy, simplicity, grid order)."""
    from joblib import Parallel, delayed

    candidates = grid()
    results = Parallel(n_jobs=n_jobs)(delayed(loocv)(sweeps, p, seed) for p in candidates)

    def rank(item):
        i, r = item
        depth = r.params["max_depth"] if r.params["max_depth"] is not None else 99
        # rounded so that float noise in the last digit cannot reorder equal results between machines
        return (round(r.mean_regret_pct, 9), -round(r.accuracy, 9), depth, -r.params["min_samples_leaf"], i)

    best = min(enumerate(results), key=rank)[1]
    return best, list(results)


def fit(sweeps: list[Sweep], params: dict, seed: int):
    X, y = design(sweeps)
    return make_estimator(params, seed).fit(X, y)


def feature_names() -> list[str]:
    return list(FEATURE_ORDER)
