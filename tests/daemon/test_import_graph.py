"""What ftgovd loads: nothing of the simulator, the pipeline, the client, the CLI, or the heavy numeric stack."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("governor.sim", "governor.pipeline", "governor.client", "governor.cli", "numpy", "sklearn", "torch",
             "pickle")


def imported_modules(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    # "import time: self [us] | cumulative | imported package", the name indented by its depth.
    return {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2} - {"imported package"}


def offenders(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def test_the_daemon_loads_none_of_the_forbidden_modules():
    modules = imported_modules("-m", "governor.daemon", "--version")
    assert "governor.daemon.server" in modules and "governor.daemon.controller" in modules  # it did load the daemon
    assert offenders(modules) == []


def test_the_check_sees_a_forbidden_import():
    assert "governor.sim.tree" in offenders(imported_modules("-c", "import governor.daemon.main, governor.sim.tree"))


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (imports inside functions count too)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


# The daemon's side: what runs as root in ftgovd. `ftgov restore` (systemd's ExecStopPost) reads the daemon's state
# through the same code; nothing else outside governor/daemon may import it.
DAEMON_SIDE = ("governor/daemon/",)
MAY_IMPORT_THE_DAEMON = {"governor/cli/restore.py"}


def test_user_side_code_imports_nothing_from_the_daemon():
    offending = []
    for path in sorted((REPO / "governor").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(DAEMON_SIDE) or rel in MAY_IMPORT_THE_DAEMON:
            continue
        offending += [f"{rel}: {m}" for m in _imports(path)
                      if m == "governor.daemon" or m.startswith("governor.daemon.")]
    assert offending == []


def test_nothing_shipped_imports_the_tests_and_nothing_patches_sys_path():
    shipped = [p for p in (REPO / "governor").rglob("*.py")]
    assert [str(p) for p in shipped if any(m == "tests" or m.startswith("tests.") for m in _imports(p))] == []
    runnable = shipped + list((REPO / "benchmarks").glob("*.py")) + list((REPO / "scripts").glob("*.py"))
    assert [str(p) for p in runnable if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()] == []


# That governor/daemon and governor/policy have no import circle: tests/repo/test_import_circles.py.
