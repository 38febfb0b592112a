"""The pipeline's one registry of stages behind every entry (`python -m governor.pipeline STAGE`, `ftgov model STAGE`,
`ftgov characterize` / `ftgov evaluate`), the Makefile's file chain,
the dataset file that fit trains on, and the evaluation deciding through the daemon's Policy.decide."""

from __future__ import annotations

import argparse
import csv
import importlib
import shutil
import subprocess

import pytest

from governor import pipeline as pipeline_package
from governor.cli import SUBCOMMAND_MODULES, build_parser
from governor.cli import main as ftgov
from governor.errors import FtgovError
from governor.pipeline import dataset
from governor.pipeline import evaluate as ev
from governor.pipeline.__main__ import main as pipeline
from governor.pipeline.policies import build_policies
from governor.policy import Policy
from tests.support import REPO

STAGES = ("characterize", "dataset", "fit", "export", "ffg", "evaluate", "retrain")
DATA = REPO / "model" / "data" / "characterization.csv"
SHIPPED = REPO / "governor" / "data"


@pytest.mark.parametrize("entry", [lambda argv: pipeline(argv), lambda argv: ftgov(["model", *argv])],
                         ids=["python -m governor.pipeline", "ftgov model"])
def test_every_stage_is_a_command_of_both_entries(entry, capsys):
    assert len(STAGES) == len(pipeline_package.STAGES)  # a stage added to the registry is tested here too
    for stage in STAGES:
        with pytest.raises(SystemExit) as e:
            entry([stage, "--help"])
        assert e.value.code == 0
        assert f" {stage}" in capsys.readouterr().out


def test_each_stage_is_added_by_the_registry_under_its_name():
    for stage in pipeline_package.STAGES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(stage.module).add_parser(sub)
        assert list(sub.choices) == [stage.name]
    assert [s.name for s in pipeline_package.STAGES] == list(STAGES)


def test_top_level_stages_come_from_the_registry_and_match_ftgov_model():
    # No entry lists a stage module itself: the registry is the one place a stage and its arguments are added from.
    assert not [m for m in SUBCOMMAND_MODULES if m.startswith("governor.pipeline")]
    commands = build_parser()._subparsers._group_actions[0].choices
    model = commands["model"]._subparsers._group_actions[0].choices
    top = [s.name for s in pipeline_package.STAGES if s.top_level]
    assert top == ["characterize", "evaluate"]  # the README's `ftgov characterize`, `ftgov evaluate`
    def arguments(parser):
        return [(a.option_strings, a.dest, a.default, a.help) for a in parser._actions]

    for name in top:
        assert arguments(commands[name]) == arguments(model[name])


def test_make_model_chains_the_stages_by_their_files(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".base").touch()
    # -W: as if the characterization had just changed; -o: the venv stamp counts as made (nothing is installed).
    out = subprocess.run(["make", "-n", "-W", "governor/data/characterization.csv", "model", f"DEV_VENV={venv}",
                          "-o", f"{venv}/.base"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stages = [line.split("governor.pipeline ")[1].split()[0] for line in out.stdout.splitlines()
              if "governor.pipeline " in line]
    assert stages == ["dataset", "fit", "export", "ffg"]
    export = next(line for line in out.stdout.splitlines() if "governor.pipeline export" in line)
    assert "--tree governor/data/mlg-tree.json" in export  # into the package data the daemon loads


def test_fit_trains_on_the_dataset_file_and_refuses_one_from_other_data(tmp_path):
    out = tmp_path / "dataset.csv"
    assert pipeline(["dataset", "--data", str(DATA), "--out", str(out)]) == 0
    sweeps = dataset.load(DATA)
    assert dataset.read_labels(out, sweeps) == {s.workload: dataset.label_hz(s) for s in sweeps}

    rows = list(csv.DictReader(out.open()))
    other = tmp_path / "other.csv"

    def write(rows):
        with other.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    write(rows[1:])
    with pytest.raises(FtgovError, match=f"no label for {rows[0]['workload']}"):
        dataset.read_labels(other, sweeps)
    write([{**rows[0], "num_layers": "99"}, *rows[1:]])
    with pytest.raises(FtgovError, match="features differ"):
        dataset.read_labels(other, sweeps)
    relabelled = {**rows[0], "label_hz": str(sweeps[0].levels_hz[0])}
    write([relabelled, *rows[1:]])
    assert dataset.read_labels(other, sweeps)[rows[0]["workload"]] == sweeps[0].levels_hz[0]


def test_evaluation_decides_through_the_daemons_policy(monkeypatch):
    calls = []
    decide = Policy.decide

    def recording(self, features, levels_hz, policy=None):
        decision = decide(self, features, levels_hz, policy)
        calls.append((self.name, decision.freq_hz))
        return decision

    monkeypatch.setattr(Policy, "decide", recording)
    sweeps = dataset.load(REPO / "model" / "data" / "held-out.csv")[:3]
    policies = build_policies(SHIPPED / "ffg.json", SHIPPED / "paper-tree.json", SHIPPED / "mlg-tree.json")
    results = ev.evaluate(sweeps, policies)
    # maxn (the daemon's observe), ffg, paper and mlg: one decision each per workload, and what it decided is scored
    assert sorted(name for name, _ in calls) == sorted(["observe", "ffg", "mlg", "mlg"] * len(sweeps))
    for s in sweeps:
        assert results[s.workload]["maxn"].freq_hz is None
    picked = [hz for name, hz in calls if name == "ffg"]
    assert picked == [results[s.workload]["ffg"].freq_hz for s in sweeps]
