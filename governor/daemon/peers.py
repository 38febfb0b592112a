"""Who is on the other end of the socket, and which process a job is: SO_PEERCRED, /proc, pidfds.

Identity comes from the kernel (SO_PEERCRED), never from what the client says. A job's process is held by a pidfd,
opened at once and checked against the start time the kernel reports, so a recycled PID can never keep a pin alive.
"""

from __future__ import annotations

import grp
import os
import select
import socket
import struct
from dataclasses import dataclass
from typing import Optional

from governor.sysfs import read_once


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return Peer(pid, uid, gid)


def group_id(name: str) -> Optional[int]:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def groups_of(pid: int, primary_gid: int) -> set[int]:
    """The process's supplementary groups from /proc (what the kernel checked when it let the peer connect)."""
    groups = {primary_gid}
    try:
        for line in _read_proc(pid, "status").splitlines():
            if line.startswith(b"Groups:"):
                groups.update(int(g) for g in line.split()[1:])
                break
    except (ProcessGone, ValueError):
        pass
    return groups


class ProcessGone(Exception):
    pass


@dataclass
class HeldProcess:
    pid: int
    pidfd: int
    start_ticks: int  # the kernel's start time of the process, in clock ticks since boot (/proc/PID/stat field 22)
    uid: int

    def close(self) -> None:
        try:
            os.close(self.pidfd)
        except OSError:
            pass

    def another(self) -> "HeldProcess":
        """A hold of its own on the same process (a pidfd duplicate); ProcessGone once the process has exited."""
        poll = select.poll()  # not select(): it cannot take a descriptor numbered 1024 or more
        poll.register(self.pidfd, select.POLLIN)
        if poll.poll(0):  # a pidfd turns readable when its process exits
            raise ProcessGone(f"process {self.pid} has exited")
        return HeldProcess(self.pid, os.dup(self.pidfd), self.start_ticks, self.uid)


def _read_proc(pid: int, name: str) -> bytes:
    """/proc/PID/NAME in one read (a seq_file hands over the whole of it): on the register and accept paths."""
    try:
        return read_once(f"/proc/{pid}/{name}")
    except OSError as e:
        raise ProcessGone(f"no process {pid}") from e


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); ProcessGone for a zombie."""
    stat = _read_proc(pid, "stat")
    # The command name (field 2) is in parentheses and may itself contain spaces or parentheses.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z":
        raise ProcessGone(f"process {pid} has exited")
    return int(fields[19])


def process_identity(pid: int) -> tuple[int, int]:
    """(start time in clock ticks since boot, real uid) from /proc: together with the pid, names one process."""
    start = start_ticks(pid)
    status = _read_proc(pid, "status")
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            return start, int(line.split()[1])
    raise ProcessGone(f"cannot read the owner of process {pid}")


def hold(pid: int, expected_start_ticks: Optional[int] = None, *, known_uid: Optional[int] = None) -> HeldProcess:
    """Open a pidfd for pid, then read the identity of the process it refers to.

    The pidfd is opened first: whatever process it holds is the one /proc shows right after (a recycled PID would
    show the new process's start time on both), so one read gives a consistent (pidfd, start time, uid). Re-adoption
    passes the start time it recorded, and a different one means the PID was reused.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        raise ProcessGone(f"no process {pid}" if e.errno == 3 else f"cannot open process {pid}: {e.strerror}") from e
    try:
        # The peer's own process: the kernel already told us its uid (SO_PEERCRED); only the start time is needed.
        start, uid = (start_ticks(pid), known_uid) if known_uid is not None else process_identity(pid)
        if expected_start_ticks is not None and start != expected_start_ticks:
            raise ProcessGone(f"process {pid} is not the one we held (started at another time)")
    except ProcessGone:
        os.close(pidfd)
        raise
    return HeldProcess(pid, pidfd, start, uid)
