"""`ftgov`: the client and operator command. Each subcommand lives in its own module (add_parser + run)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

from governor import __version__

# Modules that provide add_parser(subparsers); imported when `ftgov` starts, so they keep heavy imports inside run().
SUBCOMMAND_MODULES = (
    "governor.cli.restore",
    "governor.cli.run",
    "governor.cli.ops",
    "governor.cli.doctor",
    "governor.cli.metrics",
    "governor.pipeline.characterize",
    "governor.pipeline.evaluate",
    "governor.cli.sim",
    "governor.sim.job",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ftgov", description="Client and operator tool for ftgovd.")
    parser.add_argument("--version", action="version", version=f"ftgov {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130

