"""Train the MLG tree and derive FFG's frequency, in stages with path arguments (cookiecutter-data-science style).

    PYTHONPATH=. python model/train.py labels --data model/data/characterization.csv --out model/artifacts/labels.csv
    PYTHONPATH=. python model/train.py fit    --data model/data/characterization.csv --estimator model/artifacts/mlg.joblib \
                                              --report model/artifacts/cv-report.json [--seed 0] [--jobs 2]
    PYTHONPATH=. python model/train.py export --data model/data/characterization.csv --estimator model/artifacts/mlg.joblib \
                                              --report model/artifacts/cv-report.json --tree model/mlg-tree.json \
                                              --rules model/mlg-rules.txt
    PYTHONPATH=. python model/train.py ffg    --data model/data/characterization.csv --out model/ffg.json
    PYTHONPATH=. python model/train.py all    --data model/data/characterization.csv   (all four, default paths)

Deterministic: the same data and seed give byte-identical mlg-tree.json, mlg-rules.txt and ffg.json (the joblib
artifact and the report may differ by library version and are not committed).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from governor.errors import FtgovError
from governor.pipeline import dataset, export, train

MODEL_DIR = Path(__file__).resolve().parent
DEFAULT_DATA = MODEL_DIR / "data" / "characterization.csv"
ARTIFACTS = MODEL_DIR / "artifacts"


def stage_labels(data: Path, out: Path) -> None:
    """Per configuration: the five features (encoded as the daemon encodes them), the label (smoothed energy
    optimum, governor/pipeline/train.py says why) and the raw optimum beside it."""
    sweeps = dataset.load(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["workload", *train.feature_names(), "label_hz", "raw_optimum_hz", "regret_of_label_pct",
                    "savings_at_label_pct"])
        for s in sweeps:
            label = train.label_hz(s)
            w.writerow([s.workload, *(f"{v:g}" for v in s.features.vector()), label, s.optimum_hz,
                        f"{s.regret_pct(label):.2f}", f"{s.savings_pct(s.energy_j[label]):.2f}"])
    print(f"{out}: {len(sweeps)} labelled configurations", file=sys.stderr)


def stage_fit(data: Path, estimator_path: Path, report_path: Path, seed: int, jobs: int) -> dict:
    import joblib
    import sklearn

    sweeps = dataset.load(data)
    best, results = train.search(sweeps, seed=seed, n_jobs=jobs)
    estimator = train.fit(sweeps, best.params, seed)
    estimator_path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(estimator, estimator_path)
    report = {
        "data": str(data.name), "data_sha256": dataset.sha256(data), "seed": seed,
        "params": best.params, "loocv_accuracy": round(best.accuracy, 4),
        "loocv_mean_regret_pct": round(best.mean_regret_pct, 3), "loocv_max_regret_pct": round(best.max_regret_pct, 3),
        "loocv_predictions_hz": {s.workload: p for s, p in zip(sweeps, best.predictions_hz)},
        "label_hz": {s.workload: train.label_hz(s) for s in sweeps},
        "raw_optimum_hz": {s.workload: s.optimum_hz for s in sweeps},
        "loocv_raw_optimum_hit_rate": round(sum(p == s.optimum_hz for s, p in zip(sweeps, best.predictions_hz))
                                            / len(sweeps), 4),
        "train_accuracy": round(float(estimator.score(*train.design(sweeps))), 4),
        "n_leaves": int(estimator.get_n_leaves()), "depth": int(estimator.get_depth()),
        "grid_size": len(results), "sklearn_version": sklearn.__version__,
        "grid": [{"params": r.params, "accuracy": round(r.accuracy, 4), "mean_regret_pct": round(r.mean_regret_pct, 3)}
                 for r in results],
    }
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"LOOCV over {len(sweeps)} configurations, {len(results)} hyperparameter sets; chosen {best.params}\n"
          f"  LOOCV accuracy {best.accuracy:.3f} (raw optimum hit {report['loocv_raw_optimum_hit_rate']:.3f}), mean energy regret {best.mean_regret_pct:.2f}% "
          f"(max {best.max_regret_pct:.2f}%); tree: depth {report['depth']}, {report['n_leaves']} leaves",
          file=sys.stderr)
    return report


def stage_export(data: Path, estimator_path: Path, report_path: Path, tree_path: Path, rules_path: Path) -> None:
    import joblib

    estimator = joblib.load(estimator_path)
    report = json.loads(report_path.read_text())
    meta = dataset_meta(data)
    metadata = {
        "data": report["data"], "data_sha256": report["data_sha256"], "data_source": meta.get("source", "unknown"),
        "energy_model": meta.get("energy_model"), "data_seed": meta.get("seed"), "seed": report["seed"],
        "hyperparameters": report["params"], "loocv_accuracy": report["loocv_accuracy"],
        "loocv_mean_regret_pct": report["loocv_mean_regret_pct"],
        "loocv_max_regret_pct": report["loocv_max_regret_pct"],
        "loocv_raw_optimum_hit_rate": report["loocv_raw_optimum_hit_rate"],
        "label": "energy-optimal level of the measured curve after 1-2-1 smoothing on log energy",
        "gpu_util": "GPU load under MAXN (the board's default governor), percent",
        "thresholds": "float64 equivalents of scikit-learn's float32 comparisons (see governor/pipeline/export.py)",
    }
    description = ("MLG tree trained by model/train.py on the " + str(meta.get("source", "")) + " characterization "
                   "set (model/data/characterization.csv): label = energy-optimal level of the 1-2-1 smoothed curve, "
                   "hyperparameters by LOOCV energy regret.")
    tree_path.write_text(export.to_json(estimator, description, metadata))
    header = [f"MLG tree, trained on {report['data']} ({metadata['data_source']}, {metadata['energy_model']}, "
              f"data seed {metadata['data_seed']}), training seed {report['seed']}",
              f"hyperparameters {json.dumps(report['params'], sort_keys=True)}",
              f"LOOCV accuracy {report['loocv_accuracy']:.3f} (label), {report['loocv_raw_optimum_hit_rate']:.3f} "
              f"(raw optimum); mean energy regret "
              f"{report['loocv_mean_regret_pct']:.2f}% (max {report['loocv_max_regret_pct']:.2f}%)",
              "model_type: 0 = encoder, 1 = decoder; gpu_util: GPU load under MAXN, percent"]
    rules_path.write_text(export.to_rules(estimator, header))
    print(f"{tree_path}, {rules_path} written", file=sys.stderr)


def stage_ffg(data: Path, out: Path) -> int:
    """FFG: the one level with the least total energy per step summed over every configuration.

    A sum of joules weighs each configuration by its energy, as a board running all of them for the same number
    of steps would; the mean relative energy (each configuration against its own MAXN) is reported beside it.
    """
    sweeps = dataset.load(data)
    levels = sweeps[0].levels_hz
    total = {f: sum(s.energy_j[f] for s in sweeps) for f in levels}
    relative = {f: sum(s.energy_j[f] / s.maxn_energy_j for s in sweeps) / len(sweeps) for f in levels}
    best = min(levels, key=lambda f: (total[f], f))
    meta = dataset_meta(data)
    doc = {
        "freq_hz": best,
        "criterion": "least total energy per step, summed over the characterization configurations",
        "data": data.name, "data_sha256": dataset.sha256(data), "data_source": meta.get("source", "unknown"),
        "energy_model": meta.get("energy_model"), "configurations": len(sweeps),
        "total_energy_per_step_j": {str(f): round(total[f], 4) for f in levels},
        "mean_energy_vs_maxn": {str(f): round(relative[f], 4) for f in levels},
        "best_by_mean_relative_energy_hz": min(levels, key=lambda f: (relative[f], f)),
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{out}: FFG at {best / 1e6:g} MHz", file=sys.stderr)
    return best


def dataset_meta(data: Path) -> dict:
    sidecar = data.with_name(data.name + ".meta.json")
    try:
        return json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("labels")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=ARTIFACTS / "labels.csv")
    p = sub.add_parser("fit")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--estimator", type=Path, default=ARTIFACTS / "mlg.joblib")
    p.add_argument("--report", type=Path, default=ARTIFACTS / "cv-report.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="joblib workers for the LOOCV search")
    p = sub.add_parser("export")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--estimator", type=Path, default=ARTIFACTS / "mlg.joblib")
    p.add_argument("--report", type=Path, default=ARTIFACTS / "cv-report.json")
    p.add_argument("--tree", type=Path, default=MODEL_DIR / "mlg-tree.json")
    p.add_argument("--rules", type=Path, default=MODEL_DIR / "mlg-rules.txt")
    p = sub.add_parser("ffg")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=MODEL_DIR / "ffg.json")
    p = sub.add_parser("all", help="labels, fit, export and ffg with default paths under --out-dir")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out-dir", type=Path, default=MODEL_DIR)
    p.add_argument("--artifacts", type=Path, default=ARTIFACTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        if args.stage == "labels":
            stage_labels(args.data, args.out)
        elif args.stage == "fit":
            stage_fit(args.data, args.estimator, args.report, args.seed, args.jobs)
        elif args.stage == "export":
            stage_export(args.data, args.estimator, args.report, args.tree, args.rules)
        elif args.stage == "ffg":
            stage_ffg(args.data, args.out)
        else:
            est, rep = args.artifacts / "mlg.joblib", args.artifacts / "cv-report.json"
            stage_labels(args.data, args.artifacts / "labels.csv")
            stage_fit(args.data, est, rep, args.seed, args.jobs)
            stage_export(args.data, est, rep, args.out_dir / "mlg-tree.json", args.out_dir / "mlg-rules.txt")
            stage_ffg(args.data, args.out_dir / "ffg.json")
    except FtgovError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
