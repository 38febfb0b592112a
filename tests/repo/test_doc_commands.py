"""Every command line the documentation shows names options its command has: `ftgov SUBCOMMAND --flag`, `ftgovd
--flag`, `python -m benchmarks.X --flag` (and scripts.X, governor.pipeline), in inline code and in code blocks of
README.md, docs/*.md and model/README.md, and in the Makefile and the systemd units. The options are read from the
argparse parsers themselves: each module's main() is run until it parses its arguments, and stopped there."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "model" / "README.md"]
PLAIN = [REPO / "Makefile", *sorted(p for p in (REPO / "systemd").rglob("*") if p.is_file())]
# Where a command line ends: a shell operator, a comment, the end of the span.
END = re.compile(r"\s(?:\||;|&&|#|--(?=\s|$))|`|$")
START = re.compile(r"(?<![\w.-])(?:(ftgovd|ftgov)(?![\w./-])|(?:python3?|\$\(VPY\)) -m "
                   r"((?:benchmarks|scripts)\.\w+|governor\.pipeline)|\$\(PIPELINE\))")
# What may stand before a command for it to be one (not an argument: `journalctl -u ftgovd`, `usermod -aG ftgov`): the
# start, a shell operator, sudo, an environment assignment, a path to its bin/.
COMMAND_POSITION = re.compile(r"(?:^|[;|&(]|\bsudo|\b[A-Z_]+=\S*|\$\(VPY\)|\bpython3?)\s*(?:\S*/)?$")


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser module.main() builds, taken from its parse_args call (main() stops there)."""
    def grab(self, *args, **kwargs):
        raise _Parsed(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(sys, "argv", [module])
    try:
        with pytest.raises(_Parsed) as caught:
            importlib.import_module(module).main()
    finally:
        monkeypatch.undo()
    return caught.value.parser


def options(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], tuple[set[str], dict]]:
    """Each (sub)command path: its option strings and its subcommands' parsers."""
    out = {}

    def walk(p, path):
        subs = {}
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                subs.update(action.choices)
        out[path] = ({s for a in p._actions for s in a.option_strings}, subs)
        for name, sp in subs.items():
            walk(sp, (*path, name))
    walk(parser, ())
    return out


@pytest.fixture(scope="module")
def commands():
    from governor.cli import build_parser

    mp = pytest.MonkeyPatch()
    found = {"ftgov": options(build_parser()), "ftgovd": options(parser_of("governor.daemon.main", mp)),
             "governor.pipeline": options(parser_of("governor.pipeline.__main__", mp))}
    for folder in ("benchmarks", "scripts"):
        for path in sorted((REPO / folder).glob("*.py")):
            if "ArgumentParser(" in path.read_text():
                found[f"{folder}.{path.stem}"] = options(parser_of(f"{folder}.{path.stem}", mp))
            else:  # no arguments: its main() would run at once
                found[f"{folder}.{path.stem}"] = {(): (set(), {})}
    return found


def command_lines(path: Path):
    """(line number, text) of each piece of the file that is code: inline code spans (which may run over a line's end)
    and fenced or indented lines of a page; every line of a plain file, a line continued with a backslash joined to
    the next."""
    lines = path.read_text().splitlines()
    if path.suffix != ".md":
        number = 0
        while number < len(lines):
            start, text = number + 1, lines[number]
            while text.endswith("\\") and number + 1 < len(lines):
                number += 1
                text = text[:-1] + " " + lines[number]
            yield start, text
            number += 1
        return
    fenced, prose = False, []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            yield number, line
        else:
            prose.append((number, line))
    text = "\n".join(line for _, line in prose)
    for m in re.finditer(r"`([^`]+)`", text):
        yield prose[text[:m.start()].count("\n")][0], m.group(1).replace("\n", " ")


@pytest.mark.parametrize("path", PAGES + PLAIN, ids=lambda p: str(p.relative_to(REPO)))
def test_documented_options_exist(path, commands):
    wrong = []
    for number, text in command_lines(path):
        for m in START.finditer(text):
            if not COMMAND_POSITION.search(text[:m.start()]):
                continue
            name = m.group(1) or m.group(2) or "governor.pipeline"
            if name not in commands:
                wrong.append(f"{path.name}:{number}: no command {name}")
                continue
            tree, at, flagged = commands[name], (), False
            rest = text[m.end():]
            for token in rest[:END.search(rest).start()].split():
                token = token.strip("[](),.'\"")
                flags, subs = tree[at]
                if token.startswith("-") and len(token) > 1:
                    flagged = True
                    if token.split("=")[0] not in flags:
                        wrong.append(f"{path.name}:{number}: {' '.join((name, *at))} has no {token.split('=')[0]}")
                elif token in subs and not flagged:  # the subcommands come before any option
                    at = (*at, token)
    assert not wrong, "\n".join(wrong)


def test_every_runnable_benchmark_and_script_parses_its_arguments():
    """A module run with ``python -m`` that parses no arguments runs at once on ``--help``: a benchmark then rewrote
    docs/benchmarks.md for a reader who asked how to run it."""
    runnable = [p for folder in ("benchmarks", "scripts") for p in sorted((REPO / folder).glob("*.py"))
                if '__name__ == "__main__"' in p.read_text()]
    assert runnable
    silent = [str(p.relative_to(REPO)) for p in runnable if "ArgumentParser(" not in p.read_text()]
    assert not silent, f"no argparse parser (--help would run them): {', '.join(silent)}"
