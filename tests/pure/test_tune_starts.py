"""governor.daemon.starts: where a tuned job starts on a GPU the tree was not trained for."""

import json

from governor.daemon.starts import KEPT_PER_SHAPE, TuneStarts
from governor.features import Features
from governor.store import measurements as store

LEVELS = (345_000_000, 900_000_000, 1_500_000_000, 1_980_000_000)
KEY = ("NVIDIA H200", LEVELS)
USER, OTHER = 1000, 1001
BERT = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


def test_the_most_recent_level_of_the_same_shape_within_the_seq_len_tolerance():
    starts = TuneStarts()
    starts.learn(KEY, BERT, LEVELS[1], USER)
    starts.learn(KEY, BERT.model_copy(update={"seq_len": 43.0}), LEVELS[2], USER)
    assert starts.lookup(KEY, BERT, USER) == LEVELS[2]  # 43 is within 10% of 40, and more recent
    assert starts.lookup(KEY, BERT.model_copy(update={"seq_len": 60.0}), USER) is None
    assert starts.lookup(KEY, BERT.model_copy(update={"num_layers": 24}), USER) is None
    assert starts.lookup(("NVIDIA H100", LEVELS), BERT, USER) is None  # another kind of GPU
    assert starts.lookup(("NVIDIA H200", LEVELS[1:]), BERT, USER) is None  # another table


def test_a_users_start_comes_from_its_own_jobs_else_roots_never_another_members():
    # A member's client reports its own step counts: what its tuner converged on is only as honest as it is.
    starts = TuneStarts()
    starts.learn(KEY, BERT, LEVELS[0], OTHER)  # forged to the bottom of the table
    assert starts.lookup(KEY, BERT, USER) is None and starts.lookup(KEY, BERT, 0) is None
    starts.learn(KEY, BERT, LEVELS[2], 0)
    assert starts.lookup(KEY, BERT, USER) == LEVELS[2]  # root's
    starts.learn(KEY, BERT, LEVELS[1], USER)
    assert starts.lookup(KEY, BERT, USER) == LEVELS[1]  # its own, before root's
    assert starts.lookup(KEY, BERT, OTHER) == LEVELS[0]  # a member's own jobs start its own


def test_a_level_outside_the_table_is_never_learnt_and_the_index_stays_small():
    starts = TuneStarts()
    starts.learn(KEY, BERT, 1_000_000_000, USER)
    assert starts.lookup(KEY, BERT, USER) is None
    for _ in range(3 * KEPT_PER_SHAPE):
        starts.learn(KEY, BERT, LEVELS[0], USER)
    assert len(starts) == KEPT_PER_SHAPE


def test_loaded_from_the_store_only_converged_tuned_jobs_off_devfreq(tmp_path):
    path = tmp_path / "m.sqlite"
    s = store.Store(path)
    base = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_name=KEY[0],
                levels_hz=json.dumps(list(LEVELS)), policy="tune", uid=USER)
    s.add(store.JobRecord(ended_at=1.0, **base, backend="nvml", freq_hz=LEVELS[1], converged=True))
    s.add(store.JobRecord(ended_at=2.0, **base, backend="nvml", freq_hz=LEVELS[0], converged=False))
    s.add(store.JobRecord(ended_at=3.0, **base, backend="devfreq", freq_hz=LEVELS[2], converged=True))
    s.add(store.JobRecord(ended_at=4.0, **{**base, "policy": "mlg"}, backend="nvml", freq_hz=LEVELS[3]))
    s.add(store.JobRecord(ended_at=5.0, **{**base, "uid": None}, backend="nvml", freq_hz=LEVELS[3], converged=True))
    s.close()
    starts = TuneStarts.load(path)
    assert len(starts) == 1 and starts.lookup(KEY, BERT, USER) == LEVELS[1]
    assert starts.lookup(KEY, BERT, OTHER) is None  # USER's level starts nobody else's job


def test_no_store_or_an_unreadable_one_gives_an_empty_index(tmp_path):
    assert len(TuneStarts.load(None)) == 0
    assert len(TuneStarts.load(tmp_path / "absent.sqlite")) == 0
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    assert len(TuneStarts.load(bad)) == 0
