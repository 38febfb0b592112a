"""How the pipeline's stages write the files they make."""

from __future__ import annotations

from pathlib import Path

from governor.safefile import write_file


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless the file holds exactly that already; returns whether it wrote.

    The stages that write tracked files (the shipped tree, its rules, FFG's level) are rerun by make whenever an input
    looks newer, as on a fresh clone; what they recompute is byte-identical, and an untouched file keeps a clean tree
    clean (its mtime included). make then reruns the cheap stage next time, not the expensive ones before it.
    """
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass  # missing or unreadable: write it
    write_file(path, text)  # atomically, through a checked directory (governor/safefile.py)
    return True
