"""The model ftgov ships, as package data: mlg-tree.json (the trained tree the daemon loads by default), ffg.json
(FFG's frequency, from the same data) and paper-tree.json (the paper's published tree, for comparison). The
pipeline's export and ffg stages write the first two here (`make model`); model/ holds links to them.

The two simulated sweeps the model is made from ship too, so that `ftgov evaluate` and `ftgov model retrain` run
from an installed package: characterization.csv (the training set) and held-out.csv (the evaluation set), each
with its provenance sidecar (NAME.meta.json); model/data/ holds links to them."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

MLG_TREE = "mlg-tree.json"
FFG = "ffg.json"
PAPER_TREE = "paper-tree.json"
CHARACTERIZATION = "characterization.csv"
HELD_OUT = "held-out.csv"


def path(name: str) -> Path:
    """Where a shipped file lies: in the installed package, or governor/data/ of a checkout."""
    return Path(str(files(__name__) / name))
