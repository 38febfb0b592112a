"""The daemon's status report (the status method; `ftgov status` and the metrics exporter format it)."""

from __future__ import annotations

import time

from governor.daemon.controller import Controller
from governor.errors import BackendError


def status(ctl: Controller) -> dict:
    """What the status method answers: the policy, each GPU's reading and pin, each job, the board's power."""
    gpus = []
    for gid, pin in ctl.gpus.items():
        try:
            reading = pin.gpu.read().to_dict()
        except BackendError as e:
            reading = {"error": str(e)}
        reads = ctl.energy.counter_reads(gid)
        if reads is not None:  # what the energy counter's reads have cost the daemon, all told (wall s)
            reading |= {"energy_counter_reads": reads.reads, "energy_counter_read_s": round(reads.read_s, 6)}
        gpus.append({"id": gid, **pin.gpu.describe(), "available_hz": list(pin.gpu.levels_hz), **reading,
                     "pinned_hz": pin.pinned_hz, "stood_down": pin.stood_down, "throttled_hz": pin.throttled_hz,
                     "cannot_pin": pin.cannot_pin, "cannot_cap": pin.cannot_cap,
                     "write_error": pin.write_error if pin.restore_failed else None,
                     "read_error": pin.read_error,
                     "baseline_min_hz": pin.baseline.min_hz if pin.baseline else None,
                     "baseline_max_hz": pin.baseline.max_hz if pin.baseline else None})
    power = None
    if ctl.rails is not None:
        try:
            power = ctl.rails.read_mw()
        except BackendError:
            power = None
    now = time.monotonic()
    jobs = []
    for j in ctl.jobs.values():
        energy = j.energy_so_far_j()
        jobs.append({"job_id": j.job_id, "name": j.name, "pid": j.pid, "uid": j.uid, "gpu": j.gpu_id,
                     "policy": j.decision.label if j.decision else None, "freq_hz": j.freq_hz,
                     "reason": j.decision.reason if j.decision else None, "features": j.features.model_dump(),
                     "duration_s": round(now - j.started_s, 3), "steps": j.steps, "total_steps": j.total_steps,
                     "phase": j.phase_said or j.phase,
                     "energy_j": energy, "adopted": j.adopted,
                     "tuner": j.tuner.describe() if j.tuner is not None else None,
                     "saving": j.tuner.saving() if j.tuner is not None else None})
    return {"policy": ctl.policy.name.value, "jobs": jobs, "gpus": gpus, "gpu_missing": ctl.missing_why,
            "power_mw": power,
            "energy_rails": ctl.rails.energy_rails if ctl.rails else [], "energy_source": ctl.energy.source(),
            "store": ctl.recorder.status() if ctl.recorder is not None else None,
            "holds": ctl.scheduler.describe() if ctl.scheduler is not None else []}
