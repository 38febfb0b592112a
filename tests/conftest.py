"""Fixtures for every test folder (tests/X/ holds the tests of governor/X/). pytest puts the repository root on
sys.path (pyproject.toml's ``pythonpath``), so tests import the checkout's governor, tests.support and benchmarks.
The attack tests' helpers are in tests/support/security.py; their fixtures (a throwaway member, a process of root's)
are here."""

import os
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest

from governor.sim import tree
from tests.support import hostusers
from tests.support.daemon import WORKDIRS_ENV, Daemon
from tests.support.security import needs_root


def pytest_configure(config):
    if os.geteuid() == 0:
        left = hostusers.remove_left_over()  # what a killed session made and never removed
        if left:
            print(f"removed {', '.join(left)}, left by a test session that did not end", file=sys.stderr)
    # The daemons' workdirs (socket, state, log) go in one directory of the session's, removed at its end. Others may
    # pass through it to a workdir (a throwaway user reaching a socket): 0755, each workdir 0700 until a test opens it.
    parent = tempfile.mkdtemp(prefix="ftgov-tests-", dir="/tmp")
    os.chmod(parent, 0o755)
    os.environ[WORKDIRS_ENV] = parent


def pytest_sessionfinish(session, exitstatus):
    """What the session made is removed: the daemons' workdirs, and the users and groups the root-only tests made.
    The host is left as the session found it."""
    shutil.rmtree(os.environ.pop(WORKDIRS_ENV, ""), ignore_errors=True)
    failed = hostusers.remove_made()
    if failed:
        print(f"\nwarning: could not remove {', '.join(failed)} made by the tests", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def children():
    """Child processes that run until their stdin closes (or they are killed): a job's process, a group's rank."""
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=10)


@pytest.fixture
def orin(tmp_path):
    """A fresh simulated AGX Orin tree (JetPack 6 layout)."""
    return tree.build(tmp_path / "root", "jp6").root


@pytest.fixture
def start_daemon(request, orin):
    """Start real ftgovd processes; their logs are printed when the test fails."""
    daemons = []

    def start(root=orin, *, launch=True, **kwargs):
        d = Daemon(root, **kwargs)
        daemons.append(d)
        return d.start() if launch else d

    yield start
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for d in daemons:
        d.close()
        if failed:
            print(f"\n----- ftgovd log ({d.log_path}) -----\n{d.log()}")


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
