"""Users and groups that the root-only tests need on the host: made when missing, removed when the test session ends.

Only what the session made is removed (tests/conftest.py's pytest_sessionfinish calls remove_made): a user or group
that was there before, an administrator's `ftgov` group say, stays. useradd also makes a user's own group (Debian's
USERGROUPS_ENAB), which userdel removes with the user.
"""

from __future__ import annotations

import subprocess

_made_users: list[str] = []
_made_groups: list[str] = []


def _exists(database: str, name: str) -> bool:
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 0


def ensure_group(name: str) -> None:
    if not _exists("group", name):
        subprocess.run(["groupadd", name], check=True)
        _made_groups.append(name)


def ensure_user(name: str, *, groups: tuple[str, ...] = (), primary: str | None = None) -> None:
    """A login-less user with these supplementary groups (and primary group), made if missing."""
    for group in (*groups, *((primary,) if primary else ())):
        ensure_group(group)
    if _exists("passwd", name):
        return
    cmd = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    if primary:
        cmd += ["-g", primary]
    if groups:
        cmd += ["-G", ",".join(groups)]
    subprocess.run([*cmd, name], check=True)
    _made_users.append(name)


def remove_user(name: str) -> None:
    """Remove a user this session made, now (a throwaway member). If userdel refuses (a process of the user has not
    been reaped yet), the session's end tries again."""
    if name in _made_users and subprocess.run(["userdel", name], capture_output=True).returncode == 0:
        _made_users.remove(name)


def remove_made() -> list[str]:
    """Remove every user, then every group, this session made; returns what could not be removed."""
    failed = []
    while _made_users:
        name = _made_users.pop()
        if subprocess.run(["userdel", name], capture_output=True).returncode != 0 and _exists("passwd", name):
            failed.append(f"user {name}")
    while _made_groups:
        name = _made_groups.pop()
        if subprocess.run(["groupdel", name], capture_output=True).returncode != 0 and _exists("group", name):
            failed.append(f"group {name}")
    return failed
