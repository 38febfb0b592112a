"""The source distribution is the whole source (MANIFEST.in): a packager or a board without git unpacks it and runs
the Makefile's install (the units, the sysusers entry, the default config, docs/install.md) and the tests as from a
checkout. setuptools alone would pack the package, and of tests/ only its top-level test_*.py files, which import
tests/support."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from importlib import metadata

import pytest
import tomllib

from tests.support import REPO


def _tracked() -> list[str]:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: no list of the source's files to compare the sdist with")
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True, check=True,
                         timeout=60)
    return [p for p in out.stdout.split("\0") if p]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tarfile.TarFile:
    """The sdist built (setuptools' build_sdist, as `python -m build --sdist` calls it) from a copy of the tracked
    files: building in the checkout would leave ftgov.egg-info behind in it."""
    if tuple(int(p) for p in metadata.version("setuptools").split(".")[:1]) < (77,):
        pytest.skip("pyproject's build-system wants setuptools>=77, which this environment lacks")
    tmp = tmp_path_factory.mktemp("sdist")
    src = tmp / "src"
    for path in _tracked():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, src / path, follow_symlinks=False)  # model/data's links stay links
    built = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                            "print(b.build_sdist(sys.argv[1]))", str(tmp / "dist")],
                           cwd=src, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    return tarfile.open(tmp / "dist" / built.stdout.split()[-1])


def test_the_sdist_holds_every_tracked_file(sdist):
    top = "ftgov-" + tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] + "/"
    packed = {m.name.removeprefix(top) for m in sdist.getmembers()}
    assert sorted(set(_tracked()) - packed) == []
    assert not [p for p in packed if "__pycache__" in p or p.endswith(".pyc")]


def test_the_makefiles_install_runs_from_the_unpacked_sdist(sdist, tmp_path):
    sdist.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    stage = tmp_path / "stage"
    done = subprocess.run(["make", "-C", str(unpacked), "--no-print-directory", "install-units", "install-config",
                           f"DESTDIR={stage}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    for installed in ("etc/systemd/system/ftgovd.service", "etc/systemd/system/ftgovd.socket",
                      "usr/lib/sysusers.d/ftgov.conf", "etc/ftgov/ftgov.yaml"):
        assert (stage / installed).is_file(), installed
    assert (unpacked / "docs" / "install.md").is_file()  # install-venv copies it into the venv
