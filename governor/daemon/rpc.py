"""The daemon's JSON-RPC methods: register, update, progress, unregister, status, predict, ping, and a job group's
set_level and job_energy (governor.daemon.groups).

Each answers at once with a dict, or, when it has to measure gpu_util first, with a coroutine that will (the
connection then holds the lines behind it). Parameters arrive validated (governor.daemon.protocol); what is checked
here is what needs the daemon's state: limits, the caller's right to name a process, the GPU it names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from governor.config import Config
from governor.daemon import peers, ratelimit, redact, status
from governor.daemon.groups import GroupRefused, Groups
from governor.daemon.holds import Holds, summary
from governor.daemon.jobs import ActiveJob, GroupTag
from governor.daemon.pins import PinController
from governor.daemon.protocol import RpcFault
from governor.daemon.utilization import measure_load_pct
from governor.errors import INVALID_PARAMS, LIMIT_EXCEEDED, PERMISSION_DENIED, SERVER_ERROR, UNKNOWN_JOB, FtgovError
from governor.policy import PolicyName

if TYPE_CHECKING:
    from governor.daemon.connection import Connection
    from governor.daemon.utilization import UtilizationSampler

log = logging.getLogger("ftgovd")

# A pin check writes the pin twice and saves the state file twice: a member may ask for one a second (root always).
PIN_CHECK_INTERVAL_S = 1.0

MEASURING = ("waiting for gpu_util, which this decision needs: it is measured over the job's first training steps "
             "(or after a settling delay without progress reports); no pin until then, the default governor runs")


class Methods:
    """config(): the config in force (reload replaces it). redecide: coalesces a job's re-decisions. gpu_search():
    how the daemon looks for a GPU while it has none, for the error that says so."""

    def __init__(self, pins: PinController, holds: Holds, sampler: UtilizationSampler, redecide: ratelimit.Coalescer,
                 config: Callable[[], Config], gpu_search: Callable[[], str], groups: Groups | None = None):
        self.pins = pins
        self.groups = groups if groups is not None else Groups()
        self.holds = holds
        self.sampler = sampler
        self.redecide = redecide
        self._config = config
        self._gpu_search = gpu_search
        self._pin_checked_s: dict[int, float] = {}  # uid -> when its last pin check ran (monotonic)
        self._registrations: ratelimit.TokenBuckets | None = None  # per non-root uid; made from the config in force

    @property
    def config(self) -> Config:
        return self._config()

    def call(self, conn: Connection, method: str, params):
        return getattr(self, f"rpc_{method}")(conn, params)

    def rpc_ping(self, conn: Connection, params) -> dict:
        return {}

    def rpc_status(self, conn: Connection, params) -> dict:
        uid = conn.peer.uid
        return {**redact.status_for(status.status(self.pins), uid),
                "groups": self.groups.describe(uid, redact.sees_all(uid))}

    def _no_gpu(self) -> RpcFault:
        return RpcFault(SERVER_ERROR, f"no GPU to govern yet ({self.pins.missing_why}); {self._gpu_search()}: "
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
        return {"gpus": self.pins.pin_check()}

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
        if not self.pins.gpus:
            raise self._no_gpu()
        features = params.features()
        gid = self.pins.default_gpu()
        if features.gpu_util is None and self.pins.policy.needs_gpu_util(features):
            # The GPU's load now, for want of the job's: the answer says so (register measures it while it trains).
            return self._predict_measured(features, gid)
        return self._predict(features, gid, "")

    async def _predict_measured(self, features, gid: str) -> dict:
        util_pct, why = await measure_load_pct(self.pins.gpus[gid].gpu, self.config.util_sample_s)
        return self._predict(features.model_copy(update={"gpu_util": util_pct}), gid, why)

    def _predict(self, features, gid: str, why: str) -> dict:
        d = self.pins.power_mode.within(gid, self.pins.policy.decide(features, self.pins.gpus[gid].gpu.levels_hz))
        return {"policy": d.label, "freq_hz": d.freq_hz, "reason": d.reason + (f"; {why}" if why else "")}

    def rpc_register(self, conn: Connection, params):
        if not self.pins.gpus:
            raise self._no_gpu()
        limits = self.config.limits
        if conn.peer.uid != 0:
            self._registration_allowed(conn.peer.uid, limits)
        if self.holds.count(conn) >= limits.max_jobs_per_connection:
            raise RpcFault(LIMIT_EXCEEDED, f"this connection already holds {self.holds.count(conn)} jobs "
                           "(limits.max_jobs_per_connection)")
        # A job group counts once, however many ranks it has here.
        held_by_uid = self.groups.jobs_of_uid(self.pins.jobs.values(), conn.peer.uid, params.group)
        if held_by_uid >= limits.max_jobs_per_uid:
            raise RpcFault(LIMIT_EXCEEDED, f"uid {conn.peer.uid} already holds {held_by_uid} jobs "
                           "(limits.max_jobs_per_uid; a job group counts once)")
        pid = params.pid or conn.peer.pid
        try:
            held = peers.process_for_job(conn.process, conn.peer, params.pid)
        except peers.NotTheirs as e:
            if conn.peer.uid != 0:  # whose a process is stays the kernel's to tell (hidepid): the log has it
                log.info("uid %d: register pid %s refused: %s", conn.peer.uid, pid, e)
                raise RpcFault(PERMISSION_DENIED, f"pid: process {pid} is not yours", {"field": "pid"}) from e
            raise RpcFault(PERMISSION_DENIED, f"pid: {e}", {"field": "pid"}) from e
        except peers.ProcessGone as e:
            raise RpcFault(INVALID_PARAMS, f"pid: {e}", {"field": "pid"}) from e
        try:
            job = self._admit(conn, params, pid, held)
        except BaseException:  # any failure, a bug's too: the pidfd goes with it (a leak per request exhausts fds)
            held.close()
            raise
        job.total_steps = params.total_steps
        self.holds.hold(job, held, conn)
        if job.features.gpu_util is None and self.pins.policy.needs_gpu_util(job.features, job.policy):
            decision = self.pins.hold_unpinned(job, MEASURING)
            self.sampler.start(job)
            return self._registered(job, decision)
        reply = self._decide_new(conn, job, "")
        self._record_util(job)
        return reply

    def _record_util(self, job: ActiveJob) -> None:
        """A job decided without its gpu_util has it measured anyway, for status and the store."""
        if job.features.gpu_util is None:
            self.sampler.start(job, decide=False)

    def _admit(self, conn: Connection, params, pid: int, held: peers.HeldProcess) -> ActiveJob:
        """The job of a registration whose process is held (the caller releases ``held`` if this raises)."""
        if conn.peer.uid != 0 and held.uid != conn.peer.uid:
            raise RpcFault(PERMISSION_DENIED, f"pid: process {pid} is not yours (uid {conn.peer.uid})",
                           {"field": "pid"})
        if params.tune and self.pins.policy.name is PolicyName.OBSERVE:
            raise RpcFault(INVALID_PARAMS, "tune: this daemon runs the observe policy and pins nothing",
                           {"field": "tune"})
        try:
            gpu_id = self.pins.find_gpu(params.gpu)
        except FtgovError as e:
            raise RpcFault(INVALID_PARAMS, f"gpu: {e}", {"field": "gpu"}) from e
        tag = None if params.group is None else GroupTag(params.group, params.rank, params.world_size)
        if tag is not None:
            try:
                self.groups.check_join(conn.peer.uid, tag, gpu_id)
            except GroupRefused as e:
                raise RpcFault(INVALID_PARAMS, str(e), {"field": e.field}) from e
        try:
            job = self.pins.admit(pid=pid, start_ticks=held.start_ticks, uid=conn.peer.uid, name=params.name,
                                  gpu_id=gpu_id, features=params.features(),
                                  policy=PolicyName.TUNE if params.tune else None)
        except FtgovError as e:
            raise RpcFault(LIMIT_EXCEEDED, str(e)) from e
        if tag is not None:
            job.group = tag
            self.groups.join(self.pins, job)
        return job

    def _decide_new(self, conn: Connection, job: ActiveJob, why: str) -> dict:
        try:
            decision = self.pins.decide(job, why_util=why)
        except FtgovError:
            self.holds.release(job.job_id)  # the pin controller dropped the job
            self.groups.left(job.job_id, "its first pin failed")
            raise
        return self._registered(job, decision)

    def _registered(self, job: ActiveJob, decision) -> dict:
        reply = {"job_id": job.job_id, "policy": decision.label, "freq_hz": decision.freq_hz,
                 "reason": decision.reason, "gpu": job.gpu_id, "gpu_util": job.features.gpu_util}
        if job.group is not None:  # the GPU's table: a multi-node group's rank 0 tunes over it
            reply.update(group=job.group.key, rank=job.group.rank,
                         levels_hz=list(self.pins.power_mode.allowed_levels(job.gpu_id)))
        return reply

    def _own_job(self, conn: Connection, job_id: int) -> ActiveJob:
        if not self.holds.held_by(conn, job_id):
            raise RpcFault(UNKNOWN_JOB, f"job_id: no job {job_id} on this connection", {"field": "job_id"})
        return self.pins.jobs[job_id]

    def rpc_update(self, conn: Connection, params) -> dict:
        job = self._own_job(conn, params.job_id)
        changes = {k: v for k, v in (("gpu_util", params.gpu_util), ("seq_len", params.seq_len)) if v is not None}
        deferred_s = 0.0
        if changes and any(getattr(job.features, k) != v for k, v in changes.items()):
            old = job.features
            job.features = job.features.model_copy(update=changes)
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
        if job.job_id not in self.pins.jobs:  # ended while the re-decision waited
            return
        sampler = self.sampler
        if job.features.gpu_util is None and self.pins.policy.needs_gpu_util(job.features, job.policy):
            if not sampler.waiting(job):  # a new seq_len leads the tree to a gpu_util test: measure it
                self.pins.hold_unpinned(job, MEASURING)
                sampler.start(job)
            return
        waited = sampler.waiting(job)
        if waited or job.features.gpu_util is not None:
            sampler.forget(job.job_id)  # the client sent gpu_util, or the decision no longer waits for it
        try:
            self.pins.decide(job)
        except FtgovError:
            job.features = old
            raise
        if waited:
            self._record_util(job)

    def rpc_progress(self, conn: Connection, params) -> dict:
        job = self._own_job(conn, params.job_id)
        if params.step_end_s is not None:
            check_step_end(job, params.steps, params.step_end_s, time.monotonic())
            job.step_end_s = params.step_end_s
        elif params.steps > job.steps:
            job.step_end_s = None  # a client that stopped sending them: this report's steps have no time
        job.steps = max(job.steps, params.steps)
        if params.total_steps is not None and params.total_steps != job.total_steps:
            job.total_steps = params.total_steps
            if job.tuner is not None:
                job.tuner.set_total_steps(self.pins, job)
        self.pins.set_phase(job, params.phase)
        self.sampler.progress(job, params.phase)
        if job.tuner is not None:
            job.tuner.progress(self.pins, job)
        if job.group is not None:
            self.groups.progress(self.pins, job, params.compute_s)
        return {}

    def rpc_set_level(self, conn: Connection, params) -> dict:
        """A rank of a group whose ranks span nodes moves its own GPU to the level its rank 0 chose: only the
        connection that holds the job, only a group's job, only a level of the GPU's table under the power mode's cap;
        the move waits for the GPU's re-pin interval as a tuner's does (deferred: true)."""
        job = self._own_job(conn, params.job_id)
        try:
            self.groups.set_level(self.pins, job, params.freq_hz)
        except GroupRefused as e:
            raise RpcFault(INVALID_PARAMS, str(e), {"field": e.field}) from e
        return {"job_id": job.job_id, "freq_hz": job.freq_hz, "deferred": self.pins.repin_pending(job.gpu_id)}

    def rpc_job_energy(self, conn: Connection, params) -> dict:
        """A group's rank's energy so far (J, the group's own meter of its GPU) and when it was read (this host's
        CLOCK_MONOTONIC): a multi-node group's windows are measured from these."""
        job = self._own_job(conn, params.job_id)
        if job.group is None:
            raise RpcFault(INVALID_PARAMS, "job_id: this job is in no group", {"field": "job_id"})
        return {"job_id": job.job_id, "energy_j": self.groups.energy_j(job), "at_s": time.monotonic()}

    def rpc_unregister(self, conn: Connection, params) -> dict:
        kept = self.holds.take_ended(conn, params.job_id)  # its process exited first: the summary kept then
        if kept is not None:
            return kept
        self._own_job(conn, params.job_id)
        ended = self.holds.end(params.job_id, "unregistered")
        assert ended is not None, "_own_job found it in the table"
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
