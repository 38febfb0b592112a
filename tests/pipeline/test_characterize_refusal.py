"""One writer: `ftgov characterize` on a board refuses to sweep devfreq while ftgovd serves, and as root refuses a
sysfs root another user can write."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from governor.cli import build_parser
from governor.cli.doctor import refuse_while_daemon_runs
from governor.errors import FtgovError
from governor.pipeline import characterize
from tests.support.daemon import limits


def hardware_args(orin, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "task").mkdir()
    return build_parser().parse_args(["characterize", "--model-dir", str(tmp_path / "model"), "--task", "sst2",
                                      "--task-dir", str(tmp_path / "task"), "--sysfs-root", str(orin),
                                      "--out", str(tmp_path / "out.csv"), "--quiet"])


def test_refused_while_ftgovd_runs(orin, start_daemon, tmp_path, monkeypatch):
    d = start_daemon()
    monkeypatch.setenv("FTGOV_SOCKET", d.socket)
    before = limits(orin)
    with pytest.raises(FtgovError, match=r"ftgovd is active .* answers a ping.*systemctl stop ftgovd\.socket ftgovd"):
        characterize.run(hardware_args(orin, tmp_path))
    assert limits(orin) == before
    assert not (tmp_path / "out.csv").exists()


def test_as_root_a_sysfs_root_another_user_owns_is_refused(orin, tmp_path, monkeypatch):
    """Its owner could swap the GPU node for a link between the sweep's read and its write: root would write the
    owner's levels into another node (docs/security.md, "Files the daemon opens as root")."""
    if os.geteuid() != 0:
        pytest.skip("the tree's owner is checked when root sweeps")
    monkeypatch.setenv("FTGOV_SOCKET", str(tmp_path / "none.sock"))
    os.chown(orin, 4242, 4242)
    with pytest.raises(FtgovError, match=f"sysfs_root {orin} belongs to uid 4242"):
        characterize.run(hardware_args(orin, tmp_path))
    assert not (tmp_path / "out.csv").exists()


def test_not_refused_when_nothing_listens(tmp_path):
    refuse_while_daemon_runs("test", str(tmp_path / "none.sock"))  # no socket: nothing to fight with


def test_refused_when_the_socket_refuses_this_user(tmp_path, monkeypatch):
    """A socket this user may not connect to may have a daemon behind it: refused, not taken for none."""
    from governor.cli import doctor
    from governor.client import SocketPermissionError

    def refuse(path, timeout_s):
        raise SocketPermissionError(f"permission denied on {path}")

    monkeypatch.setattr(doctor, "Connection", refuse)
    with pytest.raises(FtgovError, match="cannot tell whether ftgovd is active.*permission denied.*Run this as root"):
        refuse_while_daemon_runs("test", str(tmp_path / "theirs.sock"))


def test_refused_when_something_accepts_but_does_not_answer(tmp_path):
    path = str(tmp_path / "mute.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def accept_and_hang_up():
        conn, _ = listener.accept()
        conn.close()

    t = threading.Thread(target=accept_and_hang_up)
    t.start()
    try:
        with pytest.raises(FtgovError, match="did not answer a ping"):
            refuse_while_daemon_runs("test", path)
    finally:
        t.join(10)
        listener.close()
