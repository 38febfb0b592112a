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
