"""tests/support/hostusers.py: what a test session makes on the host (users, groups) is removed, also when the
session that made it was killed before its end."""

from __future__ import annotations

import secrets
import subprocess
import sys

from tests.support import hostusers
from tests.support.daemon import REPO
from tests.support.security import needs_root


def test_what_a_killed_session_made_is_removed_by_the_next():
    """A session killed mid-run (a timeout, a SIGKILL) never reaches pytest_sessionfinish: its throwaway users and
    the ftgov group it made stayed on the host (seen after an interrupted run), and the next session took the group
    for an administrator's. The ledger names them with their maker's pid: the next session's start removes what a
    session no longer running made, and leaves what a running one did."""
    needs_root()
    dead, alive = f"ftgs{secrets.token_hex(3)}", f"ftgs{secrets.token_hex(3)}"
    group = f"ftgt{secrets.token_hex(3)}"
    killed = subprocess.run([sys.executable, "-c", (
        "import os; from tests.support import hostusers; "
        f"hostusers.ensure_user({dead!r}, groups=({group!r},), primary={group!r}); os._exit(9)")], cwd=REPO)
    assert killed.returncode == 9
    hostusers.ensure_user(alive, groups=(group,))  # this session's: its maker runs
    try:
        assert _exists("passwd", dead) and _exists("group", group)
        removed = hostusers.remove_left_over()
        assert f"user {dead}" in removed and not _exists("passwd", dead)
        assert _exists("passwd", alive) and (hostusers.LEDGER / f"user.{alive}").exists()
    finally:
        hostusers.remove_user(alive)
        subprocess.run(["userdel", dead], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        for kind, name in (("user", dead), ("group", group)):
            (hostusers.LEDGER / f"{kind}.{name}").unlink(missing_ok=True)
    assert not (hostusers.LEDGER / f"user.{alive}").exists()


def _exists(database: str, name: str) -> bool:
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 0
