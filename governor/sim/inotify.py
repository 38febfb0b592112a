"""inotify through ctypes (the stdlib has no binding): the simulated board waits on writes into its tree."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_HEADER = struct.Struct("iIII")


class Inotify:
    """One inotify instance; ``fd`` is readable when events are queued (for select/poll)."""

    def __init__(self):
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, Path] = {}

    def watch(self, directory: Path, mask: int) -> None:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")
        self._dirs[wd] = Path(directory)

    def read(self) -> list[tuple[Path, str, int]]:
        """The queued events as (directory, entry name, mask); empty when none are queued."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out, pos = [], 0
        while pos < len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, pos)
            name = data[pos + _HEADER.size: pos + _HEADER.size + length].rstrip(b"\0").decode(errors="replace")
            pos += _HEADER.size + length
            if wd in self._dirs:
                out.append((self._dirs[wd], name, mask))
        return out

    def close(self) -> None:
        os.close(self.fd)
