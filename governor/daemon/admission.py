"""Who gets a connection, and how long an idle one is kept: the rules that keep one user (or a few) from locking
everyone out, root included.

A connection costs two descriptors and a slot of limits.max_connections. Each uid may hold at most
limits.max_connections_per_uid of them (by default a sixteenth of the total, so that it takes sixteen users acting
together to fill the daemon), and root has limits.root_reserve_connections more beyond the total, so that the
operator's `ftgov status` and `ftgov restore` get in while members hold every ordinary slot. A connection that holds
no job and sends nothing for limits.idle_timeout_s is closed: slots are not kept by sockets left open for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def connection_refusal(limits, *, uid: int, total: int, of_uid: int) -> str | None:
    """Why a new connection from uid is refused (a message naming the limit), or None to admit it.

    ``total`` is the number of open connections, ``of_uid`` those of this uid; ``limits`` a LimitsConfig.
    """
    cap = limits.max_connections + (limits.root_reserve_connections if uid == 0 else 0)
    if total >= cap:
        return ("too many connections (limits.max_connections"
                + (" + limits.root_reserve_connections)" if uid == 0 else ")"))
    if of_uid >= limits.max_connections_per_uid:
        return f"too many connections from uid {uid} (limits.max_connections_per_uid)"
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
