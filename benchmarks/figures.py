"""What the benchmark scripts share: percentiles, markdown tables, and the one writer of docs/benchmarks.md.

Each benchmark owns one section of docs/benchmarks.md, the text between ``<!-- begin NAME -->`` and
``<!-- end NAME -->``; a run replaces its own section and leaves the others as they are.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from governor.safefile import write_file

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"

PREAMBLE = """# Benchmark figures

Each section below is written by the benchmark it names (`benchmarks/figures.py`, `write_section`): `make bench`,
`make stress`, `make learn` and `make evaluate` replace their own sections. A section states what was run, how many
runs or seeds it covers and the machine. All figures come from the simulated Orin or from recorded curves, not from
a Jetson: what is unverified on a real board is in [hardware.md](hardware.md).
"""


def pct(values, p: float) -> float:
    """The p-th percentile by nearest rank (NaN for no values)."""
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def markdown_table(header: tuple[str, ...], rows) -> list[str]:
    """Rows of cells as markdown table lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def machine() -> str:
    """The CPUs the figures were measured on: their count and /proc/cpuinfo's model name."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model})"


def write_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> Path:
    """Put ``markdown`` between NAME's markers in ``path``, replacing what was there; other sections stay.

    A missing file gets the preamble, a missing section goes at the end. The file is replaced atomically (a
    temporary file in the same directory, then rename), so a reader or a failed run never sees half of it; and under
    an exclusive flock on its directory, so that benchmarks run side by side (make -j bench) cannot lose each other's
    sections between the read and the rename.
    """
    if not re.fullmatch(r"[a-z0-9_-]+", name):
        raise ValueError(f"section name {name!r}: use lowercase letters, digits, '-' and '_'")
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else PREAMBLE
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: block, text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        write_file(path, text)
    finally:
        os.close(folder)  # and the lock with it
    return path


def publish(name: str, text: str, *, doc: bool = True) -> None:
    """Print a benchmark's section and, unless ``doc`` is False (its --no-doc), write it to docs/benchmarks.md."""
    print(text)
    if doc:
        write_section(name, text)
