"""The simulated board process: the kernel's clamping of devfreq writes, load only while a job's steps run, rails
from the energy model per board, and the devfreq backend's pin check and restore against that clamping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from governor.backends import devfreq, rails
from governor.backends.base import Limits
from governor.sim import job as simjob
from governor.sim import tree
from governor.sim.energy import OrinEnergyModel, nx_rails_mw, workload_from_features
from governor.sysfs import Root, write_text
from tests.support import REPO
from tests.support.board import read, running_board, wait_reads

BERT = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0}


def node_of(root) -> Path:
    return devfreq.find_node(Root(root))


def test_a_min_written_above_the_max_reads_back_as_the_max(orin):
    node = node_of(orin)
    with running_board(orin):
        write_text(node / "max_freq", "612000000")
        write_text(node / "min_freq", "918000000")
        assert wait_reads(node / "min_freq", lambda t: t == "612000000") == "612000000"
        assert read(node / "max_freq") == "612000000"
        # The request stays: raising the max lets the min that was asked for show again, as the kernel's QoS does.
        write_text(node / "max_freq", "1300500000")
        assert wait_reads(node / "min_freq", lambda t: t == "918000000") == "918000000"


def test_writes_read_back_within_the_table_in_whole_khz(orin):
    node = node_of(orin)
    with running_board(orin):
        write_text(node / "max_freq", "2147483647")  # nvpmodel MAXN's max
        write_text(node / "min_freq", "0")
        wait_reads(node / "min_freq", lambda t: t == "306000000")
        assert wait_reads(node / "max_freq", lambda t: t == "1300500000") == "1300500000"
        write_text(node / "max_freq", "714000001")  # kept in kHz, max rounded up
        assert wait_reads(node / "max_freq", lambda t: t != "714000001") == "714001000"
        write_text(node / "max_freq", "0")  # no limit
        assert wait_reads(node / "max_freq", lambda t: t != "0") == "1300500000"
        write_text(node / "min_freq", "abc")  # EINVAL on a kernel: the request stays, the file reads the range
        assert wait_reads(node / "min_freq", lambda t: t != "abc") == "306000000"


def test_a_pin_reads_back_as_sysfs_formats_it(orin):
    """The backend writes a limit as `echo` does, newline and all, which the kernel's "%lu" takes; it reads back
    ending in one, as every devfreq attribute does ("%lu\n")."""
    node = node_of(orin)
    with running_board(orin):
        (gpu,) = devfreq.probe(Root(orin))
        gpu.pin(714000000)
        assert (node / "min_freq").read_text() == (node / "max_freq").read_text() == "714000000\n"


def test_cur_freq_follows_the_pin_and_the_range(orin):
    node = node_of(orin)
    with running_board(orin):
        (gpu,) = devfreq.probe(Root(orin))
        gpu.pin(816000000)
        assert wait_reads(node / "cur_freq", lambda t: t == "816000000")
        gpu.restore(Limits(306000000, 1300500000))
        assert wait_reads(node / "cur_freq", lambda t: t == "306000000"), "idle: the lowest clock the range allows"


def test_load_shows_only_while_the_steps_run(orin):
    root = Root(orin)
    gpu = devfreq.probe(root)[0]
    load = gpu.load_path
    model = OrinEnergyModel()
    workload = workload_from_features(BERT, "bert")
    with running_board(orin):
        gpu.pin(714000000)
        wait_reads(gpu.node / "cur_freq", lambda t: t == "714000000")
        with simjob.announce(root, workload) as job:
            assert json.loads(job.path.read_text())["stepping"] is False
            wait_reads(load, lambda t: t == "0")  # announced, before its first step: the GPU idles
            assert rails.discover(root).total_mw(rails.discover(root).read_mw()) == pytest.approx(
                sum(model.idle_rails_mw()[r] for r in rails.AGX_ENERGY_RAILS), rel=1e-3)
            job.stepping(True)
            busy = model.expected(workload, 714000000)
            assert int(wait_reads(load, lambda t: t != "0")) == round(busy.gpu_util_pct * 10)
            r = rails.discover(root)
            assert r.total_mw(r.read_mw()) == pytest.approx(busy.power_mw, rel=1e-3)
            job.stepping(False)  # between steps (evaluation, checkpointing): idle again
            wait_reads(load, lambda t: t == "0")
        assert not list(root.path(tree.JOBS_DIR).iterdir()), "the job's file is gone with the job"


def test_a_job_whose_process_died_leaves_the_board(orin):
    root = Root(orin)
    load = devfreq.probe(root)[0].load_path
    code = ("import sys, time; from governor.sim import job; from governor.sim.energy import workload_from_features; "
            "from governor.sysfs import Root; "
            f"a = job.Announcement(Root({str(orin)!r}), workload_from_features({BERT!r}, 'x')); a.stepping(True); "
            "print('stepping', flush=True); sys.stdin.read()")
    with running_board(orin):
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert child.stdout.readline() == b"stepping\n"
            wait_reads(load, lambda t: t != "0")
            child.kill()
            # Not reaped yet (a zombie): it is dead all the same (its pidfd is readable at once, for ever).
            assert wait_reads(load, lambda t: t == "0") == "0"
            assert not list(root.path(tree.JOBS_DIR).iterdir()), "the board removed the dead job's file"
        finally:
            child.kill()
            child.wait()


def test_an_orin_nx_board_reports_its_input_rail(tmp_path):
    root = tree.build(tmp_path / "nx", "nx-jp6")
    model = OrinEnergyModel(levels_hz=tree.NX_LEVELS_HZ)
    workload = workload_from_features(BERT, "bert")
    with running_board(root.root):
        (gpu,) = devfreq.probe(root)
        gpu.pin(612000000)
        wait_reads(gpu.node / "cur_freq", lambda t: t == "612000000")
        with simjob.announce(root, workload) as job:
            job.stepping(True)
            wait_reads(gpu.load_path, lambda t: t != "0")
            r = rails.discover(root)
            power = r.read_mw()
            assert r.energy_rails == ["VDD_IN"] and sorted(power) == sorted(rails.NX_ORIN_RAILS)
            want = nx_rails_mw(model.expected(workload, 612000000).rails_mw)
            assert power == pytest.approx(want, rel=1e-3)
            assert power["VDD_IN"] == pytest.approx(model.expected(workload, 612000000).power_mw, rel=1e-3)


def test_a_power_mode_cap_bounds_the_load_following_clock(tmp_path):
    root = tree.build(tmp_path / "capped", "jp6", max_hz=612000000)  # AGX Orin MODE_30W
    gpu = devfreq.probe(root)[0]
    assert gpu.snapshot() == Limits(306000000, 612000000)
    with running_board(root.root):
        with simjob.announce(root, workload_from_features(BERT, "bert")) as job:
            job.stepping(True)
            assert wait_reads(gpu.node / "cur_freq", lambda t: t != "306000000") == "612000000"


def test_pin_check_and_restore_against_the_clamping(orin):
    """The backend reads what the kernel reads: a min asked above the pinned max leaves the pin's range as it was
    (the pin holds); a max raised under the pin breaks it; a MAXN baseline (0 / 2147483647) reads as the table."""
    node = node_of(orin)
    with running_board(orin):
        write_text(node / "max_freq", "2147483647")
        write_text(node / "min_freq", "0")
        wait_reads(node / "min_freq", lambda t: t == "306000000")
        wait_reads(node / "max_freq", lambda t: t == "1300500000")
        (gpu,) = devfreq.probe(Root(orin))
        baseline = gpu.snapshot()
        assert baseline == Limits(306000000, 1300500000)
        gpu.pin(714000000)
        write_text(node / "min_freq", "1300500000")  # a tool asks for more than the pin allows
        wait_reads(node / "min_freq", lambda t: t == "714000000")
        assert gpu.pin_holds()
        write_text(node / "max_freq", "1300500000")
        wait_reads(node / "max_freq", lambda t: t == "1300500000")
        wait_reads(node / "min_freq", lambda t: t == "1300500000")
        assert not gpu.pin_holds()
        gpu.restore(baseline)
        assert gpu.snapshot() == baseline


def test_the_board_ends_when_its_starter_does(orin):
    with running_board(orin) as proc:
        proc.stdin.close()
        assert proc.wait(10) == 0


def test_a_tree_that_is_not_simulated_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "governor.sim.board", "--tree", str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 1 and "not a simulated tree" in out.stderr and "Traceback" not in out.stderr


def test_sim_job_runs_its_steps_on_the_board(orin):
    load = devfreq.probe(Root(orin))[0].load_path
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with running_board(orin):
        job = subprocess.Popen([sys.executable, "-m", "governor.cli", "sim-job", "--tree", str(orin), "--no-daemon",
                                "--steps", "400", "--time-scale", "0.05"], env=env, stderr=subprocess.PIPE)
        try:
            wait_reads(load, lambda t: t != "0", 30)  # as an unmodified script under ftgov run would load the GPU
        finally:
            job.terminate()
            job.wait()
        assert wait_reads(load, lambda t: t == "0") == "0", "its process ended: the board idles"
    missing = subprocess.run([sys.executable, "-m", "governor.cli", "sim-job", "--tree", str(orin / "missing")],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.startswith("ftgov: error: ")
    assert "not a simulated tree" in missing.stderr
    assert "Traceback" not in missing.stderr


# ---- the rails as an INA3221 reports them (governor.sim.meters), on a clock the test drives ----
class ManualClock:
    def __init__(self, now_s: float = 1000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def ina3221_meters(root: Root) -> None:
    root.path(tree.METERS).write_text("ina3221\n")


def total_mw(root: Root) -> float:
    r = rails.discover(root)
    return r.total_mw(r.read_mw())


def test_the_rails_average_over_the_trees_update_interval_and_hold_between_refreshes(orin):
    from governor.sim.board import Board
    root = Root(orin)
    tree.set_update_interval(root, 50)
    ina3221_meters(root)
    clock = ManualClock()
    board = Board(root, clock)
    assert board.ina.clock.period_s == 0.05  # read from the tree's hwmon, not assumed
    board.react()
    idle_mw = total_mw(root)
    devfreq.probe(root)[0].pin(714000000)
    workload = workload_from_features(BERT, "bert")
    busy = OrinEnergyModel().expected(workload, 714000000)
    clock.now_s += 1.0
    with simjob.announce(root, workload) as job:
        job.stepping(True)
        board.react()
        assert total_mw(root) == pytest.approx(idle_mw, rel=1e-3)  # the reading is still the last interval's
        readings, gpu = [], []
        for k in range(400):  # 20 s of 50 ms refreshes (at 1000.0 + k x 0.05), read twice between each two
            clock.now_s = 1001.0 + 0.05 * k + 0.01
            board.refresh()
            readings.append(total_mw(root))
            gpu.append(rails.discover(root).read_mw()[rails.RAIL_GPU_SOC])
            clock.now_s += 0.03
            board.refresh()
            assert total_mw(root) == readings[-1]  # held until the next refresh
        cpu = rails.discover(root).read_mw()[rails.RAIL_CPU_CV]
        assert cpu == pytest.approx(busy.rails_mw[rails.RAIL_CPU_CV], rel=1e-3)  # no phases there
    assert sum(readings[2:]) / len(readings[2:]) == pytest.approx(busy.power_mw, rel=0.02)
    assert max(gpu) / min(gpu) > 1.1  # the GPU rail's phases show through a 50 ms average of 0.2 s steps


def test_a_change_reaches_the_rails_over_one_update_interval(orin):
    from governor.sim.board import Board
    root = Root(orin)
    ina3221_meters(root)
    clock = ManualClock()
    board = Board(root, clock)  # the tree's update_interval: 140 ms
    board.react()
    idle_mw = total_mw(root)
    clock.now_s += 1.0
    workload = workload_from_features(BERT, "bert")
    with simjob.announce(root, workload) as job:
        job.stepping(True)
        board.react()
        assert board.refresh_timeout_s() is not None  # steps run: the sensor refreshes
        start = board.ina.next_refresh_s(clock.now_s)
        clock.now_s = start - 1e-6
        board.refresh()
        assert total_mw(root) == pytest.approx(idle_mw, rel=1e-3)
        clock.now_s = start + 0.140 + 1e-6  # a whole interval after the change: all of it busy
        board.refresh()
        assert total_mw(root) > idle_mw * 1.3
        job.stepping(False)
        board.react()
        clock.now_s += 1.0
        board.refresh()
    assert total_mw(root) == pytest.approx(idle_mw, rel=1e-3)
    assert board.refresh_timeout_s() is None  # settled and idle: no timer


def test_without_the_sensors_model_the_rails_read_the_models_mean_at_once(orin):
    from governor.sim.board import Board
    root = Root(orin)
    board = Board(root, ManualClock())
    devfreq.probe(root)[0].pin(714000000)
    workload = workload_from_features(BERT, "bert")
    with simjob.announce(root, workload) as job:
        job.stepping(True)
        board.react()
        assert total_mw(root) == pytest.approx(OrinEnergyModel().expected(workload, 714000000).power_mw, rel=1e-3)
        assert board.refresh_timeout_s() is None


def test_a_job_whose_board_was_rebuilt_under_it_stops_with_a_clear_error(tmp_path):
    """A restarted `ftgovd --simulate` builds a new tree: a sim-job running on the old one ended in a traceback."""
    import shutil

    from governor.errors import FtgovError

    root = Root(tree.build(tmp_path / "orin").root)
    workload = workload_from_features({"model_type": "encoder", "num_layers": 12, "hidden_size": 768,
                                       "seq_len": 40.0}, "t")
    node = devfreq.find_node(root)

    def rebuilt(step: int) -> None:
        if step == 3:
            shutil.rmtree(node)

    with pytest.raises(FtgovError, match="tree went away after 3 of 10 steps.*ftgovd --simulate was restarted"):
        simjob.run(root, simjob._Unregistered(), workload, 10, time_scale=0.0001, on_step=rebuilt)
