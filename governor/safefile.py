"""Files written by root-run code into a directory someone else may control, without following their symlinks.

`ftgov report --out DIR` and the other root-run writers take a directory from the command line. Writing there by
path lets whoever can write to that directory choose what root overwrites: a planted ``summary.md ->
/etc/ld.so.preload`` turns a report into root code execution. So every writer here:

- opens the directory once, walking it from ``/`` (or the working directory) one component at a time, and follows a
  symlink only where nobody but root or the caller could have placed it (its directory is writable by no one else,
  or is sticky like /tmp and the link belongs to root or the caller: the kernel's ``fs.protected_symlinks`` rule);
- checks the opened directory: owned by the caller or root and writable by no one else (``check_dir``; one this call
  created passes);
- writes every file relative to that descriptor: a temp name created with O_CREAT|O_EXCL|O_NOFOLLOW, fchmod on the
  descriptor (never chmod by path), fsync, then renameat over the final name, which replaces a planted link instead
  of following it.

An unsafe directory is refused with one line that names it (`UnsafeDirectory`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from governor.errors import FtgovError

_MAX_LINKS = 40  # what the kernel allows in one lookup (MAXSYMLINKS)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDirectory(FtgovError):
    """A directory that someone other than the caller and root could write to, or a path through their symlink."""


def check_dir(fd: int, path: str | os.PathLike) -> None:
    """A directory is safe to write in when only the caller (or root) can add, remove or replace names in it."""
    st = os.fstat(fd)
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        raise UnsafeDirectory(f"{path}: belongs to uid {st.st_uid}, not to you (uid {euid}) or root: its owner could "
                              "swap the files written there for links; use a directory of your own or a new path")
    if st.st_mode & 0o022:
        raise UnsafeDirectory(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): another "
                              "user could swap the files written there for links; use a directory of your own or a "
                              "new path")


def _may_follow(dirfd: int, name: str) -> bool:
    """Whether the symlink ``name`` in ``dirfd`` can only have been placed by root or the caller."""
    dst = os.fstat(dirfd)
    if not dst.st_mode & 0o022:
        return dst.st_uid in (0, os.geteuid())
    link = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    return bool(dst.st_mode & stat.S_ISVTX) and link.st_uid in (0, os.geteuid())


def open_dir(path: str | os.PathLike, *, create: bool = True, mode: int = 0o755) -> int:
    """An O_DIRECTORY descriptor of ``path``, checked (see the module's docstring); missing components are created
    with ``mode`` when ``create``. The caller closes it."""
    text = os.fspath(path)
    if not text:
        raise UnsafeDirectory("an empty path is not a directory")
    parts = text.split("/")
    fd = os.open("/" if text.startswith("/") else ".", _DIR_FLAGS)
    links = 0
    try:
        todo = [p for p in parts if p not in ("", ".")]
        todo.reverse()  # a stack: the next component last
        while todo:
            name = todo.pop()
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                # Made here, it passes check_dir below (ours, and the umask only takes bits away); made meanwhile by
                # someone else, it is opened and checked like any other.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
                todo.append(name)
                continue
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR) or not stat.S_ISLNK(
                        os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise
                if not _may_follow(fd, name):
                    raise UnsafeDirectory(f"{text}: {name} is a symlink in a directory other users can write to; "
                                          "it is not followed") from None
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), text) from None
                target = os.readlink(name, dir_fd=fd)
                todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                continue
            os.close(fd)
            fd = nfd
        check_dir(fd, text)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _simple(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    return name


def replace_at(dirfd: int, name: str, data: bytes, mode: int = 0o644, *, sync_dir: bool = True) -> None:
    """``data`` as the file ``name`` in ``dirfd``: a fresh temp file (never a planted one), ``mode`` set on the
    descriptor whatever the umask, fsync, then renamed over ``name`` (a link there is replaced, not followed).
    ``sync_dir`` also fsyncs the directory, so that the rename survives a power cut."""
    with _atomic_fd(dirfd, _simple(name), mode, sync_dir) as fd:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


@contextlib.contextmanager
def _atomic_fd(dirfd: int, name: str, mode: int, sync_dir: bool = True) -> Iterator[int]:
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
    try:
        try:
            os.fchmod(fd, mode)
            yield fd
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise
    if sync_dir:
        os.fsync(dirfd)


class OutDir:
    """A checked output directory; every file goes in through its descriptor. Use as a context manager."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True, mode: int = 0o755):
        self.path = Path(path)
        try:
            self.fd = open_dir(path, create=create, mode=mode)
        except OSError as e:
            raise FtgovError(f"{path}: {e.strerror or e}") from e

    def __enter__(self) -> OutDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def write_bytes(self, name: str, data: bytes, mode: int = 0o644) -> None:
        replace_at(self.fd, name, data, mode)

    def write_text(self, name: str, text: str, mode: int = 0o644) -> None:
        self.write_bytes(name, text.encode(), mode)

    @contextlib.contextmanager
    def open(self, name: str, *, text: bool = True, mode: int = 0o644) -> Iterator[io.IOBase]:
        """A file object for ``name``, put in place only when the block ends without an error."""
        with _atomic_fd(self.fd, _simple(name), mode) as fd:
            f = os.fdopen(os.dup(fd), "w" if text else "wb", **({"newline": ""} if text else {}))
            with f:
                yield f

    @contextlib.contextmanager
    def append(self, name: str, *, mode: int = 0o644) -> Iterator[io.TextIOBase]:
        """``name`` opened for appending text (created with ``mode`` if missing); a link or a non-regular file there
        is refused."""
        fd = os.open(_simple(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, mode, dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafeDirectory(f"{self.path / name}: not a regular file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "a", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_file(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> None:
    """``data`` written atomically as ``path``, its directory opened and checked as `OutDir` does."""
    path = Path(path)
    with OutDir(path.parent) as d:
        try:
            d.write_bytes(path.name, data.encode() if isinstance(data, str) else data, mode)
        except OSError as e:
            raise _cannot_write(path, e) from e


@contextlib.contextmanager
def open_file(path: str | os.PathLike, *, text: bool = True, mode: int = 0o644) -> Iterator[io.IOBase]:
    """A file object that becomes ``path`` when the block ends well (see `OutDir.open`)."""
    path = Path(path)
    with OutDir(path.parent) as d:
        try:
            with d.open(path.name, text=text, mode=mode) as f:
                yield f
        except OSError as e:  # the temp file's creation, a write in the block (a full disk), or the rename
            raise _cannot_write(path, e) from e


def _cannot_write(path: Path, e: OSError) -> FtgovError:
    """One line naming the file asked for, not the temp name the error carries (``--out DIR`` for a file: Is a
    directory)."""
    return FtgovError(f"cannot write {path}: {e.strerror or e}")
