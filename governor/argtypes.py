"""argparse types shared by ftgov, ftgovd and the simulator's commands (so not the CLI's: ftgovd loads nothing of
governor.cli): numbers with a range, and paths. A value out of range is a usage error naming the option
(``ftgov sim-job: error: argument --steps: must be >= 1, got -5``), not a ValueError deep inside a command."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def _number(kind: type, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def at_least(minimum: int | float, kind: type = int) -> Callable[[str], int | float]:
    def parse(text: str):
        value = _number(kind, text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" message
    return parse


def above(minimum: int | float, kind: type = float) -> Callable[[str], int | float]:
    def parse(text: str):
        value = _number(kind, text)
        if value <= minimum:
            raise argparse.ArgumentTypeError(f"must be > {minimum}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _number(int, text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {text}")
    return value


def absolute_path(text: str) -> str:
    """A path on the command line, as the user means it: from the directory the command was typed in (a config file's
    paths must be absolute, and ftgovd under systemd runs from /)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return os.path.abspath(text)
