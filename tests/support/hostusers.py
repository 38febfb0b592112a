"""Users and groups that the root-only tests need on the host: made when missing, removed when the test session ends.

Only what the session made is removed (tests/conftest.py's pytest_sessionfinish calls remove_made): a user or group
that was there before, an administrator's `ftgov` group say, stays. useradd also makes a user's own group (Debian's
USERGROUPS_ENAB), which userdel removes with the user.

A session that is killed never reaches its end: what it made stayed, and the next session took its `ftgov` group for
an administrator's (seen: the group and two throwaway members left after an interrupted run). So each user or group
made is also noted in LEDGER, with the pid of the session that made it, and a session's start (remove_left_over)
removes what sessions no longer running made.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

LEDGER = Path("/var/tmp/ftgov-tests-hostusers")  # one file a user or group made: "<kind>.<name>", the maker's pid

_made_users: list[str] = []
_made_groups: list[str] = []


def _exists(database: str, name: str) -> bool:
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 0


def _note(kind: str, name: str) -> None:
    LEDGER.mkdir(mode=0o700, exist_ok=True)
    (LEDGER / f"{kind}.{name}").write_text(f"{os.getpid()}\n")


def _forget(kind: str, name: str) -> None:
    (LEDGER / f"{kind}.{name}").unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_left_over() -> list[str]:
    """Remove the users, then the groups, that sessions no longer running made and could not remove (LEDGER);
    what was removed."""
    if not LEDGER.is_dir():
        return []
    removed = []
    for kind, tool in (("user", "userdel"), ("group", "groupdel")):
        for entry in sorted(LEDGER.glob(f"{kind}.*")):
            try:
                pid = int(entry.read_text())
            except (OSError, ValueError):
                pid = -1
            if pid > 0 and _running(pid):
                continue  # a session running beside this one
            name = entry.name.split(".", 1)[1]
            database = "passwd" if kind == "user" else "group"
            if not _exists(database, name) or subprocess.run([tool, name], capture_output=True).returncode == 0:
                entry.unlink(missing_ok=True)
                removed.append(f"{kind} {name}")
    return removed


def ensure_group(name: str) -> None:
    if not _exists("group", name):
        subprocess.run(["groupadd", name], check=True)
        _made_groups.append(name)
        _note("group", name)


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
    _note("user", name)


def remove_user(name: str) -> None:
    """Remove a user this session made, now (a throwaway member). If userdel refuses (a process of the user has not
    been reaped yet), the session's end tries again."""
    if name in _made_users and subprocess.run(["userdel", name], capture_output=True).returncode == 0:
        _made_users.remove(name)
        _forget("user", name)


def remove_made() -> list[str]:
    """Remove every user, then every group, this session made; returns what could not be removed."""
    failed = []
    while _made_users:
        name = _made_users.pop()
        if subprocess.run(["userdel", name], capture_output=True).returncode != 0 and _exists("passwd", name):
            failed.append(f"user {name}")
        else:
            _forget("user", name)
    while _made_groups:
        name = _made_groups.pop()
        if subprocess.run(["groupdel", name], capture_output=True).returncode != 0 and _exists("group", name):
            failed.append(f"group {name}")
        else:
            _forget("group", name)
    try:
        LEDGER.rmdir()  # empty: no session beside this one made anything it has not removed
    except OSError:
        pass
    return failed
