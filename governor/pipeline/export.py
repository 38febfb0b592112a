"""The `export` stage: a fitted scikit-learn DecisionTreeClassifier as the daemon's ``ftgov-tree/1`` JSON (`make model`
writes it into governor/data/, the package data the daemon loads), and as readable rules.

Node indices are scikit-learn's (depth-first, root 0), ``<=`` goes left, a leaf holds its majority class (the first
one on a tie, as ``predict`` does).

Thresholds: scikit-learn casts inputs to float32 before comparing, ``float32(x) <= t``; the daemon compares the
float64 it received. The export therefore writes, for each split, the float64 threshold T for which
``x <= T`` holds exactly when ``float32(x) <= t`` (round-to-nearest-even included), so the two agree on every input,
thresholds included. The rules text shows the thresholds rounded for reading.

Deterministic: no timestamps, fixed key order, Python's shortest float repr. Same estimator -> same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import stat
import sys
import typing
from pathlib import Path

from governor.errors import FtgovError
from governor.features import FEATURE_ORDER, MODEL_TYPE_CODES
from governor.pipeline import dataset
from governor.pipeline.outputs import write_if_changed
from governor.policy.tree import FORMAT
from governor.units import mhz


def float64_threshold(t: float) -> float:
    """The float64 T such that, for every float64 x, x <= T  <=>  float32(x) <= t."""
    import numpy as np

    t32 = np.float32(t)
    if float(t32) > t:  # the largest float32 not above t
        t32 = np.nextafter(t32, np.float32(-np.inf))
    up = np.nextafter(t32, np.float32(np.inf))
    mid = (float(t32) + float(up)) / 2.0  # exact in float64: float32 neighbours are 1 ulp(float32) apart
    if np.float32(mid) == t32:  # a tie rounds down to t32 (even mantissa): the midpoint itself still goes left
        return mid
    return float(np.nextafter(mid, -np.inf))


def tree_nodes(estimator) -> list[dict]:
    t = estimator.tree_
    nodes = []
    for i in range(t.node_count):
        left, right = int(t.children_left[i]), int(t.children_right[i])
        if left == -1:
            cls = int(estimator.classes_[int(t.value[i][0].argmax())])
            nodes.append({"freq_hz": cls})
        else:
            nodes.append({"feature": FEATURE_ORDER[int(t.feature[i])],
                          "threshold": float64_threshold(float(t.threshold[i])), "left": left, "right": right})
    return nodes


def to_json(estimator, description: str, metadata: dict) -> str:
    doc = {
        "format": FORMAT,
        "source": "trained",
        "description": description,
        "features": list(FEATURE_ORDER),
        "model_type_codes": dict(MODEL_TYPE_CODES),
        "nodes": tree_nodes(estimator),
        "metadata": metadata,
    }
    # One node per line: diffs of a retrained tree stay readable.
    head = json.dumps({k: v for k, v in doc.items() if k not in ("nodes", "metadata")}, indent=2)[:-2]
    nodes = ",\n".join("    " + json.dumps(n) for n in doc["nodes"])
    meta = json.dumps(metadata, indent=2, sort_keys=True).replace("\n", "\n  ")
    return f'{head},\n  "nodes": [\n{nodes}\n  ],\n  "metadata": {meta}\n}}\n'


def to_rules(estimator, header: list[str]) -> str:
    """Readable if/else rules; thresholds rounded to 2 decimals, frequencies in MHz."""
    t = estimator.tree_
    lines = [f"# {h}" for h in header]

    def walk(i: int, depth: int) -> None:
        pad = "|   " * depth
        left, right = int(t.children_left[i]), int(t.children_right[i])
        if left == -1:
            hz = int(estimator.classes_[int(t.value[i][0].argmax())])
            lines.append(f"{pad}-> {mhz(hz)}  (samples: {int(t.n_node_samples[i])})")
            return
        name, thr = FEATURE_ORDER[int(t.feature[i])], float(t.threshold[i])
        shown = "encoder" if name == "model_type" and thr < 0.5 else None
        lines.append(f"{pad}if {name} <= {thr:.2f}:" + (f"  # model_type is {shown}" if shown else ""))
        walk(left, depth + 1)
        lines.append(f"{pad}else:  # {name} > {thr:.2f}")
        walk(right, depth + 1)

    walk(0, 0)
    return "\n".join(lines) + "\n"


def open_trusted(path: Path) -> typing.BinaryIO:
    """``path`` opened for reading if only its reader or root could have written it: it is unpickled, and a pickle
    runs whatever code it names. Checked on the opened file, so a swapped name cannot slip another one in."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # non-blocking: a FIFO is refused, not waited on
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid not in (0, os.geteuid()):
        why = f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root"
    elif st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid()):
        # A group-writable file of one's own group is a umask of 002's (Ubuntu's for users), not another's write.
        why = f"it is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, group {st.st_gid})"
    if why is not None:
        os.close(fd)
        raise FtgovError(f"refusing to unpickle {path}: {why}, and loading a pickle runs any code its writer put in "
                         "it; fit it yourself (ftgov model fit) or take the exported JSON tree instead")
    return os.fdopen(fd, "rb")


def run_export(data: Path, estimator_path: Path, report_path: Path, tree_path: Path, rules_path: Path) -> None:
    import joblib

    try:
        with open_trusted(estimator_path) as f:
            estimator = joblib.load(f)
        report = json.loads(report_path.read_text())
    # Unpickling a file that is not one fails in whatever way the bytes lead it (EOFError, IndexError, ...).
    except (OSError, ValueError, EOFError, IndexError, KeyError, AttributeError, ImportError,
            pickle.UnpicklingError) as e:
        raise FtgovError(f"cannot read the fitted tree ({estimator_path}, {report_path}): {e}; run `fit` first, or "
                         "give the files it wrote as --estimator and --report") from e
    if dataset.sha256(data) != report.get("data_sha256"):  # the metadata would name one file's provenance for another's
        raise FtgovError(f"{data} is not the characterization `fit` trained on ({report_path} names "
                         f"{report.get('data')}): give that CSV as --data")
    meta = dataset.meta(data)
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
    # The data as fit named it (a board's own CSV, or the shipped one); its digest is in the metadata.
    source = metadata["data_source"]
    description = (f"MLG tree trained by the model pipeline on {report['data']}"
                   + (f", a {source} characterization set" if source != "unknown" else "")
                   + ": label = energy-optimal level of the 1-2-1 smoothed curve, hyperparameters by LOOCV energy "
                   "regret.")
    write_if_changed(tree_path, to_json(estimator, description, metadata))
    header = [f"MLG tree, trained on {report['data']} ({metadata['data_source']}, {metadata['energy_model']}, "
              f"data seed {metadata['data_seed']}), training seed {report['seed']}",
              f"hyperparameters {json.dumps(report['params'], sort_keys=True)}",
              f"LOOCV accuracy {report['loocv_accuracy']:.3f} (label), {report['loocv_raw_optimum_hit_rate']:.3f} "
              f"(raw optimum); mean energy regret "
              f"{report['loocv_mean_regret_pct']:.2f}% (max {report['loocv_max_regret_pct']:.2f}%)",
              "model_type: 0 = encoder, 1 = decoder; gpu_util: GPU load under MAXN, percent"]
    write_if_changed(rules_path, to_rules(estimator, header))


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("export", help="write the fitted tree as the daemon's JSON and as readable rules",
                              description=__doc__.split("\n\n")[0])
    dataset.add_data_argument(p, "characterization CSV `fit` trained on (its provenance goes into the tree's "
                              "metadata)")
    dataset.add_file_argument(p, "--estimator", "mlg.joblib", "from `fit`")
    dataset.add_file_argument(p, "--report", "cv-report.json", "from `fit`")
    dataset.add_file_argument(p, "--tree", "mlg-tree.json", "ftgov-tree/1 JSON to write",
                              "; point the daemon's model_file at it")
    dataset.add_file_argument(p, "--rules", "mlg-rules.txt", "readable rules to write")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    run_export(args.data, args.estimator, args.report, args.tree, args.rules)
    print(f"{args.tree}, {args.rules} written", file=sys.stderr)
    return 0
