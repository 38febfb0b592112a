"""governor.daemon.starts: where a tuned job starts on a GPU the tree was not trained for."""

import json
import tracemalloc

import pytest

from governor.backends.base import Limits
from governor.config import TunerConfig
from governor.daemon.controller import Controller
from governor.daemon.settings import PinSettings
from governor.daemon.starts import KEPT_PER_SHAPE, MAX_SHAPES_PER_UID, TuneStarts
from governor.daemon.tuning import TunerAttach
from governor.features import Features
from governor.policy import Policy, PolicyName
from governor.store import measurements as store
from governor.store.state import StateFile
from tests.support.fakegpu import LimitsGpu

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


def test_a_member_converging_ever_new_shapes_keeps_a_bounded_index_and_evicts_only_its_own():
    """~290 B a converged job of a new shape, never freed, was 50 MB a day per member at the default rate."""
    starts = TuneStarts()
    starts.learn(KEY, BERT, LEVELS[2], 0)
    tracemalloc.start()
    try:
        for i in range(10_000):
            shape = BERT.model_copy(update={"num_layers": 1 + i % 1024, "hidden_size": 1 + i // 1024})
            starts.learn(KEY, shape, LEVELS[0], USER)
        grown_b, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(starts) == MAX_SHAPES_PER_UID + 1
    assert grown_b < 100_000, f"{grown_b} B kept for 10,000 shapes"
    assert starts.lookup(KEY, BERT, OTHER) == LEVELS[2], "root's shape is not the member's to evict"
    newest = BERT.model_copy(update={"num_layers": 1 + 9_999 % 1024, "hidden_size": 1 + 9_999 // 1024})
    assert starts.lookup(KEY, newest, USER) == LEVELS[0]
    assert starts.lookup(KEY, BERT.model_copy(update={"num_layers": 1, "hidden_size": 1}), USER) is None  # evicted


def test_the_least_recently_used_shape_goes_first():
    starts = TuneStarts()
    shapes = [BERT.model_copy(update={"num_layers": n}) for n in range(1, MAX_SHAPES_PER_UID + 1)]
    for shape in shapes:
        starts.learn(KEY, shape, LEVELS[1], USER)
    assert starts.lookup(KEY, shapes[0], USER) == LEVELS[1]  # used: now the most recent
    starts.learn(KEY, BERT.model_copy(update={"num_layers": 500}), LEVELS[1], USER)
    assert starts.lookup(KEY, shapes[0], USER) == LEVELS[1]
    assert starts.lookup(KEY, shapes[1], USER) is None


class _OneLevelGpu(LimitsGpu):
    """A GPU of one level: a tuned job's search converges on its first window."""


    def __init__(self, backend: str):
        self.backend, self.levels_hz, self.limits = backend, (LEVELS[0],), Limits(LEVELS[0], LEVELS[0])

    def describe(self) -> dict:
        return {"backend": self.backend, "name": KEY[0]}



@pytest.mark.parametrize("backend, kept", [("devfreq", 0), ("nvml", 1)])
def test_converged_levels_are_kept_only_where_a_start_is_looked_up(tmp_path, backend, kept):
    attach = TunerAttach()
    settings = PinSettings(Policy(PolicyName.FFG, LEVELS[0], None), tuner=TunerConfig(baseline_window=False))
    pins = Controller([_OneLevelGpu(backend)], settings, StateFile(tmp_path / "state"), "boot-1",
                      attach_tuner=attach, plan_tune=attach.plan)
    job = pins.admit(pid=100, start_ticks=5100, uid=USER, name=None, gpu_id="0", features=BERT,
                     policy=PolicyName.TUNE)
    pins.decide(job)
    job.tuner.tuner.observe(LEVELS[0], 5.0, 1.0)  # its one window
    assert job.tuner.tuner.converged
    pins.end(job.job_id, "unregistered")
    assert len(attach.starts) == kept
