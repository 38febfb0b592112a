"""The daemon's side of the measurement store (governor.store.measurements).

The Recorder turns each job the controller ends into a record, on the event loop, copying fields only (the
board's identity is read once at start; the tuner's windows come from the job's tuner, which keeps each closed
window); the StoreWriter commits records on a thread of its own.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from governor.errors import FtgovError
from governor.policy.tree import tree_version
from governor.store.measurements import (
    DEFAULT_MAX_JOBS,
    JobRecord,
    SchedulerJobRecord,
    Store,
    StoreError,
    Window,
    measured_saving,
    no_totals,
)
from governor.sysfs import Root

if TYPE_CHECKING:
    from governor.backends.base import Gpu
    from governor.policy import Policy

log = logging.getLogger("ftgovd")


def board_identity(root: Root, gpu, simulated: bool = False) -> dict:
    """Board model and L4T release (Jetson: /proc/device-tree/model, /etc/nv_tegra_release), GPU name and driver.
    ``simulated``: the board model is marked "(simulated)". The simulated tree names the board it imitates, and a
    store's jobs are told apart by board: unmarked, `ftgov model retrain --from` merged them with that board's."""
    desc = gpu.describe()
    model = _first_line(root, "/proc/device-tree/model")
    if simulated:
        model = f"{model or 'unknown board'} (simulated)"
    return {"levels_hz": json.dumps(list(gpu.levels_hz)), "board_model": model,
            "l4t_release": _first_line(root, "/etc/nv_tegra_release"),
            "backend": desc.get("backend"), "gpu_name": desc.get("name"), "driver": gpu.driver_version()}


def window_util_pct(gov, job) -> float | None:
    """The GPU's load as a window closes, for the store: one reading at that moment, not an average over the window
    (the load file is itself the driver's recent average on a Jetson; unverified over how long). Without a load
    file, the job's utilization feature."""
    try:
        load = gov.gpus[job.gpu_id].gpu.read().load_pct
    except FtgovError:
        load = None
    return load if load is not None else job.features.gpu_util


def _first_line(root: Root, path: str) -> str | None:
    try:
        text = root.path(path).read_bytes()[:4096].replace(b"\0", b"\n").decode(errors="replace")
    except OSError:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line or None


class Recorder:
    def __init__(self, writer: StoreWriter, root: Root, boot_id: str | None, simulated: bool = False):
        self.writer = writer
        self.root = root
        self.simulated = simulated
        self._identity: dict[str, dict] = {}  # per GPU id, read at its first job's end: a GPU found late has one too
        self.boot_id = boot_id

    def identity(self, gpu: Gpu) -> dict:
        if gpu.id not in self._identity:
            self._identity[gpu.id] = board_identity(self.root, gpu, self.simulated)
        return self._identity[gpu.id]

    def job_ended(self, ended, gpu: Gpu, policy: Policy) -> None:
        """Called by the controller for every job that ends, with the job's GPU and the policy in force; never
        raises (a record is not worth a job's pin)."""
        try:
            rec = self.record(ended, gpu, policy)
        except Exception:
            log.exception("measurement store: could not build the record of job %s", ended.job.job_id)
            return
        if rec is not None:
            self.writer.submit(rec)

    def scheduler_job_ended(self, rec: SchedulerJobRecord) -> None:
        """A scheduler's job released (governor.daemon.scheduler): its record, written as a job's is."""
        self.writer.submit(rec)

    def record(self, ended, gpu: Gpu, policy: Policy) -> JobRecord | None:
        job = ended.job
        if job.decision is None:
            return None  # refused before a decision: nothing ran under us
        f = job.features
        windows: tuple[Window, ...] = ()
        start_hz = converged = None
        tuner = job.tuner
        if tuner is not None:
            windows = tuple(Window(m.level_hz, m.joules_per_step, m.seconds_per_step, m.measured_steps, util)
                            for m, util in getattr(tuner, "windows", ()))
            if getattr(tuner, "tuner", None) is not None:
                start_hz, converged = tuner.tuner.start_hz, tuner.tuner.converged
        saved_rel, basis = measured_saving(windows, job.freq_hz, start_hz)
        saved_pct_err = None
        if ended.saving is not None:  # against the baseline window, the converged level measured over the job's rest
            saved_rel, basis = ended.saving["saved_rel"], ended.saving["basis"]
            saved_pct_err = ended.saving.get("saved_pct_err")
        tree = getattr(policy, "tree", None)
        return JobRecord(
            ended_at=time.time(), duration_s=ended.duration_s, boot_id=self.boot_id, daemon_job_id=job.job_id,
            uid=job.uid, name=job.name, model_type=f.model_type, num_layers=f.num_layers,
            hidden_size=f.hidden_size, seq_len=f.seq_len, gpu_util=f.gpu_util, gpu_util_at_hz=job.gpu_util_at_hz,
            **self.identity(gpu), model_version=tree_version(tree),
            model_source=getattr(tree, "source", None), policy=job.decision.label, freq_hz=job.freq_hz,
            reason=job.decision.reason, steps=job.steps, energy_j=ended.energy_j, start_hz=start_hz,
            converged=converged, saved_rel=saved_rel, saved_basis=basis, saved_pct_err=saved_pct_err,
            ended=ended.why, windows=windows)

    def status(self) -> dict:
        return self.writer.status()

    def close(self) -> None:
        self.writer.close()


_STOP = object()


class StoreWriter:
    """Owns a Store on a thread of its own: ``submit`` only puts the record on a queue, so the event loop never waits
    on a commit. The store is opened (and checked, and a corrupt file moved aside) in the constructor, at start-up
    before READY=1, so that status has the totals from the first request. A store that cannot be opened at all is
    logged once and the records are dropped: governing goes on."""

    def __init__(self, path: str | os.PathLike, max_jobs: int = DEFAULT_MAX_JOBS):
        self.path = Path(path)
        self.max_jobs = max_jobs
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._totals = no_totals()
        self.error: str | None = None
        self._store = self._open()
        self._thread = threading.Thread(target=self._run, name="ftgov-store", daemon=True)
        self._thread.start()

    def submit(self, rec: JobRecord | SchedulerJobRecord) -> None:
        self._queue.put(rec)

    def status(self) -> dict:
        """For the daemon's status (and Prometheus): the cumulative totals of committed jobs."""
        with self._lock:
            return {"path": str(self.path), **self._totals, "error": self.error, "pending": self._queue.qsize()}

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop (the daemon's shutdown: the jobs it just ended are recorded)."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("measurement store: still writing after %g s at shutdown; the last jobs may be lost", timeout_s)

    def join_queue(self) -> None:
        """Wait until everything submitted so far is committed (tests, benchmarks)."""
        self._queue.join()

    def _open(self) -> Store | None:
        try:
            store = Store(self.path, self.max_jobs)
            self._totals = store.totals()
        except (StoreError, sqlite3.Error) as e:
            self.error = str(e)
            log.error("measurement store disabled: %s", e)
            return None
        log.info("measurement store %s: %d job(s) so far", self.path, self._totals["jobs"])
        return store

    def _run(self) -> None:
        store = self._store
        while True:
            rec = self._queue.get()
            try:
                if rec is _STOP:
                    break
                if store is not None:
                    self._write(store, rec)
            finally:
                self._queue.task_done()
        if store is not None:
            store.close()

    def _write(self, store: Store, rec: JobRecord | SchedulerJobRecord) -> None:
        try:
            if isinstance(rec, SchedulerJobRecord):
                store.add_scheduler_job(rec)
            else:
                store.add(rec)
            totals = store.totals()
        except sqlite3.Error as e:
            what = (f"{rec.scheduler} job {rec.sched_job_id}" if isinstance(rec, SchedulerJobRecord)
                    else f"job {rec.daemon_job_id}")
            log.error("measurement store: could not record %s: %s", what, e)
            with self._lock:
                self.error = str(e)
            return
        with self._lock:
            self._totals, self.error = totals, None
