"""The model pipeline (never imported by the daemon), one command per stage, each with path arguments:

    characterize  measure every level (the simulated Orin, or a Hugging Face loop on a board) -> characterization CSV
    dataset       label each configuration with its energy-optimal level              -> dataset.csv
    fit           LOOCV hyperparameter search and fit                                 -> mlg.joblib, cv-report.json
    export        the fitted tree as the daemon's JSON and as rules                   -> mlg-tree.json, mlg-rules.txt
    ffg           FFG's single frequency                                              -> ffg.json
    evaluate      every policy through the daemon's Policy.decide on held-out workloads
    retrain       the tree from the board's measurement store and the characterization -> mlg-tree.json

Run as ``python -m governor.pipeline STAGE`` or ``ftgov model STAGE`` (characterize and evaluate also as ``ftgov
STAGE``); the Makefile's ``model`` target chains them by their files, named in full (model/artifacts/, and the
package data in governor/data/). Without paths a stage reads the shipped characterization and writes the names above
in the current directory, so the stages run from an installed ftgov too. STAGES is the one list every entry builds its
commands from. Each stage module has add_parser(subparsers) and run(args) and keeps numpy and scikit-learn imports
inside its functions, so listing the stages costs nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str  # the command, as the module's add_parser names it
    module: str
    top_level: bool = False  # also `ftgov NAME`, beside `ftgov model NAME`


STAGES = (
    Stage("characterize", "governor.pipeline.characterize", top_level=True),
    Stage("dataset", "governor.pipeline.dataset"),
    Stage("fit", "governor.pipeline.train"),
    Stage("export", "governor.pipeline.export"),
    Stage("ffg", "governor.pipeline.ffg"),
    Stage("evaluate", "governor.pipeline.evaluate", top_level=True),
    Stage("retrain", "governor.pipeline.retrain"),
)


def add_stage_parsers(subparsers, *, top_level_only: bool = False) -> None:
    """Add each stage's command (its module's add_parser) to ``subparsers``; with ``top_level_only``, only the
    stages that are also top-level ftgov commands."""
    for stage in STAGES:
        if stage.top_level or not top_level_only:
            importlib.import_module(stage.module).add_parser(subparsers)
