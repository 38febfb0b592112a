"""The measurement store on its own: schema, size bound, hostile names, a corrupt file, SIGKILL mid-write, the writer
thread."""

import ast
import dataclasses
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from governor.daemon.recorder import StoreWriter
from governor.store import measurements as store
from governor.store.measurements import JobRecord, Store, Window
from tests.support.stores import old_store

REPO = Path(__file__).resolve().parents[2]


def rec(i: int = 0, name: str = "job", **kw) -> JobRecord:
    fields = dict(ended_at=1_000_000.0 + i, model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0,
                  gpu_util=60.0, name=name, policy="tune", freq_hz=714_000_000, energy_j=100.0 + i,
                  duration_s=10.0, steps=200, start_hz=816_000_000, saved_rel=0.05, saved_basis="start level",
                  windows=(Window(816_000_000, 1.0, 0.1, 4, 60.0), Window(714_000_000, 0.95, 0.11, 4, 61.0)))
    fields.update(kw)
    return JobRecord(**fields)


def test_schema_is_versioned_in_wal_mode_and_round_trips(tmp_path):
    path = tmp_path / "m.sqlite"
    s = Store(path)
    s.add(rec(1))
    s.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    jobs = store.read_jobs(store.open_read_only(path))
    assert len(jobs) == 1 and jobs[0] == rec(1)
    saved_j = pytest.approx(101.0 * 0.05 / 0.95)
    assert Store(path).totals() == {"jobs": 1, "energy_j": 101.0, "saved_j": saved_j, "saved_default_j": 0.0,
                                    "saved_start_j": saved_j, "saved_unsplit_j": 0.0}


def test_a_newer_schema_is_moved_aside_not_rewritten(tmp_path, caplog):
    path = tmp_path / "m.sqlite"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={store.SCHEMA_VERSION + 1}")
    raw.close()
    with caplog.at_level(logging.ERROR, "ftgovd"):
        Store(path).close()
    assert [p.name for p in tmp_path.glob("m.sqlite.corrupt-*")] and "newer than" in caplog.text


def test_oldest_jobs_are_dropped_past_max_jobs_and_totals_survive(tmp_path):
    s = Store(tmp_path / "m.sqlite", max_jobs=5)
    for i in range(12):
        s.add(rec(i))
    jobs = store.read_jobs(s.conn)
    assert [j.ended_at for j in jobs] == [1_000_000.0 + i for i in range(7, 12)]
    assert s.conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 10  # the dropped jobs' windows went too
    assert s.totals()["jobs"] == 12 and s.totals()["energy_j"] == sum(100.0 + i for i in range(12))


def test_a_user_filling_the_store_drops_its_own_oldest_jobs_not_the_others(tmp_path):
    s = Store(tmp_path / "m.sqlite", max_jobs=10)
    for i in range(3):
        s.add(dataclasses.replace(rec(i), uid=0, name=f"root {i}"))
    s.add(dataclasses.replace(rec(3), uid=1001, name="other member"))
    for i in range(4, 60):  # a register-and-close loop
        s.add(dataclasses.replace(rec(i), uid=1000, name=f"flood {i}"))
    names = [j.name for j in store.read_jobs(s.conn)]
    assert len(names) == 10 and names[:4] == ["root 0", "root 1", "root 2", "other member"]
    assert names[4:] == [f"flood {i}" for i in range(54, 60)]  # its own newest
    assert s.totals()["jobs"] == 60


HOSTILE = ["'); DROP TABLE jobs; --", 'Robert"); DELETE FROM windows; --', "\x1b[2J\x1b[31mred\r\n\x00end",
           "%s %d {0} ?", "名前 \u202e", "x" * 10000]


def test_hostile_names_are_stored_as_data(tmp_path):
    s = Store(tmp_path / "m.sqlite")
    for i, name in enumerate(HOSTILE):
        s.add(rec(i, name=name))
    assert [j.name for j in store.read_jobs(s.conn)] == HOSTILE
    assert s.conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 2 * len(HOSTILE)


# A member's store for root's `ftgov history --store`, `report`, `model retrain --from`. Any view runs the file's own
# SQL: one of rows without end (WITH RECURSIVE) made history sort them into an unlinked temp file in /var/tmp at
# hundreds of MB a second; a plain one stands for it here, so that the old code fails at once instead. A generated
# column is computed at every read: a 100 MB blob a row from a file of a few KB.
VIEW = "ALTER TABLE jobs RENAME TO stored; CREATE VIEW jobs AS SELECT * FROM stored;"
COMPUTED_COLUMN = """ALTER TABLE windows RENAME TO stored;
CREATE TABLE windows (job INTEGER, seq INTEGER, level_hz INTEGER, joules_per_step REAL, seconds_per_step REAL,
                      steps INTEGER, gpu_util REAL, pad BLOB GENERATED ALWAYS AS (zeroblob(100000000)) VIRTUAL);"""


@pytest.mark.parametrize("sql", [VIEW, COMPUTED_COLUMN], ids=["view", "generated-column"])
def test_a_store_whose_tables_run_its_own_sql_is_refused_unread(tmp_path, sql):
    path = tmp_path / "member.sqlite"
    s = Store(path)
    s.add(rec(1))
    s.close()
    raw = sqlite3.connect(path)
    raw.executescript(sql)
    raw.close()
    with pytest.raises(store.StoreError, match="not a store ftgovd wrote"):
        store.open_read_only(path)


def test_garbage_file_is_moved_aside_and_a_fresh_store_starts(tmp_path, caplog):
    path = tmp_path / "m.sqlite"
    garbage = os.urandom(8192)
    path.write_bytes(garbage)
    with caplog.at_level(logging.ERROR, "ftgovd"):
        s = Store(path)
    s.add(rec(1))
    assert len(store.read_jobs(s.conn)) == 1
    aside = list(tmp_path.glob("m.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert "moved aside" in caplog.text


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_store_in_a_directory_others_may_write_is_refused_before_sqlite_opens_it(tmp_path, mode):
    """SQLite opens the store, -wal and -shm by path: there another user could put their own database (rows of uid
    0, which retrain trusts) or links in place of ours. Refused with the directory's reason; nothing created."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    writer = StoreWriter(shared / "m.sqlite")
    writer.submit(rec(1))
    writer.join_queue()
    assert "writable by group or others" in writer.status()["error"]
    writer.close()
    assert list(shared.iterdir()) == []


def test_a_damaged_page_is_moved_aside(tmp_path):
    path = tmp_path / "m.sqlite"
    s = Store(path)
    for i in range(300):
        s.add(rec(i, name="n" * 200))
    s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[3 * page: 6 * page] = os.urandom(3 * page)  # keep the header: only quick_check can tell
    path.write_bytes(bytes(data))
    s = Store(path)
    assert store.read_jobs(s.conn) == [] and list(tmp_path.glob("m.sqlite.corrupt-*"))


WRITER_CHILD = """
import sys
from governor.store.measurements import Store, JobRecord, Window
s = Store(sys.argv[1])
i = 0
while True:
    s.add(JobRecord(ended_at=float(i), model_type="decoder", num_layers=6, hidden_size=512, seq_len=22.0,
                    name=f"job {i}", energy_j=float(i),
                    windows=tuple(Window(306000000 + k, 1.0, 0.1, 4) for k in range(8))))
    print(i, flush=True)  # committed
    i += 1
"""


def test_sigkill_mid_write_keeps_every_committed_job(tmp_path):
    path = tmp_path / "m.sqlite"
    child = subprocess.Popen([sys.executable, "-c", WRITER_CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    committed = -1
    for line in child.stdout:
        committed = int(line)
        if committed >= 150:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    child.stdout.close()
    s = Store(path)  # opens (quick_check passes) without being moved aside
    jobs = store.read_jobs(s.conn)
    assert not list(tmp_path.glob("*.corrupt-*"))
    assert len(jobs) >= committed + 1  # every job it reported committed, perhaps one more that it had not printed
    assert [j.name for j in jobs] == [f"job {i}" for i in range(len(jobs))]
    assert all(len(j.windows) == 8 for j in jobs)  # no job without its windows: one transaction each


def test_writer_thread_commits_while_other_threads_submit_and_readers_see_whole_jobs(tmp_path):
    path = tmp_path / "m.sqlite"
    writer = StoreWriter(path, max_jobs=1000)
    reader = store.open_read_only(path)

    def produce(k):
        for i in range(50):
            writer.submit(rec(k * 100 + i, name=f"t{k}-{i}"))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    seen = []
    for _ in range(20):  # WAL: a reader gets a snapshot between the writer's transactions, never half a job
        jobs = store.read_jobs(reader)
        assert all(len(j.windows) == 2 for j in jobs)
        seen.append(len(jobs))
    for t in threads:
        t.join()
    writer.join_queue()
    assert seen == sorted(seen)
    assert writer.status()["jobs"] == 200 and writer.status()["error"] is None
    writer.close()
    names = sorted(j.name for j in store.read_jobs(reader))
    assert names == sorted(f"t{k}-{i}" for k in range(4) for i in range(50))


def test_writer_with_an_unopenable_store_drops_records_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = StoreWriter(blocker / "sub" / "m.sqlite")
    writer.submit(rec(1))
    writer.join_queue()
    assert "cannot create" in writer.status()["error"]
    writer.close()


def test_measured_saving_prefers_the_default_governor_window():
    ws = [Window(None, 2.0, 0.1, 4), Window(816_000_000, 1.6, 0.1, 4), Window(714_000_000, 1.5, 0.1, 4)]
    assert store.measured_saving(ws, 714_000_000, 816_000_000) == (pytest.approx(0.25), "default governor")
    assert store.measured_saving(ws[1:], 714_000_000, 816_000_000) == (pytest.approx(1 - 1.5 / 1.6), "start level")
    assert store.measured_saving(ws[1:], 612_000_000, 816_000_000) == (None, None)


def test_the_store_path_is_systemds_state_directory_or_none_unless_configured():
    from governor.config import load_config, store_path

    auto = load_config(None)
    assert store_path(auto, {"STATE_DIRECTORY": "/var/lib/ftgov"}) == "/var/lib/ftgov/measurements.sqlite"
    assert store_path(auto, {}) is None  # started by hand: no store on the board's disk unless asked for
    assert store_path(load_config(None, {"store.path": "/tmp/x.sqlite"}), {"STATE_DIRECTORY": "/s"}) == "/tmp/x.sqlite"
    none = load_config(None).model_copy(update={"store": load_config(None).store.model_copy(update={"path": None})})
    assert store_path(none, {"STATE_DIRECTORY": "/s"}) is None


def test_the_daemons_store_pulls_in_no_numpy_or_scikit_learn():
    code = ("import sys, governor.daemon.main, governor.daemon.recorder; "
            "print([m for m in ('numpy', 'sklearn', 'governor.pipeline', 'governor.sim') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[]"


def test_a_store_locked_by_another_process_is_refused_not_moved_aside(tmp_path, monkeypatch):
    store.Store(tmp_path / "m.sqlite").close()
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.1)
    holder = sqlite3.connect(tmp_path / "m.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(store.StoreError, match="locked"):
            store.Store(tmp_path / "m.sqlite")
    finally:
        holder.close()
    assert not list(tmp_path.glob("m.sqlite.corrupt-*"))
    assert store.Store(tmp_path / "m.sqlite").totals()["jobs"] == 0


def test_a_store_of_schema_1_is_read_as_it_is_and_migrated_when_the_daemon_opens_it(tmp_path):
    """Schema 2 added saved_pct_err: a file written before keeps its jobs (their uncertainty unknown, None); the CLI
    reads it unchanged, the daemon's Store brings it to version 2 and records the uncertainty from then on."""
    path = tmp_path / "m.sqlite"
    raw = old_store(path, 1)
    raw.execute("INSERT INTO jobs (ended_at, model_type, num_layers, hidden_size, seq_len, saved_rel, saved_basis) "
                "VALUES (1e6, 'encoder', 12, 768, 40.0, 0.1, 'default governor')")
    raw.commit()
    raw.close()
    old, = store.read_jobs(store.open_read_only(path))
    assert old.saved_rel == 0.1 and old.saved_pct_err is None
    s = Store(path)
    s.add(rec(1, saved_pct_err=1.25))
    s.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION
    raw.close()
    old, new = store.read_jobs(store.open_read_only(path))
    assert old.saved_pct_err is None and new == rec(1, saved_pct_err=1.25)


def test_the_saved_total_is_kept_by_basis_and_an_older_total_stays_apart(tmp_path):
    """A saving against the default governor and one against the tuner's start (what tuning added on top of the tree)
    are different figures: the totals keep them apart. A store written before they were split (schema 3) keeps its
    total as "unsplit", read as it is by the CLI and after the daemon's migration alike."""
    path = tmp_path / "m.sqlite"
    raw = old_store(path, 3)
    raw.execute("UPDATE totals SET jobs = 4, energy_j = 900.0, saved_j = 50.0")
    raw.commit()
    raw.close()
    before = {"jobs": 4, "energy_j": 900.0, "saved_j": 50.0, "saved_default_j": 0.0, "saved_start_j": 0.0,
              "saved_unsplit_j": 50.0}
    assert store.read_totals(store.open_read_only(path)) == before
    s = Store(path)
    assert s.totals() == before
    default = rec(1, saved_basis="default governor", saved_rel=0.2, energy_j=80.0)  # saved 20 J
    start = rec(2, saved_basis="start level", saved_rel=-0.25, energy_j=100.0)  # cost 20 J more than its start
    s.add(default)
    s.add(start)
    s.add(rec(3, saved_rel=None))
    s.close()
    totals = store.read_totals(store.open_read_only(path))
    assert totals == {"jobs": 7, "energy_j": pytest.approx(1183.0), "saved_j": pytest.approx(50.0),
                      "saved_default_j": pytest.approx(20.0), "saved_start_j": pytest.approx(-20.0),
                      "saved_unsplit_j": 50.0}


def test_store_names_each_class_once():
    """The state file's held job and the store's finished job are different things: one name each, so an import of
    one cannot be taken for the other."""
    where: dict[str, list[str]] = {}
    for path in sorted((REPO / "governor" / "store").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(path.name)
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


def test_the_saving_from_windows_weighs_each_level_by_its_steps():
    """A tuned job's windows past the first 256 at a level are stored as one pooled row of all their steps
    (governor.policy.measured_saving.KeptWindows): averaged as one window beside a 4-step one, it counted thousands of
    steps as many as four."""
    from governor.store.measurements import measured_saving

    windows = [Window(None, 2.0, 0.1, 40), Window(816_000_000, 1.0, 0.12, 10_000),
               Window(816_000_000, 2.0, 0.12, 4)]
    saved, basis = measured_saving(windows, 816_000_000, None)
    assert basis == "default governor"
    assert saved == pytest.approx(1 - (10_000 + 8) / 10_004 / 2.0)


def test_an_observed_jobs_saving_from_an_older_daemon_is_read_as_none(tmp_path):
    """A daemon before 2026-12-07 stored 0.0% against the default governor for every observed job (its windows
    against themselves): history showed a measured 0% and report averaged it into the tuned jobs' savings."""
    path = tmp_path / "m.sqlite"
    s = Store(path)
    s.add(rec(1, policy="observe", freq_hz=None, saved_rel=0.0, saved_basis="default governor",
              windows=(Window(None, 1.0, 0.1, 40), Window(None, 1.0, 0.1, 40))))
    s.close()
    job, = store.read_jobs(store.open_read_only(path))
    assert (job.saved_rel, job.saved_basis, job.saved_pct_err) == (None, None, None)
