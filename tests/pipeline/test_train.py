"""Training is reproducible, the committed export is what training produces, and the daemon's evaluator gives
scikit-learn's answers."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.cli import main as ftgov
from governor.features import FEATURE_ORDER
from governor.pipeline import dataset, train
from governor.pipeline.export import float64_threshold
from governor.policy.tree import DecisionTree, Leaf, Split
from tests.support import REPO

DATA = REPO / "model" / "data" / "characterization.csv"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A full `make model` run (dataset, fit, export, ffg) into a temporary directory, one worker, through `ftgov
    model STAGE` (the same stages as `python -m governor.pipeline STAGE`)."""
    out = tmp_path_factory.mktemp("model")
    art = out / "artifacts"
    data = ["--data", str(DATA)]
    for stage in (["dataset", *data, "--out", str(art / "dataset.csv")],
                  ["fit", *data, "--dataset", str(art / "dataset.csv"), "--estimator", str(art / "mlg.joblib"),
                   "--report", str(art / "cv-report.json"), "--seed", "0", "--jobs", "1"],
                  ["export", *data, "--estimator", str(art / "mlg.joblib"), "--report", str(art / "cv-report.json"),
                   "--tree", str(out / "mlg-tree.json"), "--rules", str(out / "mlg-rules.txt")],
                  ["ffg", *data, "--out", str(out / "ffg.json")]):
        assert ftgov(["model", *stage]) == 0, stage
    return out


@pytest.mark.parametrize("name", ["mlg-tree.json", "mlg-rules.txt", "ffg.json"])
def test_committed_model_equals_a_fresh_training_run(fresh, name):
    assert (fresh / name).read_bytes() == (REPO / "model" / name).read_bytes()


def test_the_stages_run_outside_a_checkout_on_the_shipped_data_into_the_current_directory(tmp_path, monkeypatch,
                                                                                         capsys):
    """An installed ftgov has no model/ nor a writable governor/data/: with no paths, each stage reads the shipped
    characterization and writes plain names in the current directory, and the chain makes the shipped model."""
    shipped = [REPO / "governor" / "data" / name for name in ("mlg-tree.json", "ffg.json")]
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in shipped]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert ftgov(["model", "fit", "--jobs", "1"]) == 1  # fit before dataset: what is missing, and what to give
    err = capsys.readouterr().err
    assert "cannot read dataset.csv" in err and "give --dataset" in err
    for stage in (["dataset"], ["fit", "--jobs", "1"], ["export"], ["ffg"]):
        assert ftgov(["model", *stage]) == 0, capsys.readouterr().err
    written = {"dataset.csv", "mlg.joblib", "cv-report.json", "mlg-tree.json", "mlg-rules.txt", "ffg.json"}
    assert {p.name for p in work.iterdir()} == written
    for name in ("mlg-tree.json", "mlg-rules.txt", "ffg.json"):
        assert (work / name).read_bytes() == (REPO / "model" / name).read_bytes()
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in shipped] == before  # the package's data is left alone


def test_export_refuses_data_other_than_fits(fresh, tmp_path, capsys):
    """The tree's metadata names the data's provenance: another CSV's (the shipped default, where fit was given a
    board's own) would be recorded as the data the tree was trained on."""
    other = tmp_path / "other.csv"
    other.write_bytes(DATA.read_bytes() + b"\n")
    art = fresh / "artifacts"
    assert ftgov(["model", "export", "--data", str(other), "--estimator", str(art / "mlg.joblib"), "--report",
                  str(art / "cv-report.json"), "--tree", str(tmp_path / "t.json"), "--rules",
                  str(tmp_path / "r.txt")]) == 1
    assert "give that CSV as --data" in capsys.readouterr().err and not (tmp_path / "t.json").exists()


def test_a_stage_rerun_on_the_same_data_leaves_its_files_untouched(fresh):
    """make reruns export and ffg on a fresh clone (any input may look newer): the shipped files they recompute
    byte-identically are not rewritten, so a clean checkout stays clean, mtimes included."""
    outputs = [fresh / name for name in ("mlg-tree.json", "mlg-rules.txt", "ffg.json")]
    for path in outputs:
        os.utime(path, ns=(0, 0))
    art = fresh / "artifacts"
    assert ftgov(["model", "export", "--data", str(DATA), "--estimator", str(art / "mlg.joblib"),
                  "--report", str(art / "cv-report.json"), "--tree", str(outputs[0]), "--rules", str(outputs[1])]) == 0
    assert ftgov(["model", "ffg", "--data", str(DATA), "--out", str(outputs[2])]) == 0
    assert [p.stat().st_mtime_ns for p in outputs] == [0, 0, 0]


class _Planted:
    """A pickle that runs code as it loads: it touches the file its writer named."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("planted_by", ["world-writable", "group-writable, another group", "another user"])
def test_export_unpickles_no_estimator_someone_else_could_have_written(fresh, tmp_path, capsys, planted_by):
    """`ftgov model export --estimator` loads a pickle: one whose file another user could have written (theirs, or
    writable by others or by a group not the exporter's) is refused before it is read, so its code never runs as the
    exporter (root)."""
    import joblib

    if planted_by != "world-writable" and os.geteuid() != 0:
        pytest.skip("giving a file to another user or group needs root")
    marker, planted = tmp_path / "ran", tmp_path / "mlg.joblib"
    joblib.dump(_Planted(marker), planted)
    if planted_by == "another user":
        os.chown(planted, 65534, -1)
    elif planted_by == "world-writable":
        planted.chmod(0o646)
    else:
        os.chown(planted, -1, 65534)
        planted.chmod(0o664)
    art = fresh / "artifacts"
    assert ftgov(["model", "export", "--data", str(DATA), "--estimator", str(planted), "--report",
                  str(art / "cv-report.json"), "--tree", str(tmp_path / "t.json"), "--rules",
                  str(tmp_path / "r.txt")]) != 0
    assert "refusing to unpickle" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "t.json").exists()


def test_committed_tree_loads_and_names_its_data():
    tree = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    assert tree.source == "trained"
    assert tree.metadata["data_sha256"] == dataset.sha256(DATA)
    assert tree.metadata["data_source"] == "simulated"
    assert set(tree.leaves_hz()) <= set(dataset.load(DATA)[0].levels_hz)


def test_ffg_is_the_level_with_least_total_energy():
    sweeps = dataset.load(DATA)
    ffg = json.loads((REPO / "model" / "ffg.json").read_text())
    totals = {f: sum(s.energy_j[f] for s in sweeps) for f in sweeps[0].levels_hz}
    assert ffg["freq_hz"] == min(totals, key=totals.get)


def test_labels_are_the_per_configuration_energy_optimum():
    for s in dataset.load(DATA):
        assert s.energy_j[s.optimum_hz] == min(s.energy_j.values())
        assert s.regret_pct(s.optimum_hz) == 0.0


def random_vectors(tree: DecisionTree, n: int, seed: int) -> np.ndarray:
    """Random feature vectors over the features' ranges, plus every threshold and its float neighbours."""
    rng = random.Random(seed)
    rows = [[rng.choice((0.0, 1.0)), rng.uniform(0, 100), float(rng.randint(1, 64)), float(rng.randint(32, 4096)),
             rng.uniform(1, 512)] for _ in range(n)]
    for node in tree.nodes:
        if isinstance(node, Split):
            i = FEATURE_ORDER.index(node.feature)
            for x in (node.threshold, np.nextafter(node.threshold, -np.inf), np.nextafter(node.threshold, np.inf),
                      float(np.float32(node.threshold)), round(node.threshold, 2)):
                base = list(rows[rng.randrange(n)])
                base[i] = float(x)
                rows.append(base)
    return np.array(rows, dtype=np.float64)


def test_daemon_evaluator_matches_sklearn_on_random_vectors():
    tree = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    sweeps = dataset.load(DATA)
    estimator = train.fit(sweeps, tree.metadata["hyperparameters"], tree.metadata["seed"])
    X = random_vectors(tree, 5000, seed=11)
    expected = estimator.predict(X)
    got = [tree.decide_vector(dict(zip(FEATURE_ORDER, row, strict=False))).freq_hz for row in X.tolist()]
    assert got == [int(v) for v in expected]
    assert len(set(got)) == len(tree.leaves_hz())  # the vectors reached every kind of leaf


@settings(max_examples=300, deadline=None)
@given(t=st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
       offset_ulps=st.integers(min_value=-4, max_value=4))
def test_exported_threshold_is_exact_for_float32_comparison(t, offset_ulps):
    t = float(np.float64(np.float32(t)) + (t - float(np.float32(t))) / 2)  # sklearn thresholds: midpoints
    T = float64_threshold(t)
    x = np.float32(t)
    for _ in range(abs(offset_ulps)):
        x = np.nextafter(x, np.float32(np.inf if offset_ulps > 0 else -np.inf))
    for candidate in (float(x), T, float(np.nextafter(T, np.inf)), float(np.nextafter(T, -np.inf))):
        assert (candidate <= T) == (float(np.float32(candidate)) <= t)


def test_exported_nodes_mirror_the_estimator():
    tree = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    sweeps = dataset.load(DATA)
    estimator = train.fit(sweeps, tree.metadata["hyperparameters"], tree.metadata["seed"])
    assert len(tree.nodes) == estimator.tree_.node_count
    assert sum(isinstance(n, Leaf) for n in tree.nodes) == estimator.get_n_leaves()


def test_a_tree_trained_on_a_boards_own_data_names_that_data(tmp_path, monkeypatch):
    """The export's description names the CSV fit trained on, as its metadata does: a tree from a board's own
    measurements said it came from the shipped simulated set."""
    board = tmp_path / "orin-lab-3.csv"
    board.write_bytes(DATA.read_bytes())
    sidecar = DATA.with_name(DATA.name + ".meta.json")  # characterize writes one beside its CSV
    board.with_name(board.name + ".meta.json").write_bytes(sidecar.read_bytes())
    monkeypatch.chdir(tmp_path)
    for stage in (["dataset"], ["fit", "--jobs", "1"], ["export"]):
        assert ftgov(["model", *stage, "--data", str(board)]) == 0, stage
    tree = json.loads((tmp_path / "mlg-tree.json").read_text())
    assert tree["metadata"]["data"] == "orin-lab-3.csv"
    assert "on orin-lab-3.csv, a simulated characterization set" in tree["description"], tree["description"]
