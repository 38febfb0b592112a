"""The real ftgovd process on a real socket against a fake Orin tree."""

import json
import os
import signal
import subprocess
import sys

import pytest

from governor.sim import tree
from tests.support import READ_ONLY_INT_FILE, hostusers
from tests.support.daemon import DEVFREQ, FEATURES, REPO, Daemon, Rpc, limits

BASELINE = (306000000, 1300500000)


def test_register_pins_and_unregister_restores(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    res = c.call("register", name="bert-base", **FEATURES)
    assert res["policy"] == "mlg" and res["freq_hz"] == 714000000
    assert "num_layers=12 > 7" in res["reason"]
    assert limits(orin) == (714000000, 714000000)
    end = c.call("unregister", job_id=res["job_id"])
    assert end["job_id"] == res["job_id"] and end["freq_hz"] == 714000000
    assert end["energy_j"] is not None and end["energy_j"] >= 0
    assert limits(orin) == BASELINE
    assert "job 1 'bert-base'" in d.log() and "ended (unregistered)" in d.log()


def test_connection_close_restores_baseline(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.call("register", **FEATURES)
    assert limits(orin) == (714000000, 714000000)
    c.close()
    d.wait_jobs(0)
    assert limits(orin) == BASELINE


def test_sigkill_of_the_client_process_restores_baseline(orin, start_daemon):
    d = start_daemon()
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.support.daemon import Rpc, FEATURES; "
            f"c = Rpc({d.socket!r}); c.call('register', **FEATURES); print('ok', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ok\n"
    assert limits(orin) == (714000000, 714000000)
    child.kill()
    child.wait()
    d.wait_jobs(0)
    assert limits(orin) == BASELINE


def test_job_ends_when_its_named_process_exits_even_if_the_connection_lives(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    res = c.call("register", pid=worker.pid, **FEATURES)
    assert limits(orin) == (714000000, 714000000)
    assert c.call("status")["jobs"][0]["pid"] == worker.pid
    worker.kill()
    worker.wait()
    d.wait_jobs(0)
    assert limits(orin) == BASELINE
    late = c.call("unregister", job_id=res["job_id"])  # the wrapper's late unregister still gets the figures
    assert late["job_id"] == res["job_id"] and late["ended"] == "process exited"
    err = c.request("unregister", job_id=res["job_id"])["error"]  # once
    assert err["code"] == -32003
    assert c.call("ping") == {}


def test_a_connection_outliving_its_process_cannot_register_for_it(orin, start_daemon):
    # The daemon holds the connecting process from the connect on: once it has exited, a child that inherited the
    # connection registering without a pid gets a clear error, never a pin for a dead (or recycled) pid.
    d = start_daemon()
    code = f"""
import json, os, sys
sys.path.insert(0, {str(REPO)!r})
from tests.support.daemon import Rpc, FEATURES
c = Rpc({d.socket!r})
assert c.call("ping") == {{}}
r, w = os.pipe()
if os.fork() == 0:
    os.close(w)
    os.read(r, 1)  # EOF: the parent, who connected, has exited
    print(json.dumps(c.request("register", **FEATURES)), flush=True)
    os._exit(0)
os._exit(0)
"""
    # run() returns when the pipe closes: the grandchild holds it until it has printed the daemon's reply
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout
    assert out.strip(), "the inheriting child printed nothing"
    reply = json.loads(out)
    assert reply["error"]["code"] == -32602 and "has exited" in reply["error"]["message"], reply
    assert d.client().call("status")["jobs"] == []
    assert limits(orin) == BASELINE


def test_overlapping_jobs_pin_the_highest_pick(orin, start_daemon):
    d = start_daemon()
    small, big = d.client(), d.client()
    s = small.call("register", model_type="decoder", num_layers=6, hidden_size=512, seq_len=20.0, gpu_util=50.0)
    assert s["freq_hz"] == 510000000 and limits(orin) == (510000000, 510000000)
    b = big.call("register", model_type="encoder", num_layers=24, hidden_size=1024, seq_len=70.0, gpu_util=80.0)
    assert b["freq_hz"] == 816000000 and limits(orin) == (816000000, 816000000)
    status = small.call("status")
    assert {j["freq_hz"] for j in status["jobs"]} == {510000000, 816000000}
    assert status["gpus"][0]["min_hz"] == 816000000 and status["gpus"][0]["baseline_min_hz"] == BASELINE[0]
    big.call("unregister", job_id=b["job_id"])
    assert limits(orin) == (510000000, 510000000)  # back to the remaining job's pick, not to the baseline
    small.close()
    d.wait_jobs(0)
    assert limits(orin) == BASELINE


def test_update_redecides_when_features_change(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    res = c.call("update", job_id=job, seq_len=80.0)
    assert res["freq_hz"] == 816000000 and limits(orin) == (816000000, 816000000)
    # Within a second of the last re-decision: answered with the pin in force, decided when the second is over.
    res = c.call("update", job_id=job, gpu_util=10.0)
    assert res["freq_hz"] == 816000000 and 0 < res["deferred_s"] <= 1.0, res
    d.wait_status(lambda m: "pinned to 1020 MHz" in m)
    assert c.call("status")["jobs"][0]["freq_hz"] == 1020000000 and limits(orin) == (1020000000, 1020000000)


def test_gpu_util_is_measured_from_the_load_file_when_absent(orin, start_daemon):
    # Measured once the job trains (its first progress report), no longer at registration: tests/daemon/
    # test_utilization.py has the rest.
    (orin / "sys/devices/platform/bus@0/17000000.gpu/load").write_text("150\n")  # 15.0 %
    d = start_daemon()
    features = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
    c = d.client()
    job = c.call("register", **features)["job_id"]
    c.notify("progress", job_id=job, steps=1)
    d.wait_status(lambda m: "pinned to 1020 MHz" in m)  # the paper tree's low-utilization branch
    entry = c.call("status")["jobs"][0]
    assert "measured while the job trains: 15.0%" in entry["reason"] and entry["freq_hz"] == 1020000000


def test_predict_pins_nothing(orin, start_daemon):
    d = start_daemon()
    res = d.client().call("predict", **FEATURES)
    assert res == {"policy": "mlg", "freq_hz": 714000000, "reason": res["reason"]}
    assert limits(orin) == BASELINE


@pytest.mark.parametrize("payload,code,field", [
    (b"this is not json\n", -32700, None),
    (b"[1, 2]\n", -32600, None),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "fly"}\n', -32601, "method"),
    (b'{"jsonrpc": "1.0", "id": 5, "method": "ping"}\n', -32600, "jsonrpc"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder"}}\n', -32602, "num_layers"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder", "num_layers": 12, '
     b'"hidden_size": 768, "seq_len": NaN}}\n', -32700, None),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder", "num_layers": 12, '
     b'"hidden_size": 768, "seq_len": 1e400}}\n', -32602, "seq_len"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder", "num_layers": -3, '
     b'"hidden_size": 768, "seq_len": 30}}\n', -32602, "num_layers"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "rnn", "num_layers": 3, '
     b'"hidden_size": 768, "seq_len": 30}}\n', -32602, "model_type"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder", "num_layers": 3, '
     b'"hidden_size": 768, "seq_len": 30, "gpu_util": 101}}\n', -32602, "gpu_util"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": {"model_type": "encoder", "num_layers": 3, '
     b'"hidden_size": 768, "seq_len": 30, "color": "red"}}\n', -32602, "color"),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "register", "params": [1, 2]}\n', -32602, "params"),
    (b'\xff\xfe{"jsonrpc"}\n', -32700, None),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "unregister", "params": {"job_id": 99}}\n', -32003, "job_id"),
])
def test_malformed_input_gets_an_error_and_the_connection_keeps_working(orin, start_daemon, payload, code, field):
    d = start_daemon()
    c = d.client()
    c.send_raw(payload)
    reply = c.read_reply()
    assert reply["jsonrpc"] == "2.0" and reply["error"]["code"] == code, reply
    if field:
        assert reply["error"]["data"]["field"] == field and field in reply["error"]["message"]
    assert c.call("ping") == {}
    assert limits(orin) == BASELINE


def test_oversized_line_is_refused_and_the_next_line_is_served(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"a" * 70000 + b'"}}\n')
    assert "longer than 65536" in c.read_reply()["error"]["message"]
    assert c.call("ping") == {}


def test_half_lines_and_pipelined_requests(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    c.send_raw(b'{"jsonrpc": "2.0", "id": 1, "meth')
    c.send_raw(b'od": "ping"}\n{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n')
    assert [c.read_reply()["id"], c.read_reply()["id"]] == [1, 2]
    c.notify("progress", job_id=12345, steps=3)  # a notification gets no reply, even a bad one
    assert c.call("ping") == {}


def test_limits_on_jobs_per_connection(orin, start_daemon):
    d = start_daemon(config={"limits": {"max_jobs_per_connection": 2}})
    c = d.client()
    c.call("register", **FEATURES)
    c.call("register", **FEATURES)
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32002 and "max_jobs_per_connection" in err["message"]


def test_progress_counts_steps(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    c.notify("progress", job_id=job, steps=7, phase="train")
    assert c.call("status")["jobs"][0]["steps"] == 7
    assert c.call("unregister", job_id=job)["steps"] == 7


def test_non_root_caller_may_not_name_a_process_it_does_not_own(orin, start_daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    _ensure_user("ftgovtest", groups=("ftgov",))
    d = start_daemon()
    os.chmod(d.workdir, 0o755)
    request = {"jsonrpc": "2.0", "id": 1, "method": "register", "params": {"pid": 1, **FEATURES}}
    out = _run_as("ftgovtest", d.socket, json.dumps(request))
    assert "-32001" in out.stdout and "process 1 is not yours" in out.stdout, out
    assert "uid 0" not in out.stdout  # whose it is stays the kernel's to tell (hidepid=2)
    assert limits(orin) == BASELINE


def test_user_outside_the_group_is_refused(orin, start_daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user with useradd")
    _ensure_user("ftgovout", groups=())
    d = start_daemon()
    os.chmod(d.workdir, 0o755)
    os.chmod(d.socket, 0o666)  # let the kernel pass it, so that the daemon's own SO_PEERCRED check is what refuses
    out = _run_as("ftgovout", d.socket, None)
    assert "-32001" in out.stdout and "not in group 'ftgov'" in out.stdout, out
    assert "refused uid" in d.log()


# The other user cannot run this venv's interpreter (it lives under /root): a stdlib-only client on the system one.
_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
if len(sys.argv) > 2: s.sendall(sys.argv[2].encode() + b"\\n")
print(s.makefile().readline())
"""


def _run_as(user: str, sock: str, line):
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    args = ["runuser", "-u", user, "--", python, "-c", _CLIENT, sock] + ([line] if line else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def _ensure_user(name: str, groups: tuple[str, ...]) -> None:
    hostusers.ensure_user(name, groups=groups)  # removed at the session's end if it made them


def test_socket_mode_and_stale_socket(orin, start_daemon):
    d = start_daemon()
    assert oct(os.stat(d.socket).st_mode & 0o777) == "0o660"
    d.stop(signal.SIGKILL)
    assert os.path.exists(d.socket)  # a killed daemon leaves its socket behind
    d2 = start_daemon(workdir=d.workdir, notify_name="n2.sock")
    assert d2.client().call("ping") == {}


def test_second_daemon_on_the_same_socket_refuses(orin, start_daemon):
    d = start_daemon()
    other = Daemon(orin)
    proc = subprocess.run(other.command()[:-6] + ["--socket", d.socket, "--sysfs-root", str(orin),
                                                  "--state-dir", str(other.workdir / "st")],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and "already listening" in proc.stderr


def test_bad_config_names_the_key_and_exits_non_zero(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("limits:\n  max_jobs: 0\n")
    proc = subprocess.run([sys.executable, "-m", "governor.daemon", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert "limits.max_jobs" in proc.stderr and "greater than 0" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "governor.daemon", "--config", str(tmp_path / "missing.yaml")],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_waits_for_a_late_node_then_serves(tmp_path, start_daemon):
    root = tmp_path / "late"
    root.mkdir()
    d = start_daemon(root=root)
    # Ready at once, saying what it waits for; then the node appears and it governs it.
    assert any("READY=1" in m and "waiting for the GPU node" in m for m in d.notify.messages)
    tree.build(root, "jp6")
    d.wait_status(lambda m: "GPU 0 at baseline" in m, 15)
    assert d.client().call("register", **FEATURES)["freq_hz"] == 714000000


def test_missing_node_is_reported_clearly_after_the_wait(tmp_path, start_daemon):
    # It used to exit 1 here, and systemd restarted it in a loop: now it serves without a GPU
    # (tests/daemon/test_absent_gpu.py).
    d = start_daemon(root=tmp_path, config={"node_wait_s": 0.2})
    d.wait_status(lambda m: "no devfreq class" in m and "node_wait_s" in m)
    assert "no devfreq class" in d.log() and "node_wait_s" in d.log()


def test_mlg_falls_back_to_ffg_when_the_model_file_is_bad(orin, start_daemon, tmp_path):
    bad = tmp_path / "tree.json"
    bad.write_text('{"format": "ftgov-tree/1", "nodes": "oops"}')
    d = start_daemon(config={"model_file": str(bad), "ffg_freq_hz": 612000000})
    res = d.client().call("register", **FEATURES)
    assert res["policy"] == "mlg->ffg" and res["freq_hz"] == 612000000
    assert "fell back to ffg" in res["reason"] and "MLG falls back to FFG" in d.log()


@pytest.mark.parametrize("beside_hz, pinned_hz", [(510000000, 510000000), (None, 816000000)])
def test_ffg_reads_the_ffg_json_beside_the_model_file(orin, start_daemon, tmp_path, beside_hz, pinned_hz):
    # An operator's own `ftgov model export` and `ftgov model ffg` write mlg-tree.json and ffg.json side by side
    # (model/README.md): pointed at the tree, the daemon's FFG is that data's level, not the shipped simulated one's
    # (816 MHz). A tree with no ffg.json beside it (`ftgov model retrain`'s) keeps the shipped level.
    own = tmp_path / "ftgov-model"
    own.mkdir()
    (own / "mlg-tree.json").write_text((REPO / "governor" / "data" / "mlg-tree.json").read_text())
    if beside_hz is not None:
        (own / "ffg.json").write_text(json.dumps({"freq_hz": beside_hz}))
    d = start_daemon(config={"model_file": str(own / "mlg-tree.json"), "policy": "ffg"})
    c = d.client()
    assert c.call("register", **FEATURES)["freq_hz"] == pinned_hz
    assert limits(orin) == (pinned_hz, pinned_hz)


def test_observe_policy_pins_nothing(orin, start_daemon):
    d = start_daemon(config={"policy": "observe"})
    res = d.client().call("register", **FEATURES)
    assert res["policy"] == "observe" and res["freq_hz"] is None
    assert limits(orin) == BASELINE


def test_failed_pin_is_an_error_to_the_client_and_leaves_the_baseline(orin, start_daemon):
    d = start_daemon()
    node = orin / DEVFREQ
    saved = (node / "min_freq").read_text()
    (node / "min_freq").unlink()
    (node / "min_freq").symlink_to(READ_ONLY_INT_FILE)
    c = d.client()
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "min_freq" in err["message"]
    assert c.call("status")["jobs"] == []
    (node / "min_freq").unlink()
    (node / "min_freq").write_text(saved)
    assert c.call("register", **FEATURES)["freq_hz"] == 714000000


def test_checkpoint_and_data_phases_drop_to_the_lowest_level(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    other = d.client()
    other.call("register", model_type="decoder", num_layers=6, hidden_size=512, seq_len=20.0, gpu_util=50.0)
    assert limits(orin) == (714000000, 714000000)
    d.notify.drain()
    c.notify("progress", job_id=job, steps=100, phase="checkpoint")
    # Acted on once it has lasted a second (governor.daemon.phases): a shorter stretch is training.
    assert c.call("status")["jobs"][0]["phase"] == "checkpoint"
    assert limits(orin) == (714000000, 714000000)
    d.wait_status(lambda m: "pinned to 510 MHz" in m)
    assert limits(orin) == (510000000, 510000000)  # the other job's pick, the highest need now
    d.notify.drain()
    other.close()
    d.wait_jobs(1)
    assert limits(orin) == (306000000, 306000000)
    d.notify.drain()
    c.notify("progress", job_id=job, steps=101, phase="train")
    # A phase moves the pin at most about once a second per GPU (a client alternating phases must not drive the
    # writes): this second change within the second lands at the window's end.
    d.wait_status(lambda m: "pinned to 714 MHz" in m)
    assert limits(orin) == (714000000, 714000000)
    assert c.call("status")["jobs"][0]["phase"] == "train"


def test_socket_activation_uses_the_passed_socket(orin, tmp_path):
    import socket as socketmod

    from governor.sim.launch import NotifyListener

    path = f"/tmp/ftg-act-{os.getpid()}.sock"
    listener = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    notify = NotifyListener(str(tmp_path / "n.sock"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("util_sample_s: 0.05\n")
    # LISTEN_PID must name the daemon itself: a shell sets it to its own pid, then execs the daemon (same pid).
    fd = listener.fileno()
    move = "" if fd == 3 else f"exec 3<&{fd} {fd}<&-; "
    cmd = (f"{move}LISTEN_PID=$$ LISTEN_FDS=1 exec {sys.executable} -m governor.daemon --config {cfg} "
           f"--sysfs-root {orin} --state-dir {tmp_path / 'st'} --socket /nonexistent/never-bound.sock")
    proc = subprocess.Popen(["bash", "-c", cmd], pass_fds=(fd,), stderr=subprocess.PIPE,  # dash: fds <= 9 only
                            env={**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": notify.path})
    try:
        notify.wait(lambda m: "READY=1" in m, 20)
        c = Rpc(path)
        assert c.call("ping") == {}
        assert not os.path.exists("/nonexistent/never-bound.sock")
    finally:
        proc.terminate()
        err = proc.communicate(timeout=15)[1].decode()
        listener.close()
        os.unlink(path)
        notify.close()
    assert "socket-activated" in err


def test_a_cuda_uuid_names_the_orins_only_gpu(orin, start_daemon):
    # torch on a Jetson reports a UUID for the integrated GPU; the client sends it; devfreq has no UUID to match.
    d = start_daemon()
    res = d.client().call("register", gpu="GPU-3f6a1c2e-0000-0000-0000-000000000000", **FEATURES)
    assert res["gpu"] == "0" and res["freq_hz"] == 714000000


def test_the_daemon_stays_lean():
    """No scikit-learn, numpy, torch or pickle on the daemon's import path (the tree is plain JSON), simulator
    included."""
    code = ("import sys, governor.daemon, governor.daemon.server, governor.daemon.tuning, governor.sim.board; "
            "print(sorted(m for m in ('sklearn', 'numpy', 'joblib', 'torch', 'pickle', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out


def test_one_user_cannot_take_every_job_slot(orin, start_daemon):
    d = start_daemon(config={"limits": {"max_jobs": 16, "max_jobs_per_uid": 3}})
    first, second = d.client(), d.client()
    for _ in range(2):
        first.call("register", **FEATURES)
    second.call("register", **FEATURES)  # this uid's third, on another connection
    err = second.request("register", **FEATURES)["error"]
    assert err["code"] == -32002 and "max_jobs_per_uid" in err["message"], err
    assert len(second.call("status")["jobs"]) == 3
    d.notify.drain()  # the STATUS=1 job(s) of the first registration is queued still: wait for the one after close
    first.close()
    d.wait_jobs(1)
    assert second.call("register", **FEATURES)["freq_hz"] == 714000000  # its slots are free again


def test_another_user_still_gets_a_job_when_one_user_holds_all_of_theirs(orin, start_daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user with useradd")
    d = start_daemon(config={"limits": {"max_jobs": 16, "max_jobs_per_uid": 3}})
    held = d.client()
    for _ in range(3):
        held.call("register", **FEATURES)
    assert held.request("register", **FEATURES)["error"]["code"] == -32002  # this uid is at its 3
    _ensure_user("ftgovtest", groups=("ftgov",))
    os.chmod(d.workdir, 0o755)
    out = _run_as("ftgovtest", d.socket, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register",
                                                       "params": FEATURES}))
    assert '"freq_hz":714000000' in out.stdout, out  # another user still gets a job


_HOLD_THREE = """
import socket, sys
held = []
for _ in range(3):
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\\n')
    print(s.makefile().readline().strip(), flush=True)
    held.append(s)
sys.stdin.readline()
"""


def test_one_user_cannot_take_every_connection_and_another_still_gets_in(orin, start_daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to create users with useradd (root itself has no per-uid cap)")
    d = start_daemon(config={"limits": {"max_connections_per_uid": 2}})
    _ensure_user("ftgovtest", groups=("ftgov",))
    _ensure_user("ftgovtest2", groups=("ftgov",))
    os.chmod(d.workdir, 0o755)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    holder = subprocess.Popen(["runuser", "-u", "ftgovtest", "--", python, "-c", _HOLD_THREE, d.socket],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        replies = [json.loads(holder.stdout.readline()) for _ in range(3)]
        assert replies[0]["result"] == {} and replies[1]["result"] == {}
        err = replies[2]["error"]  # this uid is at its 2
        assert err["code"] == -32002 and "max_connections_per_uid" in err["message"], err
        ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        out = _run_as("ftgovtest2", d.socket, ping)  # another user still gets in
        assert '"result":{}' in out.stdout, out
        assert d.client().call("ping") == {}  # and root, whose own connections are not capped
    finally:
        holder.kill()
        holder.wait()


def test_a_socket_group_that_does_not_exist_is_said_at_start(orin, start_daemon):
    """Started by hand before the ftgov group exists, the daemon serves only root (safe), and said nothing: the
    members' refusals were the first sign."""
    if os.geteuid() != 0:
        pytest.skip("the group is given to the socket only by root")
    d = start_daemon(config={"socket": {"group": "ftgov-no-such-group"}})
    assert d.client().call("status")["jobs"] == []
    assert "socket.group 'ftgov-no-such-group' does not exist" in d.log()
