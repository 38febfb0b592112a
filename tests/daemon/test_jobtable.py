"""governor.daemon.jobtable: the job table on its own (ids, admission, the pin each GPU's jobs imply)."""

from __future__ import annotations

import pytest

from governor.daemon.jobs import GroupTag
from governor.daemon.jobtable import JobTable, TableFull, needs_hz
from governor.features import Features
from governor.policy import Decision, PolicyName

ENCODER = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)
LOWEST_HZ = 306_000_000
LOW = frozenset({"checkpoint"})


def admit(table: JobTable, pid: int = 100, *, uid: int = 1000, gpu_id: str = "0", max_jobs: int = 8, **kwargs):
    return table.admit(pid=pid, start_ticks=5000 + pid, uid=uid, name=None, gpu_id=gpu_id, features=ENCODER,
                       policy=None, max_jobs=max_jobs, **kwargs)


def decided(job, freq_hz: int | None):
    job.decision = Decision(PolicyName.FFG, freq_hz, "test")
    return job


def test_ids_count_up_and_a_removed_id_is_not_given_again():
    table = JobTable()
    first, second = admit(table, 100), admit(table, 101)
    assert (first.job_id, second.job_id) == (1, 2) and table[1] is first and len(table) == 2
    assert table.remove(1) is first and table.remove(1) is None and 1 not in table
    assert admit(table, 102).job_id == 3 and list(table) == [2, 3]


def test_max_jobs_refuses_a_new_job_but_not_a_readopted_one():
    table = JobTable()
    admit(table, 100, max_jobs=1)
    with pytest.raises(TableFull, match="limits.max_jobs"):
        admit(table, 101, max_jobs=1)
    assert len(table) == 1 and table.next_job_id == 2  # the refused job took no id
    readopted = admit(table, 102, max_jobs=1, job_id=7)  # re-adopted after a restart: its old id, over the limit
    assert readopted.job_id == 7 and table[7] is readopted and table.next_job_id == 2


def test_the_per_uid_cap_counts_a_group_once_and_a_rank_joining_it_nothing_more():
    table = JobTable()
    admit(table, 100, uid=1000)
    for rank in range(3):  # three ranks of one run: one job against the cap
        admit(table, 101 + rank, uid=1000, gpu_id=str(rank), max_per_uid=2, group=GroupTag("run", rank, 4))
    admit(table, 110, uid=2000, group=GroupTag("run", 0, 1))  # another uid's key is another group
    assert table.of_uid(1000) == 2 and table.of_uid(1000, joining="run") == 1 and table[2].group.key == "run"
    admit(table, 104, uid=1000, gpu_id="3", max_per_uid=2, group=GroupTag("run", 3, 4))  # joins: counts nothing
    with pytest.raises(TableFull, match="uid 1000 already holds 2 jobs"):
        admit(table, 105, uid=1000, max_per_uid=2)
    with pytest.raises(TableFull, match="max_jobs_per_uid"):
        admit(table, 106, uid=1000, max_per_uid=2, group=GroupTag("another run"))
    assert admit(table, 107, uid=2000, max_per_uid=2).uid == 2000


def test_the_rank_cap_counts_every_rank_of_a_uid():
    table = JobTable()
    for rank in range(3):
        admit(table, 101 + rank, uid=1000, gpu_id=str(rank), max_per_uid=1, max_ranks_per_uid=4,
              group=GroupTag("run", rank, 4))
    admit(table, 104, uid=1000, gpu_id="3", max_per_uid=1, max_ranks_per_uid=4, group=GroupTag("run", 3, 4))
    with pytest.raises(TableFull, match=r"uid 1000 already holds 4 jobs, each rank .*max_ranks_per_uid"):
        admit(table, 105, uid=1000, max_per_uid=2, max_ranks_per_uid=4, group=GroupTag("another run"))
    assert admit(table, 106, uid=2000, max_per_uid=1, max_ranks_per_uid=4).uid == 2000  # another uid's own count
    assert admit(table, 107, uid=1000, max_ranks_per_uid=4, job_id=9).job_id == 9  # re-adopted: no admission


def test_ids_continue_from_a_previous_daemon_of_the_boot():
    table = JobTable()
    table.continue_ids(5)
    table.continue_ids(3)  # never backwards
    assert admit(table).job_id == 5


def test_per_uid_and_per_gpu_queries():
    table = JobTable()
    a = admit(table, 100, uid=1000, gpu_id="0")
    admit(table, 101, uid=1000, gpu_id="1")
    admit(table, 102, uid=2000, gpu_id="1")
    assert table.of_uid(1000) == 2 and table.of_uid(2000) == 1 and table.of_uid(0) == 0
    assert table.on_gpu("0") and table.on_gpu("1") and not table.on_gpu("2")
    assert not table.shares_gpu(a) and table.shares_gpu(table[2])


def test_the_target_is_the_highest_decided_need_on_the_gpu():
    table = JobTable()
    low, high, undecided = admit(table, 100), admit(table, 101), admit(table, 102)
    other = admit(table, 103, gpu_id="1")
    assert table.target_hz("0", LOW, LOWEST_HZ) is None  # nothing decided: the baseline
    decided(low, 612_000_000)
    decided(high, 918_000_000)
    decided(other, 1_300_500_000)  # another GPU's job does not count
    assert undecided.decision is None and table.target_hz("0", LOW, LOWEST_HZ) == 918_000_000
    high.phase = "checkpoint"  # checkpointing needs only the lowest level: the other job's pick is the target
    assert needs_hz(high, LOW, LOWEST_HZ) == LOWEST_HZ and table.target_hz("0", LOW, LOWEST_HZ) == 612_000_000
    decided(low, None)  # a job that pins nothing (observe, or waiting for its gpu_util) does not count
    assert table.target_hz("0", LOW, LOWEST_HZ) == LOWEST_HZ
    assert needs_hz(low, LOW, LOWEST_HZ) is None


def test_a_phase_outside_low_phases_needs_the_pick():
    table = JobTable()
    job = decided(admit(table), 714_000_000)
    job.phase = "train"
    assert needs_hz(job, LOW, LOWEST_HZ) == 714_000_000
    job.phase = "checkpoint"
    assert needs_hz(job, frozenset(), LOWEST_HZ) == 714_000_000  # low_phases empty: every phase runs at the pick


def test_records_are_the_decided_jobs_and_the_views_are_the_tables():
    table = JobTable()
    pinned, waiting = decided(admit(table, 100), 714_000_000), admit(table, 101)
    assert [r.job_id for r in table.records()] == [pinned.job_id]
    assert list(table.values()) == [pinned, waiting] and dict(table.items()) == {1: pinned, 2: waiting}
    assert table.get(2) is waiting and table.get(9) is None
