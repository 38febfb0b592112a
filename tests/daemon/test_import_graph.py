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
    assert "governor.daemon.server" in modules and "governor.daemon.pins" in modules  # it did load the daemon
    assert offenders(modules) == []


def test_the_check_sees_a_forbidden_import():
    assert "governor.sim.tree" in offenders(imported_modules("-c", "import governor.daemon.main, governor.sim.tree"))
