"""The jobs the daemon holds, by id: admission under limits.max_jobs, the ids that name one job for a whole boot, and
the pin each GPU's jobs imply (``policy.combine``, the one rule for several jobs on one GPU).

A read-only mapping for everyone else (status, the tick, the sampler); only the controller (governor.daemon.controller)
admits and removes jobs.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView

from governor.daemon.jobs import ActiveJob, GroupTag, OverLimit
from governor.features import Features
from governor.policy import PolicyName, combine
from governor.store.state import HeldJob


class TableFull(OverLimit):
    """The daemon holds limits.max_jobs jobs already, or the uid limits.max_jobs_per_uid or max_ranks_per_uid."""


def needs_hz(job: ActiveJob, low_phases: frozenset[str], lowest_hz: int) -> int | None:
    """What one job needs now: its pick, or the GPU's lowest level (``lowest_hz``) while it is in one of
    ``low_phases`` (checkpoint, data: the GPU mostly idles then; a job that reports no phases always needs its pick)."""
    hz = job.decision.freq_hz if job.decision is not None else None
    if hz is not None and job.phase is not None and job.phase in low_phases:
        return lowest_hz
    return hz


class JobTable(Mapping[int, ActiveJob]):
    """job id -> ActiveJob. ``next_job_id`` continues across restarts (adopt), so that journalctl JOB_ID=3 finds one
    job's story for the whole boot."""

    def __init__(self) -> None:
        self._jobs: dict[int, ActiveJob] = {}
        self.next_job_id = 1

    def __getitem__(self, job_id: int) -> ActiveJob:
        return self._jobs[job_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    # The dict's own views and lookups: Mapping's would run Python code per job on every pass over the table.
    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def get(self, job_id: int, default=None):
        return self._jobs.get(job_id, default)

    def values(self) -> ValuesView[ActiveJob]:
        return self._jobs.values()

    def items(self) -> ItemsView[int, ActiveJob]:
        return self._jobs.items()

    def admit(self, *, pid: int, start_ticks: int, uid: int, name: str | None, gpu_id: str, features: Features,
              policy: PolicyName | None, max_jobs: int, max_per_uid: int | None = None,
              max_ranks_per_uid: int | None = None, group: GroupTag | None = None,
              job_id: int | None = None) -> ActiveJob:
        """A new job, undecided, under the next id, a rank of ``group`` if given; TableFull at ``max_jobs``, at
        ``max_per_uid`` of the uid's (of_uid: a group once), or at ``max_ranks_per_uid`` of them with every rank
        counted (a group's ranks each pin a GPU and hold a pidfd: counted once alone, one member's groups would take
        max_per_uid times the GPUs' slots, the whole table on a node of eight). A job re-adopted with its old
        ``job_id`` is not a new admission: the limits (perhaps lowered since) do not apply to it."""
        if job_id is None:
            if len(self._jobs) >= max_jobs:
                raise TableFull(f"the daemon already holds {len(self._jobs)} jobs (limits.max_jobs)")
            if max_per_uid is not None:
                held = self.of_uid(uid, group.key if group is not None else None)
                if held >= max_per_uid:
                    raise TableFull(f"uid {uid} already holds {held} jobs (limits.max_jobs_per_uid; a job group "
                                    "counts once)")
            if max_ranks_per_uid is not None:
                ranks = sum(j.uid == uid for j in self._jobs.values())
                if ranks >= max_ranks_per_uid:
                    raise TableFull(f"uid {uid} already holds {ranks} jobs, each rank of a job group counted "
                                    "(limits.max_ranks_per_uid)")
            job_id, self.next_job_id = self.next_job_id, self.next_job_id + 1
        job = ActiveJob(job_id, pid, start_ticks, uid, name, gpu_id, features, policy, group=group)
        self._jobs[job_id] = job
        return job

    def continue_ids(self, next_job_id: int) -> None:
        """Ids a previous daemon of this boot gave out are not given again."""
        self.next_job_id = max(self.next_job_id, next_job_id)

    def remove(self, job_id: int) -> ActiveJob | None:
        return self._jobs.pop(job_id, None)

    def of_uid(self, uid: int, joining: str | None = None) -> int:
        """What counts against limits.max_jobs_per_uid: each of the uid's jobs outside a group, and each of its groups
        once; a registration that joins a group the uid has already counts nothing more (``joining``: its key)."""
        alone, keys = 0, set()
        for j in self._jobs.values():
            if j.uid == uid:
                if j.group is None:
                    alone += 1
                else:
                    keys.add(j.group.key)
        return alone + len(keys) - (joining in keys)

    def on_gpu(self, gpu_id: str) -> bool:
        """Whether any job runs on the GPU."""
        return any(j.gpu_id == gpu_id for j in self._jobs.values())

    def shares_gpu(self, job: ActiveJob) -> bool:
        """Whether another job runs on ``job``'s GPU (a tuner pauses then: the rails measure the whole board)."""
        for other in self._jobs.values():  # a loop, not any(): this runs on every tuned progress report
            if other.gpu_id == job.gpu_id and other is not job:
                return True
        return False

    def target_hz(self, gpu_id: str, low_phases: frozenset[str], lowest_hz: int,
                  others: Iterable[int | None] = ()) -> int | None:
        """The pin the GPU's decided jobs imply together, with ``others`` (a scheduler's holds: the same rule for
        all); None: no pin, the baseline."""
        return combine([*(needs_hz(j, low_phases, lowest_hz) for j in self._jobs.values()
                          if j.gpu_id == gpu_id and j.decision is not None), *others])

    def records(self) -> list[HeldJob]:
        """The decided jobs as the state file keeps them (what a restarted daemon re-adopts)."""
        return [j.record() for j in self._jobs.values() if j.decision]
