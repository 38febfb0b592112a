"""A pid number names a process only while it lives: a member must never get a hold on a process that took over
the number of one of theirs (SO_PEERPIDFD, or the real uid of the process checked against the socket's)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from governor.daemon import peers
from tests.support.daemon import FEATURES, limits
from tests.support.security import BASELINE, job_record, needs_root, open_to_members, run_as, write_state

# The member's process: a child connects on the shared socket and exits at once; the parent keeps the connection.
_CONNECT_THEN_EXIT = """
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
child = os.fork()
if child == 0:
    s.connect(sys.argv[1])
    os._exit(0)
os.waitpid(child, 0)
print(child, flush=True)
sys.stdin.readline()
s.settimeout(20)
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": json.loads(sys.argv[2])}).encode()
          + b"\\n")
print(s.makefile().readline(), flush=True)
"""

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _root_process_on(pid: int, attempts: int = 100) -> subprocess.Popen:
    """A root `sleep` placed on pid (ns_last_pid: the next fork takes the number after it). Bounded: other
    processes of the machine fork too, and may take the number first."""
    for _ in range(attempts):
        try:
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError as e:
            pytest.skip(f"cannot write {NS_LAST_PID} to recycle a pid: {e}")
        proc = subprocess.Popen(["sleep", "300"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.skip(f"could not place a process on pid {pid} in {attempts} tries")


def test_a_members_recycled_pid_never_becomes_their_job(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    d.proc.send_signal(signal.SIGSTOP)  # the daemon accepts only once the connecting process is gone
    try:
        attacker = run_as(user, _CONNECT_THEN_EXIT, d.socket, json.dumps(FEATURES))
        gone_pid = int(attacker.stdout.readline())
        victim = _root_process_on(gone_pid)
    finally:
        d.proc.send_signal(signal.SIGCONT)
    try:
        attacker.stdin.write("\n")
        attacker.stdin.flush()
        reply = json.loads(attacker.stdout.readline())
        assert "error" in reply, f"root's process {victim.pid} was registered as the member's job: {reply}"
        assert reply["error"]["code"] in (-32602, -32001), reply
        assert d.client().call("status")["jobs"] == []
        assert limits(orin) == BASELINE
    finally:
        victim.kill()
        victim.wait()
        attacker.kill()
        attacker.wait()


def test_without_pidfds_the_held_process_must_have_the_sockets_uid(root_sleep, monkeypatch):
    # A kernel older than 6.5: the pid is all there is, and what it names now must belong to the uid that connected.
    monkeypatch.setattr(peers, "SO_PEERPIDFD", None)
    a, b = socket.socketpair()
    with a, b:
        uid = 4242 if os.geteuid() == 0 else 0
        with pytest.raises(peers.NotTheirs, match="pid was reused"):
            peers.hold_peer(a, peers.Peer(root_sleep.pid, uid, uid))
        mine = peers.hold_peer(a, peers.Peer(os.getpid(), os.getuid(), os.getgid()))
        assert mine.uid == os.getuid()
        mine.close()


def test_pidfd_from_the_socket_holds_the_process_that_connected():
    if peers.SO_PEERPIDFD is None:
        pytest.skip("no SO_PEERPIDFD number for this architecture")
    a, b = socket.socketpair()
    with a, b:
        try:
            held = peers.hold_peer(a, peers.peer_of(a))
        except OSError as e:
            pytest.skip(f"kernel without SO_PEERPIDFD (Linux < 6.5): {e}")
        assert held.pid == os.getpid() and held.uid == os.getuid()
        held.close()


def test_peer_groups_come_from_the_socket():
    a, b = socket.socketpair()
    with a, b:
        groups = peers.peer_groups(a, peers.peer_of(a))
    if groups is None:
        pytest.skip("kernel without SO_PEERGROUPS (Linux < 4.13)")
    assert groups == {os.getgid(), *os.getgroups()}


def test_a_record_whose_process_belongs_to_another_uid_is_not_readopted(orin, start_daemon, root_sleep):
    # What the daemon saved for the member whose pid was recycled, or a forged record: root's process as uid 4242's.
    needs_root()
    d = start_daemon(launch=False)
    write_state(d, orin, jobs=[job_record(root_sleep.pid, uid=4242)])
    d.start()
    assert d.client().call("status")["jobs"] == []
    assert limits(orin) == BASELINE
    assert "belongs to uid 0, but the record says uid 4242" in d.log()


_DROP_TO_4242 = """
import os, sys
sys.stdin.readline()
os.setuid(4242)
print("dropped", flush=True)
sys.stdin.readline()
"""


def test_a_held_process_whose_real_uid_changed_is_not_handed_to_a_new_job():
    # Each new job on the connection's process reads its real uid again: a process that is no longer the uid that
    # connected (here root's, turned 4242's) is not that uid's to register.
    needs_root()
    proc = subprocess.Popen([sys.executable, "-c", _DROP_TO_4242], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        held = peers.hold(proc.pid)
        assert held.uid == 0
        held.another().close()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "dropped"
        with pytest.raises(peers.NotTheirs, match="now belongs to uid 4242"):
            held.another()
        held.close()
    finally:
        proc.kill()
        proc.wait()


def test_without_peergroups_membership_comes_from_the_held_process_only(root_sleep, monkeypatch):
    # Never from whatever the peer's pid names now: with no held process, the primary group from SO_PEERCRED alone.
    monkeypatch.setattr(peers, "SO_PEERGROUPS", None)
    a, b = socket.socketpair()
    with a, b:
        stranger = peers.Peer(root_sleep.pid, 4242, 4242)
        assert not peers.is_member(a, stranger, None, os.getgid() if os.getgid() != 4242 else 0)
        assert peers.is_member(a, stranger, None, 4242)
        assert not peers.is_member(a, stranger, None, None)


def test_a_process_on_its_way_out_is_gone_before_its_pidfd_says_so(monkeypatch):
    # do_exit sets PF_EXITING, then closes the process's files (a child waiting on a pipe from it reads EOF and may
    # register at once), and only at its end makes the pidfd readable: the flag in /proc/PID/stat is what tells.
    held = peers.hold(os.getpid())
    try:
        held.another().close()
        real = peers._read_proc

        def exiting(pid, name):
            data = real(pid, name)
            if name != "stat":
                return data
            head, tail = data[:data.rindex(b")") + 2], data[data.rindex(b")") + 2:].split()
            tail[6] = str(int(tail[6]) | peers.PF_EXITING).encode()
            return head + b" ".join(tail)

        monkeypatch.setattr(peers, "_read_proc", exiting)
        with pytest.raises(peers.ProcessGone, match="has exited"):
            held.another()
    finally:
        held.close()
