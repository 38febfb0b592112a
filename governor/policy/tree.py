"""Evaluate an exported decision tree: plain data, no scikit-learn, no pickle.

Export format ``ftgov-tree/1`` (JSON), written by model/ (the pipeline) and read here:

    {"format": "ftgov-tree/1",
     "source": "paper" | "trained",          # where the tree came from
     "description": "...",
     "features": ["model_type", "gpu_util", "num_layers", "hidden_size", "seq_len"],
     "model_type_codes": {"encoder": 0, "decoder": 1},
     "nodes": [{"feature": "num_layers", "threshold": 7.0, "left": 1, "right": 2},
               {"freq_hz": 510000000}, ...],  # node 0 is the root; left when value <= threshold
     "metadata": {...}}                       # free-form: data version, seed, CV scores

The ``<=`` goes left, as in scikit-learn, so an exported tree gives the same answers as the estimator it came from.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from governor.errors import ModelError
from governor.features import FEATURE_ORDER, MODEL_TYPE_CODES, Features
from governor.units import mhz

FORMAT = "ftgov-tree/1"


@dataclass(frozen=True)
class Split:
    feature: str
    threshold: float
    left: int
    right: int


@dataclass(frozen=True)
class Leaf:
    freq_hz: int


@dataclass(frozen=True)
class TreeDecision:
    freq_hz: int
    path: tuple[str, ...]  # human-readable tests taken from the root, e.g. ("num_layers=12 > 7", "seq_len=40 <= 53")

    def explain(self) -> str:
        return " -> ".join(self.path) + f" -> {mhz(self.freq_hz)}"


class DecisionTree:
    """A validated tree: every node reachable, no cycles, every leaf a frequency, every split a known feature."""

    def __init__(self, nodes: list[Split | Leaf], source: str, description: str = "", metadata: dict | None = None):
        self.nodes = nodes
        self.source = source
        self.description = description
        self.metadata = metadata or {}

    @classmethod
    def from_dict(cls, data: dict) -> DecisionTree:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ModelError(f"not a {FORMAT} export (format={_short(found)})")
        # A hand-edited file may hold any JSON value in any field: each is checked for its type here, so that what
        # the daemon is given is a ModelError (refused with the reason, the tree in use kept), never a TypeError.
        features = data.get("features")
        if not isinstance(features, list) or features != list(FEATURE_ORDER):
            raise ModelError(f"features must be {list(FEATURE_ORDER)}, got {_short(features)}")
        if data.get("model_type_codes", MODEL_TYPE_CODES) != MODEL_TYPE_CODES:
            raise ModelError(f"model_type_codes must be {MODEL_TYPE_CODES}")
        for key in ("source", "description"):
            if not isinstance(data.get(key, ""), str):
                raise ModelError(f"{key} must be a string, got {_short(data[key])}")
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ModelError(f"metadata must be an object, got {_short(metadata)}")
        raw = data.get("nodes")
        if not isinstance(raw, list) or not raw:
            raise ModelError("nodes must be a non-empty list")
        nodes: list[Split | Leaf] = []
        for i, node in enumerate(raw):
            nodes.append(_parse_node(i, node, len(raw)))
        _check_is_tree(nodes)
        return cls(nodes, source=data.get("source", "unknown"), description=data.get("description", ""),
                   metadata=metadata)

    @classmethod
    def load(cls, path: str | Path) -> DecisionTree:
        try:
            text = read_model_bytes(path).decode()
        except OSError as e:
            raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from e
        except UnicodeDecodeError as e:
            raise ModelError(f"model file {path} is not UTF-8 text: {e}") from e
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ModelError(f"model file {path} is not valid JSON: {e}") from e
        try:
            return cls.from_dict(data)
        except ModelError as e:
            raise ModelError(f"model file {path}: {e}") from e

    def leaves_hz(self) -> list[int]:
        return sorted({n.freq_hz for n in self.nodes if isinstance(n, Leaf)})

    def decide(self, features: Features) -> TreeDecision:
        return self.decide_vector(dict(zip(FEATURE_ORDER, features.vector(), strict=True)))

    def decide_vector(self, values: dict[str, float]) -> TreeDecision:
        node, path = self.nodes[0], []
        while isinstance(node, Split):
            x = values[node.feature]
            if x <= node.threshold:
                path.append(f"{node.feature}={_fmt(x)} <= {_fmt(node.threshold)}")
                node = self.nodes[node.left]
            else:
                path.append(f"{node.feature}={_fmt(x)} > {_fmt(node.threshold)}")
                node = self.nodes[node.right]
        return TreeDecision(node.freq_hz, tuple(path))


# The shipped tree is a few KB; a tree of 10,000 nodes is under 1 MiB. The daemon reads the model as root at start:
# a device (/dev/zero), a FIFO or a huge file (in place of the tree or ffg.json) must be an error, not an endless
# read or a memory blow-up.
MAX_MODEL_BYTES = 4 * 1024 * 1024

# A leaf's frequency must read as a GPU clock in Hz (an Orin's levels are 306 to 1300.5 MHz, a datacenter GPU's up to
# about 2 GHz); a leaf between two levels of a table, or past its ends, is pinned at the nearest level at or above it.
MIN_LEAF_HZ = 1_000_000
MAX_LEAF_HZ = 10_000_000_000


def read_model_bytes(path: str | os.PathLike[str]) -> bytes:
    """A model file's bytes (the tree, ffg.json): a regular file of at most MAX_MODEL_BYTES, else OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO must not block the open
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > MAX_MODEL_BYTES:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than {MAX_MODEL_BYTES}")
        data = os.read(fd, MAX_MODEL_BYTES + 1)
        if len(data) > MAX_MODEL_BYTES:
            raise OSError(errno.EFBIG, f"more than {MAX_MODEL_BYTES} bytes")
        return data
    finally:
        os.close(fd)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _parse_node(i: int, node, count: int) -> Split | Leaf:
    if not isinstance(node, dict):
        raise ModelError(f"node {i} is not an object")
    if "freq_hz" in node:
        hz = node["freq_hz"]
        if not isinstance(hz, int) or isinstance(hz, bool) or hz <= 0:
            raise ModelError(f"node {i}: freq_hz must be a positive integer (Hz), got {_short(hz)}")
        if not MIN_LEAF_HZ <= hz <= MAX_LEAF_HZ:
            # The daemon pins the nearest level at or above a leaf: 816 (MHz written for Hz) would pin every job it
            # reaches at the lowest level, 816e9 at the highest, each silently. Refused, as ffg_freq_hz is.
            raise ModelError(f"node {i}: freq_hz {_short(hz)} is not a GPU clock in Hz ({mhz(MIN_LEAF_HZ)} to "
                             f"{mhz(MAX_LEAF_HZ)}); the value is in Hz")
        return Leaf(hz)
    feature, threshold = node.get("feature"), node.get("threshold")
    if feature not in FEATURE_ORDER:
        raise ModelError(f"node {i}: unknown feature {_short(feature)}")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not _finite(threshold):
        raise ModelError(f"node {i}: threshold must be a finite number, got {_short(threshold)}")
    return Split(feature, float(threshold), _child(i, node, "left", count), _child(i, node, "right", count))


def _finite(x: int | float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer past float's range (JSON allows 400 digits)
        return False


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _child(i: int, node: dict, name: str, count: int) -> int:
    child = node.get(name)
    if not isinstance(child, int) or isinstance(child, bool) or not 0 < child < count:
        raise ModelError(f"node {i}: {name} must be a node index in 1..{count - 1}, got {_short(child)}")
    return child


def _check_is_tree(nodes: list[Split | Leaf]) -> None:
    seen, stack = set(), [0]
    while stack:
        i = stack.pop()
        if i in seen:
            raise ModelError(f"node {i} is reached twice: not a tree")
        seen.add(i)
        node = nodes[i]
        if isinstance(node, Split):
            stack += [node.left, node.right]
    if len(seen) != len(nodes):
        raise ModelError(f"nodes {sorted(set(range(len(nodes))) - seen)} are unreachable")


def tree_version(tree) -> str | None:
    """A short id of the tree the daemon decides with (recorded with each job; retrain finds the tree by it): its own
    ``model_id`` when the export carries one, else a hash of its nodes (so a reload that changes the tree changes
    the id)."""
    if tree is None:
        return None
    meta = getattr(tree, "metadata", None) or {}
    if isinstance(meta.get("model_id"), str):
        return meta["model_id"]
    return hashlib.sha256(repr(tree.nodes).encode()).hexdigest()[:16]
