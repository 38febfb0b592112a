"""Retraining from the measurement store: labels from bracketed minima, the per-level correction, determinism, the
export (the daemon's reader, scikit-learn's answers), fleets, and the command."""

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from governor.errors import FtgovError
from governor.features import FEATURE_ORDER, Features
from governor.pipeline import board_data, dataset, retrain
from governor.policy.tree import DecisionTree
from governor.sim import learning
from governor.store.measurements import JobRecord, Store, Window

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "model" / "data" / "characterization.csv"
LEVELS = (306, 408, 510, 612, 714, 816, 918)
F = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


def curve(energy: dict[int, float], windows: int = 1) -> board_data.BoardCurve:
    return board_data.BoardCurve(F, energy, {hz: windows for hz in energy}, 1)


def test_a_minimum_with_worse_neighbours_on_both_sides_is_a_label():
    label, confidence = board_data.bracket(curve({510: 1.10, 612: 1.00, 714: 1.12}), LEVELS)
    assert label == 612 and confidence == 1.0
    assert board_data.bracket(curve({612: 1.00, 714: 1.05}), LEVELS) == (None, 0.0)  # 510 unmeasured: not bracketed
    assert board_data.bracket(curve({306: 1.00, 408: 1.20}), LEVELS)[0] == 306  # the end of the table brackets it


def test_a_minimum_bracketed_within_noise_counts_less_and_more_windows_count_more():
    _, once = board_data.bracket(curve({510: 1.03, 612: 1.00, 714: 1.04}), LEVELS)
    _, many = board_data.bracket(curve({510: 1.03, 612: 1.00, 714: 1.04}, windows=6), LEVELS)
    assert 0 < once < many <= 1.0


def test_windows_of_one_workload_pool_across_jobs_and_the_default_governor_is_left_out():
    def job(i, windows):
        return JobRecord(ended_at=float(i), model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0,
                         gpu_util=60.0, windows=tuple(windows))

    recs = [job(0, [Window(None, 2.0, 0.1, 4), Window(510_000_000, 1.2, 0.1, 4), Window(612_000_000, 1.0, 0.1, 4)]),
            job(1, [Window(612_000_000, 1.2, 0.1, 12), Window(714_000_000, 1.3, 0.1, 4)]), job(2, [])]
    [c] = board_data.board_curves(recs, tuple(hz * 1_000_000 for hz in LEVELS))
    assert c.jobs == 2 and c.windows == {510_000_000: 1, 612_000_000: 2, 714_000_000: 1}
    assert c.energy_j[612_000_000] == pytest.approx((1.0 * 4 + 1.2 * 12) / 16)
    assert c.label_hz == 612_000_000


def test_the_board_curves_shift_the_simulated_ones_where_the_board_departs_from_them():
    sweeps = dataset.load(DATA)
    s = sweeps[0]
    levels = s.levels_hz
    # The board: the nearest sweep's own curve, 10% dearer at the top three levels.
    board = {hz: s.energy_j[hz] * (1.1 if hz >= levels[-3] else 1.0) for hz in levels}
    c = board_data.BoardCurve(s.features, board, {hz: 2 for hz in levels}, board_data.MIN_AGREEING_JOBS,
                              uids=frozenset({0}))  # enough jobs to agree (one user is every user here)
    offsets = board_data.level_offsets([c], sweeps)
    shape = [offsets[hz] - offsets[levels[0]] for hz in levels]
    assert shape[-1] == pytest.approx(np.log(1.1)) and shape[0] == 0 and shape[-4] == pytest.approx(0, abs=1e-12)
    fixed = board_data.corrected(sweeps, offsets)
    assert fixed[1].energy_j[levels[-1]] / fixed[1].energy_j[levels[0]] == pytest.approx(
        1.1 * sweeps[1].energy_j[levels[-1]] / sweeps[1].energy_j[levels[0]])
    assert board_data.level_offsets([], sweeps) == {hz: 0.0 for hz in levels}


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    """A store of 40 tuned jobs on the simulated board B, each started from the shipped tree."""
    path = tmp_path_factory.mktemp("store") / "measurements.sqlite"
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    s = Store(path)
    for rec in learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 40, seed=3):
        s.add(rec)
    s.close()
    return path


def run_cli(*argv) -> int:
    from governor.cli import main

    return main(["model", "retrain", *map(str, argv)])


def test_retrain_is_deterministic_and_reports_before_and_after(sim_store, tmp_path, capsys):
    # The simulated board's jobs are uid 1000's; board B departs from the shipped tree's calibration by a level or two
    # by construction, so more than half the workloads move by more than one level: --force.
    args = ["--store", sim_store, "--current", REPO / "model" / "mlg-tree.json", "--seed", "0", "--uid", 1000,
            "--force"]
    assert run_cli(*args, "--out", tmp_path / "a.json") == 0
    out = capsys.readouterr().out
    assert run_cli(*args, "--out", tmp_path / "b.json", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert "before (the tree in use)" in out and "after (each left out)" in out and "on the board's 2" in out
    assert report["labelled_curves"] > 5 and report["tuned_jobs"] == 40
    assert report["after"]["mean_regret_pct"] < report["before"]["mean_regret_pct"]
    assert report["moved"]["more_than_one_level"] > report["moved"]["workloads"] / 2
    assert not list(tmp_path.glob(".a.json.*"))  # the temporary file was renamed, not left behind


def test_the_export_is_read_by_the_daemon_and_matches_scikit_learn(sim_store, tmp_path):
    sweeps = dataset.load(DATA)
    from governor.store import measurements as store

    records = store.read_jobs(store.open_read_only(sim_store))
    result = retrain.retrain(records, sweeps, seed=0)
    out = tmp_path / "tree.json"
    model_id = retrain.export_tree(result, out, {"stores": [str(sim_store)], "anything": {"nested": [1, 2]}})
    doc = json.loads(out.read_text())
    assert doc["provenance"]["anything"] == {"nested": [1, 2]} and doc["source"] == "retrained"
    tree = DecisionTree.load(out)  # extra provenance keys are accepted by the daemon's reader
    assert tree.metadata["model_id"] == model_id and tree.metadata["retrained"]["tuned_jobs"] == 40
    rng = random.Random(5)
    rows = [[rng.choice([0.0, 1.0]), rng.uniform(0, 100), rng.randrange(1, 48), rng.choice([256, 512, 768, 1024, 2048]),
             rng.uniform(5, 120)] for _ in range(3000)]
    for node in tree.nodes:  # the thresholds themselves, where float32 and float64 could disagree
        if hasattr(node, "threshold"):
            for x in (node.threshold, np.nextafter(node.threshold, -np.inf), np.nextafter(node.threshold, np.inf)):
                row = list(rows[rng.randrange(len(rows))])
                row[FEATURE_ORDER.index(node.feature)] = float(x)
                rows.append(row)
    expected = result.estimator.predict(np.array(rows))
    got = [tree.decide_vector(dict(zip(FEATURE_ORDER, r, strict=True))).freq_hz for r in rows]
    assert got == [int(v) for v in expected]


def test_a_fleet_merges_stores_of_one_kind_and_refuses_two_kinds(sim_store, tmp_path, capsys):
    fleet = tmp_path / "fleet"
    (fleet / "board-a").mkdir(parents=True)
    (fleet / "board-b").mkdir()
    (fleet / "board-a" / "measurements.sqlite").write_bytes(sim_store.read_bytes())
    b = Store(fleet / "board-b" / "measurements.sqlite")
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    for rec in learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 10, seed=4,
                               first_index=100):
        b.add(rec)
    b.close()
    (fleet / "copy-of-a.sqlite").write_bytes(sim_store.read_bytes())  # copied twice: counted once
    assert run_cli("--from", fleet, "--out", tmp_path / "fleet.json", "--json", "--uid", 1000, "--force",
                   "--current", REPO / "model" / "mlg-tree.json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 50
    assert len(json.loads((tmp_path / "fleet.json").read_text())["provenance"]["stores"]) == 3
    other = Store(fleet / "board-b" / "other.sqlite")
    other.add(JobRecord(ended_at=1.0, model_type="encoder", num_layers=4, hidden_size=512, seq_len=20.0,
                        board_model="NVIDIA Jetson Orin Nano", gpu_name="17000000.gpu"))
    other.close()
    assert run_cli("--from", fleet, "--out", tmp_path / "x.json", "--uid", 1000, "--force",
                   "--current", REPO / "model" / "mlg-tree.json") == 1
    assert "different kinds of board" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_from_needs_out_and_a_missing_store_is_a_clear_error(tmp_path, capsys):
    assert run_cli("--store", tmp_path / "none.sqlite", "--out", tmp_path / "t.json",
                   "--current", REPO / "model" / "mlg-tree.json") == 1
    assert "no measurement store" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    Store(tmp_path / "d" / "m.sqlite").close()
    assert run_cli("--from", tmp_path / "d", "--current", REPO / "model" / "mlg-tree.json") == 1
    assert "--from needs --out" in capsys.readouterr().err


def test_retrain_defaults_to_the_simulated_daemons_store_and_names_store_when_there_is_none(sim_store, tmp_path,
                                                                                              monkeypatch, capsys):
    import governor
    from governor import config

    shipped = REPO / "model" / "mlg-tree.json"
    monkeypatch.setattr(governor, "DEFAULT_CONFIG_PATH", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(config, "DEFAULT_STORE_PATH", str(tmp_path / "none.sqlite"))
    monkeypatch.delenv("FTGOV_SIM_TREE", raising=False)
    monkeypatch.delenv("FTGOV_SOCKET", raising=False)
    assert run_cli("--current", shipped) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov: error: no measurement store at {tmp_path / 'none.sqlite'} "
                                               "(give --store PATH, or for ftgovd --simulate's: "
                                               'eval "$(ftgovd --simulate --print-env)")')
    state_dir = tmp_path / "ftgov-sim"  # as `eval "$(ftgovd --simulate --print-env)"` names it
    monkeypatch.setenv("FTGOV_SIM_TREE", str(state_dir / "sim-orin"))
    assert run_cli("--current", shipped) == 1
    assert capsys.readouterr().err.strip().endswith(f"{state_dir / 'measurements.sqlite'} (give --store PATH)")
    state_dir.mkdir()
    (state_dir / "measurements.sqlite").write_bytes(sim_store.read_bytes())
    assert run_cli("--current", shipped, "--uid", 1000, "--force", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stores"] == [{"path": str(state_dir / "measurements.sqlite"), "jobs": 40}]
    assert report["out"] == str(state_dir / "mlg-tree.json")
    (state_dir / "sim-orin").mkdir()  # the simulated daemon's tree beside its store: its reload is a SIGHUP
    assert run_cli("--current", shipped, "--uid", 1000, "--force") == 0
    assert "point model_file at it and send ftgovd --simulate a SIGHUP" in capsys.readouterr().out


def test_store_paths_find_every_store_under_a_directory(tmp_path):
    with pytest.raises(FtgovError, match="no \\*.sqlite"):
        retrain.store_paths(None, str(tmp_path))


def test_retrain_may_learn_from_trusted_users_only(tmp_path):
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    path = tmp_path / "m.sqlite"
    s = Store(path)
    for i, rec in enumerate(learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 6,
                                            seed=4)):
        s.add(JobRecord(**{**rec.__dict__, "uid": 0 if i < 4 else 1000}))
    s.close()
    every, _ = retrain.load_records([path])
    trusted, _ = retrain.load_records([path], {0})
    assert len(every) == 6 and len(trusted) == 4 and {r.uid for r in trusted} == {0}
    with pytest.raises(SystemExit):  # a uid must be a number
        run_cli("--store", path, "--uid", "root", "--out", tmp_path / "t.json")


def test_a_store_another_user_owns_is_that_users_word_whatever_uid_its_rows_say(tmp_path):
    """retrain learns from root's jobs unless told to trust more users; but a row's uid is the word of whoever wrote
    the file. A member's own file of rows that say uid 0, given with --store, was learnt from as root's."""
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    path = tmp_path / "forged.sqlite"
    s = Store(path)
    for rec in learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 4, seed=4):
        s.add(JobRecord(**{**rec.__dict__, "uid": 0}))
    s.close()
    for f in tmp_path.iterdir():
        os.chown(f, 4242, 4242)
    trusted, identity = retrain.load_records([path], {0})
    assert trusted == [] and identity["jobs_left_out"] == 4
    vouched, _ = retrain.load_records([path], {0, 4242})  # --uid 4242: that user's word is taken
    assert len(vouched) == 4


def test_a_store_of_a_gpu_without_the_characterization_levels_is_refused(tmp_path, capsys):
    # An NVML GPU's store (15 MHz steps from 345 MHz): its windows are at levels the Orin's sweeps were not measured
    # at, so none can label or correct anything; a "retrained" tree from it would be the sweeps' alone.
    path = tmp_path / "nvml.sqlite"
    table = [345_000_000 + 15_000_000 * k for k in range(110)]
    s = Store(path)
    for rec in learning.stream(lambda f: 816_000_000, 4, seed=5):
        windows = tuple(Window(table[46 + j], w.joules_per_step, w.seconds_per_step, w.steps, w.gpu_util)
                        for j, w in enumerate(rec.windows))
        s.add(JobRecord(**{**rec.__dict__, "uid": 0, "backend": "nvml", "board_model": None,
                           "gpu_name": "NVIDIA H100 80GB HBM3", "levels_hz": json.dumps(table), "windows": windows}))
    s.close()
    out = tmp_path / "t.json"
    assert run_cli("--store", path, "--out", out, "--current", REPO / "model" / "mlg-tree.json") == 1
    err = capsys.readouterr().err
    assert "only 0 of the" in err and "tuned windows in the store are at a level of the characterization" in err, err
    assert "NVIDIA H100 80GB HBM3" in err and not out.exists()


def test_a_store_with_nothing_to_learn_from_writes_no_tree(tmp_path, capsys):
    # Jobs registered by users (the ftgov group's members, not root) are left out unless named with --uid: a store of
    # such jobs only, like an empty one, labels nothing and corrects no level, and the "retrained" tree would be the
    # sweeps' alone, installed by the operator as if it were the board's.
    shipped = REPO / "model" / "mlg-tree.json"
    path = tmp_path / "m.sqlite"
    s = Store(path)
    for rec in learning.stream(retrain.tree_decider(DecisionTree.load(shipped), learning.board_model().levels_hz), 12,
                               seed=4):
        s.add(JobRecord(**{**rec.__dict__, "uid": 1000}))
    s.close()
    out = tmp_path / "t.json"
    assert run_cli("--store", path, "--out", out, "--current", shipped) == 1
    err = capsys.readouterr().err
    assert "nothing to learn from" in err and "12 jobs of other users left out (--uid" in err, err
    assert not out.exists()
    Store(tmp_path / "empty.sqlite").close()
    assert run_cli("--store", tmp_path / "empty.sqlite", "--out", out, "--current", shipped, "--json") == 1
    said = capsys.readouterr()  # said before the search, as any refusal of its input: no report to print
    assert said.out == "" and "nothing to learn from in the store: no jobs of the trusted users" in said.err
    assert not out.exists()
    assert run_cli("--store", path, "--out", out, "--current", shipped, "--uid", 1000, "--force") == 0
    assert DecisionTree.load(out).source == "retrained"
