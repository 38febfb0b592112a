"""The measurement store: every job the daemon governed, with what was measured while it ran (docs/store.md).

One SQLite file (stdlib sqlite3) in the daemon's state directory (/var/lib/ftgov, which survives reboots): per job its
features, the board and GPU identity, the tree's version, the policy and pick, every tuner window (level, joules and
seconds per step, steps, utilization) and the outcome (duration, energy, measured saving where known).
`ftgov model retrain` turns it into training data; `ftgov history` and `ftgov report` show it.

Safety, as SQLite's own guidance for an application file format says:
- WAL journal, synchronous=FULL, one transaction per job: a SIGKILL mid-write loses at most the job being written.
- ``PRAGMA user_version`` holds the schema version; a newer schema is refused (moved aside, not rewritten), an older
  one brought up to date in one transaction when the daemon opens it (``_MIGRATIONS``; the CLI reads it as it is).
- A file that is not a database, or fails ``quick_check``, is renamed ``<name>.corrupt-<time>`` with a log line and a
  fresh store is started: the daemon never stops over its store.
- At most ``max_jobs`` jobs: the oldest of the user with the most jobs are dropped in the transaction that adds one
  (``_PRUNE``); the cumulative totals live in their own row and survive the pruning.
- Client strings are bound as parameters, never formatted into SQL.
- The file is created 0600 whatever the umask (``_private``; SQLite gives -wal and -shm the same mode): it holds the
  job names that ``status`` redacts. An existing store readable by others is narrowed to at most 0640.

The daemon writes from one thread (governor.daemon.recorder.StoreWriter) fed by a queue, so a commit's fsync never
blocks the event loop; readers open the file read-only. Nothing here imports numpy or scikit-learn.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import sqlite3
import stat
import time
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from governor import safefile
from governor.errors import FtgovError

log = logging.getLogger("ftgovd")

SCHEMA_VERSION = 5
DEFAULT_MAX_JOBS = 20000
BUSY_TIMEOUT_S = 5.0

_SCHEDULER_TABLE = """
CREATE TABLE scheduler_jobs (         -- a scheduler's job (Slurm), held from its prolog to its epilog
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ended_at REAL NOT NULL,
    scheduler TEXT NOT NULL,            -- 'slurm'
    sched_job_id INTEGER NOT NULL,      -- the scheduler's job id (SLURM_JOB_ID)
    boot_id TEXT, uid INTEGER, partition TEXT, policy TEXT,
    gpus TEXT,                          -- JSON: the GPU ids held, each with its pin
    duration_s REAL, energy_j REAL,     -- over the GPUs held, from the prolog's hold to the epilog's release
    saved_pct REAL, saved_pct_err REAL, -- measured saving of the job's own tuned registrations, where there were any
    daemon_job_ids TEXT,                -- JSON: the registrations from inside the job that joined the hold
    ended TEXT
);
"""
_SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ended_at REAL NOT NULL,            -- Unix time the job ended
    duration_s REAL,
    boot_id TEXT, daemon_job_id INTEGER, uid INTEGER,
    name TEXT,                          -- the client's string, as given
    model_type TEXT NOT NULL, num_layers INTEGER NOT NULL, hidden_size INTEGER NOT NULL, seq_len REAL NOT NULL,
    gpu_util REAL,
    gpu_util_at_hz INTEGER,             -- NULL: gpu_util as given or measured at the default governor; else the pin
                                        -- it was measured under (the job's load at that clock, not the feature's)
    board_model TEXT, l4t_release TEXT, backend TEXT, gpu_name TEXT, driver TEXT,
    levels_hz TEXT,                     -- the GPU's table of levels, JSON: a window's neighbours are read from it
    model_version TEXT, model_source TEXT,
    policy TEXT, freq_hz INTEGER, reason TEXT,
    steps INTEGER, energy_j REAL,
    start_hz INTEGER,                   -- the tuner's start (the tree's pick), when tuned
    converged INTEGER,
    saved_rel REAL,                     -- measured energy saving per step, 0..1, against saved_basis
    saved_basis TEXT,
    saved_pct_err REAL,                 -- the measured saving's uncertainty (s.d.), percentage points
    ended TEXT
);
CREATE INDEX jobs_ended_at ON jobs (ended_at);
CREATE TABLE windows (
    job INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    level_hz INTEGER,                   -- NULL: the default governor (the board's baseline)
    joules_per_step REAL NOT NULL, seconds_per_step REAL NOT NULL,
    steps INTEGER NOT NULL, gpu_util REAL,
    PRIMARY KEY (job, seq)
);
CREATE TABLE totals (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    jobs INTEGER NOT NULL, energy_j REAL NOT NULL,
    saved_j REAL NOT NULL,              -- every job's measured saving against its own basis: the next three summed
    saved_default_j REAL NOT NULL DEFAULT 0,  -- of jobs measured against the default governor
    saved_start_j REAL NOT NULL DEFAULT 0,    -- of jobs measured against the tuner's start (what tuning added)
    saved_unsplit_j REAL NOT NULL DEFAULT 0   -- recorded before schema 4 kept the two apart
);
INSERT INTO totals (one, jobs, energy_j, saved_j) VALUES (1, 0, 0.0, 0.0);
"""
# version -> what brings a store of that version to the next one
_MIGRATIONS = {
    1: "ALTER TABLE jobs ADD COLUMN saved_pct_err REAL;",
    2: _SCHEDULER_TABLE,
    3: """ALTER TABLE totals ADD COLUMN saved_default_j REAL NOT NULL DEFAULT 0;
ALTER TABLE totals ADD COLUMN saved_start_j REAL NOT NULL DEFAULT 0;
ALTER TABLE totals ADD COLUMN saved_unsplit_j REAL NOT NULL DEFAULT 0;
UPDATE totals SET saved_unsplit_j = saved_j;""",
    4: "ALTER TABLE jobs ADD COLUMN gpu_util_at_hz INTEGER;",
}
# A job's saved_basis -> the totals' column its saving is added to (measured_saving's labels).
_SAVED_BY_BASIS = {"default governor": "saved_default_j", "start level": "saved_start_j"}

JOB_COLUMNS = ("ended_at", "duration_s", "boot_id", "daemon_job_id", "uid", "name", "model_type", "num_layers",
               "hidden_size", "seq_len", "gpu_util", "gpu_util_at_hz", "board_model", "l4t_release", "backend",
               "gpu_name", "driver", "levels_hz",
               "model_version", "model_source", "policy", "freq_hz", "reason", "steps", "energy_j", "start_hz",
               "converged", "saved_rel", "saved_basis", "saved_pct_err", "ended")
_INSERT_JOB = f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) VALUES ({', '.join('?' * len(JOB_COLUMNS))})"
SCHEDULER_COLUMNS = ("ended_at", "scheduler", "sched_job_id", "boot_id", "uid", "partition", "policy", "gpus",
                     "duration_s", "energy_j", "saved_pct", "saved_pct_err", "daemon_job_ids", "ended")
_INSERT_SCHEDULER_JOB = (f"INSERT INTO scheduler_jobs ({', '.join(SCHEDULER_COLUMNS)}) "
                         f"VALUES ({', '.join('?' * len(SCHEDULER_COLUMNS))})")
_INSERT_WINDOW = ("INSERT INTO windows (job, seq, level_hz, joules_per_step, seconds_per_step, steps, gpu_util) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?)")


# Past max_jobs, the oldest jobs of the user with the most are dropped (NULL, no uid known, counts as one user): a
# member who fills the store with short jobs evicts its own, not root's or another user's (a register-and-close loop
# emptied a 500-job store of everyone else's jobs in 2.5 s before). With one user, the oldest jobs, as before.
_PRUNE = """DELETE FROM jobs WHERE id IN (SELECT id FROM jobs
    WHERE uid IS (SELECT uid FROM jobs GROUP BY uid ORDER BY COUNT(*) DESC, MIN(id) LIMIT 1) ORDER BY id LIMIT ?)"""


class StoreError(FtgovError):
    """The measurement store could not be opened or read."""


class StoreMissing(StoreError):
    """No store file where one was looked for: a command that looked at its default says which option names one."""


class BadRow(StoreError):
    """A row that holds what ftgovd never writes (a string where a number belongs, a time past year 9999, a table of
    levels that is not JSON): a damaged store, or one made elsewhere. Names the row and the column."""


@dataclass(frozen=True, slots=True)
class Window:
    """One measurement window: mean energy and time per step at one level (None: the default governor)."""

    level_hz: int | None
    joules_per_step: float
    seconds_per_step: float
    steps: int
    gpu_util: float | None = None


@dataclass(frozen=True)
class SchedulerJobRecord:
    """What the store keeps of a scheduler's job held from its prolog to its epilog (governor.daemon.scheduler).
    ``gpus`` and ``daemon_job_ids`` are JSON text."""

    ended_at: float
    scheduler: str
    sched_job_id: int
    boot_id: str | None = None
    uid: int | None = None
    partition: str | None = None
    policy: str | None = None
    gpus: str | None = None
    duration_s: float | None = None
    energy_j: float | None = None
    saved_pct: float | None = None
    saved_pct_err: float | None = None
    daemon_job_ids: str | None = None
    ended: str | None = None


@dataclass(frozen=True)
class JobRecord:
    """What the store keeps of one job. Energies in joules, times in seconds, frequencies in Hz."""

    ended_at: float
    model_type: str
    num_layers: int
    hidden_size: int
    seq_len: float
    gpu_util: float | None = None
    gpu_util_at_hz: int | None = None  # where gpu_util was measured under a pin (its Hz); None: the feature's meaning
    duration_s: float | None = None
    boot_id: str | None = None
    daemon_job_id: int | None = None
    uid: int | None = None
    name: str | None = None
    board_model: str | None = None
    l4t_release: str | None = None
    backend: str | None = None
    gpu_name: str | None = None
    driver: str | None = None
    levels_hz: str | None = None  # JSON list
    model_version: str | None = None
    model_source: str | None = None
    policy: str | None = None
    freq_hz: int | None = None
    reason: str | None = None
    steps: int | None = None
    energy_j: float | None = None
    start_hz: int | None = None
    converged: bool | None = None
    saved_rel: float | None = None
    saved_basis: str | None = None
    saved_pct_err: float | None = None  # saved_rel's s.d., in percentage points (as unregister reports it)
    ended: str | None = None
    windows: tuple[Window, ...] = field(default_factory=tuple)

    @property
    def saved_j(self) -> float | None:
        """Joules saved against the basis: the job spent energy_j; at the basis it would have spent energy_j/(1-s)."""
        if self.energy_j is None or self.saved_rel is None or not self.saved_rel < 1:
            return None
        return self.energy_j * self.saved_rel / (1 - self.saved_rel)


def measured_saving(windows: Iterable[Window], chosen_hz: int | None,
                    start_hz: int | None) -> tuple[float | None, str | None]:
    """The saving per step the windows themselves show, and against what.

    Against the default governor when a window measured it (level None); else against the tuner's start (the tree's
    pick), which is what tuning saved on top of the tree. None when the windows do not measure both ends, or when
    nothing was chosen (``chosen_hz`` None: observe pins nothing, and its windows at the default governor compared with
    themselves are no saving).
    """
    # J and steps at each level, summed: a level's J/step is over its steps, so that a pooled row (KeptWindows: one
    # row for a level's windows past the first 256, thousands of steps) weighs as the steps it holds, not as one window.
    by_level: dict[int | None, list[float]] = {}
    for w in windows:
        sums = by_level.setdefault(w.level_hz, [0.0, 0.0])
        steps = max(w.steps, 1)
        sums[0] += w.joules_per_step * steps
        sums[1] += steps
    if chosen_hz is None or chosen_hz not in by_level:
        return None, None
    chosen = by_level[chosen_hz][0] / by_level[chosen_hz][1]
    for basis, label in ((None, "default governor"), (start_hz, "start level")):
        if basis in by_level and (basis is not None or None in by_level):
            ref = by_level[basis][0] / by_level[basis][1]
            if ref > 0:
                return 1.0 - chosen / ref, label
    return None, None


def _connect(uri: str) -> sqlite3.Connection:
    # The daemon opens its store on the main thread, before READY=1, and hands it to the writer thread.
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


# The most a store may be opened to: read by its group (0640 root:ftgov), never by others or written by the group.
STORE_MODE_MAX = 0o640


def _private(path: Path) -> None:
    """Create the store 0600 before SQLite opens it (SQLite would create it 0644 under umask 022, and its -wal and
    -shm after it), and narrow an existing store and its -wal and -shm to at most STORE_MODE_MAX; on the opened
    descriptor (fchmod), never following a symlink."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise StoreError(f"cannot create the measurement store {path}: {e.strerror or e}") from e
    else:
        try:
            os.fchmod(fd, 0o600)  # the umask may have taken bits off, never added any: exactly 0600
        finally:
            os.close(fd)
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        try:
            fd = os.open(name, flags)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreError(f"cannot open the measurement store {name}: {e.strerror or e}") from e
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & ~STORE_MODE_MAX:
                os.fchmod(fd, mode & STORE_MODE_MAX)
        finally:
            os.close(fd)


def _check(conn: sqlite3.Connection) -> None:
    """Raise sqlite3.DatabaseError unless the file is a sound store of a schema this code reads."""
    row = conn.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"schema version {version} is newer than this ftgov's ({SCHEMA_VERSION})")


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring an older store to SCHEMA_VERSION, each step in its own transaction with its version (a crash between
    steps leaves a store of the older version, which the next open takes up from)."""
    while (version := conn.execute("PRAGMA user_version").fetchone()[0]) < SCHEMA_VERSION:
        try:
            conn.executescript(f"BEGIN IMMEDIATE;{_MIGRATIONS[version]}PRAGMA user_version={version + 1};COMMIT;")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


class Store:
    """A writable store. One connection, used from one thread (the daemon's writer thread, a test, a benchmark)."""

    def __init__(self, path: str | os.PathLike, max_jobs: int = DEFAULT_MAX_JOBS):
        if max_jobs < 1:
            raise StoreError(f"max_jobs must be >= 1, got {max_jobs}")
        self.path = Path(path)
        self.max_jobs = max_jobs
        self.conn = self._open()

    def _open(self) -> sqlite3.Connection:
        # SQLite opens the store and its -wal and -shm by path: in a directory another user may write to, they could
        # put their own database there (rows of uid 0, which `ftgov model retrain` trusts) or links for ours. The
        # directory is checked as root-run writers check theirs (the default, /var/lib/ftgov, is root's and 0700);
        # one made here is made 0700 whatever the umask (the store holds the job names status redacts).
        try:
            os.close(safefile.open_dir(self.path.parent, create=True, mode=0o700))
        except safefile.UnsafeDirectory as e:
            raise StoreError(f"measurement store {self.path}: {e}") from e
        except OSError as e:
            raise StoreError(f"cannot create or open {self.path.parent}: {e.strerror or e}") from e
        _private(self.path)
        try:
            return self._open_sound()
        except sqlite3.DatabaseError as e:
            # OperationalError is the file's circumstances, not its content (unable to open, locked past the busy
            # timeout, disk full, I/O error): say so and leave it alone. Only a file that is not a sound store
            # (not a database, corrupt, a newer schema) is moved aside.
            if isinstance(e, sqlite3.OperationalError):
                raise StoreError(f"cannot open the measurement store {self.path}: {e}") from e
            aside = self._move_aside()
            log.error("measurement store %s is unreadable (%s): moved aside to %s, starting a fresh one",
                      self.path, e, aside)
            try:
                _private(self.path)
                return self._open_sound()
            except sqlite3.Error as e2:
                raise StoreError(f"cannot start a fresh measurement store at {self.path}: {e2}") from e2

    def _open_sound(self) -> sqlite3.Connection:
        conn = _connect(f"file:{_quote_path(self.path)}?mode=rwc")
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # each job's commit reaches the disk before the next
            conn.execute("PRAGMA foreign_keys=ON")
            _check(conn)
            if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                # One transaction: a crash here leaves version 0 and no tables, and the next open starts again.
                try:
                    conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA + _SCHEDULER_TABLE
                                       + f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
                except sqlite3.Error:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            _migrate(conn)
            conn.execute("CREATE INDEX IF NOT EXISTS jobs_uid ON jobs (uid, id)")  # _PRUNE; older files get it too
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self) -> Path:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            try:
                os.replace(src, str(aside) + suffix)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"cannot move the unreadable store {src} aside: {e.strerror or e}") from e
        return aside

    def add(self, rec: JobRecord) -> int:
        """Add one job and its windows in one transaction, dropping the oldest jobs past max_jobs; its row id."""
        values = [getattr(rec, c) for c in JOB_COLUMNS]
        saved_j = rec.saved_j
        with _transaction(self.conn):
            job_id = self.conn.execute(_INSERT_JOB, values).lastrowid
            self.conn.executemany(_INSERT_WINDOW, [(job_id, i, w.level_hz, w.joules_per_step, w.seconds_per_step,
                                                    w.steps, w.gpu_util) for i, w in enumerate(rec.windows)])
            # The saving also goes to its basis's column (one of _SAVED_BY_BASIS's names, never client text).
            column = _SAVED_BY_BASIS.get(rec.saved_basis or "", "saved_unsplit_j")
            self.conn.execute(f"UPDATE totals SET jobs = jobs + 1, energy_j = energy_j + ?, saved_j = saved_j + ?, "
                              f"{column} = {column} + ?", (rec.energy_j or 0.0, saved_j or 0.0, saved_j or 0.0))
            count = self.conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
            while count > self.max_jobs:
                dropped = self.conn.execute(_PRUNE, (count - self.max_jobs,)).rowcount
                if dropped <= 0:
                    break
                count -= dropped
        return job_id

    def add_scheduler_job(self, rec: SchedulerJobRecord) -> int:
        """Add one scheduler job, dropping the oldest past max_jobs; its row id. Its energy is its registrations'
        too, so it is not added to the totals again."""
        with _transaction(self.conn):
            row = self.conn.execute(_INSERT_SCHEDULER_JOB, [getattr(rec, c) for c in SCHEDULER_COLUMNS]).lastrowid
            self.conn.execute("DELETE FROM scheduler_jobs WHERE id <= ?", (row - self.max_jobs,))
        return row

    def totals(self) -> dict:
        return _totals(self.conn)

    def close(self) -> None:
        self.conn.close()


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (the connection is in autocommit mode)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        if not self.conn.in_transaction:
            return False
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


def _quote_path(path: Path) -> str:
    from urllib.parse import quote

    return quote(str(path.resolve()))


TOTALS = ("jobs", "energy_j", "saved_j", "saved_default_j", "saved_start_j", "saved_unsplit_j")


def _totals(conn: sqlite3.Connection) -> dict:
    try:
        row = conn.execute(f"SELECT {', '.join(TOTALS)} FROM totals").fetchone()
    except sqlite3.OperationalError:  # an older store read as it is (the CLI does not migrate): all of it unsplit
        old = conn.execute("SELECT jobs, energy_j, saved_j FROM totals").fetchone()
        row = None if old is None else (*old, 0.0, 0.0, old[2])
    return dict(zip(TOTALS, row, strict=True)) if row else no_totals()


def no_totals() -> dict:
    """The totals of a store with no job."""
    return dict.fromkeys(TOTALS, 0.0) | {"jobs": 0}


# ---- reading (the CLI, retraining: never the daemon's loop) ----------------------------------------------------------

# What the readers below select from. Each must be a plain table: a store named on the command line (--store, --from,
# $FTGOV_SIM_TREE) may be a member's file, and a view or a computed column would run that file's SQL in root's reader.
_READ_TABLES = ("jobs", "windows", "totals", "scheduler_jobs")


def _plain_tables(conn: sqlite3.Connection, p: Path) -> None:
    """StoreError unless each of _READ_TABLES in the file is a table of stored columns (one that is missing is the
    reads' to report). A 36 KB file whose jobs was a view of an endless recursive query made `ftgov history` fill
    /var/tmp with the sort's temp file, as root."""
    marks = ", ".join("?" * len(_READ_TABLES))
    rows = conn.execute(f"SELECT name, type, sql FROM sqlite_master WHERE name IN ({marks})", _READ_TABLES).fetchall()
    for name, kind, sql in rows:
        if kind != "table" or (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise StoreError(f"{p}: {name} is a {'virtual table' if kind == 'table' else kind}, not a table: not a "
                             "store ftgovd wrote")
        # table_xinfo's hidden: 0 a column, 2 and 3 a generated one (computed from an expression of the file's).
        computed = [c["name"] for c in conn.execute(f"PRAGMA table_xinfo({name})") if c["hidden"] != 0]
        if computed:
            raise StoreError(f"{p}: {name}.{computed[0]} is a generated column: not a store ftgovd wrote")


def open_read_only(path: str | os.PathLike) -> sqlite3.Connection:
    """Open a store for reading; StoreError names the file when it is absent, unreadable or not a store (a view or a
    generated column where a table belongs: `_plain_tables`)."""
    p = Path(path)
    _readable(p)
    try:
        try:
            return _checked(_connect(f"file:{_quote_path(p)}?mode=ro"), p)
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise
            # A copy whose directory we cannot write (no -shm can be made): read it as an immutable file.
            return _checked(_connect(f"file:{_quote_path(p)}?mode=ro&immutable=1"), p)
    except sqlite3.Error as e:
        raise StoreError(f"cannot read the measurement store {p}: {e}") from e


def _readable(p: Path) -> None:
    """StoreMissing where no file is; StoreError where this user may not read it (the installed store is root's, in a
    directory of root's: a member's `ftgov history` got a traceback, or SQLite's "unable to open database file")."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        raise StoreMissing(f"no measurement store at {p}") from None
    except OSError as e:
        hint = " (the store is root's: run as root, or on a copy)" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise StoreError(f"cannot read the measurement store {p}: {e.strerror or e}{hint}") from e
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not regular:
        raise StoreMissing(f"no measurement store at {p}")


def _checked(conn: sqlite3.Connection, p: Path) -> sqlite3.Connection:
    """conn, once its file passes as a store this code reads; closed otherwise."""
    try:
        _plain_tables(conn, p)
        conn.execute("SELECT 1 FROM jobs LIMIT 1").fetchall()
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if not 1 <= version <= SCHEMA_VERSION:
            raise StoreError(f"{p}: schema version {version}, this ftgov reads 1 to {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn


def read_jobs(conn: sqlite3.Connection, since: float | None = None,
              skipped: list[BadRow] | None = None, windows: bool = True) -> list[JobRecord]:
    """Every job (ended at or after ``since``, Unix time), oldest first, with its windows (``windows`` False: none
    read, each job's windows empty). Each row is checked against what ftgovd writes (``_sound``): a job that fails
    raises BadRow, or with ``skipped`` given, is left out and its BadRow appended there, so that a reader shows the
    rest of a damaged store.

    A full store holds about 5 million windows (max_jobs jobs, up to about 270 windows each): only those of the jobs
    read are read, each made a Window as it comes (a Row apiece held until the end took 2.4 GB)."""
    after = float("-inf") if since is None else since
    try:
        rows = conn.execute("SELECT * FROM jobs WHERE ended_at >= ? ORDER BY id", (after,)).fetchall()
        kept: dict[int, list[Window]] = {}
        bad: dict[int, BadRow] = {}
        if windows and rows:
            for w in conn.execute("SELECT windows.* FROM windows JOIN jobs ON jobs.id = windows.job "
                                  "WHERE jobs.ended_at >= ? ORDER BY windows.job, windows.seq", (after,)):
                if w["job"] not in bad:
                    try:
                        kept.setdefault(w["job"], []).append(_window(w))
                    except BadRow as e:
                        bad[w["job"]] = e
                        kept.pop(w["job"], None)
    except sqlite3.Error as e:
        raise StoreError(f"cannot read jobs: {e}") from e
    out = []
    for r in rows:
        try:
            out.append(_job_record(r, kept.pop(r["id"], ()), bad.get(r["id"])))
        except BadRow as e:
            if skipped is None:
                raise
            skipped.append(e)
    return out


def _window(w: sqlite3.Row) -> Window:
    return Window(**_sound(Window, f"job {w['job']}, window {w['seq']!r}", {f.name: w[f.name] for f in fields(Window)}))


def _job_record(r: sqlite3.Row, windows: Iterable[Window], bad_window: BadRow | None = None) -> JobRecord:
    where = f"job {r['id']}"
    have = r.keys()  # an older schema's file lacks the newer columns
    values = _sound(JobRecord, where, {c: r[c] if c in have else None for c in JOB_COLUMNS})
    if not 0 <= values["ended_at"] <= _LAST_TIME:
        raise BadRow(f"{where}: ended_at {values['ended_at']:g} is no time (Unix seconds, 1970 to 9999)")
    _check_levels(where, values["levels_hz"])
    _check_features(where, values)
    if bad_window is not None:
        raise bad_window
    if values["policy"] == "observe":
        # Observe pins nothing, so its windows measure no saving; a daemon before 2026-12-07 stored 0.0% against the
        # default governor (its windows against themselves), which history showed and report averaged in.
        values.update(saved_rel=None, saved_basis=None, saved_pct_err=None)
    return JobRecord(**values, windows=tuple(windows))


_LAST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: the last a datetime (and `history`'s column) can show


def _sound(cls: type, where: str, values: dict) -> dict:
    """``values`` as ``cls``'s fields declare them (a REAL column's integer as a float, converged's 0/1 as a bool), or
    BadRow: SQLite keeps whatever a file was given in any column, a string in a REAL one included."""
    out = {}
    for name, value in values.items():
        kinds = _kinds(cls)[name]
        if value is None:
            if type(None) not in kinds:
                raise BadRow(f"{where}: {name} is empty")
            out[name] = None
            continue
        if float in kinds and isinstance(value, int | float) and math.isfinite(value):
            out[name] = float(value)
        elif bool in kinds and value in (0, 1) and isinstance(value, int):
            out[name] = bool(value)
        elif (int in kinds and isinstance(value, int)) or (str in kinds and isinstance(value, str)):
            out[name] = value
        else:
            want = " or ".join({float: "a finite number", int: "an integer", bool: "0 or 1", str: "text"}[k]
                               for k in kinds if k is not type(None))
            raise BadRow(f"{where}: {name} is {_shown(value)}, not {want}")
    return out


@functools.cache
def _kinds(cls: type) -> dict[str, tuple[type, ...]]:
    """Each field's types: float | None as (float, NoneType)."""
    return {name: typing.get_args(hint) or (hint,) for name, hint in typing.get_type_hints(cls).items()}


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_levels(where: str, levels_hz: str | None) -> None:
    if levels_hz is None:
        return
    try:
        levels = json.loads(levels_hz)
    except ValueError:
        levels = None
    if not (isinstance(levels, list)
            and all(isinstance(hz, int) and not isinstance(hz, bool) and hz > 0 for hz in levels)):
        raise BadRow(f"{where}: levels_hz is {_shown(levels_hz)}, not a JSON list of frequencies in Hz")


def _check_features(where: str, values: dict) -> None:
    from pydantic import ValidationError

    from governor.features import Features

    try:
        Features(**{name: values[name] for name in Features.model_fields})
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        raise BadRow(f"{where}: {name} is {_shown(values.get(name))}: {first['msg'].lower()}") from None


def read_scheduler_jobs(conn: sqlite3.Connection) -> list[SchedulerJobRecord]:
    """Every scheduler job in the store, oldest first (none in a store older than schema 3); BadRow as read_jobs."""
    try:
        rows = conn.execute(f"SELECT id, {', '.join(SCHEDULER_COLUMNS)} FROM scheduler_jobs ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # a version-2 store read as it is (the CLI does not migrate)
        return []
    return [SchedulerJobRecord(**_sound(SchedulerJobRecord, f"scheduler job {row['id']}",
                                        {c: row[c] for c in SCHEDULER_COLUMNS})) for row in rows]


def read_totals(conn: sqlite3.Connection) -> dict:
    try:
        totals = _totals(conn)
    except sqlite3.Error as e:
        raise StoreError(f"cannot read totals: {e}") from e
    return _sound(_Totals, "the totals", totals)


@dataclass(frozen=True)
class _Totals:
    """The totals row's kinds, for _sound."""

    jobs: int
    energy_j: float
    saved_j: float
    saved_default_j: float
    saved_start_j: float
    saved_unsplit_j: float


def record_dict(rec: JobRecord) -> dict:
    """JSON-ready."""
    d = asdict(rec)
    d["saved_j"] = rec.saved_j
    return d
