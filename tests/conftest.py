"""Fixtures for every level (tests/pure, backends, daemon, pipeline). pytest puts the repository root on sys.path
(pyproject.toml's ``pythonpath``), so tests import the checkout's governor, tests.support and benchmarks."""


import pytest

from governor.sim import tree
from tests.support.daemon import Daemon


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


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
