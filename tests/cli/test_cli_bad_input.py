"""Every `ftgov` subcommand, walked from the argparse parser (a new one is covered without editing this file), answers
bad input with one line on stderr naming it and its exit code: 2 for bad usage (argparse's, and a number out of its
range), 1 for a user's error found while running (governor.cli.run_command), 126/127 for `ftgov run`'s command.
Never a traceback. (A reader that goes away: test_ops.py.) It runs the real
command: the bad commands try sockets and files, and one that regressed would start processes."""

from __future__ import annotations

import argparse

import pytest

from governor.cli import build_parser, main


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) of every runnable subcommand, nested ones (`model retrain`) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))
            return
    if path:
        yield path, parser


COMMANDS = dict(commands(build_parser()))
FEATURES = ["--model-type", "encoder", "--num-layers", "12", "--hidden-size", "768", "--seq-len", "40"]


def typed_options(parser: argparse.ArgumentParser):
    """Each option whose value is a number (int, float, a range of either, a port) or one of fixed choices."""
    for action in parser._actions:
        numeric = getattr(action.type, "__name__", None) in ("int", "float", "port")
        if action.option_strings and action.nargs != 0 and (numeric or action.choices):
            yield action.option_strings[-1], action


def generic_cases():
    for path, parser in COMMANDS.items():
        # A command with required arguments names those first, else the unknown option; either way the command's
        # own usage is the one to see (`ftgov --help` does not list a subcommand's options).
        yield pytest.param([*path, "--no-such-option"], 2, f"ftgov {' '.join(path)}: error: ",
                           id=f"{' '.join(path)} --no-such-option")
        for option, action in typed_options(parser):
            bad = "no-such-choice" if action.choices else "x1"
            yield pytest.param([*path, option, bad], 2, f"argument {option}", id=f"{' '.join(path)} {option} {bad}")


# Bad values a type alone does not catch, and bad files: (argv, exit code, what the line says). {tmp} is a fresh
# directory, {tree} a simulated Orin tree in it.
SPECIFIC = [
    # A fraction for a percent: read as 0.8%, it took the tree's low-utilization branch.
    (["predict", "--model-type", "encoder", "--num-layers", "12", "--hidden-size", "768", "--seq-len", "40",
      "--gpu-util", "0.8"], 2, "--gpu-util 0.8: a percent (0-100), and 0.8 looks like a fraction: give 80"),
    (["sim-job", "--tree", "{tree}", "--num-layers", "0"], 2, "argument --num-layers: must be >= 1, got 0"),
    (["sim-job", "--tree", "{tree}", "--hidden-size", "0"], 2, "argument --hidden-size: must be >= 1, got 0"),
    (["sim-job", "--tree", "{tree}", "--seq-len", "-1"], 2, "argument --seq-len: must be > 0, got -1"),
    (["sim-job", "--tree", "{tree}", "--steps", "-5"], 2, "argument --steps: must be >= 1, got -5"),
    (["sim-job", "--tree", "{tree}", "--time-scale", "nan"], 2, "argument --time-scale: 'nan' is not a finite"),
    # The simulated board steps its meter through each step's compressed time: at 1e-7 it fell behind for good, a
    # core busy and the rails and load frozen, long after the job ended.
    (["sim-job", "--tree", "{tree}", "--time-scale", "1e-7"], 2, "argument --time-scale: must be >= 0.01, got 1e-7"),
    (["sim-job", "--tree", "/etc/passwd"], 1, "/etc/passwd is not a simulated tree"),
    (["sim-job", "--tree", "{tree}", "--hidden-size", "100000000"], 1, "invalid job features: hidden_size"),
    (["sim-job", "--tree", "{tree}", "--seq-len", "0.5"], 1, "invalid job features: seq_len"),
    (["sim-job", "--tree", "{tree}", "--socket", "{tmp}/none.sock", "--steps", "1"], 1,
     "sim-job runs its steps for ftgovd to govern"),  # not a null summary and exit 0
    (["sim-tree", "/etc/passwd"], 1, "/etc/passwd: Not a directory"),
    (["sim-tree", "{tmp}/t", "--power-mode", "9"], 1, "power mode 9"),
    (["metrics", "--port", "70000"], 2, "argument --port: a port is 0..65535, got 70000"),
    (["metrics", "--textfile", "{tmp}/m.prom", "--interval", "0"], 2, "argument --interval: must be > 0, got 0"),
    # node_exporter's textfile collector reads only *.prom: another name was written, exit 0, and never scraped.
    (["metrics", "--textfile", "{tmp}/m.txt", "--once"], 2, "node_exporter's textfile collector reads only *.prom"),
    (["evaluate", "--data", "/etc/passwd"], 1, "/etc/passwd is not a characterization CSV"),
    (["evaluate", "--job-steps", "0"], 2, "argument --job-steps: must be >= 1, got 0"),
    (["evaluate", "--noise", "-1"], 2, "argument --noise: must be >= 0.0, got -1"),
    (["model", "ffg", "--data", "/etc/passwd", "--out", "{tmp}/f.json"], 1, "not a characterization CSV"),
    (["model", "export", "--data", "/etc/passwd", "--estimator", "/etc/passwd", "--report", "/etc/passwd",
      "--tree", "{tmp}/t.json"], 1, "cannot read the fitted tree"),
    (["model", "retrain", "--store", "/etc/passwd"], 1, "cannot read the measurement store /etc/passwd"),
    (["characterize", "--simulate", "--workload", "nope", "--out", "{tmp}/c.csv"], 1, "unknown workload"),
    (["history", "--since", "soon", "--store", "{tmp}/none.sqlite"], 1, "--since 'soon'"),
    (["history", "--store", "/etc/passwd"], 1, "cannot read the measurement store /etc/passwd"),
    (["report", "--store", "/etc/passwd", "--out", "{tmp}/r"], 1, "cannot read the measurement store"),
    # An unset variable in --out "$DIR": the report went into the directory the command was typed in.
    (["report", "--store", "{tmp}/none.sqlite", "--out", ""], 2, "argument --out: an empty path"),
    (["status", "--socket", "/etc/passwd"], 1, "/etc/passwd is not a socket"),
    (["predict", *FEATURES, "--socket", "/etc"], 1, "/etc is not a socket"),
    (["predict", *FEATURES[:-1], "0"], 2, "seq_len"),
    (["run", *FEATURES, "--", "/etc/passwd"], 126, "/etc/passwd: Permission denied"),
    (["run", *FEATURES, "--", "/nonexistent/cmd"], 127, "/nonexistent/cmd: No such file or directory"),
    (["restore", "--state-dir", "/etc/passwd"], 1, "/etc/passwd/state.json: Not a directory"),
    (["restore", "--config", "/etc/passwd"], 1, "config file /etc/passwd"),
]


def test_the_walk_finds_every_subcommand_and_the_table_names_only_real_ones():
    assert {"status", "run", "sim-job", "sim-tree", "metrics", "evaluate", "history", "report", "doctor",
            ("model retrain")} <= {" ".join(p) for p in COMMANDS}
    for argv, _, _ in SPECIFIC:
        assert tuple(argv[:2]) in COMMANDS or tuple(argv[:1]) in COMMANDS, argv


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_subcommand_says_what_it_does_in_its_help(path):
    assert COMMANDS[path].description, f"ftgov {' '.join(path)} --help has no description"


def invoke(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture
def env(tmp_path, monkeypatch):
    """No daemon anywhere: a socket path that does not exist, and a simulated tree to name. A case that ran further
    than it should writes into the test's directory, not the checkout."""
    from governor.sim import tree

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FTGOV_SOCKET", str(tmp_path / "absent.sock"))
    tree.build(tmp_path / "tree", "jp6")
    return {"{tmp}": str(tmp_path), "{tree}": str(tmp_path / "tree")}


@pytest.mark.parametrize("argv, code, says", [*generic_cases(), *(pytest.param(*case, id=" ".join(case[0]))
                                                                  for case in SPECIFIC)])
def test_bad_input_is_one_line_and_its_exit_code(argv, code, says, env, capsys):
    for key, value in env.items():
        argv = [a.replace(key, value) for a in argv]
    got, err = invoke(argv, capsys)
    assert (got, err.count("\n")) == (code, 1), err
    assert says in err and "Traceback" not in err, err


def test_the_demos_hint_names_commands_that_run_from_here(monkeypatch):
    """`make demo` ends with a hint to try ftgovd yourself: .venv/bin/ftgovd from the checkout, not a bare `ftgovd`
    that PATH does not find."""
    import shutil

    from governor.sim.demo import command_path
    from tests.support.daemon import REPO

    monkeypatch.chdir(REPO)
    for name in ("ftgovd", "ftgov"):
        assert shutil.which(command_path(name)), command_path(name)
