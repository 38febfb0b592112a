"""Every dependency pyproject.toml declares for the package (core and extras) is imported by the package's code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib

from governor.cli import OPTIONAL_MODULES

REPO = Path(__file__).resolve().parents[2]

# Distribution name -> the module the package imports.
IMPORT_NAMES = {"pyyaml": "yaml", "systemd-python": "systemd", "scikit-learn": "sklearn",
                "prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml", "jetson-stats": "jtop"}
# Declared without being imported, for a reason that the pyproject comment gives.
NEEDED_BY_ANOTHER = {"accelerate"}  # transformers' Trainer refuses to run with torch unless it is installed
NOT_THE_PACKAGES = {"test"}  # the test suite's own tools


def imported_modules() -> set[str]:
    found = set()
    for path in (REPO / "governor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def distribution(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower()


def test_every_declared_dependency_is_imported():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {("dependencies", distribution(r)) for r in project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        if extra not in NOT_THE_PACKAGES:
            declared |= {(extra, distribution(r)) for r in requirements}
    modules = imported_modules()
    unused = sorted((where, dist) for where, dist in declared
                    if dist not in NEEDED_BY_ANOTHER and IMPORT_NAMES.get(dist, dist.replace("-", "_")) not in modules)
    assert not unused, f"declared but imported by nothing in governor/: {unused}"


def test_the_extra_a_missing_module_names_declares_that_module():
    """`ftgov` names an extra to install for an optional module it did not find (governor.cli.OPTIONAL_MODULES)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (dist, extra) in OPTIONAL_MODULES.items():
        assert dist in {distribution(r) for r in extras[extra]}, (module, dist, extra)
        assert IMPORT_NAMES.get(dist, dist.replace("-", "_")) == module, (module, dist)
