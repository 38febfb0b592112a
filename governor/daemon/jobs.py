"""What the controller keeps of a job: the job it holds, and its end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from governor.backends.rails import EnergyMeter
from governor.errors import BackendError, FtgovError
from governor.features import Features
from governor.policy import Decision, PolicyName
from governor.store.state import HeldJob

if TYPE_CHECKING:
    from governor.daemon.tuning import JobTuner


# How old a counter read the state file's energy figures may take (a re-adopting daemon continues from them): the
# tuners' and observers' reads keep it fresh; a job that has none is read once in this long.
STATE_ENERGY_AGE_S = 10.0


@dataclass(frozen=True)
class GroupTag:
    """A job's place in a job group, as it registered: the key (TORCHELASTIC_RUN_ID, a Slurm step, or given), its rank
    and the group's world size (None where the client did not say)."""

    key: str
    rank: int | None = None
    world_size: int | None = None


class OverLimit(FtgovError):
    """A registration over one of the limits (limits.max_jobs, max_jobs_per_uid, max_ranks_per_uid,
    max_jobs_per_connection)."""


class Refused(FtgovError):
    """A registration the daemon does not take as asked; ``field``: the request's field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Registration:
    """A register request as the floors below the RPC layer see it: holds (governor.daemon.holds) takes its process,
    the controller (governor.daemon.controller) its GPU, limits, joins and decision."""

    uid: int  # the caller's
    pid: int | None  # the process the job is held by; None: the one that connected
    features: Features
    name: str | None = None
    gpu: str | int | None = None  # index or UUID; None: the only GPU
    tune: bool = False
    total_steps: int | None = None
    slurm_job_id: int | None = None  # joins that batch job's hold (governor.daemon.scheduler)
    group: GroupTag | None = None  # joins that job group (governor.daemon.groups)


@dataclass
class ActiveJob:
    """A job the daemon holds (the client's handle on it is governor.client.Job)."""

    job_id: int
    pid: int
    start_ticks: int  # the process's start time (clock ticks since boot, /proc/PID/stat), against PID reuse
    uid: int
    name: str | None
    gpu_id: str
    features: Features
    policy: PolicyName | None = None  # per-job policy request (tune), else the daemon's
    # Where the daemon measured features.gpu_util under a pin (its Hz), the job's load at that clock; None where the
    # client gave it or it was measured at the default governor: the feature's meaning (the tree's, the store's).
    gpu_util_at_hz: int | None = None
    decision: Decision | None = None
    started_s: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)  # the same moment on the wall clock, for the state file
    earlier_energy_j: float = 0.0  # measured by the daemon before a restart (a re-adopted job); the meter adds to it
    steps: int = 0
    step_end_s: float | None = None  # when step number ``steps`` ended (CLOCK_MONOTONIC), if the client says
    phase: str | None = None  # the phase the daemon acts on (governor.daemon.phases: a short stretch is training)
    phase_said: str | None = None  # the phase the job reported last (status)
    meter: EnergyMeter | None = None
    adopted: bool = False
    tuner: JobTuner | None = None  # when the tune policy drives this job
    total_steps: int | None = None  # the step count the job ends at, when its client knows it (register, progress)
    tune_start_hz: int | None = None  # where the tuner starts (governor.daemon.tuning.TunerAttach.plan)
    # What the job registered with (governor.daemon.groups owns the membership it implies): the group key, its rank
    # and the world size; kept here so that the state file keeps them with the job.
    group: GroupTag | None = None
    # A group's rank, whose group (not the job) has the tuner: what a restart would keep for it (Groups.kept_hz).
    group_kept_hz: Callable[[], int | None] | None = None

    @property
    def freq_hz(self) -> int | None:
        return self.decision.freq_hz if self.decision else None

    def fields(self) -> dict:
        """Structured fields for journald (JOB_ID=3 finds a job's whole story)."""
        out = {"JOB_ID": self.job_id, "JOB_PID": self.pid, "JOB_NAME": self.name or ""}
        if self.decision:
            out["POLICY"] = self.decision.label
            out["FREQ_HZ"] = self.decision.freq_hz if self.decision.freq_hz is not None else ""
        return out

    def label(self) -> str:
        return f"job {self.job_id}" + (f" {self.name!r}" if self.name else "") + f" (pid {self.pid})"

    def energy_so_far_j(self, max_age_s: float | None = None) -> float | None:
        """The energy measured for this job up to the meter's last sample, across daemon restarts (None: no meter);
        a counter's read now, or as of a read at most ``max_age_s`` old."""
        if self.meter is None:
            return None
        try:
            so_far_j = self.meter.energy_j if max_age_s is None else self.meter.recent_j(max_age_s)
            return self.earlier_energy_j + so_far_j
        except BackendError:  # an energy counter that cannot be read now: the state file keeps what it had
            return self.earlier_energy_j or None

    @property
    def kept_hz(self) -> int | None:
        """The level a restarted daemon re-adopts this job at (its state file's record): its level, or, while its
        tuner runs, what that tuner would keep were it stopped now (JobTuner.keep_hz: the best measured so far, the
        pick): a restart loses the search, and the level a window was measuring (perhaps the curve's costliest) or a
        baseline part's unpinned steps would otherwise be held until the job ends."""
        keep = self.tuner.keep_hz if self.tuner is not None else None
        if keep is None and self.group_kept_hz is not None:
            keep = self.group_kept_hz()
        return self.freq_hz if keep is None else keep

    def record(self) -> HeldJob:
        tag = self.group
        return HeldJob(job_id=self.job_id, pid=self.pid, start_ticks=self.start_ticks, gpu=self.gpu_id, name=self.name,
                       uid=self.uid, features=self.features.model_dump(), freq_hz=self.kept_hz,
                       policy=self.decision.label if self.decision else "", started_at=self.started_at,
                       energy_j=self.energy_so_far_j(STATE_ENERGY_AGE_S), group=tag.key if tag else None,
                       rank=tag.rank if tag else None, world_size=tag.world_size if tag else None,
                       gpu_util_at_hz=self.gpu_util_at_hz)

    def resume(self, rec: HeldJob) -> None:
        """Continue a job a previous daemon of this boot held: its start time and the energy it measured until its
        last save (what ran between that save and the restart is not measured)."""
        if rec.started_at is not None:
            ran_s = max(0.0, time.time() - rec.started_at)
            self.started_s, self.started_at = time.monotonic() - ran_s, rec.started_at
        if rec.energy_j is not None:
            self.earlier_energy_j = rec.energy_j
        if rec.group is not None:
            self.group = GroupTag(rec.group, rec.rank, rec.world_size)
        self.gpu_util_at_hz = rec.gpu_util_at_hz


class Registered(NamedTuple):
    """A registration's outcome: the job; whether its decision waits for its gpu_util (held unpinned meanwhile); what
    else the reply says (its Slurm job's hold, its group)."""

    job: ActiveJob
    measuring: bool
    extra: dict


@dataclass(frozen=True)
class Ended:
    job: ActiveJob
    duration_s: float
    energy_j: float | None
    why: str
    saving: dict | None = None  # measured against the default governor (governor.daemon.tuning.JobTuner.finish)
    unmeasured: str | None = None  # a tuned job without a saving: why (JobTuner.unmeasured_why)
