"""`ftgov history` and `ftgov report` on a store made by the simulator, and the store's Prometheus figures."""

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from governor.cli import main
from governor.cli.history import parse_since
from governor.cli.metrics import families
from governor.daemon.store import Store
from governor.errors import FtgovError
from governor.pipeline import retrain
from governor.policy.tree import DecisionTree
from governor.sim import learning
from governor.text import printable

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\r\nname\u202e"


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "measurements.sqlite"
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    records = list(learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 30, seed=2))
    records[5] = dataclasses.replace(records[5], name=HOSTILE)
    s = Store(path)
    for r in records:
        s.add(r)
    s.close()
    return path, records


def test_history_lists_every_job_with_escaped_names(sim_store, capsys):
    path, records = sim_store
    assert main(["history", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1 + len(records) + 1  # header, one line per job, the totals
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "evil\\x1b[2J\\x1b]0;owned\\x07\\x0d\\x0aname\\u202e"[:23] in out
    r = records[0]
    assert f"{r.freq_hz / 1e6:g}" in lines[1] and f"{r.energy_j:.1f}" in lines[1]
    assert "vs start level" in out and f"{len(records)} job(s) listed" in lines[-1]


def test_history_since_and_json(sim_store, capsys):
    path, records = sim_store
    cutoff = records[20].ended_at
    assert main(["history", "--store", str(path), "--json", "--since", str(cutoff)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [j["name"] for j in doc["jobs"]] == [r.name for r in records[20:]]
    assert doc["jobs"][0]["windows"] and doc["totals"]["jobs"] == len(records)
    assert doc["jobs"][0]["saved_j"] == pytest.approx(records[20].saved_j)


def test_since_accepts_relative_and_iso_times_and_refuses_the_rest():
    assert parse_since("2d", now=1_000_000.0) == 1_000_000.0 - 2 * 86400
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    assert parse_since("2026-12-01") < parse_since("2026-12-01T10:00")
    with pytest.raises(FtgovError, match="--since"):
        parse_since("yesterday")


def test_printable_escapes_control_and_format_characters_only():
    assert printable("bert-base/sst2 ü 名前") == "bert-base/sst2 ü 名前"
    assert printable("a\x00b\x7fc\x9bd\u200be") == "a\\x00b\\x7fc\\x9bd\\u200be"
    assert printable("forged \\x1b") == "forged \\\\x1b"  # a backslash is doubled: no escape can be faked


def test_history_on_a_missing_store_says_so(tmp_path, capsys):
    assert main(["history", "--store", str(tmp_path / "none.sqlite")]) == 1
    assert "no measurement store" in capsys.readouterr().err


def test_report_draws_the_curves_and_savings_and_writes_the_summary(sim_store, tmp_path):
    path, records = sim_store
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    for png in ("curves.png", "savings.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / png).stat().st_size > 10_000
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert sum(int(r["jobs"]) for r in rows) == len(records)
    assert any(r["bracketed_minimum_mhz"] for r in rows)
    assert all("\x1b" not in r["workload"] for r in rows)
    assert f"{len(records)} jobs recorded" in (out / "summary.md").read_text()


def test_report_survives_names_made_to_break_it(tmp_path):
    # A member names its jobs: "$...$" is matplotlib math (a bad one made the report raise), "=..." a spreadsheet
    # formula in summary.csv.
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    records = list(learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 12, seed=5))
    path = tmp_path / "m.sqlite"
    s = Store(path)
    for i, r in enumerate(records):
        s.add(dataclasses.replace(r, name="a$\\foo{$b" if i % 2 else '=HYPERLINK("http://x","y")'))
    s.close()
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    cells = [r["workload"] for r in csv.DictReader((out / "summary.csv").open())]
    assert cells and not any(c.startswith("=") for c in cells)
    assert any(c.startswith("'=HYPERLINK") for c in cells) or any("$" in c for c in cells)


def test_prometheus_families_carry_the_store_totals():
    status = {"jobs": [], "gpus": [], "store": {"jobs": 12, "energy_j": 3456.5, "saved_j": 210.25, "error": None}}
    by_name = {f.name: f.samples for f in families(status)}
    assert by_name["ftgov_jobs_recorded"] == [({}, 12.0)]
    assert by_name["ftgov_energy_joules_cumulative"] == [({}, 3456.5)]
    assert by_name["ftgov_energy_saved_joules_cumulative"] == [({}, 210.25)]
    broken = {**status, "store": {**status["store"], "error": "disk full"}}
    assert {f.name: f.samples for f in families(broken)}["ftgov_energy_joules_cumulative"] == []
