"""`ftgov`: the client and operator command. Each subcommand lives in its own module (add_parser + run)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from governor import __version__
from governor.errors import FtgovError

# Modules that provide add_parser(subparsers); imported when `ftgov` starts, so they keep heavy imports inside run().
SUBCOMMAND_MODULES = (
    "governor.cli.restore",
    "governor.cli.run",
    "governor.cli.ops",
    "governor.cli.doctor",
    "governor.cli.metrics",
    "governor.cli.pipeline_stages",  # characterize, evaluate: from the pipeline's stage registry
    "governor.cli.model",
    "governor.cli.sim",
    "governor.sim.job",
    "governor.cli.history",
    "governor.cli.report",
    "governor.cli.slurm",
)


# The optional modules commands import inside run() -> (their distribution, the extra that installs it): a command
# that finds one missing names the extra (`pip install ftgov` has none of them) instead of ending in a traceback.
OPTIONAL_MODULES = {
    "numpy": ("numpy", "model"),
    "sklearn": ("scikit-learn", "model"),
    "joblib": ("joblib", "model"),
    "matplotlib": ("matplotlib", "model"),
    "transformers": ("transformers", "hf"),
}

# What a shell reports for a command that SIGPIPE killed: `ftgov status | head -1` ends as `cat` would there.
EXIT_BROKEN_PIPE = 128 + 13


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its usage error in one line: ``ftgov sim-job: error: argument --steps: ...``; the
    usage is one ``--help`` away. Subparsers are made of the same class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        """Notes the innermost (sub)command's parser on the namespace (it parses first), for parse_args."""
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "usage_parser", None) is None:
            namespace.usage_parser = self
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        """An option a subcommand does not know is left over to the top parser, whose message would name ``ftgov``
        and point at ``ftgov --help``, where no subcommand's options are listed: the subcommand reports it."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            namespace.usage_parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ftgov", description="Client and operator tool for ftgovd.")
    parser.add_argument("--version", action="version", version=f"ftgov {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None, prog: str) -> int:
    """Parse and run one command. A user's error (an FtgovError: a missing file, a bad value, no GPU node; an
    optional module not installed) is one line on stderr and exit 1; bad usage is argparse's message and exit 2;
    anything else is a bug and keeps its traceback."""
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except FtgovError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL_MODULES:  # one of their own modules missing is a broken install: its traceback
            raise
        dist, extra = OPTIONAL_MODULES[e.name]
        # The (sub)command that needs it: ftgov's parser notes it; `python -m governor.pipeline`'s is argparse's own.
        command = args.usage_parser.prog if hasattr(args, "usage_parser") else f"{prog} {args.command}"
        print(f"{prog}: error: {command} needs {dist}: pip install 'ftgov[{extra}]'", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    """The `ftgov` entry point. A reader that goes away (`ftgov history | head -1`) ends the command quietly with
    the shell's code for SIGPIPE; stdout is pointed at /dev/null so that the interpreter's flush at exit does not
    raise again (the way Python's signal documentation handles it)."""
    try:
        try:
            return run_command(build_parser(), argv, prog="ftgov")
        finally:
            if sys.stdout is not None:  # None where the caller closed it (`ftgov run ... >&-`)
                sys.stdout.flush()  # inside the try, --help's exit included: a buffered write fails here, not at exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
