"""Who gets a connection, and how long an idle one is kept: the rules that keep one user (or a few) from locking
everyone out, root included.

A connection costs two descriptors and a slot of limits.max_connections. Each uid may hold at most
limits.max_connections_per_uid of them (by default a sixteenth of the total, so that it takes sixteen users acting
together to fill the daemon), and root has limits.root_reserve_connections more beyond the total, so that the
operator's `ftgov status` and `ftgov restore` get in while members hold every ordinary slot. A connection that holds
no job and sends nothing for limits.idle_timeout_s is closed: slots are not kept by sockets left open for nothing.
Root's connections are not counted against the per-uid cap: the operator's tools (`ftgov status`, the Prometheus
exporter that a local user can make busy) must get in whatever the load.

Descriptors: the daemon keeps FD_RESERVE of its open-file limit (RLIMIT_NOFILE, read at start) for itself and root.
A non-root connection is refused once the descriptors in use come within FD_RESERVE of the limit, and root's within
FD_RESERVE_DAEMON: the daemon can then always read sysfs and the rails, save the state file and write its store, and
root can always connect, whatever a member does with its connections.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable

log = logging.getLogger("ftgovd")

# Descriptors kept from non-root connections: root's reserve connections (two each), a burst of accepts
# (ACCEPT_BATCH), and the daemon's own files (sysfs attributes, the state file's temp file and directory, the store).
FD_RESERVE = 96
FD_RESERVE_DAEMON = 32  # kept even from root: the daemon's own files
# Connections accepted in one event-loop turn, before any of them is checked: each holds a descriptor until then.
ACCEPT_BATCH = 16


def raise_fd_limit(limits) -> int | None:
    """Room for ``limits`` (a LimitsConfig): a connection takes two descriptors (its socket and a pidfd for its
    process), a job one more. The soft limit is 1024 by default (for select()'s sake; the daemon never uses select()),
    the hard limit under systemd 524288: take what the limits need, never more than the hard limit allows. At start
    and at each reload (raised limits raise it; it is never lowered). Returns the soft limit now (None: unlimited)."""
    # + listening socket, epolls, files, logs, and the descriptors kept for root and the daemon itself
    need = 2 * (limits.max_connections + limits.root_reserve_connections) + limits.max_jobs + 64 + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if soft < need:
            log.warning("open files limited to %d (hard limit), but limits.max_connections=%d and max_jobs=%d need "
                        "about %d: some connections will wait or be refused", soft, limits.max_connections,
                        limits.max_jobs, need)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_refusal(limits, *, uid: int, total: int, of_uid: int, fds_in_use: int = 0,
                       fd_limit: int | None = None) -> str | None:
    """Why a new connection from uid is refused (a message naming the limit), or None to admit it.

    ``total`` is the number of open connections, ``of_uid`` those of this uid; ``limits`` a LimitsConfig;
    ``fds_in_use`` the descriptors open now (this connection's included), ``fd_limit`` the open-file limit (None:
    unlimited).
    """
    cap = limits.max_connections + (limits.root_reserve_connections if uid == 0 else 0)
    if total >= cap:
        return ("too many connections (limits.max_connections"
                + (" + limits.root_reserve_connections)" if uid == 0 else ")"))
    if uid != 0 and of_uid >= limits.max_connections_per_uid:
        return f"too many connections from uid {uid} (limits.max_connections_per_uid)"
    if fd_limit is not None and fds_in_use + (FD_RESERVE_DAEMON if uid == 0 else FD_RESERVE) > fd_limit:
        return (f"the daemon is near its open-file limit ({fds_in_use} of {fd_limit} in use, the rest kept for root "
                "and the daemon): try again later")
    return None


class IdleTimer:
    """Closes a connection once it has been idle for timeout_s while holding nothing.

    One timer per connection, moved only when it fires: ``touch()`` on every read just notes the time (a request
    costs no timer rescheduling). When it fires, a connection that was active meanwhile, or that holds a job or a
    request in progress (``holds()``), is given another full period from its last activity.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, holds: Callable[[], bool],
                 close: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        self.loop, self.timeout_s, self.holds, self.close, self.clock = loop, timeout_s, holds, close, clock
        self.last_s = clock()
        self.handle: asyncio.TimerHandle | None = loop.call_later(timeout_s, self._fire)

    def touch(self) -> None:
        self.last_s = self.clock()

    def set_timeout(self, timeout_s: float) -> None:
        """A new limits.idle_timeout_s (a reload): counted from the last activity, as if it had always been so."""
        self.timeout_s = timeout_s
        if self.handle is not None:
            self.handle.cancel()
            self.handle = self.loop.call_later(max(0.0, self.last_s + timeout_s - self.clock()), self._fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        now = self.clock()
        if self.holds():
            self.last_s = now
        left_s = self.last_s + self.timeout_s - now
        if left_s > 0:
            self.handle = self.loop.call_later(left_s, self._fire)
            return
        self.handle = None
        self.close()
