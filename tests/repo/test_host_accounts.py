"""The root-only tests leave no users or groups behind: only what the session made goes, what was there stays."""

import secrets
import subprocess

from tests.support import hostusers
from tests.support.security import needs_root


def exists(database: str, name: str) -> bool:
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 0


def test_the_accounts_a_session_made_are_removed_and_the_others_stay():
    needs_root()
    tag = secrets.token_hex(3)
    admins, user, group = f"ftga{tag}", f"ftgu{tag}", f"ftgg{tag}"
    subprocess.run(["groupadd", admins], check=True)  # an administrator's group, there before the session
    try:
        hostusers.ensure_user(user, groups=(group, admins))
        assert exists("passwd", user) and exists("group", group) and exists("group", user)  # useradd's own group
        hostusers.ensure_group(admins)  # there already: not the session's to remove
        assert hostusers.remove_made() == []
        assert not exists("passwd", user) and not exists("group", group) and not exists("group", user)
        assert exists("group", admins)
    finally:
        subprocess.run(["groupdel", admins], capture_output=True)
