"""systemd integration without a dependency: sd_notify datagrams and socket activation (LISTEN_FDS).

Both protocols are small and stable (sd_notify(3), sd_listen_fds(3)); speaking them directly keeps the daemon free of
libsystemd at run time. Outside systemd every call here is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping

from governor.daemon import logs

SD_LISTEN_FDS_START = 3


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET")
        if addr and addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace
        self.addr = addr
        self.sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        ours = not pid or pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec and usec.isascii() and usec.isdigit() and ours else None

    def send(self, *lines: str) -> bool:
        """Send one message; False where the reader's queue is full and it was dropped (the caller may send its latest
        state again once the reader caught up: the last of a burst of changes has no later one to supersede it)."""
        if not self.addr:
            return True
        logs.flush()  # a message never overtakes the log lines that led to it (they may wait for the loop turn's end)
        if self.sock is None:
            # Non-blocking: a reader that falls behind (or a full socket buffer) must never stall the daemon; a dropped
            # STATUS= is superseded by the next one, or sent again (Ticker) where it was the last.
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            self.sock.sendto("\n".join(lines).encode(), self.addr)
        except BlockingIOError:
            return False  # the reader's queue is full (net.unix.max_dgram_qlen messages unread)
        except OSError:
            pass  # systemd gone (shutdown): nothing to tell now
        return True

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")


def listen_fds(env: MutableMapping[str, str] | None = None) -> list[int]:
    """File descriptors passed by systemd socket activation, meant for this process; unsets the variables."""
    env = os.environ if env is None else env
    if env.get("LISTEN_PID") != str(os.getpid()):
        return []
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count))
    for fd in fds:
        try:
            os.set_inheritable(fd, False)
        except OSError as e:
            from governor.errors import FtgovError

            raise FtgovError(f"LISTEN_FDS={count} but file descriptor {fd} is not open: {e.strerror}") from e
    return fds

