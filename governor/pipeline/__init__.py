"""The model pipeline (never imported by the daemon), one command per stage, each with path arguments:

    characterize  measure every level (the simulated Orin, or a Hugging Face loop on a board) -> characterization CSV
    dataset       label each configuration with its energy-optimal level              -> model/artifacts/dataset.csv
    fit           LOOCV hyperparameter search and fit                                 -> mlg.joblib, cv-report.json
    export        the fitted tree as the daemon's JSON and as rules                   -> governor/data/mlg-tree.json
    ffg           FFG's single frequency                                              -> governor/data/ffg.json
    evaluate      every policy through the daemon's Policy.decide on held-out workloads
    retrain       the tree from the board's measurement store and the characterization -> mlg-tree.json

Run as ``python -m governor.pipeline STAGE`` or ``ftgov model STAGE``; the Makefile's ``model`` target chains them
by their files. Each stage module has add_parser(subparsers) and run(args) and keeps numpy and scikit-learn imports
inside its functions, so listing the stages costs nothing.
"""

from __future__ import annotations

import importlib

STAGE_MODULES = (
    "governor.pipeline.characterize",
    "governor.pipeline.dataset",
    "governor.pipeline.train",  # the `fit` stage
    "governor.pipeline.export",
    "governor.pipeline.ffg",
    "governor.pipeline.evaluate",
    "governor.pipeline.retrain",
)


def add_stage_parsers(subparsers) -> None:
    for name in STAGE_MODULES:
        importlib.import_module(name).add_parser(subparsers)
