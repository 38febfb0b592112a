"""`ftgov doctor` against good and broken simulated Orins, with and without a running ftgovd."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from governor.sim import tree
from tests.support import NVPMODEL_CONF, READ_ONLY_INT_FILE, hostusers
from tests.support.daemon import DEVFREQ, FEATURES, REPO, limits

BASELINE = (306000000, 1300500000)


@pytest.fixture(autouse=True)
def socket_group():
    """As root, the config's socket group exists before a daemon starts, as an install makes it (doctor checks it,
    and the daemon gives it its socket); made for the session, not left to whichever test ran first."""
    if os.geteuid() == 0:
        hostusers.ensure_group("ftgov")



def power_mode(root: Path, mode: int) -> None:
    (root / "etc/nvpmodel.conf").write_text(NVPMODEL_CONF)
    (root / "var/lib/nvpmodel").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/nvpmodel/status").write_text(f"pmode:{mode:04d} fmode:quiet\n")


# As another user: the interpreter may live where that user cannot read (a venv under /root), so the child starts as
# root, imports what doctor uses, then drops to the user with no supplementary groups and runs it.
AS_USER = """
import os, sys
import governor.cli, governor.cli.doctor, governor.backends.devfreq, governor.backends.rails, governor.sysfs
import governor.config, governor.store.state, governor.policy.tree, encodings.idna
args = governor.cli.build_parser().parse_args(sys.argv[1:-1])  # imports every subcommand's module
uid = int(sys.argv[-1])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
sys.exit(args.func(args))
"""


def doctor(root: Path, daemon=None, *, user: int | None = None,
           state_dir: Path | None = None) -> tuple[int, dict[str, list[dict]]]:
    """doctor --json on root; --state-dir is the daemon's, else state_dir, else root/state (None: leave it out)."""
    args = ["doctor", "--json", "--sysfs-root", str(root)]
    if daemon is not None:
        args += ["--config", str(daemon.config_path), "--socket", daemon.socket]
        state_dir = daemon.state_dir if state_dir is None else state_dir
    else:
        args += ["--config", str(REPO / "etc/ftgov.yaml"), "--socket", str(root / "none.sock")]
        state_dir = root / "state" if state_dir is None else state_dir
    if state_dir != "":
        args += ["--state-dir", str(state_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "governor.cli", *args] if user is None else [sys.executable, "-c", AS_USER,
                                                                              *args, str(user)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert p.stdout, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] == (p.returncode == 0)
    checks: dict[str, list[dict]] = {}
    for c in out["checks"]:
        assert c["status"] in ("OK", "WARN", "FAIL"), c
        checks.setdefault(c["name"], []).append(c)
    return p.returncode, checks


def one(checks, name: str) -> dict:
    (check,) = checks[name]
    return check


def test_good_board_with_ftgovd_pins_at_the_current_level_and_restores(orin, start_daemon):
    power_mode(orin, 0)
    d = start_daemon()
    rc, checks = doctor(orin, d)
    assert rc == 0, checks
    assert not [c for cs in checks.values() for c in cs if c["status"] == "FAIL"]
    assert "L4T R36.4.3 (JetPack 6)" in one(checks, "board")["detail"]
    assert "11 levels" in one(checks, "devfreq")["detail"]
    pin = one(checks, "pin")
    assert pin["status"] == "OK" and "pinned at the current 306 MHz and restored" in pin["detail"], pin
    assert one(checks, "power mode")["status"] == "OK" and "MAXN" in one(checks, "power mode")["detail"]
    assert "VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0" in one(checks, "rails")["detail"]
    assert one(checks, "socket")["status"] == "OK" and one(checks, "holder")["status"] == "OK"
    assert limits(orin) == BASELINE
    log = d.log()
    assert "pin check: pinned at the current 306 MHz and restored" in log
    assert "GPU 0 restored to its baseline" in log
    assert json.loads((d.state_dir / "state.json").read_text())["gpus"] == {}  # nothing left to restore


def test_a_jobs_pin_is_checked_by_reading_not_written(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    freq = c.call("register", **FEATURES)["freq_hz"]
    assert limits(orin) == (freq, freq)
    rc, checks = doctor(orin, d)
    pin = one(checks, "pin")
    assert pin["status"] == "OK" and "no write" in pin["detail"] and "the pin holds" in pin["detail"], pin
    assert "ftgovd's pin for 1 job(s)" in one(checks, "holder")["detail"]
    assert limits(orin) == (freq, freq)
    c.close()


def test_no_devfreq_node(orin):
    (orin / "sys/class/devfreq/17000000.gpu").unlink()
    rc, checks = doctor(orin)
    assert rc == 1
    devfreq = one(checks, "devfreq")
    assert devfreq["status"] == "FAIL" and "no GPU devfreq node" in devfreq["detail"] and "CUDA" in devfreq["fix"]
    pin = one(checks, "pin")
    # Starting ftgovd does not make the node appear: the fix is the devfreq line's.
    assert pin["status"] == "FAIL" and pin["fix"] == "see 'devfreq' above", pin
    # jetson_clocks alone copies max_freq into min_freq and leaves it there: the node would appear held at the top,
    # ftgovd would take that as its baseline, and the next doctor would FAIL 'holder'. The hint must put min back.
    fix = devfreq["fix"]
    assert "jetson_clocks --store" in fix and "jetson_clocks --restore" in fix, fix
    assert fix.index("jetson_clocks --store") < fix.index("jetson_clocks --restore"), fix


def test_a_cooling_device_on_the_gpus_devfreq_is_warned_of(orin):
    """Whether L4T caps the GPU through a devfreq cooling device (whose cap max_freq would read) is unverified: doctor
    says which way the board goes, on the first run."""
    rc, checks = doctor(orin)
    assert one(checks, "cooling")["status"] == "OK"
    fan = orin / "sys/class/thermal/cooling_device0"
    fan.mkdir(parents=True)
    (fan / "type").write_text("pwm-fan\n")
    assert one(doctor(orin)[1], "cooling")["status"] == "OK"
    gpu = orin / "sys/class/thermal/cooling_device1"
    gpu.mkdir()
    (gpu / "type").write_text("devfreq-17000000.gpu\n")
    rc, checks = doctor(orin)
    cooling = one(checks, "cooling")
    assert cooling["status"] == "WARN" and "cooling_device1" in cooling["detail"] and "nvpmodel" in cooling["fix"]
    # Before Linux 5.12 (JetPack 5's 5.10) the kernel named a devfreq cooling device by a number, not by its device:
    # one was missed and doctor said OK.
    (gpu / "type").write_text("thermal-devfreq-0\n")
    cooling = one(doctor(orin)[1], "cooling")
    assert cooling["status"] == "WARN" and "cooling_device1 (thermal-devfreq-0)" in cooling["detail"], cooling
    assert "names no device" in cooling["detail"], cooling


def test_min_freq_read_only(orin):
    (orin / DEVFREQ / "min_freq").chmod(0o444)
    rc, checks = doctor(orin)
    assert rc == 1
    check = one(checks, "limits")
    assert check["status"] == "FAIL" and "min_freq of 17000000.gpu are read-only" in check["detail"]


def test_root_write_test_with_ftgovd_stopped(orin):
    if os.geteuid() != 0:
        pytest.skip("the write test runs only as root")
    rc, checks = doctor(orin)
    pin = one(checks, "pin")
    assert pin["status"] == "OK" and "root write test" in pin["detail"], pin
    assert limits(orin) == BASELINE


def test_root_write_test_writes(orin):
    """A node that reads fine and looks writable (0644) but refuses root's writes (a read-only /sys in a container,
    an LSM) fails the write test: it writes, it does not only read."""
    if os.geteuid() != 0:
        pytest.skip("the write test runs only as root")
    max_freq = orin / DEVFREQ / "max_freq"
    if subprocess.run(["chattr", "+i", str(max_freq)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i (an immutable file, which refuses root's writes) is not available here")
    try:
        rc, checks = doctor(orin)
    finally:
        subprocess.run(["chattr", "-i", str(max_freq)], check=True)
    pin = one(checks, "pin")
    assert rc == 1 and pin["status"] == "FAIL" and "max_freq" in pin["detail"], pin
    assert limits(orin) == BASELINE


def test_pinned_by_someone_else(orin, start_daemon):
    d = start_daemon()
    node = orin / DEVFREQ
    (node / "min_freq").write_text((node / "max_freq").read_text())  # what jetson_clocks does
    rc, checks = doctor(orin, d)
    assert rc == 1
    holder = one(checks, "holder")
    assert holder["status"] == "FAIL" and "jetson_clocks" in holder["detail"] and "nvpmodel" in holder["fix"]
    # The pin check stays within the limits in force: the clock never leaves the other tool's level.
    assert "pinned at the current 1300.5 MHz" in one(checks, "pin")["detail"]
    assert limits(orin) == (1300500000, 1300500000)


def test_no_rails_is_a_warning(orin, start_daemon):
    for link in (orin / "sys/class/hwmon").iterdir():
        link.unlink()
    d = start_daemon()
    rc, checks = doctor(orin, d)
    assert rc == 0
    rails = one(checks, "rails")
    assert rails["status"] == "WARN" and "energy is not reported" in rails["detail"]


def doctor_as_nobody(start_daemon, prepare=lambda d: None) -> tuple[int, dict[str, list[dict]]]:
    """doctor as uid 65534 against a running daemon of a board nobody may read, as /sys and /run/ftgov are (pytest's
    own temporary directories are not); ``prepare(daemon)`` first."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run doctor as another user")
    board = Path(tempfile.mkdtemp(prefix="ftgdoc", dir="/tmp"))
    try:
        board.chmod(0o755)
        tree.build(board, "jp6")
        d = start_daemon(board)
        d.workdir.chmod(0o755)
        prepare(d)
        return doctor(board, d, user=65534)
    finally:
        shutil.rmtree(board)


def test_caller_not_in_the_socket_group(start_daemon):
    rc, checks = doctor_as_nobody(start_daemon)
    assert rc == 1
    socket = one(checks, "socket")
    assert socket["status"] == "FAIL" and "not in group" in socket["detail"], socket
    assert "usermod -aG" in socket["fix"]
    # The daemon runs: the fix is the socket's, not "start it" (another would find its socket taken).
    daemon = one(checks, "daemon")
    assert daemon["status"] == "WARN" and daemon["fix"] == "see 'socket' below", daemon
    pin = one(checks, "pin")  # nobody may neither reach the daemon nor write the limits
    assert pin["status"] == "WARN" and pin["fix"] == "see 'socket' below, or run doctor as root", pin


def test_a_socket_of_roots_group_is_not_fixed_by_joining_it(start_daemon):
    """A socket of group root (ftgovd started by hand where no ftgov group exists) was fixed with 'sudo usermod -aG
    root USER', which would open every file root's group may read or write."""
    rc, checks = doctor_as_nobody(start_daemon, lambda d: os.chown(d.socket, 0, 0))
    access = checks["socket"][0]
    assert access["status"] == "FAIL" and access["fix"].startswith("run as root"), access
    assert "usermod" not in access["fix"] and "its group is root: run as root" in one(checks, "daemon")["detail"]


def test_pin_left_by_a_crashed_daemon(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    freq = c.call("register", **FEATURES)["freq_hz"]
    d.stop(signal.SIGKILL)
    c.close()
    rc, checks = doctor(orin, d)
    assert rc == 1
    state = one(checks, "state")
    assert state["status"] == "FAIL" and f"pinned at {freq / 1e6:g} MHz" in state["detail"]
    assert "ftgov restore" in state["fix"]
    assert one(checks, "holder")["status"] == "FAIL"


def test_power_mode_cap_below_the_table(orin):
    power_mode(orin, 2)
    rc, checks = doctor(orin)
    mode = one(checks, "power mode")
    assert mode["status"] == "WARN" and "MODE_30W" in mode["detail"] and "capped at 612 MHz" in mode["detail"]


def test_text_output_gives_each_fix(orin):
    (orin / "sys/class/devfreq/17000000.gpu").unlink()
    p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--sysfs-root", str(orin), "--socket",
                        str(orin / "none.sock"), "--state-dir", str(orin / "state"), "--config",
                        str(REPO / "etc/ftgov.yaml")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    fail = next(i for i, line in enumerate(lines) if line.startswith("FAIL  devfreq"))
    assert lines[fail + 1].strip().startswith("fix: ")
    assert lines[-1].endswith("WARN") and "FAIL" in lines[-1]




def _mount_read_only_int_file(path: Path) -> None:
    """Put READ_ONLY_INT_FILE at path as a file, not a symlink (the daemon refuses a symlinked attribute): a bind
    mount, which needs root with CAP_SYS_ADMIN."""
    if os.geteuid() != 0:
        pytest.skip("needs root: bind-mounts a read-only file over max_freq")
    p = subprocess.run(["mount", "--bind", str(READ_ONLY_INT_FILE), str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot bind-mount a read-only file over max_freq here: {p.stderr.strip()}")


def test_pin_check_that_cannot_write_fails_and_leaves_the_baseline_with_nothing_to_retry(orin, start_daemon):
    d = start_daemon()
    max_freq = (orin / DEVFREQ / "max_freq").resolve()
    _mount_read_only_int_file(max_freq)
    try:
        rc, checks = doctor(orin, d)
        assert rc == 1
        pin = one(checks, "pin")
        assert pin["status"] == "FAIL" and "failed" in pin["detail"] and "restore failed" not in pin["detail"], pin
        assert "read-only" in one(checks, "limits")["detail"]
        # The limits still read the baseline (max_freq refused the pin's write; min_freq already held the level the
        # check pins at, the current one): there is nothing to put back, and no restore is left to retry.
        assert json.loads((d.state_dir / "state.json").read_text())["gpus"] == {}
        assert "will retry" not in d.log()
    finally:
        subprocess.run(["umount", str(max_freq)], check=True)


def test_an_invalid_state_file_is_reported_and_left_where_it_is(orin):
    if os.geteuid() != 0:
        pytest.skip("the state file is judged as root judges it")
    state_dir = orin / "state"
    state_dir.mkdir(mode=0o700)
    (state_dir / "state.json").write_text("{not json")
    rc, checks = doctor(orin)
    state = one(checks, "state")
    assert rc == 1 and state["status"] == "FAIL" and "invalid" in state["detail"], state
    assert (state_dir / "state.json").read_text() == "{not json" and not list(state_dir.glob("*.invalid*"))


def test_a_baseline_kept_for_a_gpu_that_was_away_is_not_called_a_crash(orin):
    """An NVML GPU off the bus at the stop keeps its baseline in the state file under its UUID, and `ftgov restore`
    (ExecStopPost) exits 0 leaving it: a clean stop. doctor said "a crashed daemon left the pin" and to run
    `sudo ftgov restore`, which keeps it again while the GPU is away."""
    if os.geteuid() != 0:
        pytest.skip("the state file is judged as root judges it")
    from governor.backends.base import Limits
    from governor.store.state import GpuState, State, StateFile, boot_id
    from governor.sysfs import Root

    uuid = "GPU-00000000-5a1e-4e55-9a3d-00000000f000"
    state_dir = orin / "state"
    state_dir.mkdir(mode=0o700)
    StateFile(state_dir).write(State(boot_id(Root(str(orin))), {uuid: GpuState(
        describe={"backend": "nvml", "index": 0, "uuid": uuid}, baseline=Limits(345_000_000, 1_980_000_000),
        pinned_hz=945_000_000)}))
    rc, checks = doctor(orin)
    state = one(checks, "state")
    assert state["status"] == "FAIL" and f"GPU {uuid} (away when last restored) pinned at 945 MHz" in state["detail"]
    assert "crashed" not in state["detail"] and "nvidia-smi lists the GPU" in state["fix"], state


def test_a_non_root_caller_is_told_the_state_file_is_roots(orin):
    rc, checks = doctor(orin, user=65534) if os.geteuid() == 0 else doctor(orin)
    state = one(checks, "state")
    assert state["status"] == "WARN" and "readable by root only" in state["detail"], state


def test_a_non_root_caller_is_told_there_is_no_state_file_when_there_is_none(orin):
    """Not 'readable by root only' for a file that does not exist, in a directory the caller may look into."""
    open_dir = Path(tempfile.mkdtemp(prefix="ftg", dir="/tmp"))
    try:
        open_dir.chmod(0o755)
        rc, checks = (doctor(orin, user=65534, state_dir=open_dir) if os.geteuid() == 0
                      else doctor(orin, state_dir=open_dir))
        assert one(checks, "state") == {"name": "state", "status": "OK",
                                        "detail": f"{open_dir / 'state.json'}: no state file", "fix": ""}
    finally:
        shutil.rmtree(open_dir)


def test_doctor_on_a_simulated_tree_checks_that_daemons_state_file(start_daemon):
    """--sysfs-root STATE_DIR/sim-orin (what ftgovd --simulate builds) without --state-dir: the state file beside
    the tree, the one that daemon writes, not the board's /run/ftgov/state.json."""
    d = start_daemon(simulate=True)
    holder = d.client()  # the job lasts as long as this connection
    holder.call("register", **FEATURES)
    rc, checks = doctor(d.state_dir / "sim-orin", d, state_dir="")
    holder.close()
    state = one(checks, "state")
    assert state["status"] == "OK" and state["detail"].startswith(f"{d.state_dir / 'state.json'}: GPU 0 pinned at"), \
        state


def test_doctor_of_a_named_simulated_tree_asks_that_trees_daemon(start_daemon, tmp_path):
    """--sysfs-root names a simulated tree: its daemon is the one beside it, not $FTGOV_SOCKET's (a shell pointed at
    another simulated daemon by the print-env eval), which governs another tree."""
    d = start_daemon(simulate=True, launch=False)
    d.socket = str(d.state_dir / "ftgov.sock")  # where ftgovd --simulate listens unless told otherwise
    d.start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTGOV_SOCKET": str(tmp_path / "another-simulation.sock")}
    p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--json", "--sysfs-root",
                        str(d.state_dir / "sim-orin"), "--config", os.devnull], capture_output=True, text=True,
                       env=env, timeout=60, cwd="/")
    out = json.loads(p.stdout)
    assert [c["status"] for c in out["checks"] if c["name"] in ("daemon", "socket")] == ["OK", "OK"], out


def test_doctor_after_the_print_env_eval_checks_the_simulated_daemon(start_daemon, tmp_path):
    """As a newcomer runs it: `eval "$(ftgovd --simulate --print-env)"`, then `ftgov doctor` with no options. The
    tree is $FTGOV_SIM_TREE (not the host's /), the state beside it, and the socket's group is not asked of a
    simulated daemon (no systemd socket made it: a config's group need not exist)."""
    d = start_daemon(simulate=True)
    config = tmp_path / "ftgov.yaml"
    config.write_text("socket: {group: ftgov-no-such-group}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTGOV_SOCKET": d.socket,
           "FTGOV_SIM_TREE": str(d.state_dir / "sim-orin")}
    p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--json", "--config", str(config)],
                       capture_output=True, text=True, env=env, timeout=60, cwd="/")
    out = json.loads(p.stdout)
    assert out["sysfs_root"] == str(d.state_dir / "sim-orin"), out
    assert [c for c in out["checks"] if c["status"] == "FAIL"] == [] and p.returncode == 0, out
    assert not [c for c in out["checks"] if c["status"] == "WARN" and "nvpmodel" in c["detail"]], out
    d.stop()  # then the fix is to start the simulation again, not systemd's socket unit
    p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--json", "--config", str(config)],
                       capture_output=True, text=True, env=env, timeout=60, cwd="/")
    checks = json.loads(p.stdout)["checks"]
    start = f"ftgovd --simulate --state-dir {d.state_dir} --socket {d.socket} &"  # the daemon these paths are of
    assert p.returncode == 1
    assert [(c["name"], c["status"], c["fix"]) for c in checks if c["name"] in ("daemon", "socket")] == [
        ("daemon", "WARN", start), ("socket", "FAIL", start)], checks


def test_as_root_a_tree_another_user_owns_is_neither_read_nor_written(orin, tmp_path):
    """A member's shell points $FTGOV_SIM_TREE at its own tree, and root runs doctor there (sudo -E, su without -).
    The member's links lead out of the tree: its GPU node to a root-only directory (whose min_freq the write test
    used to truncate and rewrite), its release file to a root-only secret (printed in the board line)."""
    if os.geteuid() != 0:
        pytest.skip("the tree's owner is checked when root runs doctor")
    victim = tmp_path / "victim"
    (victim / "dev/of_node").mkdir(parents=True)
    (victim / "dev/of_node/name").write_text("gpu\n")
    (victim / "device").symlink_to("dev")
    for name in ("available_frequencies", "max_freq", "cur_freq"):
        shutil.copy(orin / DEVFREQ / name, victim / name)
    (victim / "min_freq").write_text("306000000 root's own line\n")
    (tmp_path / "secret").write_text("not for members\n")
    for path in [orin, *orin.rglob("*")]:
        os.chown(path, 4242, 4242, follow_symlinks=False)
    node = orin / "sys/class/devfreq/17000000.gpu"
    node.unlink()
    node.symlink_to(os.path.relpath(victim, node.parent))
    release = orin / "etc/nv_tegra_release"
    release.unlink()
    release.symlink_to(os.path.relpath(tmp_path / "secret", release.parent))
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTGOV_SIM_TREE": str(orin),
           "FTGOV_SOCKET": str(tmp_path / "none.sock")}
    p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor"], capture_output=True, text=True, env=env,
                       timeout=60, cwd="/")
    assert p.returncode == 1 and f"sysfs_root {orin} belongs to uid 4242" in p.stderr, (p.stdout, p.stderr)
    assert (victim / "min_freq").read_text() == "306000000 root's own line\n"
    assert "not for members" not in p.stdout + p.stderr


def test_a_tune_policy_needs_the_tree_it_starts_from(orin, start_daemon, tmp_path):
    # tune starts each job from MLG's pick (governor.policy): without the tree it starts from FFG's level instead.
    d = start_daemon(config={"policy": "tune", "model_file": str(tmp_path / "missing.json")})
    assert d.client().call("register", **FEATURES)["reason"].startswith("tune fell back to ffg")
    _, checks = doctor(orin, d)
    model = one(checks, "model")
    assert model["status"] == "WARN" and "does not load" in model["detail"] and "tuner starts" in model["detail"], model


def test_text_output_escapes_what_the_socket_answered(orin, tmp_path):
    """Root's doctor talks to whichever socket it is given (--socket, or $FTGOV_SOCKET from a member's shell under
    sudo -E): what answers there must not reach root's terminal as escape sequences."""
    import socketserver
    import threading

    class Answer(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                req = json.loads(line)
                result = ({"policy": "mlg\x1b]0;owned\x07\x1b[2J", "jobs": [], "gpus": [], "holds": []}
                          if req.get("method") == "status" else {})
                self.wfile.write((json.dumps({"jsonrpc": "2.0", "id": req.get("id"), "result": result}) + "\n")
                                 .encode())

    path = str(tmp_path / "a.sock")
    server = socketserver.ThreadingUnixStreamServer(path, Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--sysfs-root", str(orin), "--socket",
                            path, "--state-dir", str(orin / "state"), "--config", str(REPO / "etc/ftgov.yaml")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert "policy mlg\\x1b]0;owned\\x07\\x1b[2J" in p.stdout and "\x1b" not in p.stdout, p.stdout


def test_a_config_that_does_not_exist_is_not_told_to_be_fixed(orin, tmp_path):
    """--config naming no file was told "fix the file"; a bad file still is."""
    for text, fix in ((None, "give the config file ftgovd runs with"), ("polcy: ffg\n", "fix the file")):
        config = tmp_path / "ftgov.yaml"
        if text is not None:
            config.write_text(text)
        p = subprocess.run([sys.executable, "-m", "governor.cli", "doctor", "--json", "--sysfs-root", str(orin),
                            "--config", str(config), "--socket", str(orin / "none.sock"), "--state-dir",
                            str(orin / "state")], capture_output=True, text=True, timeout=60, cwd="/",
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        (check,) = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "config"]
        assert check["status"] == "FAIL" and check["fix"].startswith(fix), check


def test_a_shell_never_pointed_at_a_running_simulated_daemon_is_told_how(tmp_path, monkeypatch, capsys):
    """A new shell: `ftgov doctor` checks this machine's board, which on a machine without a Jetson fails four ways,
    while ftgovd --simulate runs beside it; nothing said how to check that one (status and history do)."""
    import socket as socketlib

    from governor.cli import doctor as doctor_cli
    from governor.cli import main

    runtime = tmp_path / "ftgov-sim"
    runtime.mkdir()
    listening = socketlib.socket(socketlib.AF_UNIX)
    listening.bind(str(runtime / "ftgov.sock"))
    monkeypatch.setattr(doctor_cli, "simulate_runtime_dir", lambda: runtime)
    for name in ("FTGOV_SIM_TREE", "FTGOV_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "ftgov.yaml"
    config.write_text(f"sysfs_root: {tmp_path / 'no-board'}\nstate_dir: {tmp_path / 'state'}\n")
    try:
        assert main(["doctor", "--config", str(config)]) == 1
        out = capsys.readouterr().out
        assert f"ftgovd --simulate listens on {runtime / 'ftgov.sock'}" in out
        assert 'eval "$(ftgovd --simulate --print-env)"' in out.splitlines()[-1], out
        monkeypatch.setenv("FTGOV_SOCKET", str(tmp_path / "other.sock"))  # a shell pointed somewhere: no hint
        assert main(["doctor", "--config", str(config)]) == 1
        assert "listens on" not in capsys.readouterr().out
    finally:
        listening.close()
