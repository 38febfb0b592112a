"""The daemon's status report (the status method; `ftgov status` and the metrics exporter format it)."""

from __future__ import annotations

import time

from governor.daemon.pins import PinController
from governor.errors import BackendError


def status(pins: PinController) -> dict:
    """What the status method answers: the policy, each GPU's reading and pin, each job, the board's power."""
    gpus = []
    for gid, ctl in pins.gpus.items():
        try:
            reading = ctl.gpu.read().to_dict()
        except BackendError as e:
            reading = {"error": str(e)}
        gpus.append({"id": gid, **ctl.gpu.describe(), "available_hz": list(ctl.gpu.levels_hz), **reading,
                     "pinned_hz": ctl.pinned_hz, "stood_down": ctl.stood_down, "throttled_hz": ctl.throttled_hz,
                     "baseline_min_hz": ctl.baseline.min_hz if ctl.baseline else None,
                     "baseline_max_hz": ctl.baseline.max_hz if ctl.baseline else None})
    power = None
    if pins.rails is not None:
        try:
            power = pins.rails.read_mw()
        except BackendError:
            power = None
    now = time.monotonic()
    jobs = []
    for j in pins.jobs.values():
        energy = j.energy_so_far_j()
        jobs.append({"job_id": j.job_id, "name": j.name, "pid": j.pid, "uid": j.uid, "gpu": j.gpu_id,
                     "policy": j.decision.label if j.decision else None, "freq_hz": j.freq_hz,
                     "reason": j.decision.reason if j.decision else None, "features": j.features.model_dump(),
                     "duration_s": round(now - j.started_s, 3), "steps": j.steps, "total_steps": j.total_steps,
                     "phase": j.phase,
                     "energy_j": energy, "adopted": j.adopted,
                     "tuner": j.tuner.describe() if j.tuner is not None else None,
                     "saving": j.tuner.saving() if j.tuner is not None else None})
    return {"policy": pins.policy.name.value, "jobs": jobs, "gpus": gpus, "gpu_missing": pins.missing_why,
            "power_mw": power,
            "energy_rails": pins.rails.energy_rails if pins.rails else [], "energy_source": pins.energy.source(),
            "store": pins.recorder.status() if pins.recorder is not None else None,
            "holds": pins.scheduler.describe() if pins.scheduler is not None else []}
