"""governor.daemon.holds: which connection and which process hold which job, with real child processes."""

from __future__ import annotations

import os
import select
import subprocess

from governor.daemon import peers
from governor.daemon.holds import ENDED_KEPT, Holds
from governor.daemon.jobs import ActiveJob, Ended
from governor.features import Features

FEATURES = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


class Ends:
    """The rest of a job's end, as the server does it: records each call and answers an Ended."""

    def __init__(self):
        self.calls: list[tuple[int, str]] = []
        self.jobs: dict[int, ActiveJob] = {}

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
    holds = Holds(ends)
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
    holds = Holds(ends)
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
    holds = Holds(ends)
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
    holds = Holds(ends)
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
    holds = Holds(ends)
    conn, proc = object(), children()
    job = job_of(ends, holds, 1, proc, conn)
    holds.release(job.job_id)  # the pin failed: the pin controller dropped the job itself
    assert holds.count(conn) == 0 and holds.processes() == 0
    proc.stdin.close()
    proc.wait(timeout=10)
    holds.processes_exited()
    assert ends.calls == []
    holds.close()
