"""What a caller may see of other users' jobs: least disclosure in `status`.

A job's name (by default the model's local path), pid and features say what a user works on; its frequency and GPU
say only what the GPU does, which every member sees anyway. Root and the daemon's own uid see everything; everyone
else sees their own jobs and Slurm holds in full, others' jobs with only the fields in OTHERS_SEE and others' holds
with only those in OTHERS_SEE_OF_HOLDS.
"""

from __future__ import annotations

import os

OTHERS_SEE = ("job_id", "gpu", "policy", "freq_hz", "phase", "duration_s", "adopted")
# Of another user's Slurm hold: what its GPUs do. Its uid and the daemon jobs that joined it would tell whose the
# redacted jobs are; its Slurm job id and partition, whose batch job it is.
OTHERS_SEE_OF_HOLDS = ("policy", "gpus", "duration_s")


def sees_all(uid: int) -> bool:
    return uid in (0, os.geteuid())


def status_for(status: dict, uid: int) -> dict:
    """The status as uid may see it (a new dict; the daemon's own is untouched)."""
    if sees_all(uid):
        return status
    jobs = [j if j.get("uid") == uid else {**{k: j.get(k) for k in OTHERS_SEE}, "redacted": True}
            for j in status.get("jobs") or []]
    holds = [h if h.get("uid") == uid else {**{k: h.get(k) for k in OTHERS_SEE_OF_HOLDS}, "redacted": True}
             for h in status.get("holds") or []]
    return {**status, "jobs": jobs, "holds": holds}
