"""`ftgov evaluate`: the JSON schema, scoring on the held-out measurements, the policy hook, the plots."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass

import pytest

from governor.config import TunerConfig
from governor.errors import FtgovError
from governor.pipeline import dataset
from governor.pipeline import evaluate as ev
from governor.pipeline.policies import Pick, TuneSettings, build_policies, model_energy_j, simulated_workload
from governor.policy.tree import DecisionTree
from governor.sim.tuned_job import ModelBoard, run_tuned_job
from tests.support import REPO

MODEL = REPO / "model"
POLICIES = ("maxn", "ffg", "paper", "mlg", "tune", "oracle")
STATIC = ("ffg", "paper", "mlg", "oracle")


def parse(argv):
    parser = argparse.ArgumentParser()
    ev.add_parser(parser.add_subparsers())
    args = parser.parse_args(["evaluate", "--data", str(MODEL / "data" / "held-out.csv"),
                              "--mlg-tree", str(MODEL / "mlg-tree.json"),
                              "--paper-tree", str(MODEL / "paper-tree.json"),
                              "--ffg", str(MODEL / "ffg.json"), *argv])
    return args


def run_json(argv):
    args = parse(["--json", *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.func(args) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def report():
    """`ftgov evaluate --json` on the committed held-out set and models, parsed."""
    return run_json([])


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
            assert set(p) == {"freq_hz", "energy_j", "time_s"} | ({"profiled_steps"} if name == "tune" else set())
            assert (p["freq_hz"] is None) == (name == "maxn")
            assert p["energy_j"] > 0 and p["time_s"] > 0


def test_scores_are_the_held_out_measurements(report):
    sweeps = {s.workload: s for s in dataset.load(MODEL / "data" / "held-out.csv")}
    mlg = DecisionTree.load(MODEL / "mlg-tree.json")
    for w in report["workloads"]:
        s, p = sweeps[w["name"]], w["policies"]
        assert p["maxn"]["energy_j"] == pytest.approx(s.maxn_energy_j)
        for name in STATIC:
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


def test_tune_explores_within_the_daemons_energy_budget(report):
    """The daemon's budget is energy, not windows (TunerConfig, docs/tuner.md): what exploring costs over the whole
    2,000-step job (its energy per step over the converged level's, measured rows) is at most explore_budget_frac,
    plus what the windows' noise can add to the tuner's own reckoning: it prices windows at their noisy means
    against a noisy incumbent, 3 s.d. of which is about 1.5 points of a window at most here."""
    cfg = TunerConfig()
    assert cfg.max_probes >= 40  # a safety cap only: it must not cut the search off
    sweeps = {s.workload: s for s in dataset.load(MODEL / "data" / "held-out.csv")}
    excess = []
    for w in report["workloads"]:
        tune = w["policies"]["tune"]
        excess.append(tune["energy_j"] / sweeps[w["name"]].energy_j[tune["freq_hz"]] - 1)
        assert tune["profiled_steps"] > 0
    assert max(excess) <= cfg.explore_budget_frac + 0.005, sorted(excess)[-5:]
    assert sum(excess) / len(excess) <= cfg.explore_budget_frac


def test_tune_charges_its_exploration_over_the_whole_job(report):
    """One workload, recomputed apart: the same simulated job (seed 1000 * index + 0), its steps at each level
    charged at those levels' measured rows, the rest of the 2,000 steps at the converged level."""
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")
    s = next(s for s in sweeps if s.workload == "pythia-70m/qqp")
    index, workload = simulated_workload(s)
    start_hz = DecisionTree.load(MODEL / "mlg-tree.json").decide(s.features).freq_hz
    job = run_tuned_job(ModelBoard(workload, TuneSettings.noise, 1000 * index), start_hz, 2000,
                        config=TunerConfig.exact_meter())
    assert sum(job.steps_at_hz.values()) == job.profiled_steps
    assert len(job.steps_at_hz) >= 2  # it did explore: at least the start and a neighbour
    rest = 2000 - job.profiled_steps
    expected_j = (sum(n * s.energy_j[hz] for hz, n in job.steps_at_hz.items()) + rest * s.energy_j[job.best_hz]) / 2000
    expected_s = (sum(n * s.time_s[hz] for hz, n in job.steps_at_hz.items()) + rest * s.time_s[job.best_hz]) / 2000
    tune = next(w for w in report["workloads"] if w["name"] == s.workload)["policies"]["tune"]
    assert tune["freq_hz"] == job.best_hz
    assert tune["profiled_steps"] == job.profiled_steps
    assert tune["energy_j"] == pytest.approx(expected_j, abs=1e-6)
    assert tune["time_s"] == pytest.approx(expected_s, abs=1e-6)
    assert tune["energy_j"] != pytest.approx(s.energy_j[job.best_hz], abs=1e-6)  # exploration is in it


def test_tune_with_noise_lands_near_the_optimum(report):
    """Loose bounds: within one level of the (measured) oracle on average, and issue 6's 1% on the noise-free curve."""
    sweeps = dataset.load(MODEL / "data" / "held-out.csv")
    levels = list(sweeps[0].levels_hz)
    picks = {w["name"]: w["policies"] for w in report["workloads"]}
    gap = [abs(levels.index(picks[s.workload]["tune"]["freq_hz"]) - levels.index(s.optimum_hz)) for s in sweeps]
    assert sum(gap) / len(gap) <= 1.0
    truth = model_energy_j(sweeps)
    regret = [truth[s.workload][picks[s.workload]["tune"]["freq_hz"]] / min(truth[s.workload].values()) - 1
              for s in sweeps]
    assert sum(regret) / len(regret) <= 0.01
    assert all(p["tune"]["energy_j"] < p["maxn"]["energy_j"] for p in picks.values())


def test_tune_is_deterministic_by_seed(report):
    def tune_of(doc):
        return [w["policies"]["tune"] for w in doc["workloads"]]

    again = run_json(["--seed", "0"])
    assert tune_of(again) == tune_of(report)
    assert tune_of(run_json(["--seed", "3"])) != tune_of(report)  # the seed does drive the noise


def test_a_job_too_short_for_the_tuner_is_an_error():
    s = dataset.load(MODEL / "data" / "held-out.csv")[0]
    _, workload = simulated_workload(s)
    with pytest.raises(FtgovError, match="not converged"):  # shorter than the start's window of 1 + 4 steps
        run_tuned_job(ModelBoard(workload, 1.0, 0), s.levels_hz[5], 3)


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
    policies = build_policies(MODEL / "ffg.json", MODEL / "paper-tree.json", MODEL / "mlg-tree.json",
                              tune=TuneSettings())
    names = [p.name for p in policies]
    assert names == list(POLICIES)
    results = ev.evaluate(few, policies)
    text = ev.table(few, results, names, truth=model_energy_j(few))
    assert "average savings vs MAXN" in text and all(s.workload in text for s in few)
    assert "tune MHz/save%/steps" in text and "profiled steps, max" in text and "noise-free optimum" in text
    from governor.pipeline import plots

    written = plots.write_all(few, results, names, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["energy-vs-frequency-bert.png", "energy-vs-frequency-pythia.png",
                                               "savings.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
