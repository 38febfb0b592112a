"""Where a tuned job starts on a GPU the Orin tree was not trained for (NVML): the level the last tuned job of the same
shape converged on, on the same kind of GPU.

The tree's leaves are Orin clocks; on another GPU's table they mean nothing. So on such a GPU the start is:

1. the converged level of the most recent tuned job with the same model_type, num_layers and hidden_size and a
   seq_len within SEQ_LEN_TOLERANCE, on a GPU of the same name and table, of the same user, else of root (a member's
   jobs never decide where another user's start: a client reports its own step counts);
2. else the top of the table (the highest level the power mode allows): what the default governor runs a busy GPU at.

gpu_util is not matched (on these GPUs it varies from run to run). The index is loaded from the store once before the
daemon serves, and every tuned job that converges on such a GPU is added when it ends; lookups never touch the file.
Bounded per uid: the MAX_SHAPES_PER_UID shapes used most recently, each with its KEPT_PER_SHAPE most recent levels; a
member's new shapes evict its own oldest, never another user's (about 100 KB per user at most).
"""
from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections import OrderedDict
from pathlib import Path

from governor.features import Features
from governor.store.measurements import StoreError, open_read_only

log = logging.getLogger("ftgovd")

# Two jobs of one model whose average sequence lengths differ by at most this (relative) are taken for one workload:
# padding-free lengths of one data set measured over a few batches differ by a few percent from run to run.
SEQ_LEN_TOLERANCE = 0.10
KEPT_PER_SHAPE = 16  # the most recent converged levels kept per model shape and GPU kind
MAX_SHAPES_PER_UID = 64  # shapes kept per user, least recently used dropped first


def gpu_key(gpu) -> tuple[str, tuple[int, ...]]:
    """The kind of GPU a converged level is valid for: its name and its table of levels."""
    return str(gpu.describe().get("name")), tuple(gpu.levels_hz)


def read_on(gpu) -> bool:
    """Whether a tuned job's start on this GPU comes from this index: not on a devfreq board, where the tree (trained
    on that board) picks it."""
    return gpu.describe().get("backend") != "devfreq"


class TuneStarts:
    def __init__(self):
        # uid -> (gpu name, levels, model_type, num_layers, hidden_size) -> [(seq_len, freq_hz)], most recent last;
        # shapes in the order of their last use, the least recent first
        self._levels: dict[int, OrderedDict[tuple, list[tuple[float, int]]]] = {}

    def __len__(self) -> int:
        return sum(len(v) for shapes in self._levels.values() for v in shapes.values())

    @classmethod
    def load(cls, path: str | Path | None) -> TuneStarts:
        """The converged levels of the tuned jobs in the store at ``path``; empty when there is none or it cannot be
        read (logged: a start from the top of the table is always safe)."""
        starts = cls()
        if path is None or not Path(path).is_file():
            return starts
        try:
            conn = open_read_only(path)
        except StoreError as e:
            log.warning("tuner starts: cannot read the measurement store: %s; tuned jobs on NVML GPUs start at the top "
                        "of the table", e)
            return starts
        try:
            rows = conn.execute("SELECT gpu_name, levels_hz, model_type, num_layers, hidden_size, seq_len, freq_hz, "
                                "uid FROM jobs WHERE policy = 'tune' AND converged = 1 AND backend != 'devfreq' "
                                "AND freq_hz IS NOT NULL ORDER BY id").fetchall()
        except sqlite3.Error as e:
            log.warning("tuner starts: cannot read the measurement store %s: %s", path, e)
            return starts
        finally:
            conn.close()
        for r in rows:
            if r["uid"] is None:
                continue  # whose it was is unknown: it starts nobody's job
            try:
                levels = tuple(int(hz) for hz in json.loads(r["levels_hz"] or "[]"))
                uid, seq_len, freq_hz = int(r["uid"]), float(r["seq_len"]), int(r["freq_hz"])
            except (ValueError, TypeError, OverflowError):
                continue  # a damaged row (SQLite keeps text in a number's column): not worth the daemon's start
            starts._add(uid, (str(r["gpu_name"]), levels, r["model_type"], r["num_layers"], r["hidden_size"]),
                        seq_len, freq_hz)
        # Jetsons' tuned jobs (devfreq) are left out: their start is the tree's prediction, not a store's level.
        if starts:  # a Jetson's store has none to tell (its tuned jobs start at the tree's level)
            log.info("tuner starts: %d converged level(s) of NVML GPUs' tuned jobs from %s", len(starts), path)
        return starts

    def learn(self, key: tuple[str, tuple[int, ...]], features: Features, freq_hz: int, uid: int) -> None:
        """A tuned job of ``uid`` converged on ``freq_hz`` on a GPU of kind ``key`` (gpu_key)."""
        self._add(uid, (*key, features.model_type, features.num_layers, features.hidden_size), features.seq_len,
                  freq_hz)

    def lookup(self, key: tuple[str, tuple[int, ...]], features: Features, uid: int) -> int | None:
        """The most recent converged level for these features on this kind of GPU among uid's jobs, else root's;
        None when neither has one."""
        limit = math.log1p(SEQ_LEN_TOLERANCE)
        shape = (*key, features.model_type, features.num_layers, features.hidden_size)
        for owner in dict.fromkeys((uid, 0)):
            shapes = self._levels.get(owner)
            if shapes is None:
                continue
            seen = shapes.get(shape, [])
            hz = next((hz for seq_len, hz in reversed(seen)
                       if seq_len > 0 and abs(math.log(seq_len / features.seq_len)) <= limit), None)
            if hz is not None:
                shapes.move_to_end(shape)
                return hz
        return None

    def _add(self, uid: int, shape: tuple, seq_len: float, freq_hz: int) -> None:
        if freq_hz not in shape[1]:
            return
        shapes = self._levels.setdefault(uid, OrderedDict())
        seen = shapes.setdefault(shape, [])
        shapes.move_to_end(shape)
        seen.append((seq_len, freq_hz))
        del seen[:-KEPT_PER_SHAPE]
        while len(shapes) > MAX_SHAPES_PER_UID:
            shapes.popitem(last=False)
