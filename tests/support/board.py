"""Run the simulated board (python -m governor.sim.board) beside a test, and wait for what it writes.

The board reacts to writes a moment after they land, so a test waits on the board's own writes (inotify on the
directory it writes into), never on a sleep.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from tests.support import REPO
from tests.support.fswatch import Watch


@contextmanager
def running_board(tree: Path, *args: str, timeout_s: float = 30.0):
    """The board process over ``tree`` (``args``: --build LAYOUT and the like), ready once this yields."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "governor.sim.board", "--tree", str(tree), "--until-stdin-closes",
                             *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else b""
        assert line == b"ready\n", (line, proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
        yield proc
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read(path: Path) -> str:
    return path.read_text().strip()


def wait_reads(path: Path, predicate, timeout_s: float = 10.0) -> str:
    """Until ``predicate(text of path)`` holds (the board renames its writes into place: watch the directory)."""
    watch = Watch(Path(os.path.realpath(path.parent)))
    try:
        watch.wait(lambda: predicate(read(path)), timeout_s)
    except TimeoutError as e:
        raise TimeoutError(f"{path} reads {read(path)!r}: {e}") from None
    finally:
        watch.close()
    return read(path)
