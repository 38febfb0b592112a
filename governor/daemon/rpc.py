"""The daemon's JSON-RPC methods: register, update, progress, unregister, status, predict, ping, pin_check, a job
group's set_level and job_energy (governor.daemon.groups), and root's slurm_hold and slurm_release
(governor.daemon.scheduler).

Each answers at once with a dict, or, when it has to measure gpu_util first, with a coroutine that will (the
connection then holds the lines behind it). Parameters arrive validated (governor.daemon.protocol); what is checked
here is what needs the daemon's state: limits, the caller's right to name a process, the GPU it names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.backends.gpuid import GpuNotFound
from governor.config import Config
from governor.daemon import peers, phases, ratelimit, redact, status
from governor.daemon.controller import MEASURING, Controller
from governor.daemon.groups import GroupRefused, Groups
from governor.daemon.holds import Holds, summary
from governor.daemon.jobs import ActiveJob, GroupTag, OverLimit, Refused, Registration
from governor.daemon.protocol import RpcFault
from governor.daemon.scheduler import SchedulerHolds, UnknownHold
from governor.daemon.ticks import defer_on_loop
from governor.daemon.utilization import measure_load_pct
from governor.errors import INVALID_PARAMS, LIMIT_EXCEEDED, PERMISSION_DENIED, SERVER_ERROR, UNKNOWN_JOB, FtgovError
from governor.features import Features
from governor.policy import PolicyName
from governor.policy.windows import SHORT_PHASE_S

if TYPE_CHECKING:
    from governor.daemon.connection import Connection
    from governor.daemon.utilization import UtilizationSampler

log = logging.getLogger("ftgovd")

# A pin check writes the pin twice and saves the state file twice: a member may ask for one a second (root always).
PIN_CHECK_INTERVAL_S = 1.0


class Methods:
    """config: the config in force (reload replaces it). redecide: coalesces a job's re-decisions. gpu_search():
    how the daemon looks for a GPU while it has none, for the error that says so."""

    def __init__(self, controller: Controller, holds: Holds, sampler: UtilizationSampler,
                 redecide: ratelimit.Coalescer, config: Config, gpu_search: Callable[[], str],
                 scheduler: SchedulerHolds, groups: Groups):
        self.controller = controller
        self.groups = groups
        self.holds = holds
        self.sampler = sampler
        self.redecide = redecide
        self.config = config
        self._gpu_search = gpu_search
        self.scheduler = scheduler
        self._pin_checked_s: dict[int, float] = {}  # uid -> when its last pin check ran (monotonic)
        self._registrations: ratelimit.TokenBuckets | None = None  # per non-root uid; made from the config in force
        self.phases = phases.PhaseHold(defer_on_loop, self._phase_lasted)

    def call(self, conn: Connection, method: str, params):
        return getattr(self, f"rpc_{method}")(conn, params)

    def rpc_ping(self, conn: Connection, params) -> dict:
        return {}

    def rpc_status(self, conn: Connection, params) -> dict:
        uid = conn.peer.uid
        return {**redact.status_for(status.status(self.controller), uid),
                "groups": self.groups.describe(uid, redact.sees_all(uid))}

    def _no_gpu(self) -> RpcFault:
        return RpcFault(SERVER_ERROR, f"no GPU to govern yet ({self.controller.missing_why}); {self._gpu_search()}: "
                        "training runs on at the default clocks")

    def rpc_pin_check(self, conn: Connection, params) -> dict:
        uid = conn.peer.uid
        if uid != 0:
            now_s = time.monotonic()
            wait_s = self._pin_checked_s.get(uid, -PIN_CHECK_INTERVAL_S) + PIN_CHECK_INTERVAL_S - now_s
            if wait_s > 0:
                raise RpcFault(LIMIT_EXCEEDED, f"pin_check: at most one a second per user (each writes the pin and "
                               f"saves the state file); try again in {wait_s:.1f} s")
            self._pin_checked_s[uid] = now_s
        log.info("pin check requested by uid %d (pid %d)", conn.peer.uid, conn.peer.pid)
        return {"gpus": self.controller.pin_check()}

    def _registration_allowed(self, uid: int, limits) -> None:
        """A member registering and ending jobs in a loop drives a pin write and a state save per registration and
        per end (phase reports are coalesced, registrations are answered at once): a token bucket per uid bounds
        them; root is not limited."""
        bucket = self._registrations
        if bucket is None or (bucket.rate_per_s, bucket.burst) != (limits.registrations_per_s,
                                                                   limits.registration_burst):
            bucket = self._registrations = ratelimit.TokenBuckets(limits.registrations_per_s,
                                                                  limits.registration_burst)
        wait_s = bucket.take(uid)
        if wait_s:
            raise RpcFault(LIMIT_EXCEEDED, f"register: at most {limits.registrations_per_s:g} a second per user "
                           f"(limits.registrations_per_s; each pins the GPU and saves the state file); try again in "
                           f"{wait_s:.1f} s")

    def rpc_predict(self, conn: Connection, params):
        ctl = self.controller
        if not ctl.gpus:
            raise self._no_gpu()
        features = Features.of(params)
        if features.gpu_util is None and ctl.policy.needs_gpu_util(features):
            # The GPU's load now, for want of the job's: the answer says so (register measures it while it trains).
            return self._predict_measured(features)
        return self._predicted(ctl.predict(features))

    async def _predict_measured(self, features) -> dict:
        ctl = self.controller
        util_pct, why = await measure_load_pct(ctl.gpus[ctl.default_gpu()].gpu, self.config.util_sample_s)
        return self._predicted(ctl.predict(features.model_copy(update={"gpu_util": util_pct}), why))

    @staticmethod
    def _predicted(d) -> dict:
        return {"policy": d.label, "freq_hz": d.freq_hz, "reason": d.reason}

    def rpc_register(self, conn: Connection, params):
        """The caller's rate, then the floors below in one call: holds takes the process and holds the job the
        controller registers (governor.daemon.holds.Holds.register). Their errors become replies here."""
        if not self.controller.gpus:
            raise self._no_gpu()
        limits = self.config.limits
        peer = conn.peer
        if peer.uid != 0:
            self._registration_allowed(peer.uid, limits)
        tag = None if params.group is None else GroupTag(params.group, params.rank, params.world_size)
        reg = Registration(uid=peer.uid, pid=params.pid, features=Features.of(params), name=params.name, gpu=params.gpu,
                           tune=bool(params.tune), total_steps=params.total_steps, slurm_job_id=params.slurm_job_id,
                           group=tag)
        try:
            job, measuring, extra = self.holds.register(conn, reg, limits.max_jobs_per_connection)
        except OverLimit as e:
            raise RpcFault(LIMIT_EXCEEDED, str(e)) from e
        except peers.NotTheirs as e:
            pid = params.pid or peer.pid
            if peer.uid != 0:  # whose a process is stays the kernel's to tell (hidepid): the log has it
                log.info("uid %d: register pid %s refused: %s", peer.uid, pid, e)
                raise RpcFault(PERMISSION_DENIED, f"pid: process {pid} is not yours", {"field": "pid"}) from e
            raise RpcFault(PERMISSION_DENIED, f"pid: {e}", {"field": "pid"}) from e
        except peers.CannotHold as e:
            raise RpcFault(SERVER_ERROR, str(e)) from e
        except peers.ProcessGone as e:
            raise RpcFault(INVALID_PARAMS, f"pid: {e}", {"field": "pid"}) from e
        except GpuNotFound as e:
            raise RpcFault(INVALID_PARAMS, f"gpu: {e}", {"field": "gpu"}) from e
        except Refused as e:
            raise RpcFault(INVALID_PARAMS, str(e), {"field": e.field}) from e
        # A job decided without its gpu_util has it measured anyway, for status and the store.
        if job.features.gpu_util is None:
            self.sampler.start(job, decide=measuring)
        d = job.decision
        assert d is not None, "registered: decided, or held unpinned"
        # A GPU that cannot be pinned runs the job as observe: said apart from the reason, for the client to warn.
        unpinnable = self.controller.gpus[job.gpu_id].cannot_pin
        return {"job_id": job.job_id, "policy": d.label, "freq_hz": d.freq_hz, "reason": d.reason,
                "gpu": job.gpu_id, "gpu_util": job.features.gpu_util, **extra,
                **({"gpu_cannot_pin": unpinnable} if unpinnable is not None else {})}

    def _own_job(self, conn: Connection, job_id: int) -> ActiveJob:
        job = self.holds.job(conn, job_id)
        if job is None:
            raise RpcFault(UNKNOWN_JOB, f"job_id: no job {job_id} on this connection", {"field": "job_id"})
        return job

    def rpc_update(self, conn: Connection, params) -> dict:
        job = self._own_job(conn, params.job_id)
        changes = {k: v for k, v in (("gpu_util", params.gpu_util), ("seq_len", params.seq_len)) if v is not None}
        deferred_s = 0.0
        if changes and any(getattr(job.features, k) != v for k, v in changes.items()):
            old = job.features
            job.features = job.features.model_copy(update=changes)
            if "gpu_util" in changes:
                job.gpu_util_at_hz = None  # the client's own: the feature's meaning, not a load read under a pin
            deferred_s = self.redecide.request(job.job_id, lambda: self._redecide(job, old))
        d = job.decision
        assert d is not None, "a job is decided, or held unpinned, before its register is answered"
        reply = {"job_id": job.job_id, "policy": d.label, "freq_hz": d.freq_hz, "reason": d.reason}
        if deferred_s:  # within a second of the last re-decision: decided on the latest features when the window ends
            reply["deferred_s"] = round(deferred_s, 3)
        return reply

    def _redecide(self, job: ActiveJob, old) -> None:
        """Decide again on the job's changed features, at once or when the coalescer's window ends
        (governor.daemon.ratelimit); ``old`` is put back when the pin fails."""
        ctl = self.controller
        if job.job_id not in ctl.jobs:  # ended while the re-decision waited
            return
        sampler = self.sampler
        if ctl.needs_gpu_util(job):
            if not sampler.waiting(job):  # a new seq_len leads the tree to a gpu_util test: measure it
                ctl.hold_unpinned(job, MEASURING)
                sampler.start(job)
            return
        waited = sampler.waiting(job)
        if waited or job.features.gpu_util is not None:
            sampler.forget(job.job_id)  # the client sent gpu_util, or the decision no longer waits for it
        try:
            ctl.decide(job)
        except FtgovError:
            job.features = old
            raise
        if waited and job.features.gpu_util is None:
            self.sampler.start(job, decide=False)  # measured anyway, for status and the store

    def rpc_progress(self, conn: Connection, params) -> dict:
        job = self._own_job(conn, params.job_id)
        if params.step_end_s is not None:
            check_step_end(job, params.steps, params.step_end_s, time.monotonic())
            # Only a step not counted yet has a new end: a report of one counted already (a count again, or stale)
            # would make the step held end later than it did.
            if params.steps > job.steps or (params.steps == job.steps and job.step_end_s is None):
                job.step_end_s = params.step_end_s
        elif params.steps > job.steps:
            job.step_end_s = None  # a client that stopped sending them: this report's steps have no time
        job.steps = max(job.steps, params.steps)
        total_steps_changed = params.total_steps is not None and params.total_steps != job.total_steps
        if total_steps_changed:
            job.total_steps = params.total_steps
        phase = self.phases.reported(job, params.phase, self._phase_hold_s())
        self.controller.progress(job, phase, total_steps_changed=total_steps_changed)
        self.sampler.progress(job, phase)  # reads the load only: the board follows a pin on its own time
        if job.group is not None:
            self.groups.progress(self.controller, job, params.compute_s)
        return {}

    def _phase_hold_s(self) -> float:
        """How long a stretch out of training is training (governor.daemon.phases)."""
        return max(SHORT_PHASE_S, self.controller.settings.repin_interval_s)

    def _phase_lasted(self, job: ActiveJob, phase: str) -> None:
        """A stretch out of training lasted past the hold: acted on as a report of it now would be."""
        if self.controller.jobs.get(job.job_id) is not job:
            return  # ended meanwhile
        self.controller.progress(job, phase)
        if job.group is not None:
            self.groups.progress(self.controller, job)

    def rpc_set_level(self, conn: Connection, params) -> dict:
        """A rank of a group whose ranks span nodes moves its own GPU to the level its rank 0 chose: only the
        connection that holds the job, only a group's job, only a level of the GPU's table under the power mode's cap;
        the move waits for the GPU's re-pin interval as a tuner's does (deferred: true)."""
        job = self._own_job(conn, params.job_id)
        try:
            self.groups.set_level(self.controller, job, params.freq_hz)
        except GroupRefused as e:
            raise RpcFault(INVALID_PARAMS, str(e), {"field": e.field}) from e
        return {"job_id": job.job_id, "freq_hz": job.freq_hz, "deferred": self.controller.repin_pending(job.gpu_id)}

    def rpc_job_energy(self, conn: Connection, params) -> dict:
        """A group's rank's energy so far (J, the group's own meter of its GPU) and when it was read (this host's
        CLOCK_MONOTONIC): a multi-node group's windows are measured from these."""
        job = self._own_job(conn, params.job_id)
        if job.group is None:
            raise RpcFault(INVALID_PARAMS, "job_id: this job is in no group", {"field": "job_id"})
        return {"job_id": job.job_id, "energy_j": self.groups.energy_j(job), "at_s": time.monotonic()}

    def _root_only(self, conn: Connection, method: str) -> None:
        if conn.peer.uid != 0:
            log.info("uid %d: %s refused: root only", conn.peer.uid, method)
            raise RpcFault(PERMISSION_DENIED, f"{method}: only root (the scheduler's prolog and epilog) may hold or "
                           "release a scheduler job's GPUs")

    def rpc_slurm_hold(self, conn: Connection, params) -> dict:
        self._root_only(conn, "slurm_hold")
        if not self.controller.gpus:
            raise self._no_gpu()
        policy = params.policy
        if policy != "off" and self.controller.settings.policy.name is PolicyName.OBSERVE:
            # A daemon that observes pins nothing for anyone and measures every job: this one too, as off (its
            # record, the accounting's too, says what ran). Refused, the jobs that never heard of ftgov went unmeasured.
            log.info("Slurm job %d: %s asked; this daemon runs the observe policy: held as off (measured, no pin)",
                     params.slurm_job_id, policy)
            policy = "off"
        try:
            return self.scheduler.hold(slurm_job_id=params.slurm_job_id, uid=params.uid, partition=params.partition,
                                       policy=policy, gpus=params.gpus, gpu_numbering=params.gpu_numbering,
                                       node_gpus=params.node_gpus, het_job_id=params.het_job_id)
        except FtgovError as e:
            raise RpcFault(SERVER_ERROR, f"Slurm job {params.slurm_job_id}: {e}") from e

    def rpc_slurm_release(self, conn: Connection, params) -> dict:
        self._root_only(conn, "slurm_release")
        try:
            return self.scheduler.release(params.slurm_job_id, params.why)
        except UnknownHold as e:
            raise RpcFault(UNKNOWN_JOB, str(e), {"field": "slurm_job_id"}) from e

    def rpc_resume(self, conn: Connection, params) -> dict:
        """A job's client connected again after the daemon restarted: it holds the job the restart re-adopted (held
        by its process alone until then, so a notebook's job kept its pin until the kernel exited), and its progress,
        unregister and closing work as before. Only a job no connection holds, only its own uid's (or root's): a
        process of that uid could end the job's process anyway. Another's job reads as none, as elsewhere."""
        job = self.controller.jobs.get(params.job_id)
        if job is None or (conn.peer.uid not in (0, job.uid)):
            raise RpcFault(UNKNOWN_JOB, f"job_id: no job {params.job_id} to resume", {"field": "job_id"})
        try:
            attached = self.holds.attach(conn, job, self.config.limits.max_jobs_per_connection)
        except OverLimit as e:
            raise RpcFault(LIMIT_EXCEEDED, str(e)) from e
        if not attached:
            raise RpcFault(UNKNOWN_JOB, f"job_id: job {params.job_id} is held by a connection; only a job re-adopted "
                           "after a daemon restart can be resumed", {"field": "job_id"})
        log.info("%s resumed by its client (uid %d, pid %s) after a daemon restart", job.label(), conn.peer.uid,
                 conn.peer.pid)
        d = job.decision
        return {"job_id": job.job_id, "policy": None if d is None else d.label, "freq_hz": job.freq_hz,
                "reason": None if d is None else d.reason, "gpu": job.gpu_id}

    def rpc_unregister(self, conn: Connection, params) -> dict:
        kept = self.holds.take_ended(conn, params.job_id)  # its process exited first: the summary kept then
        if kept is not None:
            return kept
        if not self.holds.held_by(conn, params.job_id):
            raise RpcFault(UNKNOWN_JOB, f"job_id: no job {params.job_id} on this connection", {"field": "job_id"})
        ended = self.holds.end(params.job_id, "unregistered")
        assert ended is not None, "a job held by a connection is in the table"
        return summary(ended)


# A step end is a time this host's CLOCK_MONOTONIC has passed (a report is sent after its step ends; a little slack
# for the clock's own reads), and no older than this: another host's clock, or a client's wrong clock, is refused.
STEP_END_AHEAD_S = 0.5
STEP_END_MAX_AGE_S = 600.0


def check_step_end(job: ActiveJob, steps: int, step_end_s: float, now_s: float) -> None:
    """Refuse a ``step_end_s`` that cannot be when step ``steps`` of this job ended on this host."""
    if not now_s - STEP_END_MAX_AGE_S <= step_end_s <= now_s + STEP_END_AHEAD_S:
        raise RpcFault(INVALID_PARAMS, f"step_end_s: {step_end_s:.3f} is not a recent CLOCK_MONOTONIC time of this "
                       f"host (now {now_s:.3f}): send time.monotonic() at the step's end", {"field": "step_end_s"})
    if job.step_end_s is not None and (step_end_s < job.step_end_s or (steps > job.steps and
                                                                       step_end_s == job.step_end_s)):
        raise RpcFault(INVALID_PARAMS, f"step_end_s: {step_end_s:.3f} for step {steps} is not after "
                       f"{job.step_end_s:.3f}, step {job.steps}'s end", {"field": "step_end_s"})
