"""Every sysfs and procfs path goes through here, so the same code runs on a Jetson, a simulated Orin and a test tree.

``Root("/")`` is the real machine; ``Root("/tmp/x")`` maps ``/sys/class/devfreq`` to ``/tmp/x/sys/class/devfreq``.
Symlinks inside the tree are absolute on a real board (``/sys/devices/...``); ``resolve`` re-roots them so that a
fake tree can carry the same absolute links as the board it mirrors.
"""

from __future__ import annotations

import os
from pathlib import Path

from governor.errors import BackendError


class Root:
    """A file-system root under which absolute paths like /sys/... are looked up."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Root({str(self.root)!r})"

    def path(self, absolute: str | os.PathLike) -> Path:
        """Map an absolute board path to this root."""
        rel = str(absolute).lstrip("/")
        return self.root / rel if rel else self.root

    def unroot(self, path: Path) -> str:
        """The board path of a path under this root (for messages and the state file)."""
        try:
            return "/" + str(path.relative_to(self.root)).lstrip("/")
        except ValueError:
            return str(path)

    def resolve(self, path: Path) -> Path:
        """Follow symlinks one hop at a time, mapping absolute link targets into the root."""
        path = Path(path)
        for _ in range(40):  # the kernel's own limit on link hops
            parts = path.parts
            resolved = self.root if path.is_relative_to(self.root) else Path(parts[0])
            rest = path.relative_to(resolved).parts
            changed = False
            for i, part in enumerate(rest):
                candidate = resolved / part
                if candidate.is_symlink():
                    target = os.readlink(candidate)
                    base = self.path(target) if target.startswith("/") else candidate.parent / target
                    path = Path(os.path.normpath(base.joinpath(*rest[i + 1 :])))
                    changed = True
                    break
                resolved = candidate
            if not changed:
                return resolved
        raise BackendError(f"too many symlinks resolving {self.unroot(path)}")


MAX_ATTR_BYTES = 65536  # a sysfs attribute is at most a page; never read an endless file (a link to /dev/zero) whole


def read_once(path: str | os.PathLike) -> bytes:
    """One open and one read (at most MAX_ATTR_BYTES), without Python's file layers: sysfs attributes and /proc
    files on the daemon's register path. OSError is the caller's to convert."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, MAX_ATTR_BYTES)
    finally:
        os.close(fd)


def read_text(path: Path) -> str:
    """Read a sysfs attribute, stripped; OSError becomes BackendError naming the file."""
    try:
        data = read_once(path)
    except OSError as e:
        raise BackendError(f"cannot read {path}: {e.strerror or e}") from e
    return data.decode(errors="replace").strip()


def read_int(path: Path) -> int:
    text = read_text(path)
    try:
        return int(text.split()[0])
    except (ValueError, IndexError) as e:
        raise BackendError(f"{path} holds {text!r}, not an integer") from e


def write_text(path: Path, value: str) -> None:
    """Write one sysfs attribute the way the kernel expects: a single write of the whole value."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        raise BackendError(f"cannot open {path} for writing: {e.strerror or e}") from e
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise BackendError(f"cannot write {value!r} to {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)
