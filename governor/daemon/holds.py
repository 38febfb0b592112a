"""Which connection and which process hold which job: the one owner of that.

A job is held by the connection that registered it (none for a job re-adopted after a restart) and by its process,
through a pidfd: whichever ends first ends the job. A job whose process exits before its client unregisters leaves
its summary with the connection, so that a late unregister still gets the figures (the last ENDED_KEPT of each).
Nothing here polls: the pidfds wait in an epoll of their own, which the event loop watches as one file (joining it
is one cheap epoll_ctl, where the loop's own add_reader costs several times that on every registration).
"""

from __future__ import annotations

import select
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from governor.daemon import peers, protocol, ratelimit
from governor.daemon.jobs import ActiveJob, Ended, OverLimit, Registered, Registration

ENDED_KEPT = 16

Owner = Hashable  # a connection (governor.daemon.connection.Connection)
EndJob = Callable[[int, str], "Ended | None"]
RegisterJob = Callable[[Registration, peers.HeldProcess], Registered]


class Client(Protocol):
    """What a registration's owner is (governor.daemon.connection.Connection): who connected, and the hold on the
    process that connected (None: it had exited by the accept)."""

    @property
    def peer(self) -> peers.Peer: ...

    @property
    def process(self) -> peers.HeldProcess | None: ...

    def __hash__(self) -> int: ...


class Holds:
    """register(reg, process): the controller's registration of a job held by ``process``
    (governor.daemon.controller.Controller.register). end(job_id, why): everything else a job's end does (the
    controller's end, the measurements that wait for it); called after the job is released here."""

    def __init__(self, end: EndJob, register: RegisterJob):
        self._end = end
        self._register = register
        self._owner: dict[int, Owner | None] = {}  # job id -> the connection that holds it
        self._of_owner: dict[Owner, dict[int, ActiveJob]] = {}  # a connection's jobs, by id
        self._uid: dict[int, int] = {}  # job id -> its uid: the log lines of its end count against that uid
        self._process: dict[int, peers.HeldProcess] = {}
        self._exit_job: dict[int, int] = {}  # pidfd -> job id
        self._ended: dict[Owner, dict[int, dict]] = {}
        self._exits = select.epoll()
        # Set while the daemon stops: a connection that closes then leaves its jobs for the shutdown to decide on.
        self.stopping = False

    # ---- holding ----------------------------------------------------------------------------------------------------
    def register(self, client: Client, reg: Registration, max_per_client: int) -> Registered:
        """A new job for ``client``, held by its process (the one that connected, or ``reg.pid``) and by ``client``.
        OverLimit at ``max_per_client`` jobs held; ProcessGone or NotTheirs for a process it cannot hold (a member's
        job is held by a process of its own uid); the controller's errors as they are. The process's pidfd is closed
        if anything fails (a pidfd leaked per request would exhaust the daemon's descriptors)."""
        self._room(client, max_per_client)
        peer = client.peer
        process = peers.process_for_job(client.process, peer, reg.pid)
        try:
            if peer.uid != 0 and process.uid != peer.uid:
                raise peers.NotTheirs(f"process {process.pid} is not yours (uid {peer.uid})")
            registered = self._register(reg, process)
            self.hold(registered.job, process, client)
        except BaseException:
            process.close()
            raise
        return registered

    def hold(self, job: ActiveJob, process: peers.HeldProcess, owner: Owner | None = None) -> None:
        """The job is held by its process (``process``: closed when the job ends) and by ``owner``, if any."""
        job_id = job.job_id
        self._owner[job_id] = owner
        if owner is not None:
            self._of_owner.setdefault(owner, {})[job_id] = job
        self._uid[job_id] = job.uid
        self._process[job_id] = process
        self._exit_job[process.pidfd] = job_id
        self._exits.register(process.pidfd, select.EPOLLIN)  # readable once the process has exited

    def _room(self, owner: Owner, max_per_client: int) -> None:
        """OverLimit when ``owner`` already holds ``max_per_client`` jobs."""
        held_here = self.count(owner)
        if held_here >= max_per_client:
            raise OverLimit(f"this connection already holds {held_here} jobs (limits.max_jobs_per_connection)")

    def attach(self, owner: Owner, job: ActiveJob, max_per_client: int) -> bool:
        """``owner`` holds ``job`` from now on, if no connection does (a job re-adopted after a restart, whose client
        has connected again): closing it then ends the job, as for any job. False when the job is not held here or a
        connection holds it already; OverLimit at ``max_per_client`` jobs held, as for register."""
        if job.job_id not in self._owner or self._owner[job.job_id] is not None:
            return False
        self._room(owner, max_per_client)
        self._owner[job.job_id] = owner
        self._of_owner.setdefault(owner, {})[job.job_id] = job
        return True

    def release(self, job_id: int) -> Owner | None:
        """Stop holding the job (its process's pidfd closed); the connection that held it, if any."""
        owner = self._owner.pop(job_id, None)
        if owner is not None:
            jobs = self._of_owner[owner]
            jobs.pop(job_id, None)
            if not jobs:
                del self._of_owner[owner]
        self._uid.pop(job_id, None)
        process = self._process.pop(job_id, None)
        if process is not None:
            del self._exit_job[process.pidfd]
            self._exits.unregister(process.pidfd)
            process.close()
        return owner

    def count(self, owner: Owner) -> int:
        """How many jobs ``owner`` holds."""
        return len(self._of_owner.get(owner, ()))

    def held_by(self, owner: Owner, job_id: int) -> bool:
        return job_id in self._of_owner.get(owner, ())

    def job(self, owner: Owner, job_id: int) -> ActiveJob | None:
        """``owner``'s job ``job_id``; None when ``owner`` holds no such job (another's, or ended)."""
        return self._of_owner.get(owner, {}).get(job_id)

    def processes(self) -> int:
        """How many pidfds are open for jobs."""
        return len(self._process)

    # ---- ends -------------------------------------------------------------------------------------------------------
    def end(self, job_id: int, why: str) -> Ended | None:
        self.release(job_id)
        return self._end(job_id, why)

    def end_owner(self, owner: Owner, why: str, uid: int | None) -> None:
        """``owner`` (of uid ``uid``) closed: its jobs end, unless the daemon is stopping."""
        if self.stopping:
            return
        # The lines of a job's end are its client's: a register-and-close loop must not flood the journal.
        token = ratelimit.caused_by(uid)
        try:
            for job_id in sorted(self._of_owner.get(owner, ())):
                self.end(job_id, why)
        finally:
            ratelimit.done(token)

    def forget(self, owner: Owner) -> None:
        """``owner`` is gone: the summaries it kept go too."""
        self._ended.pop(owner, None)

    def take_ended(self, owner: Owner, job_id: int) -> dict | None:
        """The summary of ``owner``'s job that ended without unregister (its process exited first), once."""
        return self._ended.get(owner, {}).pop(job_id, None)

    def exits_fileno(self) -> int:
        """The epoll that is readable while a job's process has exited: the event loop calls processes_exited."""
        return self._exits.fileno()

    def processes_exited(self) -> None:
        for pidfd, _events in self._exits.poll(0):
            job_id = self._exit_job.get(pidfd)
            if job_id is not None:  # not ended by an earlier one of these
                self._process_exited(job_id)

    def _process_exited(self, job_id: int) -> None:
        owner = self._owner.get(job_id)
        token = ratelimit.caused_by(self._uid.get(job_id))
        try:
            ended = self.end(job_id, "process exited")
        finally:
            ratelimit.done(token)
        if owner is not None and ended is not None:
            kept = self._ended.setdefault(owner, {})
            kept[job_id] = summary(ended)
            while len(kept) > ENDED_KEPT:
                kept.pop(next(iter(kept)))

    def close(self) -> None:
        """The daemon stops: close every pidfd (the jobs themselves are the shutdown's to decide on) and the epoll."""
        for process in self._process.values():
            process.close()
        self._process.clear()
        self._exit_job.clear()
        self._exits.close()


def summary(ended: Ended) -> dict:
    """What unregister answers (and what a connection keeps for a job whose process ended first)."""
    out: dict[str, Any] = {"job_id": ended.job.job_id, "duration_s": round(ended.duration_s, 3),
                           "freq_hz": ended.job.freq_hz, "energy_j": protocol.finite(ended.energy_j),
                           "steps": ended.job.steps, "ended": ended.why}
    if ended.saving is not None:  # a tuned job's measured saving vs the default governor (governor.daemon.tuning)
        out.update(saved_pct=ended.saving["saved_pct"], saved_pct_err=ended.saving.get("saved_pct_err"),
                   saved_measured_steps=ended.saving["measured_steps"],
                   saving=ended.saving)
    elif ended.unmeasured is not None:
        out["saving_unmeasured"] = ended.unmeasured
    return out
