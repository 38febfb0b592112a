"""Binding the daemon's socket when it is started by hand (systemd's socket unit binds it otherwise).

Root binds the socket, then gives it to the ftgov group. Whoever can write to the socket's directory could swap the
socket file for a symlink between the bind and the chown, and have root chown /etc/shadow to the group. So: the
directory must belong to the daemon's user and be writable by no one else, or be sticky like /tmp (either way no
one else can replace the socket's name there); every name is
looked up relative to that directory, opened once; the mode is set by the umask at bind time, so there is no chmod
at all (on Linux, fchmod on a socket's descriptor does not change the socket file, and chmod would follow a symlink);
and the chown is lchown (follow_symlinks=False), which on a swapped name changes the link, never its target.
"""

from __future__ import annotations

import os
import socket
import stat

from governor.daemon import peers
from governor.errors import FtgovError


def _open_dir(directory: str, create: bool) -> int:
    if create:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise FtgovError(f"the socket's directory {directory} does not exist; create it, or give a --socket path in "
                         "an existing directory") from e
    except OSError as e:
        raise FtgovError(f"cannot open the socket's directory {directory}: {e.strerror or e}") from e
    st = os.fstat(fd)
    problem = None
    if st.st_uid not in (os.geteuid(), 0):
        problem = f"belongs to uid {st.st_uid}, neither root nor uid {os.geteuid()} that runs ftgovd"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:  # sticky (/tmp): others cannot replace our name
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem:
        os.close(fd)
        raise FtgovError(f"the socket's directory {directory} {problem}: another user could swap the socket for a "
                         "symlink; use a directory only ftgovd's user can write to (default /run/ftgov)")
    return fd


def _clear_stale(dirfd: int, name: str, path: str) -> None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FtgovError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(name, dir_fd=dirfd)  # stale: its daemon is gone
    else:
        raise FtgovError(f"another ftgovd is already listening on {path}")
    finally:
        probe.close()


def bind_socket(path: str, mode: int, group: str | None, *, create_dir: bool = False) -> socket.socket:
    """Bind and listen on path with exactly mode (and the group, as root): no window with a looser mode, and no
    symlink swap that can redirect the ownership change. The directory is created only with ``create_dir`` (the
    daemon's own runtime directory, as systemd's RuntimeDirectory= would make it); a mistyped path is an error, not a
    new directory left behind."""
    directory, name = os.path.split(os.path.abspath(path))
    dirfd = _open_dir(directory, create_dir)
    try:
        _clear_stale(dirfd, name, path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(path)
        except OSError as e:
            sock.close()
            raise FtgovError(f"cannot bind {path}: {e.strerror or e}") from e
        finally:
            os.umask(old_umask)
        try:
            gid = peers.group_id(group) if group else None
            if gid is not None and os.geteuid() == 0:
                os.chown(name, 0, gid, dir_fd=dirfd, follow_symlinks=False)
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) != mode & 0o777:
                raise FtgovError(f"{path} was replaced while binding it (now mode {st.st_mode:o}): refusing to serve")
            sock.listen(socket.SOMAXCONN)  # a burst of clients waits in the queue, not in EAGAIN
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        os.close(dirfd)
