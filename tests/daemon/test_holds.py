"""governor.daemon.holds: which connection and which process hold which job, with real child processes."""

from __future__ import annotations

import os
import select
import subprocess

import pytest

from governor.daemon import peers
from governor.daemon.holds import ENDED_KEPT, Holds
from governor.daemon.jobs import ActiveJob, Ended, OverLimit, Refused, Registered, Registration
from governor.errors import PinError
from governor.features import Features

FEATURES = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


class Ends:
    """The controller, as holds sees it: registers a job (or raises ``refuse``), and does the rest of a job's end:
    records each call and answers an Ended."""

    def __init__(self):
        self.calls: list[tuple[int, str]] = []
        self.jobs: dict[int, ActiveJob] = {}
        self.refuse: Exception | None = None
        self.processes: list[peers.HeldProcess] = []

    def register(self, reg: Registration, process: peers.HeldProcess) -> Registered:
        self.processes.append(process)
        if self.refuse is not None:
            raise self.refuse
        job = ActiveJob(len(self.processes), process.pid, process.start_ticks, reg.uid, reg.name, "0", reg.features)
        self.jobs[job.job_id] = job
        return Registered(job, False, {})

    def __call__(self, job_id: int, why: str) -> Ended | None:
        self.calls.append((job_id, why))
        job = self.jobs.pop(job_id, None)
        return None if job is None else Ended(job, 1.5, None, why)


def job_of(ends: Ends, holds: Holds, job_id: int, proc: subprocess.Popen, owner=None) -> ActiveJob:
    job = ActiveJob(job_id, proc.pid, 0, os.getuid(), None, "0", FEATURES)
    ends.jobs[job_id] = job
    holds.hold(job, peers.hold(proc.pid), owner)
    return job


def exit_and_wait(holds: Holds, proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=10)
    readable, _, _ = select.select([holds.exits_fileno()], [], [], 10)
    assert readable, "the exits epoll never became readable"


def test_a_connection_holds_its_jobs_and_only_those(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    a, b = object(), object()
    first = job_of(ends, holds, 1, children(), a)
    job_of(ends, holds, 2, children(), a)
    job_of(ends, holds, 3, children(), b)
    job_of(ends, holds, 4, children())  # re-adopted: held by its process only
    assert (holds.count(a), holds.count(b), holds.processes()) == (2, 1, 4)
    assert holds.held_by(a, 1) and not holds.held_by(b, 1) and not holds.held_by(a, 4)
    assert holds.job(a, 1) is first and holds.job(b, 1) is None and holds.job(a, 4) is None
    holds.end_owner(a, "connection closed", os.getuid())
    assert holds.job(a, 1) is None
    assert ends.calls == [(1, "connection closed"), (2, "connection closed")]
    assert (holds.count(a), holds.count(b), holds.processes()) == (0, 1, 2)
    holds.close()


def test_a_job_whose_process_exits_ends_and_leaves_its_summary_for_one_late_unregister(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    conn, proc = object(), children()
    job_of(ends, holds, 7, proc, conn).steps = 12
    exit_and_wait(holds, proc)
    holds.processes_exited()
    assert ends.calls == [(7, "process exited")]
    assert not holds.held_by(conn, 7) and holds.processes() == 0
    summary = holds.take_ended(conn, 7)
    assert summary is not None and (summary["job_id"], summary["steps"], summary["ended"]) == (7, 12, "process exited")
    assert holds.take_ended(conn, 7) is None  # once
    holds.close()


def test_a_connection_keeps_the_last_summaries_only_and_forgets_them_when_it_goes(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    conn = object()
    for job_id in range(1, ENDED_KEPT + 3):
        proc = children()
        job_of(ends, holds, job_id, proc, conn)
        exit_and_wait(holds, proc)
        holds.processes_exited()
    assert holds.take_ended(conn, 1) is None and holds.take_ended(conn, 2) is None  # the oldest went
    assert holds.take_ended(conn, 3) is not None
    holds.forget(conn)
    assert holds.take_ended(conn, ENDED_KEPT + 2) is None
    holds.close()


def test_while_the_daemon_stops_a_closing_connection_leaves_its_jobs_held(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    conn = object()
    job_of(ends, holds, 1, children(), conn)
    holds.stopping = True
    holds.end_owner(conn, "connection closed", os.getuid())
    assert ends.calls == [] and holds.held_by(conn, 1)
    assert holds.end(1, "daemon stopping") is not None  # shutdown's decision
    assert ends.calls == [(1, "daemon stopping")] and holds.processes() == 0
    holds.close()


def test_a_released_job_closes_its_pidfd_and_its_exit_is_not_an_end(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    conn, proc = object(), children()
    job = job_of(ends, holds, 1, proc, conn)
    holds.release(job.job_id)  # the pin failed: the pin controller dropped the job itself
    assert holds.count(conn) == 0 and holds.processes() == 0
    proc.stdin.close()
    proc.wait(timeout=10)
    holds.processes_exited()
    assert ends.calls == []
    holds.close()


class Client:
    """A connection as holds sees it: who connected, and the hold on the process that connected."""

    def __init__(self, proc: subprocess.Popen, uid: int | None = None):
        self.peer = peers.Peer(proc.pid, os.getuid() if uid is None else uid, os.getgid())
        self.process = peers.hold(proc.pid)


def pidfd_open(process: peers.HeldProcess) -> bool:
    try:
        os.fstat(process.pidfd)
    except OSError:
        return False
    return True


def test_register_holds_the_job_by_its_client_and_by_the_process_that_connected(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    client = Client(children())
    job, measuring, extra = holds.register(client, Registration(os.getuid(), None, FEATURES), 4)
    assert (job.pid, measuring, extra) == (client.peer.pid, False, {})
    assert holds.job(client, job.job_id) is job and holds.processes() == 1
    assert ends.processes[0].pidfd != client.process.pidfd  # a hold of its own: the connection's stays the connection's
    holds.close()
    client.process.close()


@pytest.mark.parametrize("refusal", [Refused("tune", "this daemon runs the observe policy"), PinError("no pin"),
                                     KeyboardInterrupt()])
def test_a_refused_register_closes_the_pidfd_it_took_and_holds_nothing(children, refusal):
    ends = Ends()
    holds = Holds(ends, ends.register)
    client = Client(children())
    ends.refuse = refusal
    with pytest.raises(type(refusal)):
        holds.register(client, Registration(os.getuid(), None, FEATURES), 4)
    assert not pidfd_open(ends.processes[0]) and holds.processes() == 0 and holds.count(client) == 0
    holds.close()
    client.process.close()


def test_register_refuses_a_client_at_its_limit_before_taking_a_process(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    client = Client(children())
    for _ in range(2):
        holds.register(client, Registration(os.getuid(), None, FEATURES), 2)
    with pytest.raises(OverLimit, match="already holds 2 jobs"):
        holds.register(client, Registration(os.getuid(), None, FEATURES), 2)
    assert len(ends.processes) == 2
    holds.close()
    client.process.close()


def test_a_member_cannot_register_a_job_held_by_another_uids_process(children):
    ends = Ends()
    holds = Holds(ends, ends.register)
    other = children()
    client = Client(children(), uid=os.getuid() + 12345)  # a member whose uid is not the processes' owner
    with pytest.raises(peers.NotTheirs):
        holds.register(client, Registration(client.peer.uid, other.pid, FEATURES), 4)
    assert ends.processes == [] and holds.processes() == 0
    holds.close()
    client.process.close()


def test_a_system_call_filter_that_refuses_pidfds_is_named_not_taken_for_a_gone_process(monkeypatch):
    """pidfd_open has no EPERM of its own: a seccomp filter gives it (the unit's SystemCallFilter on an older
    systemd). The systemd suite runs the daemon under such a filter; here, what each caller is told."""
    assert peers.pidfd_problem() is None

    def refused(pid, flags=0):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "pidfd_open", refused)
    assert "SystemCallFilter=pidfd_open" in peers.pidfd_problem()
    with pytest.raises(peers.CannotHold, match="pidfd_open is refused"):
        peers.hold(os.getpid())


def test_a_threads_id_is_named_as_a_thread_of_its_process():
    import threading

    started, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def thread():
        tids.append(threading.get_native_id())
        started.set()
        done.wait()

    t = threading.Thread(target=thread)
    t.start()
    started.wait()
    try:
        with pytest.raises(peers.ProcessGone, match=f"{tids[0]} is a thread of process {os.getpid()}, not a process"):
            peers.hold(tids[0])
    finally:
        done.set()
        t.join()
