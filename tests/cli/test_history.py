"""`ftgov history` and `ftgov report` on a store made by the simulator, and the store's Prometheus figures."""

import argparse
import csv
import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from governor.cli import main
from governor.cli.history import parse_since
from governor.cli.metrics import families
from governor.errors import FtgovError
from governor.pipeline import retrain
from governor.policy.tree import DecisionTree
from governor.safefile import OutDir
from governor.sim import learning
from governor.store.measurements import BadRow, JobRecord, Store, open_read_only, read_jobs
from governor.text import printable
from governor.units import energy
from tests.support.stores import old_store

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


def test_history_escapes_every_text_a_store_from_elsewhere_carries(sim_store, tmp_path, capsys):
    """A store given with --store may be a member's file: its policy and its saving's basis are text of the file's,
    not the daemon's words, and reach root's terminal too."""
    _path, records = sim_store
    path = tmp_path / "member.sqlite"
    s = Store(path)
    s.add(dataclasses.replace(records[0], policy=HOSTILE, saved_rel=0.1, saved_basis=HOSTILE))
    s.close()
    assert main(["history", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert out.count("evil\\x1b[2J") == 2  # the policy's first characters, and the basis whole


def test_history_since_and_json(sim_store, capsys):
    path, records = sim_store
    cutoff = records[20].ended_at
    assert main(["history", "--store", str(path), "--json", "--since", f"@{cutoff}"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [j["name"] for j in doc["jobs"]] == [r.name for r in records[20:]]
    assert doc["jobs"][0]["windows"] and doc["totals"]["jobs"] == len(records)
    assert doc["jobs"][0]["saved_j"] == pytest.approx(records[20].saved_j)


def test_since_accepts_relative_and_iso_times_today_and_yesterday_and_refuses_the_rest():
    assert parse_since("2d", now=1_000_000.0) == 1_000_000.0 - 2 * 86400
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    assert parse_since("2026-12-01") < parse_since("2026-12-01T10:00")
    noon = datetime(2026, 12, 6, 12, 30).timestamp()
    assert parse_since("today", now=noon) == datetime(2026, 12, 6).timestamp()
    assert parse_since("Yesterday", now=noon) == datetime(2026, 12, 5).timestamp()
    with pytest.raises(FtgovError, match="--since 'last week': give 7d, 12h, 30m, today, yesterday"):
        parse_since("last week")
    assert parse_since("@1796600000.5") == 1796600000.5  # epoch seconds, as journalctl and date -d take them


@pytest.mark.parametrize("text", ["7", "12", "nan", "inf", "1e9", "@nan", "@x"])
def test_since_refuses_a_bare_number_that_would_mean_1970(text):
    """`--since 7` was 7 seconds after 1970 (every job), and `--since nan` no job at all: a number wants its unit."""
    with pytest.raises(FtgovError, match=f"--since '{text}': give 7d, 12h"):
        parse_since(text)


def test_printable_escapes_control_and_format_characters_only():
    assert printable("bert-base/sst2 ü 名前") == "bert-base/sst2 ü 名前"
    assert printable("a\x00b\x7fc\x9bd\u200be") == "a\\x00b\\x7fc\\x9bd\\u200be"
    assert printable("forged \\x1b") == "forged \\\\x1b"  # a backslash is doubled: no escape can be faked


def test_history_on_a_missing_store_says_so(tmp_path, capsys):
    assert main(["history", "--store", str(tmp_path / "none.sqlite")]) == 1
    assert "no measurement store" in capsys.readouterr().err


@pytest.fixture
def sim_state_dir(sim_store, tmp_path, monkeypatch):
    """A simulated daemon's state dir, as ftgovd --simulate leaves it when stopped: tree and store, no socket."""
    state_dir = tmp_path / "ftgov-sim"
    (state_dir / "sim-orin").mkdir(parents=True)
    shutil.copy(sim_store[0], state_dir / "measurements.sqlite")
    monkeypatch.delenv("FTGOV_SIM_TREE", raising=False)
    monkeypatch.setenv("FTGOV_SOCKET", str(state_dir / "ftgov.sock"))
    return state_dir


@pytest.mark.parametrize("named_by", ["FTGOV_SIM_TREE", "FTGOV_SOCKET"])
def test_history_reads_the_stopped_simulated_daemons_store(sim_state_dir, sim_store, named_by, monkeypatch, capsys):
    if named_by == "FTGOV_SIM_TREE":
        monkeypatch.setenv("FTGOV_SIM_TREE", str(sim_state_dir / "sim-orin"))
        monkeypatch.setenv("FTGOV_SOCKET", str(sim_state_dir.parent / "elsewhere.sock"))
    assert main(["history"]) == 0
    assert f"{len(sim_store[1])} job(s) listed" in capsys.readouterr().out


def test_history_without_a_store_names_the_option_that_gives_one(tmp_path, monkeypatch, capsys):
    import governor
    from governor import config

    monkeypatch.delenv("FTGOV_SIM_TREE", raising=False)
    monkeypatch.setenv("FTGOV_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setattr(governor, "DEFAULT_CONFIG_PATH", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(config, "DEFAULT_STORE_PATH", str(tmp_path / "none.sqlite"))
    assert main(["history"]) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov history: no measurement store at {tmp_path / 'none.sqlite'} "
                                               "(give --store PATH, or for ftgovd --simulate's: "
                                               'eval "$(ftgovd --simulate --print-env)")')
    given = tmp_path / "ftgov.yaml"
    given.write_text(f"store:\n  path: {tmp_path / 'gone.sqlite'}\n")
    assert main(["history", "--config", str(given)]) == 1
    assert capsys.readouterr().err.strip().endswith("gone.sqlite (give --store PATH)")


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


def test_report_does_not_replace_files_of_a_directory_that_holds_other_work(sim_store, tmp_path, capsys):
    """`ftgov report --out .` in a project directory must not overwrite its own summary.md: the report's names are
    common ones. A directory that holds only an earlier report (the README's /tmp/ftgov-report, run again) is
    replaced as before; --force replaces anyway."""
    path, _ = sim_store
    project = tmp_path / "project"
    project.mkdir()
    (project / "summary.md").write_text("my notes\n")
    (project / "train.py").write_text("print()\n")
    assert main(["report", "--store", str(path), "--out", str(project)]) == 1
    err = capsys.readouterr().err
    assert "summary.md" in err and "--force" in err and len(err.strip().splitlines()) == 1, err
    assert (project / "summary.md").read_text() == "my notes\n"
    assert sorted(p.name for p in project.iterdir()) == ["summary.md", "train.py"]  # nothing written at all
    assert main(["report", "--store", str(path), "--out", str(project), "--force"]) == 0
    assert "jobs recorded" in (project / "summary.md").read_text()
    again = tmp_path / "ftgov-report"
    assert main(["report", "--store", str(path), "--out", str(again)]) == 0
    assert main(["report", "--store", str(path), "--out", str(again)]) == 0  # an earlier report's dir: replaced
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "notes.txt").write_text("x")
    assert main(["report", "--store", str(path), "--out", str(tmp_path / "fresh")]) == 0  # nothing of its replaced


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
    status = {"jobs": [], "gpus": [], "store": {"jobs": 12, "energy_j": 3456.5, "saved_j": 210.25,
                                                "saved_default_j": 200.0, "saved_start_j": 10.25,
                                                "saved_unsplit_j": 0.0, "error": None}}
    by_name = {f.name: f.samples for f in families(status)}
    assert by_name["ftgov_jobs_recorded"] == [({}, 12.0)]
    assert by_name["ftgov_energy_joules"] == [({}, 3456.5)]  # a counter: exposed as ftgov_energy_joules_total
    assert by_name["ftgov_energy_saved_joules_cumulative"] == [
        ({"basis": "default_governor"}, 200.0), ({"basis": "tuner_start"}, 10.25), ({"basis": "unsplit"}, 0.0)]
    before_split = {**status, "store": {"jobs": 12, "energy_j": 3456.5, "saved_j": 210.25, "error": None}}
    assert {f.name: f.samples for f in families(before_split)}["ftgov_energy_saved_joules_cumulative"] == [
        ({"basis": "unsplit"}, 210.25)]  # a daemon from before the split, until it is restarted
    broken = {**status, "store": {**status["store"], "error": "disk full"}}
    assert {f.name: f.samples for f in families(broken)}["ftgov_energy_joules"] == []


def test_energy_is_written_in_the_unit_its_size_calls_for():
    assert [energy(j) for j in (None, 0.0, 21.3, 999.4, 4500.0, 123_456.0, 2.5e6)] == [
        "-", "0.00 J", "21.3 J", "1.00 kJ", "4.50 kJ", "123 kJ", "2.50 MJ"]


def one_tuned_job(tmp_path, **changes) -> tuple[Path, object]:
    """A store holding one tuned job of the simulated board (its windows bracket a minimum), changed as given."""
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    stream = learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 8, seed=3)
    record = dataclasses.replace(next(r for r in stream if r.windows and r.saved_rel), **changes)
    path = tmp_path / "one.sqlite"
    s = Store(path)
    s.add(record)
    s.close()
    return path, record


def test_a_tuned_job_registered_without_gpu_util_has_its_curve_and_an_unknown_load(tmp_path):
    path, record = one_tuned_job(tmp_path, gpu_util=None)
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    (row,) = csv.DictReader((out / "summary.csv").open())
    levels = {w.level_hz for w in record.windows if w.level_hz is not None}
    assert (row["gpu_util"], row["tuned_jobs"], int(row["levels_measured"])) == ("", "1", len(levels))
    assert "| None |" not in (out / "summary.md").read_text()


class KeptFigures:
    """matplotlib.pyplot for report's drawing functions, keeping the figures they close, to look at after."""

    def __init__(self):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt, self.figures = plt, []

    def subplots(self, *args, **kwargs):
        fig, axes = self.plt.subplots(*args, **kwargs)
        self.figures.append(fig)
        return fig, axes

    def close(self, fig):
        pass


def test_one_job_draws_whole_titles_and_a_time_axis_around_it(tmp_path):
    from matplotlib.dates import num2date

    from governor.cli import report

    path, record = one_tuned_job(tmp_path, energy_j=100.0, saved_rel=21.3 / 121.3)  # 21.3 J saved
    jobs, totals = report.load(argparse.Namespace(store=str(path), config=None, socket=None))
    kept = KeptFigures()
    with OutDir(tmp_path / "report") as out:
        report._curves(kept, report.workloads(jobs), out)
        report._savings(kept, jobs, out)
    curves, savings = kept.figures
    renderer = curves.canvas.get_renderer()
    curves.draw(renderer)
    texts = [curves._suptitle] + [ax.title for ax in curves.axes if ax.axison]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= curves.bbox.x1 and box.y1 <= curves.bbox.y1, \
            (text.get_text(), box, curves.bbox)
    first, last = (num2date(x).timestamp() for x in savings.axes[0].get_xlim())
    assert first < record.ended_at < last and last - first <= 2 * 3600
    assert savings.axes[1].get_ylabel() == "cumulative saved (J)"
    for fig in kept.figures:
        kept.plt.close(fig)


def test_totals_small_and_large_are_written_in_their_unit(tmp_path, capsys):
    path, record = one_tuned_job(tmp_path, energy_j=100.0, saved_rel=21.3 / 121.3,
                                 saved_basis="default governor")  # 21.3 J saved
    said = "measured saved: 21.3 J against the default governor"  # none measured against the tuner's start: not said
    assert main(["history", "--store", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f", {energy(record.energy_j)}; {said}")
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    assert (out / "summary.md").read_text().endswith(f"1 jobs recorded in all: {energy(record.energy_j)}; {said}.\n")


def test_totals_say_the_saving_by_basis_and_what_came_before_the_split(tmp_path, capsys):
    """Against the default governor is ftgov's saving; against the tuner's start, what tuning added to the tree's
    pick: one sum would read as the former. A total from before the store kept them apart is said as such."""
    path = tmp_path / "m.sqlite"
    old_store(path, 3).close()
    s = Store(path)
    s.conn.execute("UPDATE totals SET saved_unsplit_j = 7.5, saved_j = 7.5")
    base = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, policy="tune", energy_j=80.0)
    s.add(JobRecord(ended_at=1e9, **base, saved_rel=0.2, saved_basis="default governor"))  # 20 J
    s.add(JobRecord(ended_at=1e9 + 1, **base, saved_rel=-0.25, saved_basis="start level"))  # -16 J
    s.close()
    assert main(["history", "--store", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "measured saved: 20.0 J against the default governor, -16.0 J against the tuner's start, 7.50 J recorded "
        "before the store kept the two apart")
    assert main(["history", "--store", str(path), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["saved_j"] == pytest.approx(11.5) and totals["saved_default_j"] == pytest.approx(20.0)


def test_history_shows_a_savings_uncertainty_where_the_store_has_one(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    s = Store(path)
    base = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, policy="tune",
                saved_rel=0.184, saved_basis="default governor")
    s.add(JobRecord(ended_at=1e9, **base, saved_pct_err=1.27))
    s.add(JobRecord(ended_at=1e9 + 1, **base))  # recorded before the store kept it: none shown
    s.close()
    assert main(["history", "--store", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("18.4% ± 1.3 vs default governor") and lines[2].endswith("18.4% vs default governor")


def test_a_saving_that_rounds_to_zero_is_not_written_minus_zero(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    s = Store(path)
    s.add(JobRecord(ended_at=1e9, model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, policy="tune",
                    saved_rel=-0.0001, saved_pct_err=7.2, saved_basis="default governor"))
    s.close()
    assert main(["history", "--store", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("  0.0% ± 7.2 vs default governor")


DAMAGE = {  # what SQLite keeps in a column whatever its declared type, and what the readers once raised a traceback on
    "text-time": "UPDATE jobs SET ended_at = 'x' WHERE id = 2",
    "far-time": "UPDATE jobs SET ended_at = 1e300 WHERE id = 2",
    "text-energy": "UPDATE jobs SET energy_j = 'lots' WHERE id = 2",
    "blob-name": "UPDATE jobs SET name = x'00ff' WHERE id = 2",
    "levels-not-json": "UPDATE jobs SET levels_hz = '[1,' WHERE id = 2",
    "text-layers": "UPDATE jobs SET num_layers = 'q' WHERE id = 2",
    "unknown-model-type": "UPDATE jobs SET model_type = 'moe' WHERE id = 2",
    "text-window": "UPDATE windows SET joules_per_step = 'q' WHERE job = 2",
}


@pytest.mark.parametrize("sql", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_job_is_left_out_by_name_and_the_rest_are_shown(sim_store, tmp_path, sql, capsys):
    _path, records = sim_store
    path = tmp_path / "damaged.sqlite"
    s = Store(path)
    for r in records[:3]:
        s.add(dataclasses.replace(r, name=f"{r.name}-{records.index(r)}"))
    s.close()
    raw = sqlite3.connect(path)
    raw.execute(sql)
    raw.commit()
    raw.close()
    assert main(["history", "--store", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and f"{records[0].name}-0" in out and f"{records[2].name}-2" in out
    if "windows" in sql:  # the table reads no windows: what it shows of job 2 is sound
        assert f"{records[1].name}-1" in out and not err
    else:
        assert "job 2" in err and "1 job(s) left out" in err and f"{records[1].name}-1" not in out
    assert main(["history", "--store", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "job 2" in err and len(json.loads(out)["jobs"]) == 2
    assert main(["report", "--store", str(path), "--out", str(tmp_path / "report")]) == 0
    assert "job 2" in capsys.readouterr().err
    with pytest.raises(BadRow, match="job 2"):  # retraining takes no partial store: it says which row
        read_jobs(open_read_only(path))
    with pytest.raises(BadRow, match=f"{path}: job 2[:,] .*no partial store"):
        retrain.load_records([path])


def test_damaged_totals_are_named_with_the_store(sim_store, tmp_path, capsys):
    path = tmp_path / "damaged.sqlite"
    s = Store(path)
    s.add(sim_store[1][0])
    s.close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE totals SET energy_j = 'q'")
    raw.commit()
    raw.close()
    assert main(["history", "--store", str(path)]) == 1
    assert capsys.readouterr().err.strip() == f"ftgov history: {path}: the totals: energy_j is 'q', not a finite number"


def _store_of_many_windows(path: Path, jobs: int, windows: int) -> None:
    """``jobs`` tuned jobs of ``windows`` windows each (the daemon's bound is about 270 a job, max_jobs 20,000 jobs:
    5 million rows a full store may hold), inserted as the store's own statements do."""
    from governor.store import measurements as store

    s = Store(path)
    base = JobRecord(ended_at=1e9, model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, policy="tune")
    with store._transaction(s.conn):
        for i in range(jobs):
            job = s.conn.execute(store._INSERT_JOB, [getattr(dataclasses.replace(base, ended_at=1e9 + i), c)
                                                     for c in store.JOB_COLUMNS]).lastrowid
            s.conn.executemany(store._INSERT_WINDOW, ((job, k, 714_000_000, 1.0, 0.1, 4, 60.0)
                                                      for k in range(windows)))
    s.close()


def test_history_reads_no_window_it_does_not_show(tmp_path, capsys):
    """The table shows no windows, and --since that no job matches shows no job: a full store's 5 million window rows
    were read and held anyway (2.4 GB and 31 s for the table of a full store; 1.6 GB and 13 s for --since that matched
    nothing), on a board whose memory its training job shares."""
    import tracemalloc

    path = tmp_path / "m.sqlite"
    _store_of_many_windows(path, 2, 50_000)
    for argv, said in ((["history", "--store", str(path)], "2 job(s) listed"),
                       (["history", "--store", str(path), "--json", "--since", "2099-01-01"], '"jobs": []')):
        tracemalloc.start()
        try:
            assert main(argv) == 0
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert said in capsys.readouterr().out
        assert peak < 8e6, (argv, peak)  # the 100,000 windows held were 42 MB


@pytest.mark.parametrize("command", ["history", "report"])
@pytest.mark.parametrize("closed", ["directory", "file"])
def test_a_store_the_user_may_not_read_is_one_line_saying_so(tmp_path, command, closed):
    """As installed, the store is 0600 in /var/lib/ftgov, 0700, both root's; a member's `ftgov history` finds it from
    the daemon's status. Its directory closed, history and report ended in pathlib's PermissionError traceback; the
    file closed, in SQLite's "unable to open database file". Run here as root without the capabilities that pass
    over file modes, on a store of another uid's."""
    from tests.support.security import needs_root

    needs_root()
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux)")
    state = tmp_path / "state"
    state.mkdir()
    Store(state / "m.sqlite").close()
    for p in (state, state / "m.sqlite"):
        os.chown(p, 65534, 65534)
    (state if closed == "directory" else state / "m.sqlite").chmod(0o700 if closed == "directory" else 0o600)
    argv = [command, "--store", str(state / "m.sqlite")] + (["--out", str(tmp_path / "r")] * (command == "report"))
    no_dac = "-dac_override,-dac_read_search"
    done = subprocess.run(["setpriv", f"--inh-caps={no_dac}", f"--bounding-set={no_dac}", sys.executable, "-m",
                           "governor.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and done.stderr == (
        f"ftgov {command}: cannot read the measurement store {state / 'm.sqlite'}: Permission denied (the store is "
        "root's: run as root, or on a copy)\n"), done.stderr


def test_report_keeps_a_workloads_savings_apart_by_basis(tmp_path):
    """Against the default governor is ftgov's saving; against the tuner's start, what tuning added to the tree's
    pick. The summary's one mean_saved_pct averaged the two (20% and 2% made 11%, which neither job measured), and the
    cumulative curve summed them, which the store's totals keep apart (schema 4)."""
    from governor.cli import report

    path, record = one_tuned_job(tmp_path, energy_j=80.0, saved_rel=0.2, saved_basis="default governor")
    s = Store(path)
    s.add(dataclasses.replace(record, ended_at=record.ended_at + 60, saved_rel=0.02, saved_basis="start level"))
    s.close()
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--out", str(out)]) == 0
    (row,) = csv.DictReader((out / "summary.csv").open())
    assert (row["mean_saved_vs_default_pct"], row["mean_saved_vs_start_pct"]) == ("20.00", "2.00")
    assert "11.00" not in (out / "summary.md").read_text()
    jobs, _ = report.load(argparse.Namespace(store=str(path), config=None, socket=None))
    kept = KeptFigures()
    with OutDir(tmp_path / "again") as again:
        report._savings(kept, jobs, again)
    (savings,) = kept.figures
    lines = {line.get_label(): line.get_ydata()[-1] for line in savings.axes[1].get_lines()}
    assert lines == {"cumulative saved vs the default governor": pytest.approx(20.0),
                     "cumulative saved vs the tuner's start": pytest.approx(80.0 * 0.02 / 0.98)}
    kept.plt.close(savings)


def test_report_gives_each_gpu_of_a_host_its_own_curve(tmp_path):
    """A host with GPUs of different tables of levels (an A100 beside an H100): report took the newest job's table
    for every job, so the other GPU's windows fell outside it and its workload had no curve."""
    from governor.cli import report
    from governor.store.measurements import JobRecord, Window

    def job(i: int, gpu: str, levels: list[int]) -> JobRecord:
        return JobRecord(ended_at=1_000_000.0 + i, model_type="encoder", num_layers=12, hidden_size=768,
                         seq_len=40.0, gpu_util=60.0, name="bert", policy="tune", freq_hz=levels[1], gpu_name=gpu,
                         levels_hz=json.dumps(levels), energy_j=100.0, duration_s=10.0, steps=200,
                         windows=tuple(Window(hz, 1.0 + 0.1 * abs(k - 1), 0.1, 20) for k, hz in enumerate(levels)))

    a100 = [1_005_000_000, 1_200_000_000, 1_410_000_000]
    h100 = [1_100_000_000, 1_500_000_000, 1_980_000_000]
    groups = report.workloads([job(1, "NVIDIA A100", a100), job(2, "NVIDIA H100", h100)])
    assert sorted(tuple(g["curve"].energy_j) for g in groups if g["curve"]) == [tuple(a100), tuple(h100)]
    assert sorted(g["gpu"] for g in groups) == ["NVIDIA A100", "NVIDIA H100"]
    assert {g["curve"].label_hz for g in groups} == {a100[1], h100[1]}
