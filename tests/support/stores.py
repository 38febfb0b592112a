"""Stores as older versions of ftgovd wrote them, built from today's schema with what each later version added taken
out: the migrations are tested on the files users have."""

import sqlite3
from pathlib import Path

from governor.store import measurements as store

# The totals row before schema 4 kept the measured saving's two bases apart.
_TOTALS_BEFORE_4 = """CREATE TABLE totals (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    jobs INTEGER NOT NULL, energy_j REAL NOT NULL, saved_j REAL NOT NULL
);
INSERT INTO totals VALUES (1, 0, 0.0, 0.0);
"""


def _without_gpu_util_at_hz(sql: str) -> str:
    """The jobs table before schema 5 noted where gpu_util was measured: the column and its comment's lines gone."""
    lines = sql.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("gpu_util_at_hz "))
    end = start + 1
    while lines[end].lstrip().startswith("--"):
        end += 1
    return "".join(lines[:start] + lines[end:])


def schema(version: int) -> str:
    """The SQL that creates an empty store of ``version`` (1 to the current one)."""
    if version >= store.SCHEMA_VERSION:
        return store._SCHEMA + store._SCHEDULER_TABLE
    sql = _without_gpu_util_at_hz(store._SCHEMA)
    if version < 4:
        sql = sql[:sql.index("CREATE TABLE totals")] + _TOTALS_BEFORE_4
    if version < 2:
        without = sql.replace("    saved_pct_err REAL,", "")
        assert without != sql
        sql = without
    return sql + (store._SCHEDULER_TABLE if version >= 3 else "")


def old_store(path: Path, version: int) -> sqlite3.Connection:
    """An empty store of ``version`` at ``path``, and a plain connection to it (the caller closes it)."""
    raw = sqlite3.connect(path)
    raw.executescript(schema(version) + f"PRAGMA user_version={version};")
    return raw
