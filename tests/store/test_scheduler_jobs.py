"""The store's scheduler jobs (schema 3): a Slurm job held from prolog to epilog, written by the daemon's Store and
read back; a version-2 store gains the table when the daemon opens it, and reads as empty before that."""

import sqlite3

import pytest

from governor.store import measurements as store
from governor.store.measurements import SchedulerJobRecord, Store
from tests.support.stores import old_store


def _version_2(path) -> None:
    old_store(path, 2).close()


def test_a_version_2_store_reads_no_scheduler_jobs_and_gains_the_table_when_opened(tmp_path):
    path = tmp_path / "m.sqlite"
    _version_2(path)
    assert store.read_scheduler_jobs(store.open_read_only(path)) == []
    s = Store(path)
    rec = SchedulerJobRecord(ended_at=1e6, scheduler="slurm", sched_job_id=41, uid=1000, partition="gpu",
                             policy="tune", gpus='{"0": {}}', duration_s=12.5, energy_j=3400.0, saved_pct=9.5,
                             saved_pct_err=1.5, daemon_job_ids="[3]", ended="epilog")
    s.add_scheduler_job(rec)
    s.close()
    assert store.read_scheduler_jobs(store.open_read_only(path)) == [rec]
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    raw.close()


def test_scheduler_jobs_past_max_jobs_drop_the_oldest(tmp_path):
    s = Store(tmp_path / "m.sqlite", max_jobs=2)
    for job_id in (1, 2, 3):
        s.add_scheduler_job(SchedulerJobRecord(ended_at=1e6 + job_id, scheduler="slurm", sched_job_id=job_id))
    s.close()
    kept = store.read_scheduler_jobs(store.open_read_only(tmp_path / "m.sqlite"))
    assert [r.sched_job_id for r in kept] == [2, 3]


def test_a_scheduler_job_holding_what_the_daemon_never_writes_is_named(tmp_path):
    path = tmp_path / "m.sqlite"
    s = Store(path)
    s.add_scheduler_job(SchedulerJobRecord(ended_at=1e6, scheduler="slurm", sched_job_id=7, energy_j=10.0))
    s.close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE scheduler_jobs SET energy_j = 'lots'")
    raw.commit()
    raw.close()
    with pytest.raises(store.BadRow, match="scheduler job 1: energy_j is 'lots', not a finite number"):
        store.read_scheduler_jobs(store.open_read_only(path))
