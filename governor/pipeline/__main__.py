"""`python -m governor.pipeline characterize|evaluate ...`: the pipeline's commands without the ftgov entry point
(the Makefile's model target uses this, so it runs from a checkout without installing the package)."""

from __future__ import annotations

import argparse
import sys

from governor.errors import FtgovError


def main(argv: list[str] | None = None) -> int:
    from governor.pipeline import characterize, evaluate

    parser = argparse.ArgumentParser(prog="python -m governor.pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (characterize, evaluate):
        module.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except FtgovError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
