"""A retrained tree in the real daemon: ftgovd loads the export, decides with it, and records its model_id."""

from pathlib import Path

from governor.backends.base import nearest_level
from governor.pipeline import dataset, retrain
from governor.policy.tree import DecisionTree
from governor.sim import learning
from governor.store import measurements as store
from governor.store.measurements import Store
from tests.support.daemon import FEATURES

REPO = Path(__file__).resolve().parents[2]


def test_the_daemon_decides_with_the_retrained_tree_and_records_its_version(start_daemon, tmp_path):
    board_store = tmp_path / "board.sqlite"
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    levels = learning.board_model().levels_hz
    s = Store(board_store)
    for rec in learning.stream(retrain.tree_decider(shipped, levels), 30, seed=1):
        s.add(rec)
    s.close()
    result = retrain.retrain(store.read_jobs(store.open_read_only(board_store)),
                             dataset.load(REPO / "model" / "data" / "characterization.csv"), seed=0)
    tree_path = tmp_path / "mlg-tree.json"
    model_id = retrain.export_tree(result, tree_path, {"stores": [str(board_store)]})

    d = start_daemon(config={"model_file": str(tree_path), "store": {"path": str(tmp_path / "daemon.sqlite")}})
    c = d.client()
    picks = []
    for layers, seq, util in ((4, 20.0, 40.0), (12, 40.0, 60.0), (24, 70.0, 90.0), (6, 11.0, 30.0)):
        features = {**FEATURES, "num_layers": layers, "seq_len": seq, "gpu_util": util}
        res = c.call("register", **features)
        vector = [[0.0 if features["model_type"] == "encoder" else 1.0, util, layers, features["hidden_size"], seq]]
        assert res["freq_hz"] == nearest_level(levels, int(result.estimator.predict(vector)[0]))
        assert res["reason"].startswith("retrained tree:")
        picks.append(c.call("unregister", job_id=res["job_id"])["freq_hz"])
    assert "MLG tree loaded from" in d.log() and "source: retrained" in d.log()
    d.stop()
    recorded = store.read_jobs(store.open_read_only(tmp_path / "daemon.sqlite"))
    assert [j.freq_hz for j in recorded] == picks
    assert {(j.model_version, j.model_source) for j in recorded} == {(model_id, "retrained")}


def test_retrain_measures_before_against_the_tree_that_decided_the_stores_jobs(start_daemon, tmp_path, monkeypatch,
                                                                               capsys):
    """A daemon started with its own config decides with its model_file, not the one of /etc/ftgov or the shipped
    tree: retrain's "before" figures and its guard on moved workloads are against the tree the store says decided
    its jobs (each job records its tree's version); a store naming a tree retrain cannot find is measured against the
    config's tree, and the report says so."""
    import json

    import governor
    from governor.cli import main

    monkeypatch.setattr(governor, "DEFAULT_CONFIG_PATH", str(tmp_path / "none.yaml"))  # no /etc/ftgov config
    monkeypatch.delenv("FTGOV_SIM_TREE", raising=False)
    monkeypatch.delenv("FTGOV_SOCKET", raising=False)
    state = tmp_path / "state"
    state.mkdir()
    board_store = state / "measurements.sqlite"
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    s = Store(board_store)
    for rec in learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 40, seed=3):
        s.add(rec)
    s.close()
    in_use = state / "mlg-tree.json"  # where retrain writes by default, beside the store
    result = retrain.retrain(store.read_jobs(store.open_read_only(board_store)),
                             dataset.load(REPO / "model" / "data" / "characterization.csv"), seed=0)
    model_id = retrain.export_tree(result, in_use, {"stores": [str(board_store)]})
    d = start_daemon(config={"model_file": str(in_use), "store": {"path": str(board_store)}})
    c = d.client()
    c.call("unregister", job_id=c.call("register", **FEATURES)["job_id"])
    d.stop()
    assert store.read_jobs(store.open_read_only(board_store))[-1].model_version == model_id

    def run(*extra) -> dict:
        argv = ["model", "retrain", "--store", str(board_store), "--uid", "1000", "--force", "--json", *extra]
        assert main([*map(str, argv), "--out", str(tmp_path / "new.json")]) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    found = run()
    assert json.loads((tmp_path / "new.json").read_text())["provenance"]["replaces"]["path"] == str(in_use)
    against_in_use, against_shipped = run("--current", in_use), run("--current", REPO / "model" / "mlg-tree.json")
    assert against_in_use["before"] != against_shipped["before"]  # the test tells the two trees apart
    for key in ("before", "moved"):
        assert found[key] == against_in_use[key]
    assert found["before_tree"]["path"] == str(in_use) and found["latest_tree"]["model_version"] == model_id
    assert against_shipped["before_tree"]["chosen"].startswith("--current (the store's latest job was decided by "
                                                                f"another tree, {model_id}")

    elsewhere = tmp_path / "elsewhere.json"  # the daemon's model_file, known only to its config
    in_use.rename(elsewhere)
    # Not found (an upgrade replaced it, or only the daemon's config names it): against the tree this command's
    # config names, the shipped one here, and the report says which and why.
    lost = run()
    assert lost["before"] == against_shipped["before"]
    assert lost["before_tree"]["chosen"].startswith(f"the store's latest job was decided by the tree {model_id}")
    assert "--current FILE" in lost["before_tree"]["chosen"]
    d.config_path.write_text(d.config_path.read_text().replace(str(in_use), str(elsewhere)))
    assert run("--config", d.config_path)["before"] == against_in_use["before"]
