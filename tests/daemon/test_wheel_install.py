"""The package ships its model: a wheel installed into a clean virtual environment (no checkout on sys.path) starts
ftgovd with the trained tree and FFG's frequency read from the package's own files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.daemon import FEATURES

# pip's messages when the package index cannot be reached (offline CI, no proxy): the test cannot run, not a fault.
OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution", "Network is unreachable",
           "No matching distribution found", "Could not find a version that satisfies", "ProxyError",
           "Connection refused", "timed out")


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def _skip_if_offline(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0 and any(m in done.stdout + done.stderr for m in OFFLINE):
        pytest.skip(f"the package index is unreachable, so {what} cannot be installed: "
                    f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


def _version(dist: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in metadata.version(dist).split(".")[:2] if p.isdigit())
    except metadata.PackageNotFoundError:
        return ()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A clean venv (`python -m venv`, no system site-packages) with the wheel built from this checkout installed,
    its dependencies (pydantic, pyyaml, psutil) resolved from the package index."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: building in the checkout would leave build/ and *.egg-info behind in it
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copy(REPO / "LICENSE", src)
    shutil.copytree(REPO / "governor", src / "governor", ignore=shutil.ignore_patterns("__pycache__"))
    # pyproject's build-system wants setuptools>=77: with it here, build offline; without, pip fetches it.
    offline_build = ["--no-build-isolation"] if _version("setuptools") >= (77,) else []
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline_build, "-w", tmp / "dist", src],
                 timeout=300)
    _skip_if_offline(built, "setuptools for the build")
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("ftgov-*.whl")
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", venv], timeout=120)
    assert made.returncode == 0, made.stderr
    pip = _run([venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", wheel], timeout=600)
    _skip_if_offline(pip, "the wheel's dependencies")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv


def test_the_wheel_holds_the_model_files(installed):
    out = _run([installed / "bin" / "python", "-c",
                "from governor import data; print(data.path(data.MLG_TREE)); print(data.path(data.FFG))"],
               cwd=installed, env={**os.environ, "PYTHONPATH": ""}, timeout=60)
    assert out.returncode == 0, out.stderr
    tree, ffg = (Path(line) for line in out.stdout.split())
    assert "site-packages" in tree.parts and tree.is_file() and ffg.is_file()
    assert tree.read_bytes() == (REPO / "governor" / "data" / "mlg-tree.json").read_bytes()


def test_an_installed_daemon_loads_the_packages_trained_tree(installed, orin, start_daemon):
    d = start_daemon(config_file=os.devnull, python=str(installed / "bin" / "python"), env={"PYTHONPATH": ""})
    site = next((installed / "lib").glob("python*/site-packages"))
    tree = site / "governor" / "data" / "mlg-tree.json"
    log = d.log()
    assert f"MLG tree loaded from {tree} (source: trained" in log, log
    assert f"(from {tree.with_name('ffg.json')})" in log, log
    assert str(REPO) not in log  # nothing came from the checkout
    res = d.client().call("register", **FEATURES)
    assert res["policy"] == "mlg" and "trained tree" in res["reason"], res


def test_the_wheel_carries_the_license_and_the_sweeps_evaluate_and_retrain_read(installed):
    out = _run([installed / "bin" / "python", "-c",
                "from importlib import metadata; from governor import data\n"
                "print(metadata.metadata('ftgov')['License-File'])\n"
                "print(next(f.locate() for f in metadata.files('ftgov') if f.name == 'LICENSE'))\n"
                "print(data.path(data.CHARACTERIZATION)); print(data.path(data.HELD_OUT))"],
               cwd=installed, env={**os.environ, "PYTHONPATH": ""}, timeout=60)
    assert out.returncode == 0, out.stderr
    declared, license_file, characterization, held_out = out.stdout.split()
    assert declared == "LICENSE"
    assert Path(license_file).read_bytes() == (REPO / "LICENSE").read_bytes()
    for shipped in (characterization, held_out):
        assert "site-packages" in Path(shipped).parts
        assert Path(shipped).read_bytes() == (REPO / "model" / "data" / Path(shipped).name).read_bytes()
    # Outside any checkout (cwd is the venv), with its defaults: the shipped held-out sweeps and trees.
    evaluate = _run([installed / "bin" / "ftgov", "evaluate", "--no-tune", "--json"], cwd=installed,
                    env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert evaluate.returncode == 0, evaluate.stderr
    assert json.loads(evaluate.stdout)["workloads"], evaluate.stdout[:500]
