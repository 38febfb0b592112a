"""A command's stdout into a pipe nobody reads: `ftgov status | head -0`, deterministically."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.daemon import REPO


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m governor.cli ARGS` with stdout a pipe whose read end was closed before the command started, so
    its first write to stdout fails with EPIPE whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "governor.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
