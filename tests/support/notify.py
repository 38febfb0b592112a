"""The receiving end of sd_notify, for running ftgovd outside systemd: wait for READY=1 and STATUS= messages instead
of sleeping or polling. The daemon's sending end is governor/daemon/notify.py."""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable


class DaemonExited(RuntimeError):
    """The process being waited on exited without sending the message waited for."""


class NotifyListener:
    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.messages: list[str] = []

    def wait(self, predicate: Callable[[str], bool], timeout_s: float = 10.0, pidfd: int | None = None) -> str:
        """The next message satisfying predicate; TimeoutError after timeout_s. With ``pidfd`` (os.pidfd_open of the
        sender), DaemonExited as soon as that process is gone and has left no such message: a daemon that dies at
        start fails the wait at once instead of at the timeout."""
        deadline = time.monotonic() + timeout_s
        watched = [self.sock] if pidfd is None else [self.sock, pidfd]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching sd_notify message within {timeout_s} s (last: {self.messages[-3:]})")
            readable, _, _ = select.select(watched, [], [], left)
            if self.sock in readable:
                msg = self.sock.recv(4096).decode(errors="replace")
                self.messages.append(msg)
                if predicate(msg):
                    return msg
            elif readable:
                # A datagram is queued when sendto returns: everything the process sent is here already.
                for msg in self._queued():
                    if predicate(msg):
                        return msg
                raise DaemonExited(f"the process exited without a matching sd_notify message "
                                   f"(last: {self.messages[-3:]})")

    def _queued(self) -> list[str]:
        got = []
        self.sock.setblocking(False)
        try:
            while True:
                got.append(self.sock.recv(4096).decode(errors="replace"))
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        self.messages += got
        return got

    def drain(self) -> None:
        """Forget every message already queued (so that the next wait sees only what happens from now on)."""
        self._queued()

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
