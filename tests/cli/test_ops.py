"""`ftgov status` and `ftgov predict` against the real daemon, through the real `ftgov` entry point."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import governor
from governor.cli import EXIT_BROKEN_PIPE, main
from governor.client import Connection
from tests.support import REPO
from tests.support.daemon import limits
from tests.support.pipes import run_into_closed_pipe

BASELINE = (306000000, 1300500000)


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


def test_status_shows_jobs_pin_load_and_power(daemon, orin, capsys):
    with governor.job(model_type="decoder", num_layers=6, hidden_size=512, seq_len=30, gpu_util=70,
                      name="pythia-70m", socket=daemon.socket) as job:
        job.step(12)
        assert main(["status", "--socket", daemon.socket, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert main(["status", "--socket", daemon.socket]) == 0
        text = capsys.readouterr().out
    pin = job.registration["freq_hz"]
    assert limits(orin) == BASELINE  # the status above was taken while the job ran

    [entry] = status["jobs"]
    assert (entry["name"], entry["freq_hz"], entry["steps"]) == ("pythia-70m", pin, 12)
    assert status["gpus"][0]["pinned_hz"] == pin
    mhz = f"{pin / 1e6:g} MHz"
    assert f"pinned to {mhz}" in text
    row = next(line for line in text.splitlines() if "pythia-70m" in line)
    assert re.match(rf"{job.job_id}\s+pythia-70m\s+\d+\s+0\s+\S+\s+{mhz}\s+12\s", row), row
    for rail, mw in status["power_mw"].items():
        assert f"{rail} {mw:.0f} mW" in text
    assert f"job {job.job_id}: {entry['reason']}" in text


def test_status_of_many_jobs_with_long_names_is_read_whole(start_daemon, capsys):
    """Each of these jobs takes ~3.5 KB of status (its name, 256 characters outside the BMP, is 3 KB of JSON escapes):
    400 of them, where an operator raised limits.max_jobs, took status past the 1 MiB a client once read, and root's
    `ftgov status` (and the exporter) failed however the jobs' owners named them."""
    n = 400
    d = start_daemon(config={"limits": {"max_jobs": n, "max_jobs_per_connection": n, "max_jobs_per_uid": n,
                                        "max_ranks_per_uid": n, "registration_burst": n}})
    c = d.client()
    name = "\N{GRINNING FACE}" * 256
    for _ in range(n):
        c.call("register", model_type="encoder", num_layers=12, hidden_size=768, seq_len=40, gpu_util=70, name=name)
    assert main(["status", "--socket", d.socket, "--json"]) == 0
    out = capsys.readouterr().out
    status = json.loads(out)
    assert len(status["jobs"]) == n and {j["name"] for j in status["jobs"]} == {name}
    assert len(json.dumps(status, separators=(",", ":"))) > 1 << 20  # as the daemon sends it: past the old bound


def test_max_jobs_is_bounded_so_status_fits_a_reply(tmp_path):
    from governor.config import LimitsConfig

    with pytest.raises(ValueError, match="less than or equal to 4096"):
        LimitsConfig(max_jobs=4097)


def test_status_with_no_jobs(daemon, capsys):
    assert main(["status", "--socket", daemon.socket]) == 0
    out = capsys.readouterr().out
    assert "0 job(s)" in out and "not pinned" in out and "JOB" not in out


def test_predict_prints_policy_frequency_and_tree_path(daemon, capsys):
    features = dict(model_type="encoder", num_layers=12, hidden_size=768, seq_len=60.0, gpu_util=80.0)
    with Connection(daemon.socket) as conn:
        expected = conn.call("predict", **features)
    argv = ["predict", "--socket", daemon.socket, "--model-type", "encoder", "--num-layers", "12",
            "--hidden-size", "768", "--seq-len", "60", "--gpu-util", "80"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"frequency: {expected['freq_hz'] / 1e6:g} MHz" in out
    assert f"path:      {expected['reason']}" in out
    assert "seq_len=60" in expected["reason"], "the reason is the tree path"
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected


def test_operator_errors_are_clear(tmp_path, capsys):
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 1
    assert "ftgovd is not running: no socket at" in capsys.readouterr().err
    assert main(["predict", "--model-type", "encoder", "--num-layers", "2", "--hidden-size", "0", "--seq-len", "9",
                 "--socket", str(tmp_path / "none.sock")]) == 2
    assert "hidden_size" in capsys.readouterr().err


def test_no_daemon_on_the_default_socket_says_how_to_reach_a_simulated_one(tmp_path, monkeypatch, capsys):
    from governor import simpaths
    from governor.client import connection

    monkeypatch.setattr(connection, "DEFAULT_SOCKET", str(tmp_path / "ftgov.sock"))  # the board's, absent
    monkeypatch.delenv("FTGOV_SOCKET", raising=False)
    assert main(["status"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"ftgov status: ftgovd is not running: no socket at {tmp_path / 'ftgov.sock'} (start it with 'systemctl "
        "start ftgovd', or point FTGOV_SOCKET / --socket at its socket; for ftgovd --simulate's: "
        'eval "$(ftgovd --simulate --print-env)")')
    assert main(["status", "--socket", str(tmp_path / "none.sock")]) == 1
    assert "--simulate" not in capsys.readouterr().err  # a socket named: that one is missing
    (tmp_path / "sim" / "sim-orin").mkdir(parents=True)  # a stopped simulated daemon's directory: start that one
    assert main(["status", "--socket", str(tmp_path / "sim" / "ftgov.sock")]) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov status: ftgovd --simulate is not running: no socket at "
                                               f"{tmp_path / 'sim' / 'ftgov.sock'} (start it: ftgovd --simulate "
                                               f"--state-dir {tmp_path / 'sim'} &)")
    monkeypatch.setattr(simpaths, "simulate_runtime_dir", lambda: tmp_path / "sim")  # --simulate's default dir
    assert main(["status", "--socket", str(tmp_path / "sim" / "ftgov.sock")]) == 1
    assert capsys.readouterr().err.strip().endswith("(start it: ftgovd --simulate &)")


def test_a_simulated_daemon_never_started_or_killed_is_named_with_the_command_that_starts_it(tmp_path, monkeypatch,
                                                                                             capsys):
    """The README's order followed loosely: `eval "$(ftgovd --simulate --print-env)"` before the daemon ever ran (no
    tree yet beside the socket), or after it was killed (its socket file left behind). Either way the hint is the
    simulated daemon's command, not systemctl's, and a left socket says what to do."""
    import socket as socketlib

    from governor import simpaths

    sim = tmp_path / "sim"
    monkeypatch.setattr(simpaths, "simulate_runtime_dir", lambda: sim)
    assert main(["status", "--socket", str(sim / "ftgov.sock")]) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov status: ftgovd --simulate is not running: no socket at "
                                               f"{sim / 'ftgov.sock'} (start it: ftgovd --simulate &)")
    (sim / "sim-orin").mkdir(parents=True)
    left = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    left.bind(str(sim / "ftgov.sock"))
    left.close()  # a killed daemon's socket: the file stays, nothing listens
    assert main(["status", "--socket", str(sim / "ftgov.sock")]) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov status: nothing listens on {sim / 'ftgov.sock'}: ftgovd "
                                               "--simulate stopped and left its socket behind (start it again: "
                                               "ftgovd --simulate &)")
    board = tmp_path / "board.sock"
    left = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    left.bind(str(board))
    left.close()
    assert main(["status", "--socket", str(board)]) == 1
    assert capsys.readouterr().err.strip() == (f"ftgov status: nothing listens on {board}: ftgovd stopped and left "
                                               "its socket behind (start it again with 'systemctl start "
                                               "ftgovd')")


def test_sim_job_before_the_simulated_daemon_first_ran_says_how_to_start_it(tmp_path, capsys):
    """`eval "$(ftgovd --simulate --print-env)"` then `ftgov sim-job` before the daemon ever started: its tree is not
    built yet, and the error names the command that builds it rather than a missing ftgov-sim/layout file."""
    tree = tmp_path / "sim" / "sim-orin"
    assert main(["sim-job", "--tree", str(tree)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"ftgov: error: no simulated tree at {tree}: ftgovd --simulate builds it when it starts (start "
                   f"it: ftgovd --simulate --state-dir {tmp_path / 'sim'} &)"), err


def test_status_into_a_reader_that_went_away_exits_quietly(daemon):
    """`ftgov status | head -0`, deterministically: the pipe's read end is closed before ftgov writes. The
    BrokenPipeError is handled once, in main(), the way the Python docs do it: quiet, exit 141."""
    for args in (["status", "--socket", daemon.socket], ["status", "--json", "--socket", daemon.socket]):
        done = run_into_closed_pipe(*args)
        assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, ""), args


@pytest.mark.parametrize("args", [["sim-tree", "{tmp}/t"], ["history", "--json", "--store", "{store}"]],
                         ids=["sim-tree", "history --json"])
def test_a_reader_that_went_away_ends_the_command_quietly(args, tmp_path):
    from governor.store.measurements import Store

    Store(tmp_path / "m.sqlite").close()
    args = [a.replace("{tmp}", str(tmp_path)).replace("{store}", str(tmp_path / "m.sqlite")) for a in args]
    done = run_into_closed_pipe(*args)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")


def test_sim_job_finds_the_tree_beside_the_daemons_socket(tmp_path, capsys, monkeypatch):
    """A shell that has FTGOV_SOCKET (or a --socket) for a simulated daemon but not FTGOV_SIM_TREE: the tree lies
    beside the socket, and sim-job takes it from there instead of saying there is none."""
    from governor.sim import tree

    tree.build(tmp_path / "sim" / "sim-orin")
    monkeypatch.delenv("FTGOV_SIM_TREE", raising=False)
    sock = tmp_path / "sim" / "ftgov.sock"  # no daemon listens: the run gets as far as registering
    for args in (["--socket", str(sock)], []):
        monkeypatch.setenv("FTGOV_SOCKET", str(sock))
        assert main(["sim-job", *args, "--steps", "1"]) == 1
        err = capsys.readouterr().err
        assert "no simulated tree" not in err and "ftgovd --simulate" in err, err


def test_sim_tree_names_a_board_command_that_runs_where_python_is_not_this_one(tmp_path):
    """The board command sim-tree prints runs as printed from an installed ftgov (/opt/ftgov's venv, linked into
    /usr/local/bin), where `python` on PATH is another interpreter or none (JetPack has only python3)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": "/nonexistent"}
    made = subprocess.run([sys.executable, "-m", "governor.cli", "sim-tree", str(tmp_path / "t")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    board = made.stdout.split("; ", 1)[1].removesuffix(" makes it follow the pins\n")
    ran = subprocess.run(shlex.split(board) + ["--until-stdin-closes"], stdin=subprocess.DEVNULL, env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
