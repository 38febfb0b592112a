"""ftgovd beside the simulated board: --simulate keeps the simulator out of the daemon's process, the board ends with
it, and the daemon's pin check, restore and energy figures hold against a board that behaves like the kernel."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys

import pytest

from governor.backends import devfreq, rails
from governor.sim import tree
from governor.sysfs import Root, write_text
from tests.daemon.test_import_graph import offenders
from tests.support import REPO
from tests.support.board import running_board, wait_reads
from tests.support.daemon import FEATURES, Daemon, limits
from tests.support.fswatch import Watch
from tests.support.security import needs_root

# Run ftgovd's own entry point, and write down at exit which modules its process imported.
_RECORD_MODULES = (
    "import atexit, runpy, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n"
    "sys.argv[0] = 'ftgovd'\n"
    "runpy.run_module('governor.daemon', run_name='__main__', alter_sys=True)\n"
)

THROTTLE_TICKS = 3  # ticks to wait for the daemon to flag (or clear) a throttled clock: two reads in a row
NOBODY = 65534


class RecordingDaemon(Daemon):
    def command(self) -> list[str]:
        cmd = super().command()
        return [sys.executable, "-c", _RECORD_MODULES, str(self.workdir / "modules.txt"),
                *cmd[cmd.index("governor.daemon") + 1:]]


def test_simulate_keeps_the_simulator_out_of_the_daemon_process(start_daemon):
    d = RecordingDaemon(None, simulate=True)
    try:
        d.start()
        assert d.client().call("register", **FEATURES)["freq_hz"] == 714000000
        board_pid = int(re.search(r"board process (\d+)", d.log()).group(1))
        # A try-out's socket is its user's: no word of the ftgov group (the demo's log began with it, as root).
        assert "socket.group" not in d.log()
        board = os.pidfd_open(board_pid)
        assert d.stop() == 0
        # The board waits on a pipe only the daemon held: it ends with it.
        assert select.select([board], [], [], 15)[0], "the board process outlived the daemon"
        os.close(board)
        modules = (d.workdir / "modules.txt").read_text().split()
    finally:
        d.close()
    assert "governor.daemon.main" in modules, "the record is of the daemon's process"
    assert offenders(set(modules)) == []  # what the daemon may not load (governor.simpaths is not the simulator)


def test_pin_check_and_restore_against_a_board_that_clamps(orin, start_daemon):
    node = devfreq.find_node(Root(orin))
    with running_board(orin):
        # nvpmodel's MAXN writes 0 / 2147483647; the kernel reads them back as the table's ends.
        write_text(node / "max_freq", "2147483647")
        write_text(node / "min_freq", "0")
        wait_reads(node / "min_freq", lambda t: t == "306000000")
        wait_reads(node / "max_freq", lambda t: t == "1300500000")
        d = start_daemon()
        c = d.client()
        job = c.call("register", **FEATURES)
        assert limits(orin) == (714000000, 714000000)
        watch = Watch(node)
        try:
            write_text(node / "max_freq", "1300500000")  # a tool raises the max under the pin: min keeps 714
            watch.wait(lambda: "limits changed under our pin" in d.log() and limits(orin) == (714000000, 714000000))
        finally:
            watch.close()
        c.call("unregister", job_id=job["job_id"])
        assert limits(orin) == (306000000, 1300500000), "the baseline as the kernel reads it"


def test_the_log_names_the_energy_sum_of_each_board(tmp_path, start_daemon):
    nx = tree.build(tmp_path / "nx", "nx-jp6").root
    d = start_daemon(root=nx)
    assert "job energy counts VDD_IN: the module's total input (Orin NX/Nano)" in d.log()
    c = d.client()
    job = c.call("register", **FEATURES)
    assert c.call("unregister", job_id=job["job_id"])["energy_j"] is not None
    d.close()

    (nx / "sys/class/hwmon/hwmon1/in1_label").unlink()  # no VDD_IN: no sum applies
    d = start_daemon(root=nx)
    assert re.search(r"WARNING .*power rails: VDD_CPU_GPU_CV, VDD_SOC; no known energy sum", d.log()), d.log()
    c = d.client()
    job = c.call("register", **FEATURES)
    assert c.call("unregister", job_id=job["job_id"])["energy_j"] is None, "no figure rather than a partial one"


def test_simulate_refuses_a_tree_of_your_own(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--sysfs-root", str(tmp_path),
                           "--config", os.devnull], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "--simulate builds its own tree" in proc.stderr, proc
    assert list(tmp_path.iterdir()) == [], "nothing written, nothing removed"


def test_simulate_refuses_a_state_dir_others_can_write_before_it_clears_the_tree(tmp_path):
    """--simulate empties sim-orin in the state dir to build its tree there. A state dir like /tmp lets another user
    plant sim-orin as a link to a directory of root's: root emptied that directory before the state dir was checked."""
    needs_root()
    shared, own, precious = tmp_path / "shared", tmp_path / "own", tmp_path / "precious"
    for d in (shared, own, precious):
        d.mkdir()
    shared.chmod(0o1777)  # /tmp
    (precious / "keep").write_text("root's\n")
    (shared / "sim-orin").symlink_to(precious)
    os.lchown(shared / "sim-orin", NOBODY, NOBODY)
    proc = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--state-dir", str(shared),
                           "--socket", str(own / "ftgov.sock"), "--config", os.devnull], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and f"state dir {shared} is writable by group or others" in proc.stderr, proc
    assert [p.name for p in precious.iterdir()] == ["keep"], "nothing removed, nothing written"


def test_sim_job_tunes_against_simulate_while_the_daemon_rewrites_the_limits(start_daemon):
    # The daemon's truncate-then-write of min_freq/max_freq can leave a plain file empty for a moment; the job's
    # steps read the limits meanwhile and must wait for the write, never fail on it.
    d = start_daemon(None, simulate=True)
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "governor.cli", "sim-job", "--socket", d.socket, "--tree",
                              str(d.state_dir / "sim-orin"), "--tune", "--steps", "120", "--time-scale", "0.02"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)  # unregister's answer, as JSON
        assert result["steps"] == 120 and result["ended"] == "unregistered", out.stdout
        # What runs meanwhile (2,000 steps take ~40 s) is said at the start, on stderr: stdout is the JSON alone.
        said = rf"sim-job: job {result['job_id']} registered \(tune, ([0-9.]+ MHz|not pinned yet)\); running 120 steps"
        assert re.search(said, out.stderr), out.stderr


def test_sim_job_finds_the_daemon_beside_the_tree_it_was_given(start_daemon):
    """A shell that exported FTGOV_SIM_TREE alone (no FTGOV_SOCKET): sim-job looked for the board's
    /run/ftgov/ftgov.sock instead of the socket beside the tree, where ftgovd --simulate listens."""
    d = start_daemon(None, simulate=True, launch=False)
    d.socket = str(d.state_dir / "ftgov.sock")  # where ftgovd --simulate listens unless told otherwise
    d.start()
    env = {k: v for k, v in os.environ.items() if k != "FTGOV_SOCKET"}
    out = subprocess.run([sys.executable, "-m", "governor.cli", "sim-job", "--steps", "20", "--time-scale", "0.02"],
                         capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": str(REPO), "FTGOV_SIM_TREE": str(d.state_dir / "sim-orin")})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["steps"] == 20


def test_sim_job_whose_daemon_stops_under_it_fails_with_why(start_daemon):
    """A daemon stopped while sim-job's steps ran left it printing `null` as the job's summary and exiting 0, after a
    Python warning that pointed at the ftgov script's own line."""
    d = start_daemon(None, simulate=True)
    proc = subprocess.Popen([sys.executable, "-m", "governor.cli", "sim-job", "--socket", d.socket, "--tree",
                             str(d.state_dir / "sim-orin"), "--steps", "300", "--time-scale", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        d.wait_jobs(1)
        d.stop()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (1, ""), err
    assert re.search(r"^ftgov: error: lost the connection to ftgovd at .*The job's steps ran on without it: no "
                     r"summary$", err, re.M), err
    assert "GovernorWarning" not in err, err


def test_a_node_outside_sys_devices_platform_is_warned_about_at_start(tmp_path, start_daemon):
    # JetPack 4's layout: the GPU directly under /sys/devices, which the unit's ReadWritePaths= does not open.
    root = tree.build(tmp_path / "jp4", "jp6")
    moved = root.path("/sys/devices/17000000.gpu")
    root.path("/sys/devices/platform/bus@0/17000000.gpu").rename(moved)
    link = root.path("/sys/class/devfreq/17000000.gpu")
    link.unlink()
    link.symlink_to("/sys/devices/17000000.gpu/devfreq/17000000.gpu")
    (moved / "of_node").unlink()  # relative, as on a board: two levels nearer the root now
    (moved / "of_node").symlink_to("../../../proc/device-tree/bus@0/gpu@17000000")
    d = start_daemon(tmp_path / "jp4")
    assert "is outside /sys/devices/platform: the shipped unit's sandbox leaves it read-only" in d.log()


def test_a_clock_throttled_under_the_pin_is_logged_and_shown_and_its_end_too(orin, start_daemon):
    # L4T's thermal throttling holds the clock below a pinned min without the limit files showing it: cur_freq does.
    root = Root(orin)
    node = devfreq.find_node(root)
    with running_board(orin):
        d = start_daemon(config={"sample_interval_s": 0.05})
        c = d.client()
        assert c.call("register", **FEATURES)["freq_hz"] == 714000000
        wait_reads(node / "cur_freq", lambda t: t == "714000000")
        tree.set_thermal_cap(root, 520_000_000)
        wait_reads(node / "cur_freq", lambda t: t == "510000000")
        d.notify.drain()  # ticks from before the change
        for _ in range(THROTTLE_TICKS):  # two ticks in a row read it, after one that may have come before
            d.wait_status(lambda m: "STATUS=" in m)
        assert "runs at 510 MHz under its pin of 714 MHz: thermal throttling" in d.log()
        gpu = c.call("status")["gpus"][0]
        assert gpu["throttled_hz"] == 510000000 and gpu["pinned_hz"] == 714000000
        assert limits(orin) == (714000000, 714000000)  # the limits do not show it
        tree.set_thermal_cap(root, None)
        wait_reads(node / "cur_freq", lambda t: t == "714000000")
        d.notify.drain()  # ticks from before the change
        for _ in range(THROTTLE_TICKS):
            d.wait_status(lambda m: "STATUS=" in m)
        assert "runs at its pin of 714 MHz again" in d.log()
        assert c.call("status")["gpus"][0]["throttled_hz"] is None


def test_print_env_names_the_paths_the_simulated_daemon_uses(tmp_path):
    """The README evals these lines instead of spelling out a /tmp path, which root could paste and find another
    user's socket or tree there."""
    from governor.simpaths import simulate_runtime_dir

    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--print-env"], env=env,
                         capture_output=True, text=True, timeout=60, cwd=REPO, check=True).stdout
    base = simulate_runtime_dir() if os.geteuid() == 0 else tmp_path / "ftgov-sim"
    assert out.splitlines() == [f"export FTGOV_SOCKET={base / 'ftgov.sock'}",
                                f"export FTGOV_SIM_TREE={base / 'sim-orin'}"]
    assert not (tmp_path / "ftgov-sim").exists()  # printing starts nothing
    other = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--print-env", "--state-dir",
                            str(tmp_path / "second")], env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
                           check=True).stdout
    assert other.splitlines() == [f"export FTGOV_SOCKET={tmp_path / 'second' / 'ftgov.sock'}",  # all in one place
                                  f"export FTGOV_SIM_TREE={tmp_path / 'second' / 'sim-orin'}"]
    bad = subprocess.run([sys.executable, "-m", "governor.daemon", "--print-env"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.strip() == "ftgovd: error: --print-env goes with --simulate"
    # A board's config file names paths the simulation replaces: said once, not silently dropped.
    config = tmp_path / "board.yaml"
    config.write_text(f"socket: {{path: {tmp_path / 'x.sock'}}}\nlog_level: info\n")
    told = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--config", str(config),
                           "--print-env"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    assert told.stdout == out and f"socket.path {tmp_path / 'x.sock'} not used" in told.stderr, told.stderr
    config.write_text("log_level: info\n")
    quiet = subprocess.run([sys.executable, "-m", "governor.daemon", "--simulate", "--config", str(config),
                            "--print-env"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    assert quiet.stderr == ""


def test_simulate_rails_report_as_an_ina3221_by_default_and_a_job_measures_its_energy_through_them(start_daemon):
    """ftgovd --simulate's rails average over update_interval and refresh at it, with the power in phases within a
    step, as a board's do; the same job measured through them and through exact rails agrees (the averaging shifts
    its edges by a fraction of a refresh, the phases' mean is the model's power: within 0.3% in quiet runs; 10% leaves
    room for a loaded machine stretching one job's idle moments, and still fails rails that hold a stale reading)."""
    from governor.daemon.main import parse_args

    assert parse_args(["--simulate"]).sim_meters == "ina3221"
    with pytest.raises(SystemExit) as refused:  # alone, a real daemon would have started on the host
        parse_args(["--sim-meters", "exact"])
    assert refused.value.code == 2
    energy_j = {}
    for meters in ("ina3221", "exact"):
        d = start_daemon(None, simulate=True, sim_meters=meters)
        sim_tree = d.state_dir / "sim-orin"
        assert Root(sim_tree).path(tree.METERS).read_text().strip() == meters
        # The exact rails refresh as often as scaled jobs need samples (tree.EXACT_UPDATE_INTERVAL_MS), the INA3221's
        # as a board's do.
        update_ms = tree.EXACT_UPDATE_INTERVAL_MS if meters == "exact" else 140
        assert rails.discover(Root(sim_tree)).update_interval_s == pytest.approx(update_ms / 1000)
        out = subprocess.run([sys.executable, "-m", "governor.cli", "sim-job", "--socket", d.socket, "--tree",
                              str(sim_tree), "--steps", "60", "--time-scale", "0.2"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["steps"] == 60, out.stdout
        energy_j[meters] = result["energy_j"]
    assert abs(energy_j["ina3221"] / energy_j["exact"] - 1) < 0.10, energy_j


def test_a_simulated_daemons_jobs_are_recorded_as_simulated_and_retrain_keeps_them_apart(start_daemon, tmp_path,
                                                                                          capsys):
    """The simulated tree names the board it imitates (/proc/device-tree/model): its jobs were recorded as that board's,
    and `ftgov model retrain --from` merged a simulated store with real boards' as one kind of board, without a word."""
    from governor.cli import main
    from governor.pipeline import retrain
    from governor.policy.tree import DecisionTree
    from governor.sim import learning
    from governor.store import measurements as store

    d = start_daemon(None, simulate=True)
    out = subprocess.run([sys.executable, "-m", "governor.cli", "sim-job", "--socket", d.socket, "--tree",
                          str(d.state_dir / "sim-orin"), "--steps", "20", "--time-scale", "0.02"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert d.stop() == 0  # the store's writer drains its queue first
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "sim.sqlite").write_bytes((d.state_dir / "measurements.sqlite").read_bytes())
    [job] = store.read_jobs(store.open_read_only(fleet / "sim.sqlite"))
    assert job.board_model == f"{learning.BOARD_MODEL} (simulated)"
    board = store.Store(fleet / "board.sqlite")
    shipped = DecisionTree.load(REPO / "model" / "mlg-tree.json")
    for rec in learning.stream(retrain.tree_decider(shipped, learning.board_model().levels_hz), 4, seed=2):
        board.add(rec)  # a real AGX Orin's jobs, as its daemon records them
    board.close()
    assert main(["model", "retrain", "--from", str(fleet), "--out", str(tmp_path / "t.json"), "--uid", "1000"]) == 1
    err = capsys.readouterr().err
    assert "different kinds of board" in err and "(simulated)" in err, err
