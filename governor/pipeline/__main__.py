"""`python -m governor.pipeline STAGE ...`: the pipeline's stages without the ftgov entry point (the Makefile's
model target uses this, so it runs from a checkout without installing the package); `ftgov model STAGE` is the same."""

from __future__ import annotations

import argparse
import sys

from governor.cli import run_command
from governor.pipeline import add_stage_parsers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m governor.pipeline", description=__doc__.split("\n\n")[0])
    add_stage_parsers(parser.add_subparsers(dest="command", required=True, metavar="STAGE"))
    return run_command(parser, argv, prog="python -m governor.pipeline")


if __name__ == "__main__":
    sys.exit(main())
