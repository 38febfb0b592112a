"""Fixtures of the attack tests: a throwaway member of the ftgov group, a process of root's. The helpers they share
are in tests/support/security.py."""

from __future__ import annotations

import secrets
import subprocess

import pytest

from tests.support import hostusers
from tests.support.security import needs_root


@pytest.fixture
def member():
    """A throwaway user in the ftgov group, removed afterwards (the group at the session's end, if it made it):
    (name, uid)."""
    needs_root()
    name = f"ftgs{secrets.token_hex(3)}"
    # ftgov as the primary group too: then SO_PEERCRED's gid alone makes the peer a member (as on many installs).
    hostusers.ensure_user(name, groups=("ftgov",), primary="ftgov")
    try:
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True).stdout)
        yield name, uid
    finally:
        hostusers.remove_user(name)


@pytest.fixture
def root_sleep():
    """A long-lived process of root (a process a member must never be able to hold)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()
