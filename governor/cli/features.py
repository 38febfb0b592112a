"""Workload features on the command line, shared by `ftgov run` and `ftgov predict`.

Either the numbers (--model-type, --num-layers, --hidden-size) or a Hugging Face config (--hf-config DIR, read as
plain JSON: no transformers import, no download), plus --seq-len, which only the data can tell.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from governor.client import check_features
from governor.errors import ConfigError
from governor.features import IncompleteHFConfig, from_hf_config

SHAPE = ("model_type", "num_layers", "hidden_size")


def add_feature_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload features (numbers override --hf-config)")
    g.add_argument("--hf-config", metavar="DIR", help="a Hugging Face model directory (its config.json) or config file")
    g.add_argument("--model-type", choices=["encoder", "decoder"])
    g.add_argument("--num-layers", type=int, metavar="N")
    g.add_argument("--hidden-size", type=int, metavar="N")
    g.add_argument("--seq-len", type=float, metavar="TOKENS", help="average non-padding tokens per sample")
    g.add_argument("--gpu-util", type=float, metavar="PCT", help="GPU utilization in percent (default: measured)")


def features_from_args(args: argparse.Namespace) -> dict:
    """The complete, validated features as register/predict params. Raises ConfigError naming the option."""
    known: dict = {}
    if args.hf_config:
        try:
            known.update(from_hf_config(load_hf_config(args.hf_config), {k: getattr(args, k) for k in SHAPE}))
        except IncompleteHFConfig as e:
            raise ConfigError(f"--hf-config {args.hf_config}: {e.why}: give "
                              f"{', '.join(_option(k) for k in e.missing)}") from e
    for key in ("model_type", "num_layers", "hidden_size", "seq_len", "gpu_util"):
        value = getattr(args, key)
        if value is not None:
            known[key] = value
    if args.gpu_util is not None and 0 < args.gpu_util < 1:
        # A percent: 0.8 read as 0.8% took the tree's low-utilization branch, which a job busy 80% of the time is not.
        raise ConfigError(f"--gpu-util {args.gpu_util:g}: a percent (0-100), and {args.gpu_util:g} looks like a "
                          f"fraction: give {100 * args.gpu_util:g}")
    shape = [_option(k) for k in SHAPE if k not in known]
    missing = []
    if shape:
        missing.append(", ".join(shape) + ("" if args.hf_config else " (or --hf-config DIR for the model's shape)"))
    if "seq_len" not in known:
        missing.append("--seq-len (average non-padding tokens per sample)")
    if missing:
        raise ConfigError(f"missing {', '.join(missing)}")
    try:
        return check_features(known).model_dump(exclude_none=True)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _option(feature: str) -> str:
    return f"--{feature.replace('_', '-')}"


def load_hf_config(path: str) -> dict:
    p = Path(path)
    if not p.exists():  # often a Hub id ("gpt2"), which names no file here
        raise ConfigError(f"--hf-config {path}: no such directory or file (a Hugging Face Hub id is not resolved, "
                          "nothing is downloaded): give the model's local directory or its config.json")
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"--hf-config: cannot read {p}: {e.strerror or e}") from e
    except ValueError as e:
        raise ConfigError(f"--hf-config: {p} is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"--hf-config: {p} does not hold a JSON object")
    return data
