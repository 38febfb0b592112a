"""What a registration joins before its decision: its batch job's hold on its GPU (governor.daemon.scheduler) and its
job group (governor.daemon.groups). The controller (governor.daemon.controller) asks here while it registers a job:
first whether the joins are allowed (before the job is admitted), then to join the admitted job (before it is
decided, so that it speaks for the hold's GPU and takes its group's level), and to undo a group's join when the first
pin fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from governor.daemon.jobs import ActiveJob, Registration
from governor.policy import PolicyName

if TYPE_CHECKING:
    from governor.daemon.groups import Groups
    from governor.daemon.scheduler import Hold, SchedulerHolds


@dataclass
class Joining:
    """What one registration joins: ``policy`` is the job's (a joined hold's, else what it asked for; None: the
    daemon's); ``reply`` is what the register reply says of it."""

    policy: PolicyName | None
    hold: Hold | None = None
    group: bool = False
    reply: dict = field(default_factory=dict)


class Joins:
    def __init__(self, scheduler: SchedulerHolds, groups: Groups):
        self.scheduler = scheduler
        self.groups = groups

    def gpu_of(self, reg: Registration) -> str | None:
        """The GPU of a registration inside a Slurm job held here that names it by a number (SchedulerHolds.only_gpu;
        GpuNotFound where the number is none of the job's GPUs)."""
        return self.scheduler.only_gpu(reg.slurm_job_id, reg.uid, reg.gpu)

    def check(self, reg: Registration, gpu_id: str, policy: PolicyName | None, observe_only: bool) -> Joining:
        """The joins ``reg`` makes on GPU ``gpu_id``: a hold it cannot join is said in the reply (the job then runs as
        one of its own, under ``policy``); a group it cannot join is refused (GroupRefused). A joined hold's policy
        is the job's; ``observe_only``: the daemon pins nothing, so a hold's tune becomes observe."""
        joining = Joining(policy, group=reg.group is not None)
        if reg.slurm_job_id is not None:
            hold, why = self.scheduler.joinable(reg.slurm_job_id, reg.uid, gpu_id)
            joining.reply["slurm"] = {"slurm_job_id": reg.slurm_job_id, "joined": hold is not None,
                                      **({"why": why} if why else {})}
            if hold is not None:
                joining.hold = hold
                joining.policy = self.scheduler.inside_policy(hold, reg.tune)
                if joining.policy is PolicyName.TUNE and observe_only:
                    joining.policy = PolicyName.OBSERVE
        if reg.group is not None:
            self.groups.check_join(reg.uid, reg.group, gpu_id)
        return joining

    def join(self, joining: Joining, gov, job: ActiveJob) -> None:
        """The admitted, undecided ``job`` joins what ``joining`` names; a group's rank is told its GPU's table,
        which a multi-node group's rank 0 tunes over (governor.client.group), and the rule its windows follow."""
        if joining.hold is not None:
            self.scheduler.join(joining.hold, job)
        if joining.group:
            self.groups.join(gov, job)
            tag = job.group
            assert tag is not None, "a job that joins a group registered with its tag"
            levels_hz = gov.power_mode.allowed_levels(job.gpu_id)
            joining.reply.update(group=tag.key, rank=tag.rank, levels_hz=list(levels_hz),
                                 window=self.groups.window_rule(job))

    def failed(self, joining: Joining, job: ActiveJob) -> None:
        """The job's first pin failed: the controller dropped it, and it leaves its group."""
        if joining.group:
            self.groups.left(job.job_id, "its first pin failed")
