"""The tree reader against hand-edited exports: every field with a wrong type or value is a ModelError (which the
daemon logs and refuses), never another exception, and a refused tree says which field and why."""

from __future__ import annotations

import copy
import json

import pytest

from governor.errors import ModelError
from governor.features import Features
from governor.policy.tree import DecisionTree
from tests.support import REPO

SHIPPED = json.loads((REPO / "governor" / "data" / "mlg-tree.json").read_text())
SPLIT = next(i for i, n in enumerate(SHIPPED["nodes"]) if "feature" in n)
LEAF = next(i for i, n in enumerate(SHIPPED["nodes"]) if "freq_hz" in n)
WRONG = [None, 5, 1.5, True, "x", [], [1], {}, {"a": 1}, 10 ** 400, float("nan"), float("inf")]


def edited(change) -> dict:
    doc = copy.deepcopy(SHIPPED)
    change(doc)
    return doc


def set_top(key, value):
    return lambda doc: doc.__setitem__(key, value)


def set_node(index, key, value):
    return lambda doc: doc["nodes"][index].__setitem__(key, value)


CASES = [(f"{key}={value!r:.20}", set_top(key, value))
         for key in ("format", "features", "model_type_codes", "nodes", "source", "description", "metadata")
         for value in WRONG] + \
        [(f"split.{key}={value!r:.20}", set_node(SPLIT, key, value))
         for key in ("feature", "threshold", "left", "right") for value in WRONG] + \
        [(f"leaf.freq_hz={value!r:.20}", set_node(LEAF, "freq_hz", value)) for value in WRONG]


@pytest.mark.parametrize("change", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_any_value_in_any_field_loads_or_is_a_model_error(change):
    doc = edited(change)
    try:
        tree = DecisionTree.from_dict(doc)
    except ModelError as e:
        assert len(str(e)) < 300  # a 400-digit number or a long list is not copied into the log whole
        return
    assert isinstance(tree.source, str) and isinstance(tree.description, str) and isinstance(tree.metadata, dict)


@pytest.mark.parametrize("key, value, fault", [
    ("features", None, "features must be"),
    ("features", 5, "features must be"),
    ("metadata", [1], "metadata must be an object"),
    ("metadata", "x", "metadata must be an object"),
    ("source", 5, "source must be a string"),
])
def test_a_top_level_field_of_the_wrong_type_is_refused_with_its_name(key, value, fault):
    with pytest.raises(ModelError, match=fault):
        DecisionTree.from_dict(edited(set_top(key, value)))


def test_a_threshold_past_floats_range_is_refused_not_an_overflow(tmp_path):
    path = tmp_path / "tree.json"
    text = json.dumps(SHIPPED).replace(json.dumps(SHIPPED["nodes"][SPLIT]["threshold"]), "1" + "0" * 400, 1)
    path.write_text(text)
    with pytest.raises(ModelError, match=f"node {SPLIT}: threshold must be a finite number, got 1000"):
        DecisionTree.load(path)


@pytest.mark.parametrize("hz", [816, 816_000, 816_000_000_000])
def test_a_leaf_that_is_no_gpu_clock_in_hz_is_refused(hz):
    # 816 was written in MHz: the daemon would pin the lowest level for every job reaching it; in GHz... the highest.
    with pytest.raises(ModelError, match=f"node {LEAF}: freq_hz {hz} is not a GPU clock in Hz"):
        DecisionTree.from_dict(edited(set_node(LEAF, "freq_hz", hz)))


def test_a_leaf_between_levels_or_past_the_table_still_loads():
    # The daemon pins the nearest level at or above it (governor.policy): 700 MHz, 2 GHz are clocks.
    for hz in (700_000_000, 2_000_000_000):
        assert hz in DecisionTree.from_dict(edited(set_node(LEAF, "freq_hz", hz))).leaves_hz()


@pytest.mark.parametrize("nodes, fault", [
    ([{"feature": "num_layers", "threshold": 7.0, "left": 1, "right": 1}, {"freq_hz": 714_000_000}], "reached twice"),
    ([{"feature": "num_layers", "threshold": 7.0, "left": 1, "right": 2},
      {"feature": "seq_len", "threshold": 7.0, "left": 2, "right": 1}, {"freq_hz": 714_000_000}], "reached twice"),
    ([{"feature": "num_layers", "threshold": 7.0, "left": 0, "right": 1}, {"freq_hz": 714_000_000}], "left must be"),
    ([{"feature": "num_layers", "threshold": 7.0, "left": 1}, {"freq_hz": 714_000_000}], "right must be"),
    ([{"feature": "num_layers", "threshold": 7.0, "left": 1, "right": 5}, {"freq_hz": 714_000_000}], "right must be"),
    ([{"freq_hz": 714_000_000}, {"freq_hz": 816_000_000}], "unreachable"),
    ([{"feature": "gpu_util", "threshold": float("nan"), "left": 1, "right": 2}, {"freq_hz": 714_000_000},
      {"freq_hz": 816_000_000}], "finite number"),
])
def test_cycles_missing_children_and_nan_thresholds_are_refused(nodes, fault):
    with pytest.raises(ModelError, match=fault):
        DecisionTree.from_dict({**SHIPPED, "nodes": nodes})


def test_a_very_deep_tree_loads_and_decides_without_recursion(tmp_path):
    # A chain of splits as deep as the size bound allows: the reader and the walk are iterative.
    depth = 40_000
    nodes = []
    for i in range(depth):
        nodes.append({"feature": "num_layers", "threshold": float(depth - i), "left": 2 * i + 2, "right": 2 * i + 1})
        nodes.append({"freq_hz": 714_000_000})
    nodes[-1] = {"freq_hz": 816_000_000}
    nodes.append({"freq_hz": 612_000_000})
    # node 2i's right child is its leaf (2i+1), its left the next split (2i+2); the last split's left is the 612 leaf
    path = tmp_path / "deep.json"
    path.write_text(json.dumps({**SHIPPED, "nodes": nodes}, separators=(",", ":")))
    tree = DecisionTree.load(path)
    decision = tree.decide(Features(model_type="encoder", num_layers=1, hidden_size=768, seq_len=40.0, gpu_util=50.0))
    assert decision.freq_hz == 612_000_000 and len(decision.path) == depth
