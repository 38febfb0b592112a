"""See every change to the fake devfreq files, and wait for one without polling (inotify, through the simulator's
binding governor.sim.inotify).

The fault tests use it to wait until the daemon has re-applied a pin, and to check that nothing but the pin and
restore paths touched the files (which files changed, and how: written, created, deleted, renamed).
"""

from __future__ import annotations

import select
import time
from pathlib import Path

from governor.sim.inotify import Inotify

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_CLOSE_NOWRITE = 0x10  # a file opened for reading was closed: someone read it
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
CHANGES = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
NAMES = {IN_MODIFY: "modify", IN_ATTRIB: "attrib", IN_CLOSE_WRITE: "close_write", IN_CLOSE_NOWRITE: "close_nowrite",
         IN_MOVED_FROM: "moved_from", IN_MOVED_TO: "moved_to", IN_CREATE: "create", IN_DELETE: "delete",
         IN_DELETE_SELF: "delete_self"}


class Watch:
    """Watches directories (their entries' contents and names) for changes."""

    def __init__(self, *directories: Path, mask: int = CHANGES):
        self._ino = Inotify()
        self.fd = self._ino.fd
        for d in directories:
            self._ino.watch(Path(d), mask)
        self.events: list[tuple[str, str]] = []  # (file name, kind), in order

    def read(self, timeout_s: float) -> list[tuple[str, str]]:
        """The events that arrive within timeout_s (returns at the first batch)."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout_s))
        if not ready:
            return []
        out = [(name, kind) for _dir, name, mask in self._ino.read() for bit, kind in NAMES.items() if mask & bit]
        self.events += out
        return out

    def drain(self) -> list[tuple[str, str]]:
        """Everything queued now, without waiting."""
        got = []
        while True:
            batch = self.read(0)
            if not batch:
                return got
            got += batch

    def wait(self, predicate, timeout_s: float = 10.0) -> None:
        """Until predicate() holds, checking it once now and again after each batch of events."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"condition not met within {timeout_s} s; events: {self.events[-10:]}")
            self.read(left)

    def close(self) -> None:
        self._ino.close()
