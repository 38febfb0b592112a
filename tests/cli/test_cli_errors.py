"""`ftgov` answers a user's error with one line and exit 1 (2 for usage), never a traceback; a bug keeps its
traceback."""

from __future__ import annotations

import sys

import pytest

import governor.pipeline.characterize as characterize
from governor.cli import main


@pytest.mark.parametrize("argv, message", [
    (["characterize", "--simulate", "--steps", "0", "--out", "{tmp}/c.csv"], "--steps must be >= 1"),
    (["evaluate", "--data", "/missing"], "cannot read /missing"),
    (["sim-job", "--tree", "/missing"], "/missing"),
    (["model", "fit", "--data", "/missing"], "cannot read /missing"),
])
def test_a_user_error_is_one_line_and_exit_1(argv, message, tmp_path, capsys):
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ftgov: error: ") and message in err and err.count("\n") == 1, err


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--seed", "many"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("ftgov evaluate: error: argument --seed: invalid int value: 'many' "
                                       "(see ftgov evaluate --help)\n")


def test_an_internal_error_keeps_its_traceback(monkeypatch, tmp_path):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(characterize, "run", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["characterize", "--simulate", "--out", str(tmp_path / "c.csv")])


@pytest.mark.parametrize("argv, missing", [
    (["model", "fit", "--data", "{tmp}/c.csv", "--dataset", "{tmp}/d.csv", "--estimator", "{tmp}/e.joblib",
      "--report", "{tmp}/r.json"], "joblib"),
    (["model", "export", "--estimator", "{tmp}/e.joblib", "--tree", "{tmp}/t.json"], "joblib"),
    (["evaluate", "--no-tune", "--out", "{tmp}/plots"], "matplotlib"),
])
def test_a_command_whose_extra_is_not_installed_names_the_extra(argv, missing, tmp_path, capsys, monkeypatch):
    """`pip install ftgov` leaves the model extra out: its commands say which extra to install, as `ftgov report`
    does, rather than end in a ModuleNotFoundError's traceback."""
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ModuleNotFoundError, as if uninstalled
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    err = capsys.readouterr().err
    prog = "ftgov " + " ".join(argv[:2] if argv[0] == "model" else argv[:1])
    assert err == f"ftgov: error: {prog} needs {missing}: pip install 'ftgov[model]'\n"


def test_the_pipelines_own_entry_names_the_extra_too(tmp_path, capsys, monkeypatch):
    """`python -m governor.pipeline` (make model's entry) runs its stages through the same run_command: a stage whose
    extra is missing is told so there too, not an AttributeError's traceback from the message naming the stage."""
    from governor.pipeline.__main__ import main as pipeline

    monkeypatch.setitem(sys.modules, "joblib", None)
    assert pipeline(["export", "--estimator", str(tmp_path / "e.joblib"), "--tree", str(tmp_path / "t.json")]) == 1
    assert capsys.readouterr().err == ("python -m governor.pipeline: error: python -m governor.pipeline export needs "
                                       "joblib: pip install 'ftgov[model]'\n")
