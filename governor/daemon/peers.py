"""Who is on the other end of the socket, and which process a job is: SO_PEERCRED, SO_PEERPIDFD, /proc, pidfds.

Identity comes from the kernel, never from what the client says. A pid *number* names a process only while that
process lives: once it exits, the number can be handed to anyone's next process. So the connecting process is held
by a pidfd, taken from the socket itself where the kernel can give one (SO_PEERPIDFD, Linux >= 6.5: the process
that connected, even if it has exited since), else opened by number and accepted only when the real uid read from
that process matches the socket's credentials. A job's process is checked against the start time the kernel reports,
so a recycled PID can never keep a pin alive.
"""

from __future__ import annotations

import errno
import grp
import os
import platform
import select
import socket
import struct
from dataclasses import dataclass

from governor.sysfs import read_once

# Python's socket module has no names for these before 3.13/never. The numbers are those of asm-generic/socket.h,
# which x86, Arm and RISC-V use; alpha, mips, parisc and sparc number them differently, and there we do without.
_GENERIC_ARCHES = ("x86_64", "i386", "i686", "aarch64", "arm64", "armv7l", "armv8l", "riscv64")
_GENERIC = platform.machine() in _GENERIC_ARCHES
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59 if _GENERIC else None)  # Linux >= 4.13
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77 if _GENERIC else None)  # Linux >= 6.5
_NO_OPTION = (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP)
# Python's getsockopt takes at most 1024 bytes: 256 groups. A peer in more is looked up in /proc instead.
_GROUPS_BUF = 1024


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return Peer(pid, uid, gid)


def group_id(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def peer_groups(sock: socket.socket, peer: Peer) -> set[int] | None:
    """The groups the peer had when it connected (SO_PEERGROUPS: from the socket's credentials, not from a pid
    that may since name another process); None where the kernel cannot say (older than 4.13, more than 256 groups)."""
    if SO_PEERGROUPS is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _GROUPS_BUF)
    except OSError as e:
        if e.errno in _NO_OPTION or e.errno == errno.ERANGE:
            return None
        raise
    return {peer.gid, *struct.unpack(f"{len(raw) // 4}I", raw)}


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


class CannotHold(ProcessGone):
    """No process can be held here: pidfd_open is refused. A ProcessGone, so that every path that goes on without a
    process it cannot hold goes on without this one; a registration's reply tells it apart (a fault of the daemon's
    host, not of the pid)."""


# pidfd_open(2) has no EPERM of its own: a system call filter gives it. Unverified on a board: whether JetPack 5's
# systemd 245 and its libseccomp pass pidfd_open in @system-service (systemd added the Linux 5.3 calls to its groups
# in v244; a libseccomp that does not know a call cannot allow it by name).
PIDFD_REFUSED = ("pidfd_open is refused (EPERM) by a system call filter, so ftgovd cannot hold a job's process by its "
                 "pid (on a kernel older than 6.5, a Jetson's, no job at all): on a systemd older than 244, or with a "
                 "libseccomp that does not know the call, the unit's SystemCallFilter=@system-service leaves it out; "
                 "`systemctl edit ftgovd` and add SystemCallFilter=pidfd_open (docs/install.md, Troubleshooting)")


def pidfd_problem() -> str | None:
    """Why this process cannot open pidfds (checked on its own pid), or None when it can."""
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError as e:
        return PIDFD_REFUSED if e.errno == errno.EPERM else f"pidfd_open fails: {e.strerror}"
    os.close(fd)
    return None


class NotTheirs(ProcessGone):
    """The process is alive but belongs to another uid than the one that asks (or that the record names)."""


def _alive(pidfd: int) -> bool:
    poll = select.poll()  # not select(): it cannot take a descriptor numbered 1024 or more
    poll.register(pidfd, select.POLLIN)
    return not poll.poll(0)  # a pidfd turns readable when its process exits


@dataclass
class HeldProcess:
    pid: int
    pidfd: int
    start_ticks: int  # the kernel's start time of the process, in clock ticks since boot (/proc/PID/stat field 22)
    uid: int
    # Held by number (no SO_PEERPIDFD): its real uid is read again on every use. From the socket's own pidfd it is
    # the process that connected, checked once.
    recheck_uid: bool = True

    def close(self) -> None:
        try:
            os.close(self.pidfd)
        except OSError:
            pass

    def another(self) -> HeldProcess:
        """A hold of its own on the same process (a pidfd duplicate); ProcessGone once the process has exited, or
        NotTheirs (recheck_uid) once its real uid is no longer the one it had when it was first held."""
        if not _alive(self.pidfd):
            raise ProcessGone(f"process {self.pid} has exited")
        start_ticks(self.pid)  # on its way out (its pidfd not readable yet) is gone too
        real_uid = _real_uid(self.pid) if self.recheck_uid else self.uid
        if not _alive(self.pidfd):  # the reads may have been of a successor on the same number
            raise ProcessGone(f"process {self.pid} has exited")
        if real_uid != self.uid:
            raise NotTheirs(f"process {self.pid} now belongs to uid {real_uid}, not uid {self.uid}")
        return HeldProcess(self.pid, os.dup(self.pidfd), self.start_ticks, self.uid, self.recheck_uid)


def _read_proc(pid: int, name: str) -> bytes:
    """/proc/PID/NAME in one read (a seq_file hands over the whole of it): on the register and accept paths."""
    try:
        return read_once(f"/proc/{pid}/{name}")
    except OSError as e:
        raise ProcessGone(f"no process {pid}") from e


# include/linux/sched.h: set as do_exit begins. A process's files close (a pipe a child waits on reads EOF) before the
# end of its exit, where its pidfd turns readable: a process seen exiting is gone, whatever its pidfd says yet.
PF_EXITING = 0x4


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); ProcessGone for a zombie or a
    process on its way out (PF_EXITING in field 9; for a thread-group leader that exits before its threads, as for
    its zombie, that is the process)."""
    stat = _read_proc(pid, "stat")
    # The command name (field 2) is in parentheses and may itself contain spaces or parentheses.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z" or int(fields[6]) & PF_EXITING:
        raise ProcessGone(f"process {pid} has exited")
    return int(fields[19])


def _real_uid(pid: int) -> int:
    for line in _read_proc(pid, "status").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    raise ProcessGone(f"cannot read the owner of process {pid}")


def process_identity(pid: int) -> tuple[int, int]:
    """(start time in clock ticks since boot, real uid) from /proc: together with the pid, names one process."""
    return start_ticks(pid), _real_uid(pid)


def _identity_of(pidfd: int, pid: int) -> tuple[int, int]:
    """What /proc says of pid, and proof that it was the pidfd's process: alive after the read, it held the number
    throughout (a number is not reused before its process has exited and been reaped)."""
    identity = process_identity(pid)
    if not _alive(pidfd):
        raise ProcessGone(f"process {pid} has exited")
    return identity


def hold(pid: int, expected_start_ticks: int | None = None) -> HeldProcess:
    """Open a pidfd for pid, then read the identity (start time, real uid) of the process it refers to.

    The pidfd is opened first and checked alive after the read, so the identity is that of the held process (a
    recycled PID shows the new process's start time). Re-adoption passes the start time it recorded, and a different
    one means the PID was reused.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno == errno.EPERM:
            raise CannotHold(PIDFD_REFUSED) from e
        if e.errno in (errno.ENOENT, errno.EINVAL) and (leader := _thread_group(pid)) not in (None, pid):
            raise ProcessGone(f"{pid} is a thread of process {leader}, not a process: give the process's pid "
                              "(os.getpid())") from e
        raise ProcessGone(f"no process {pid}" if e.errno == errno.ESRCH else
                          f"cannot open process {pid}: {e.strerror}") from e
    try:
        start, uid = _identity_of(pidfd, pid)
        if expected_start_ticks is not None and start != expected_start_ticks:
            raise ProcessGone(f"process {pid} is not the one we held (started at another time)")
    except ProcessGone:
        os.close(pidfd)
        raise
    return HeldProcess(pid, pidfd, start, uid)


def _thread_group(tid: int) -> int | None:
    """The process (thread group) that thread id ``tid`` belongs to, from /proc; None where it cannot be read. A
    thread's id opens no pidfd (ENOENT, EINVAL before Linux 6.9), though /proc shows it."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _socket_pidfd(sock: socket.socket) -> int | None:
    """A pidfd for the process that connected (SO_PEERPIDFD), or None where the kernel has no such option."""
    if SO_PEERPIDFD is None:
        return None
    try:
        return struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError as e:
        if e.errno in _NO_OPTION:
            return None
        if e.errno == errno.ESRCH:  # 6.5 to 6.15 give no pidfd for a peer that has been reaped
            raise ProcessGone(f"process {_pid_or(sock)} that connected has exited") from e
        raise


def _pid_or(sock: socket.socket) -> str:
    try:
        return str(peer_of(sock).pid)
    except OSError:
        return "?"


def hold_peer(sock: socket.socket, peer: Peer) -> HeldProcess:
    """The process that connected, held: ProcessGone when it has exited (or lives in another pid namespace),
    NotTheirs when the pid now names a process of another uid than the socket's credentials."""
    pidfd = _socket_pidfd(sock)
    if pidfd is None:
        held = hold(peer.pid)  # by number: what it names now must belong to the uid that connected
        if held.uid != peer.uid:
            held.close()
            raise NotTheirs(f"process {peer.pid} belongs to uid {held.uid}, but uid {peer.uid} connected: the "
                            "connecting process has exited and its pid was reused")
        return held
    try:
        # The pidfd is the process that connected, and SO_PEERCRED its credentials: only the start time is read (a
        # live pidfd after the read proves it was this process's).
        start = start_ticks(peer.pid)
        if not _alive(pidfd):
            raise ProcessGone(f"process {peer.pid} that connected has exited")
    except ProcessGone:
        os.close(pidfd)
        raise
    return HeldProcess(peer.pid, pidfd, start, peer.uid, recheck_uid=False)


def is_member(sock: socket.socket, peer: Peer, process: HeldProcess | None, group_gid: int | None) -> bool:
    """Whether the peer was in the group when it connected: SO_PEERGROUPS, else the groups of the process held for
    it (its uid checked against the socket's), else its primary group alone."""
    if group_gid is None:
        return False
    groups = peer_groups(sock, peer)
    if groups is None:
        groups = groups_of(process.pid, peer.gid) if process is not None else {peer.gid}
    return group_gid in groups


def process_for_job(connected: HeldProcess | None, peer: Peer, pid: int | None) -> HeldProcess:
    """The process a new job holds: the connecting process (pid left out, or its own pid), else pid held by number.

    ProcessGone when it has exited, including a connecting process already gone when the connection was accepted (its
    number may be someone else's by now); NotTheirs when it no longer has the uid it was held with. Whether the caller
    may name a process held by number is the caller's check (its uid is in the hold).
    """
    if (pid is None or pid == peer.pid) and connected is not None:
        return connected.another()
    if pid is None:
        if (why := pidfd_problem()) is not None:  # not held at the connection because none can be
            raise CannotHold(why)
        raise ProcessGone(f"the process that connected (pid {peer.pid}) had exited by the time the daemon accepted "
                          "the connection: pass pid")
    return hold(pid)


def hold_recorded(pid: int, expected_start_ticks: int, uid: int) -> HeldProcess:
    """Re-adoption: the process a saved job record names, if it is still that job's.

    pid 0 and 1 are never a job. The record's uid (the uid that registered) must be the process's real uid, unless
    root registered it (root may name any process): a job held by mistake for another user's process, or a forged
    record, is not re-adopted. ProcessGone (or NotTheirs) otherwise.
    """
    if pid <= 1:
        raise NotTheirs(f"pid {pid} is never a job")
    held = hold(pid, expected_start_ticks)
    if uid != 0 and held.uid != uid:
        held.close()
        raise NotTheirs(f"process {pid} belongs to uid {held.uid}, but the record says uid {uid}")
    return held
