"""Policy.decide with the paper's tree and FFG: names, fallbacks and levels, no daemon."""

from pathlib import Path

import pytest

from governor.features import Features
from governor.policy import Decision, Policy, PolicyName
from governor.policy.tree import DecisionTree

REPO = Path(__file__).resolve().parents[2]
LEVELS = (306_000_000, 408_000_000, 510_000_000, 612_000_000, 714_000_000, 816_000_000, 918_000_000, 1_020_000_000,
          1_122_000_000, 1_224_000_000, 1_300_500_000)
BERT = Features(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0)


@pytest.fixture(scope="module")
def tree():
    return DecisionTree.load(REPO / "model" / "paper-tree.json")


def test_mlg_follows_the_tree(tree):
    d = Policy(PolicyName.MLG, 918_000_000, tree).decide(BERT, LEVELS)
    assert (d.policy, d.freq_hz, d.fell_back_to, d.label) == (PolicyName.MLG, 714_000_000, None, "mlg")
    assert "gpu_util=60 > 22" in d.reason


def test_low_utilization_goes_down_the_other_branch(tree):
    d = Policy("mlg", 918_000_000, tree).decide(BERT.model_copy(update={"gpu_util": 10.0}), LEVELS)
    assert d.freq_hz != 714_000_000 and "gpu_util=10 <= 22" in d.reason


def test_mlg_without_a_tree_falls_back_to_ffg_as_a_field():
    d = Policy(PolicyName.MLG, 918_000_000, None, fallback_reason="no model").decide(BERT, LEVELS)
    assert (d.policy, d.fell_back_to, d.freq_hz) == (PolicyName.MLG, PolicyName.FFG, 918_000_000)
    assert d.label == "mlg->ffg" and "no model" in d.reason  # the wire name stays as before


def test_ffg_snaps_up_to_the_next_level():
    d = Policy(PolicyName.FFG, 900_000_000, None).decide(BERT, LEVELS)
    assert d.freq_hz == 918_000_000 and "nearest level 918 MHz" in d.reason


def test_observe_pins_nothing_but_says_what_mlg_would_pick(tree):
    d = Policy(PolicyName.OBSERVE, 918_000_000, tree).decide(BERT, LEVELS)
    assert d.freq_hz is None and d.policy is PolicyName.OBSERVE and "mlg would pick 714 MHz" in d.reason


def test_observe_on_another_table_names_the_mapping_once(tree):
    nvml_levels = (210_000_000, 495_000_000, 750_000_000, 945_000_000, 1_410_000_000)  # no 714 MHz on this GPU
    d = Policy(PolicyName.OBSERVE, 918_000_000, tree).decide(BERT, nvml_levels)
    assert "mlg would pick 750 MHz: the Orin tree's 714 MHz maps to 750 MHz on this GPU's table; " in d.reason
    assert "-> 714 MHz)" not in d.reason  # the tree's own number is not a second pick at the end of the path
    assert "gpu_util=60 > 22" in d.reason


def test_a_job_may_ask_for_tune_on_an_mlg_daemon(tree):
    d = Policy(PolicyName.MLG, 918_000_000, tree).decide(BERT, LEVELS, PolicyName.TUNE)
    assert (d.policy, d.freq_hz, d.label) == (PolicyName.TUNE, 714_000_000, "tune")


@pytest.mark.parametrize("label", ["mlg", "ffg", "observe", "tune", "mlg->ffg", "tune->ffg"])
def test_labels_round_trip_through_the_state_file(label):
    assert Decision.from_label(label, 612_000_000, "").label == label


def test_an_unknown_policy_name_is_refused():
    with pytest.raises(ValueError):
        Policy("fastest", 918_000_000, None)


def test_whether_a_decision_needs_gpu_util_follows_the_trees_path(tree):
    policy = Policy(PolicyName.MLG, 918_000_000, tree)
    unknown = BERT.model_copy(update={"gpu_util": None})
    assert policy.needs_gpu_util(unknown)  # num_layers 12 > 7: the next split tests gpu_util
    small = unknown.model_copy(update={"num_layers": 4})
    assert not policy.needs_gpu_util(small) and policy.decide(small, LEVELS).freq_hz == 612_000_000
    assert not Policy(PolicyName.FFG, 918_000_000, tree).needs_gpu_util(unknown)
    with pytest.raises(ValueError, match="gpu_util must be measured"):
        policy.decide(unknown, LEVELS)
