"""`ftgov evaluate`: the JSON schema, scoring on the held-out measurements, the policy hook, the plots."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from governor.pipeline import dataset
from governor.pipeline import evaluate as ev
from governor.pipeline.policies import Pick, build_policies
from governor.tree import DecisionTree

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "model"
POLICIES = ("maxn", "ffg", "paper", "mlg", "oracle")


def parse(argv):
    parser = argparse.ArgumentParser()
    ev.add_parser(parser.add_subparsers())
    args = parser.parse_args(["evaluate", "--data", str(MODEL / "data" / "held-out.csv"),
                              "--mlg-tree", str(MODEL / "mlg-tree.json"), "--paper-tree", str(MODEL / "paper-tree.json"),
                              "--ffg", str(MODEL / "ffg.json"), *argv])
    return args


@pytest.fixture(scope="module")
def report():
    """`ftgov evaluate --json` on the committed held-out set and models, parsed."""
    args = parse(["--json"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.func(args) == 0
    return json.loads(out.getvalue())


def test_json_follows_the_schema(report):
    assert set(report) == {"workloads", "average_savings_pct"}
    assert set(report["average_savings_pct"]) == set(POLICIES)
    assert report["average_savings_pct"]["maxn"] == 0
    assert len(report["workloads"]) == 60
    for w in report["workloads"]:
        assert set(w) == {"name", "model", "task", "policies"}
        assert w["name"] == f"{w['model']}/{w['task']}"
        assert set(w["policies"]) == set(POLICIES)
        for name, p in w["policies"].items():
            assert set(p) == {"freq_hz", "energy_j", "time_s"}
            assert (p["freq_hz"] is None) == (name == "maxn")
            assert p["energy_j"] > 0 and p["time_s"] > 0


def test_scores_are_the_held_out_measurements(report):
    sweeps = {s.workload: s for s in dataset.load(MODEL / "data" / "held-out.csv")}
    mlg = DecisionTree.load(MODEL / "mlg-tree.json")
    for w in report["workloads"]:
        s, p = sweeps[w["name"]], w["policies"]
        assert p["maxn"]["energy_j"] == pytest.approx(s.maxn_energy_j)
        for name in POLICIES[1:]:
            assert p[name]["energy_j"] == pytest.approx(s.energy_j[p[name]["freq_hz"]])
            assert p["oracle"]["energy_j"] <= p[name]["energy_j"]
        assert p["mlg"]["freq_hz"] == mlg.decide(s.features).freq_hz
        assert p["oracle"]["freq_hz"] == s.optimum_hz


def test_average_savings_are_the_mean_of_per_workload_savings(report):
    for name in POLICIES:
        per = [100 * (1 - w["policies"][name]["energy_j"] / w["policies"]["maxn"]["energy_j"])
               for w in report["workloads"]]
        assert report["average_savings_pct"][name] == pytest.approx(sum(per) / len(per), abs=1e-2)
    assert max(report["average_savings_pct"].values()) == report["average_savings_pct"]["oracle"]


@dataclass(frozen=True)
class ExhaustiveTuner:
    """A stand-in for an online tuner: probes every level for a few steps, then keeps the cheapest."""

    steps_per_probe: int = 10
    name: str = "tuned"

    def pick(self, sweep, probe):
        seen = [probe(f) for f in sweep.levels_hz]
        best = min(seen, key=lambda p: p.energy_j)
        return Pick(best.freq_hz, {p.freq_hz: self.steps_per_probe for p in seen})


def test_an_extra_policy_is_scored_with_its_probing_cost():
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")[:6]
    policies = build_policies(MODEL / "ffg.json", MODEL / "paper-tree.json", MODEL / "mlg-tree.json",
                              extra=[ExhaustiveTuner()])
    names = [p.name for p in policies]
    assert names == ["maxn", "ffg", "paper", "mlg", "tuned", "oracle"]
    results = ev.evaluate(sweeps, policies)
    for s in sweeps:
        tuned, oracle = results[s.workload]["tuned"], results[s.workload]["oracle"]
        assert tuned.freq_hz == oracle.freq_hz
        assert tuned.energy_j > oracle.energy_j  # it paid for probing the bad levels
    assert set(ev.to_json(sweeps, results, names)["average_savings_pct"]) == set(names)


def test_table_and_plots(tmp_path, capsys):
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")
    few = [s for s in sweeps if s.task in ("rte", "cola") and s.model in ("bert-base", "pythia-70m")]
    policies = build_policies(MODEL / "ffg.json", MODEL / "paper-tree.json", MODEL / "mlg-tree.json")
    names = [p.name for p in policies]
    results = ev.evaluate(few, policies)
    text = ev.table(few, results, names)
    assert "average savings vs MAXN" in text and all(s.workload in text for s in few)
    from governor.pipeline import plots

    written = plots.write_all(few, results, names, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["energy-vs-frequency-bert.png", "energy-vs-frequency-pythia.png",
                                               "savings.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
