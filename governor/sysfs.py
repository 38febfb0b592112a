"""Every sysfs and procfs path goes through here, so the same code runs on a Jetson, a simulated Orin and a test tree.

``Root("/")`` is the real machine; ``Root("/tmp/x")`` maps ``/sys/class/devfreq`` to ``/tmp/x/sys/class/devfreq``.
Symlinks inside the tree are relative on a real board (``../../devices/...``, as the kernel makes them); an absolute
one (``/sys/devices/...``, which a hand-made tree may carry) is re-rooted by ``resolve``, so either kind stays inside
the root.

The daemon opens these files as root, so each open takes only what it claims: attributes are opened with O_NOFOLLOW
(a symlink planted at ``max_freq`` is refused, not followed to /etc/shadow) and must be regular files (a FIFO or
/dev/zero is refused, never read or written). O_NOFOLLOW guards the last component only, on purpose: the real /sys
reaches every device through symlinks in the middle of the path (/sys/class/devfreq/X -> ../../devices/...). Those
middle components are trusted because a sysfs root other than / must belong to root (``trusted_root``). Errors show
at most a few characters of what a file held.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from governor.errors import BackendError, ConfigError


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


def trusted_root(path: str | os.PathLike) -> Root:
    """The sysfs root from the config, refused when root runs the daemon and the root directory is not root's own or
    is writable by others: whoever can write under it decides which files root reads and writes."""
    root = Root(path)
    if os.path.realpath(root.root) == "/" or os.geteuid() != 0:
        return root
    # A root that does not exist yet (no Jetson: the daemon goes on to NVML, or waits for the node) is as safe as the
    # directory it would be created in.
    where = Path(os.path.abspath(root.root))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.stat(where)
    except OSError as e:
        raise ConfigError(f"sysfs_root {root.root}: {e.strerror or e}") from e
    if st.st_uid != 0 or st.st_mode & 0o022:
        named = "" if where == Path(os.path.abspath(root.root)) else f" (its nearest existing parent {where})"
        raise ConfigError(f"sysfs_root {root.root}{named} belongs to uid {st.st_uid} with mode "
                          f"{stat.S_IMODE(st.st_mode):04o}: as root, ftgovd only uses a root it owns and that no one "
                          "else can write to")
    return root


MAX_ATTR_BYTES = 65536  # a sysfs attribute is at most a page; never read an endless file (a link to /dev/zero) whole
EXCERPT_CHARS = 12  # what an error may show of a file's content: enough to see "not a number", too little to leak


def excerpt(text: str) -> str:
    """A few characters of a file's content, quoted, for an error message."""
    return repr(text[:EXCERPT_CHARS]) + ("..." if len(text) > EXCERPT_CHARS else "")


def _open_attr(path: str | os.PathLike, flags: int) -> int:
    # O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever; regular files ignore it.
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except OSError:
        os.close(fd)
        raise
    return fd


def read_once(path: str | os.PathLike) -> bytes:
    """One open and one read (at most MAX_ATTR_BYTES), without Python's file layers: sysfs attributes and /proc
    files on the daemon's register path. OSError is the caller's to convert (ELOOP for a symlink, EINVAL for a file
    that is not regular)."""
    fd = _open_attr(path, os.O_RDONLY)
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
        raise BackendError(f"{path} holds {excerpt(text)}, not an integer") from e


def write_text(path: Path, value: str) -> None:
    """Write one sysfs attribute the way the kernel expects: a single write of the whole value."""
    try:
        # O_TRUNC is what a fake tree needs (sysfs ignores it); with O_NOFOLLOW it can only truncate the file named.
        fd = _open_attr(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        raise BackendError(f"cannot open {path} for writing: {e.strerror or e}") from e
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise BackendError(f"cannot write {value!r} to {path}: {e.strerror or e}") from e
    finally:
        os.close(fd)
