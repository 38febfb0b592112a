"""The parts of `ftgov doctor` that read board files and decide who may use the socket."""

from __future__ import annotations

import grp
import os
import pwd
import socket

import pytest

from governor.cli import doctor
from tests.support import NVPMODEL_CONF


def test_l4t_release():
    assert doctor.l4t_release("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic") == (36, "R36.4.3")
    assert doctor.l4t_release("# R35 (release), REVISION: 4.1, GCID: 33958178") == (35, "R35.4.1")
    assert doctor.l4t_release("garbage") is None


def test_parse_nvpmodel():
    modes, default = doctor.parse_nvpmodel(NVPMODEL_CONF)
    assert modes == {0: ("MAXN", None), 2: ("MODE_30W", 612000000)}
    assert default == 2


@pytest.fixture
def group_socket(tmp_path):
    """A listening socket whose group has a member named in /etc/group, as root can make it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the socket")
    members = [(g, m) for g in grp.getgrall() for m in g.gr_mem if _user_exists(m)]
    if not members:
        pytest.skip("no group with a member in /etc/group on this machine")
    group, member = members[0]
    path = str(tmp_path / "s.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chown(path, 0, group.gr_gid)
    os.chmod(path, 0o660)
    yield path, group, pwd.getpwnam(member).pw_uid
    sock.close()


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def test_socket_access(group_socket):
    path, group, member_uid = group_socket
    assert doctor.socket_access(path, 0, set()).status == "OK"
    assert doctor.socket_access(path, member_uid, {group.gr_gid}).status == "OK"
    stale = doctor.socket_access(path, member_uid, set())  # added to the group after logging in
    assert stale.status == "FAIL" and "not in this login session" in stale.detail and "newgrp" in stale.fix
    outsider = doctor.socket_access(path, 65534, {65534})
    assert outsider.status == "FAIL" and f"sudo usermod -aG {group.gr_name} nobody" in outsider.fix


def test_socket_missing_or_world_writable(tmp_path):
    missing = doctor.socket_access(str(tmp_path / "none"), 0, set())
    assert missing.status == "FAIL" and "systemctl enable --now ftgovd.socket" in missing.fix
    path = str(tmp_path / "w.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    try:
        assert "world-writable" in doctor.socket_access(path, 0, set()).detail
    finally:
        sock.close()
