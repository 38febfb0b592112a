"""Turns each job the pin controller ends into a measurement-store record, and hands it to the store's writer thread.

Runs on the event loop, so it only copies fields out of the job (no I/O): the identity of the board is read once at
start. The tuner's windows come from the job's tuner (governor.daemon.tuning keeps each closed window).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Optional

from governor.daemon.store import JobRecord, StoreWriter, Window, measured_saving, tree_version
from governor.sysfs import Root

log = logging.getLogger("ftgovd")


def board_identity(root: Root, gpu) -> dict:
    """Board model and L4T release (Jetson: /proc/device-tree/model, /etc/nv_tegra_release), GPU name and driver."""
    desc = gpu.describe()
    return {"levels_hz": json.dumps(list(gpu.levels_hz)),"board_model": _first_line(root, "/proc/device-tree/model"),
            "l4t_release": _first_line(root, "/etc/nv_tegra_release"),
            "backend": desc.get("backend"), "gpu_name": desc.get("name"),
            # NVML reports its driver; devfreq has none beyond the L4T release (unverified on a real board).
            "driver": getattr(gpu, "driver_version", None)}


def _first_line(root: Root, path: str) -> Optional[str]:
    try:
        text = root.path(path).read_bytes()[:4096].replace(b"\0", b"\n").decode(errors="replace")
    except OSError:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line or None


class Recorder:
    def __init__(self, writer: StoreWriter, gov, identity: dict[str, dict], boot_id: Optional[str]):
        self.writer = writer
        self.gov = gov
        self.identity = identity  # per GPU id
        self.boot_id = boot_id

    def job_ended(self, ended) -> None:
        """Called by the pin controller for every job that ends; never raises (a record is not worth a job's pin)."""
        try:
            rec = self.record(ended)
        except Exception:
            log.exception("measurement store: could not build the record of job %s", ended.job.job_id)
            return
        if rec is not None:
            self.writer.submit(rec)

    def record(self, ended) -> Optional[JobRecord]:
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
            start_hz, converged = tuner.tuner.start_hz, tuner.tuner.converged
        saved_rel, basis = measured_saving(windows, job.freq_hz, start_hz)
        tree = getattr(self.gov.policy, "tree", None)
        return JobRecord(
            ended_at=time.time(), duration_s=ended.duration_s, boot_id=self.boot_id, daemon_job_id=job.job_id,
            uid=job.uid, name=job.name, model_type=f.model_type, num_layers=f.num_layers,
            hidden_size=f.hidden_size, seq_len=f.seq_len, gpu_util=f.gpu_util,
            **self.identity.get(job.gpu_id, {}), model_version=tree_version(tree),
            model_source=getattr(tree, "source", None), policy=job.decision.policy, freq_hz=job.freq_hz,
            reason=job.decision.reason, steps=job.steps, energy_j=ended.energy_j, start_hz=start_hz,
            converged=converged, saved_rel=saved_rel, saved_basis=basis, ended=ended.why, windows=windows)

    def status(self) -> dict:
        return self.writer.status()

    def close(self) -> None:
        self.writer.close()
