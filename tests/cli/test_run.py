"""`ftgov run` as a user runs it: the real command line around real child processes, against the real ftgovd."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import termios
import time

import pytest

from governor.cli.run import job_name
from governor.client import Connection
from tests.support.board import wait_reads
from tests.support.daemon import DEVFREQ, REPO, limits

FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 60.0, "gpu_util": 80.0}
FEATURE_ARGS = ["--model-type", "encoder", "--num-layers", "12", "--hidden-size", "768", "--seq-len", "60",
                "--gpu-util", "80"]
BASELINE = (306000000, 1300500000)


def ftgov(*args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FTGOV_SOCKET", None)
    return subprocess.Popen([sys.executable, "-m", "governor.cli", *args], env=env, text=True, **kwargs)


def read_line(stream, timeout_s: float = 30.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, f"no output within {timeout_s} s"
    return stream.readline()


def expected_pin(daemon) -> int:
    with Connection(daemon.socket) as conn:
        return conn.call("predict", **FEATURES)["freq_hz"]


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


@pytest.fixture
def simulated(start_daemon):
    """ftgovd --simulate: a simulated Orin whose load and rails follow the pin; returns the daemon and its tree."""
    daemon = start_daemon(simulate=True)
    return daemon, daemon.state_dir / "sim-orin"


def child_script(orin) -> list[str]:
    """A child that prints its pid and the pinned minimum it finds at its very start, then waits to be killed."""
    return ["sh", "-c", f"echo $$ $(cat {orin / DEVFREQ / 'min_freq'}); exec sleep 600"]


def pid_and_min_freq(proc) -> tuple[int, int]:
    pid, min_freq = read_line(proc.stdout).split()
    return int(pid), int(min_freq)


def keeper_of(socket_path: str) -> int:
    """The pid of the keeper that holds a job on this socket for `ftgov run` (its command line is the one it was
    started with, `python -m governor.cli run --socket PATH ...`; the command exec'd away its own)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = (open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")) if entry.isdigit() else []
        except OSError:
            continue  # exited meanwhile
        if b"governor.cli" in argv and socket_path.encode() in argv:
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def test_the_command_keeps_the_pid_its_signals_and_its_exit_status(simulated):
    """ftgov run execs the command: whoever started it signals and waits for the command itself."""
    daemon, orin = simulated
    pin = expected_pin(daemon)
    proc = ftgov("run", "--socket", daemon.socket, "--name", "script", *FEATURE_ARGS, "--", *child_script(orin),
                 stdout=subprocess.PIPE)
    try:
        pid, min_freq = pid_and_min_freq(proc)
        assert pid == proc.pid
        assert min_freq == pin, "the pin is in place before the command's first instruction"
        assert limits(orin) == (pin, pin)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM, "dead of the command's signal"
    finally:
        proc.kill()
    daemon.wait_jobs(0)  # the job ends after the command, by the daemon's watch or the keeper's unregister
    # The simulated board takes the restored limits as the kernel does, a moment after the write.
    for name, value in zip(("min_freq", "max_freq"), BASELINE, strict=True):
        wait_reads(orin / DEVFREQ / name, lambda text, value=value: text == str(value))
    assert re.search(r"job \d+ 'script' \(pid \d+\) ended \((process exited|unregistered)\)", daemon.log())


def test_child_killed_directly(daemon, orin):
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *child_script(orin), stdout=subprocess.PIPE)
    try:
        child, _ = pid_and_min_freq(proc)
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        proc.kill()
    daemon.wait_jobs(0)
    assert limits(orin) == BASELINE


def test_keeper_killed_ends_the_job_and_the_command_runs_on(daemon, orin):
    pin = expected_pin(daemon)
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *child_script(orin), stdout=subprocess.PIPE)
    pid_and_min_freq(proc)
    try:
        assert limits(orin) == (pin, pin)
        os.kill(keeper_of(daemon.socket), signal.SIGKILL)
        daemon.wait_jobs(0)  # the connection closed: the daemon ended the job
        assert limits(orin) == BASELINE
        assert proc.poll() is None  # still running: we stop governing it, not the training
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_client_job_in_the_command_defers_to_ftgov_runs_job(daemon):
    """`ftgov run -- python train.py` where train.py holds a GovernorCallback: one job on the process, not two (the
    higher pin of the two, the same energy counted twice), and the client says which to drop."""
    script = ("import os, warnings, governor\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              f"    with governor.job(**{FEATURES!r}, tune=True, socket={daemon.socket!r}) as job:\n"
              "        job.step()\n"
              "print(os.environ['FTGOV_RUN_JOB'], job.registered, *[str(w.message) for w in caught], sep='\\n')\n")
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", sys.executable, "-c", script,
                 stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    run_job, registered, *warned = out.splitlines()
    assert re.findall(r"job (\d+) .*ended \(", daemon.log()) == [run_job], daemon.log()
    assert registered == "False"
    assert warned == [f"ftgov: this process is governed by `ftgov run`'s job {run_job} (FTGOV_RUN_JOB), so this "
                      "job does not register; drop one of the two (tune=True needs this job or callback without "
                      "`ftgov run`, which sends no step reports)"]


def test_only_verbose_prints_the_pick_and_the_summary(daemon):
    quiet = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", "true", stderr=subprocess.PIPE)
    assert quiet.wait(timeout=60) == 0 and quiet.stderr.read() == ""
    loud = ftgov("run", "-v", "--socket", daemon.socket, *FEATURE_ARGS, "--", "true", stderr=subprocess.PIPE)
    assert loud.wait(timeout=60) == 0
    pick, summary = loud.stderr.read().splitlines()
    assert re.fullmatch(r"ftgov: job \d+: \w+ [\d.]+ MHz \(.+\)", pick), pick
    assert re.fullmatch(r"ftgov: job \d+ ended: [\d.]+ MHz [\d.]+ s 0 steps.*", summary), summary


def test_exit_code_and_output_pass_through_without_a_daemon(tmp_path):
    proc = ftgov("run", "--socket", str(tmp_path / "absent.sock"), *FEATURE_ARGS, "--", "sh", "-c",
                 "echo from-child; exit 7", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert out == "from-child\n"
    assert err.count("ftgovd is not running") == 1, err


def test_command_not_found_and_bad_options(daemon):
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", "no-such-command-ftgov", stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 127
    assert "command not found" in proc.stderr.read()
    proc = ftgov("run", "--socket", daemon.socket, "--model-type", "encoder", "--", "true", stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 2
    assert proc.stderr.read() == ("ftgov run: missing --num-layers, --hidden-size (or --hf-config DIR for the model's "
                                  "shape), --seq-len (average non-padding tokens per sample)\n")
    assert not re.search(r"job \d+", daemon.log()), "no job was registered"


@pytest.mark.parametrize("command, code, why", [
    ("/nonexistent/cmd", 127, "No such file or directory"),
    ("/etc/passwd", 126, "Permission denied"),
    ("/etc", 126, "Is a directory"),
])
def test_a_command_that_cannot_run_is_refused_before_it_registers(daemon, command, code, why):
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", command, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == code
    assert proc.stderr.read() == f"ftgov run: {command}: {why}\n"
    assert not re.search(r"job \d+", daemon.log()), "no job was registered"


def test_a_script_under_an_interpreter_names_the_job(daemon, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", sys.executable, "-u", str(script))
    assert proc.wait(timeout=60) == 0
    assert re.search(r"job \d+ 'train.py' ", daemon.log()), daemon.log()


@pytest.mark.parametrize("command, name", [
    ("python3 -u train.py --epochs 3", "train.py"),
    ("python -m trainer.main", "trainer.main"),
    ("accelerate launch --num_processes 2 train.py", "train.py"),
    ("python -m torch.distributed.run --nproc-per-node 2 train.py", "train.py"),
    ("python3 -m torch.distributed.run --nproc-per-node 2 -m trainer.main", "trainer.main"),
    ("torchrun --nproc-per-node 2 /src/finetune.py", "finetune.py"),
    ("accelerate env", "accelerate"),
    ("./finetune", "finetune"),
])
def test_a_job_is_named_after_the_script_its_launcher_runs(command, name):
    assert job_name(command.split()) == name


def test_a_hub_id_for_hf_config_is_said_not_to_be_resolved(tmp_path):
    proc = ftgov("run", "--socket", str(tmp_path / "absent.sock"), "--hf-config", "gpt2", "--seq-len", "30", "--",
                 "true", stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.wait(timeout=60) == 2
    assert proc.stderr.read() == ("ftgov run: --hf-config gpt2: no such directory or file (a Hugging Face Hub id is "
                                  "not resolved, nothing is downloaded): give the model's local directory or its "
                                  "config.json\n")


def test_hf_config_dir_gives_the_shape(daemon, orin, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt_neox", "num_hidden_layers": 6, "hidden_size": 512}')
    proc = ftgov("run", "--socket", daemon.socket, "--hf-config", str(tmp_path), "--seq-len", "30", "--", "true")
    assert proc.wait(timeout=60) == 0
    assert re.search(r"job \d+ 'true' .*decoder L6 H512 seq 30 ", daemon.log()), daemon.log()


def test_numbers_stand_in_for_what_an_hf_config_does_not_name(daemon, tmp_path):
    """--help says the numbers override --hf-config: they also complete a config that names no layer count (MPT's
    is ``n_layers``), which was refused however many numbers came with it."""
    (tmp_path / "config.json").write_text('{"model_type": "mpt", "n_layers": 24, "d_model": 2048}')
    proc = ftgov("run", "--socket", daemon.socket, "--hf-config", str(tmp_path), "--num-layers", "24",
                 "--seq-len", "30", "--gpu-util", "80", "--", "true", stderr=subprocess.PIPE)
    assert (proc.wait(timeout=60), proc.stderr.read()) == (0, "")
    assert re.search(r"job \d+ 'true' .*decoder L24 H2048 seq 30 ", daemon.log()), daemon.log()
    proc = ftgov("run", "--socket", daemon.socket, "--hf-config", str(tmp_path), "--seq-len", "30", "--", "true",
                 stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 2
    assert proc.stderr.read() == (f"ftgov run: --hf-config {tmp_path}: config of model_type 'mpt' names no layer "
                                  "count: give --num-layers\n")


def test_an_encoder_decoder_hf_config_is_refused_until_its_numbers_are_given(daemon, tmp_path):
    """T5 was taken for a decoder of its encoder's layers alone: the tree knows encoder-only and decoder-only models,
    so the user says which the model is like, and with how many layers."""
    (tmp_path / "config.json").write_text('{"model_type": "t5", "is_encoder_decoder": true, "num_layers": 6, '
                                          '"num_decoder_layers": 6, "d_model": 512}')
    proc = ftgov("run", "--socket", daemon.socket, "--hf-config", str(tmp_path), "--seq-len", "30", "--", "true",
                 stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 2
    assert proc.stderr.read() == (f"ftgov run: --hf-config {tmp_path}: model_type 't5' is an encoder-decoder model, "
                                  "which the tree does not know (it knows encoder-only and decoder-only models): "
                                  "give --model-type, --num-layers\n")
    assert not re.search(r"job \d+", daemon.log()), "no job was registered"
    proc = ftgov("run", "--socket", daemon.socket, "--hf-config", str(tmp_path), "--model-type", "decoder",
                 "--num-layers", "12", "--seq-len", "30", "--gpu-util", "80", "--", "true")
    assert proc.wait(timeout=60) == 0
    assert re.search(r"job \d+ 'true' .*decoder L12 H512 seq 30 ", daemon.log()), daemon.log()


@pytest.mark.parametrize("name, why", [
    ("bad\nname", "must not contain control or format characters, blank fillers or stray combining marks (U+000A at "
                  "index 3)"),
    ("x" * 300, "must have at most 256 characters, not 300"),
])
def test_a_name_the_daemon_would_refuse_is_refused_before_the_command_runs(daemon, name, why):
    """A --name the daemon refuses cost the command its pin, with a warning, and ran it (exit 0) ungoverned."""
    proc = ftgov("run", "--socket", daemon.socket, "--name", name, *FEATURE_ARGS, "--", "true", stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 2
    assert proc.stderr.read().startswith(f"ftgov run: --name: {why}")
    assert not re.search(r"job \d+", daemon.log()), "no job was registered"


def test_a_command_whose_own_name_is_unprintable_is_named_with_escapes(daemon, tmp_path):
    script = tmp_path / "odd\nname"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", str(script), stderr=subprocess.PIPE)
    assert (proc.wait(timeout=60), proc.stderr.read()) == (0, "")
    assert re.search(r"job \d+ 'odd\\\\x0aname' \(pid", daemon.log()), daemon.log()


def counting_command(signo: int, orin) -> list[str]:
    """A command that counts the signals ``signo`` it dequeues: on the first it reads the GPU's pinned minimum (the
    job must still hold it while the command shuts down) and sends itself a SIGUSR2. Pending signals are taken lowest
    number first, so a duplicate sent before that SIGUSR2 is counted. (A duplicate that arrived while the first was
    still pending would merge with it unseen: a wrapper that forwards is caught often, not always; ours, which
    forwards nothing, always passes.)"""
    script = ("import os, signal\n"
              f"wanted = {{signal.Signals({int(signo)}), signal.SIGUSR2}}\n"
              "signal.pthread_sigmask(signal.SIG_BLOCK, wanted)\n"
              "print('ready', flush=True)\n"
              "count, pin = 0, None\n"
              "while True:\n"
              "    if signal.sigwaitinfo(wanted).si_signo == signal.SIGUSR2:\n"
              "        print(f'count={count} pin={pin}', flush=True)\n"
              "        break\n"
              "    count += 1\n"
              "    if count == 1:\n"
              f"        pin = open({str(orin / DEVFREQ / 'min_freq')!r}).read().strip()\n"
              "        os.kill(os.getpid(), signal.SIGUSR2)\n")
    return [sys.executable, "-c", script]


def test_ctrl_c_on_the_terminal_reaches_the_command_once(daemon, orin):
    """Ctrl-C goes to the terminal's foreground process group, which is the command's: once, as without ftgov run."""
    master, slave = pty.openpty()

    def controlling_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *counting_command(signal.SIGINT, orin),
                 stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=controlling_tty)
    os.close(slave)
    try:
        output = _read_until(master, b"ready")
        os.write(master, b"\x03")  # Ctrl-C, typed on the command's terminal
        output += _read_until(master, b"count=")
        assert proc.wait(timeout=30) == 0
        output += _read_rest(master)
        assert f"count=1 pin={expected_pin(daemon)}".encode() in output, output
    finally:
        proc.kill()
        os.close(master)


KEEPER_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


@pytest.mark.parametrize("sent_to", ["group", "every-process"])
def test_a_signal_to_the_process_group_or_to_every_process_reaches_the_command_once(daemon, orin, sent_to):
    """timeout(1) signals its command's process group, scancel and systemd (KillMode=control-group) every process of
    the job: a wrapper that forwards what it gets sent the command a second SIGTERM (a training's checkpoint-on-
    SIGTERM handler ran twice). The keeper is in a session of its own, outside the group, and ignores the signals
    sent to every process, so the job holds its pin while the command shuts down."""
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *counting_command(signal.SIGTERM, orin),
                 stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert read_line(proc.stdout) == "ready\n"
        keeper = keeper_of(daemon.socket)
        assert os.getsid(keeper) != os.getsid(proc.pid) and os.getpgid(keeper) != proc.pid
        ignored = int(next(line for line in open(f"/proc/{keeper}/status") if line.startswith("SigIgn:")).split()[1],
                      16)
        assert all(ignored >> (signo - 1) & 1 for signo in KEEPER_IGNORES), hex(ignored)
        if sent_to == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(keeper, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGTERM)
        assert read_line(proc.stdout) == f"count=1 pin={expected_pin(daemon)}\n"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    daemon.wait_jobs(0)
    assert limits(orin) == BASELINE


def _read_until(fd: int, marker: bytes, timeout_s: float = 30.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout_s
    while marker not in data:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {marker!r} within {timeout_s} s; got {data!r}"
        data += os.read(fd, 1024)
    return data


def _read_rest(fd: int) -> bytes:
    data = b""
    while select.select([fd], [], [], 0)[0]:
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # EIO: the terminal's last user closed it
            break
        if not chunk:
            break
        data += chunk
    return data


def readme_try_lines() -> list[list[str]]:
    """The commands of the README's "Try it without a Jetson" block, split as a shell would (comments dropped)."""
    import shlex

    text = (REPO / "README.md").read_text()
    block = text.split("## Try it without a Jetson", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_readmes_train_commands_run_as_written(daemon):
    """`ftgov run ... -- python3 examples/train.py` and `.venv/bin/python examples/train.py --client`, from the
    checkout, against a daemon: both files exist, both run, each is one job named train.py."""
    lines = [argv for argv in readme_try_lines() if "examples/train.py" in argv]
    assert len(lines) == 2, lines
    env = {**os.environ, "PYTHONPATH": str(REPO), "FTGOV_SOCKET": daemon.socket}
    for argv in lines:
        program = os.path.basename(argv[0])
        argv = [sys.executable, "-m", "governor.cli", *argv[1:]] if program == "ftgov" else [sys.executable, *argv[1:]]
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "train.py: 40 steps" in done.stdout, done
    assert len(re.findall(r"job \d+ 'train.py' .*ended \([\w ]+\) after [\d.]+ s", daemon.log())) == 2, daemon.log()


def test_ctrl_c_that_kills_the_command_stops_the_script_that_runs_ftgov_run(daemon):
    """A shell waiting on a command when Ctrl-C comes goes on with its script unless the command died of the SIGINT
    (bash's manual, SIGNALS): the process bash waits for is the command itself, which dies of the SIGINT, so that a
    loop of `ftgov run` jobs stops at the first Ctrl-C."""
    wrapper = shlex.join([sys.executable, "-m", "governor.cli", "run", "--socket", daemon.socket, *FEATURE_ARGS, "--",
                          "sh", "-c", "echo ready; exec sleep 600"])
    master, slave = pty.openpty()

    def controlling_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(["bash", "-c", f"{wrapper}; echo status=$?; echo the script went on"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=controlling_tty)
    os.close(slave)
    try:
        output = _read_until(master, b"ready")
        os.write(master, b"\x03")  # Ctrl-C: bash and the command are the terminal's foreground group
        assert proc.wait(timeout=30) == -signal.SIGINT
        output += _read_rest(master)
        assert b"went on" not in output, output
    finally:
        proc.kill()
        os.close(master)


def test_the_shell_sees_128_plus_n_for_a_command_killed_by_signal_n(daemon):
    proc = subprocess.run(["sh", "-c", shlex.join([sys.executable, "-m", "governor.cli", "run", "--socket",
                                                   daemon.socket, *FEATURE_ARGS, "--", "sh", "-c", "kill -TERM $$"])
                           + "; echo $?"], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout == f"{128 + signal.SIGTERM}\n", proc.stderr


def test_a_signal_while_the_job_ends_is_no_traceback(tmp_path):
    """The command has exited and the keeper waits for unregister's answer (a daemon slow to give it): a SIGINT or a
    SIGTERM sent to every process then (scancel, systemd) is no KeyboardInterrupt traceback, and the summary is
    still asked for. A stand-in daemon answers register, and unregister only once both signals were sent."""
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    proc = ftgov("run", "--socket", str(path), *FEATURE_ARGS, "--", "sh", "-c", "exit 3", stderr=subprocess.PIPE)
    try:
        server.settimeout(30)
        conn, _ = server.accept()
        conn.settimeout(30)
        lines = conn.makefile("rb")
        while True:
            request = json.loads(lines.readline())
            if "id" not in request:
                continue  # a notification: no answer
            method = request["method"]
            if method == "unregister":
                keeper = keeper_of(str(path))
                os.kill(keeper, signal.SIGINT)
                os.kill(keeper, signal.SIGTERM)
                result = {"job_id": 1, "duration_s": 0.1, "freq_hz": 816000000, "energy_j": 1.0, "steps": 0,
                          "ended": "unregistered"}
            elif method == "register":
                result = {"job_id": 1, "policy": "ffg", "freq_hz": 816000000, "reason": "stand-in", "gpu": "0",
                          "gpu_util": 80.0}
            else:
                result = {}
            conn.sendall(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode() + b"\n")
            if method == "unregister":
                break
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 3 and "Traceback" not in err, err
    finally:
        proc.kill()
        server.close()


def test_a_daemon_restart_under_the_command_is_no_false_alarm(daemon, orin):
    """The restarted daemon re-adopts the command by its pid and ends the job when it exits; the keeper, finding its
    connection gone, asks for the job: whether it gets it back or the job has ended, nothing is left pinned, and it
    must not warn that the pin may be."""
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *child_script(orin), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    child, _ = pid_and_min_freq(proc)
    try:
        daemon.stop(signal.SIGKILL)
        daemon.start()
        daemon.wait_jobs(1)  # re-adopted
        os.kill(child, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        daemon.wait_jobs(0)
        assert limits(orin) == BASELINE
        assert "pin" not in err and "Traceback" not in err, err
    finally:
        proc.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_started_with_a_thousand_descriptors_open_the_keeper_holds_the_job(daemon, orin):
    """A caller that passes ftgov run more than a thousand open descriptors (a launcher that leaks them): the
    keeper's watch on the command came above select()'s limit of 1023, and the keeper died of a ValueError as soon
    as it had released the command, its connection with it: the command ran ungoverned, under a traceback."""
    launcher = ("import os, sys\n"
                "for _ in range(1100):\n"
                "    os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)\n"
                "os.execv(sys.executable, [sys.executable, '-m', 'governor.cli', *sys.argv[1:]])")
    proc = subprocess.Popen([sys.executable, "-c", launcher, "run", "--socket", daemon.socket, *FEATURE_ARGS, "--",
                             "true"], env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)  # stderr closes once the keeper is gone too
        assert proc.returncode == 0 and "Traceback" not in err, err
        daemon.wait_jobs(0)
        assert re.search(r"job \d+ .*ended \((process exited|unregistered)\)", daemon.log()), daemon.log()
        assert limits(orin) == BASELINE
    finally:
        proc.kill()


def test_a_signal_ignored_where_ftgov_run_starts_stays_ignored_in_the_command(daemon):
    """A shell starts a background command (`cmd &` in a script) with SIGINT and SIGQUIT ignored, so that a Ctrl-C on
    the script's terminal leaves it running; nohup ignores SIGHUP. Python's SIGINT handler must not become the
    command's default: a Ctrl-C killed a training that, run without ftgov run, would have run on."""
    command = ("import os, signal; os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGHUP); "
               "print('ran on', flush=True)")
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", sys.executable, "-c", command,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)])
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, "ran on\n"), err


def test_started_with_sigchld_ignored_ftgov_run_still_runs_its_command(daemon):
    """A parent that leaves SIGCHLD ignored (SIG_IGN survives exec) makes the kernel reap ftgov run's children itself
    (a wrapper that waited for its command's SIGCHLD waited forever). The command inherits the ignored SIGCHLD, as it
    would without ftgov run."""
    command = "import signal; print(signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN); raise SystemExit(3)"
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", sys.executable, "-c", command,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (3, "True\n"), err
    daemon.wait_jobs(0)


@pytest.mark.parametrize("closed", [(2,), (0, 2)], ids=["stderr", "stdin-and-stderr"])
def test_started_with_stdin_or_stderr_closed_the_job_holds_while_the_command_runs(daemon, orin, closed):
    """With stderr closed, Python's sys.stderr is None: flushing it failed ftgov run (exit 1) before the command ran,
    and print(file=None) would write ftgov's messages to stdout, the command's output."""
    pin = expected_pin(daemon)
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", *child_script(orin), stdout=subprocess.PIPE,
                 preexec_fn=lambda: [os.close(fd) for fd in closed])
    try:
        assert pid_and_min_freq(proc)[1] == pin
        with Connection(daemon.socket) as conn:
            assert [job["pid"] for job in conn.call("status")["jobs"]] == [proc.pid]
        assert limits(orin) == (pin, pin)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    daemon.wait_jobs(0)


@pytest.mark.parametrize("closed", [(0,), (1,), (0, 1)], ids=["stdin", "stdout", "both"])
def test_started_with_stdin_or_stdout_closed_the_command_is_governed(daemon, orin, closed):
    """A caller may start ftgov run with stdin or stdout closed (`cmd <&-`, `cmd >&-`, a launcher that closes them).
    The descriptors ftgov run opens for itself then take those numbers, and the keeper's /dev/null over its own stdin
    and stdout must not replace them: over the pidfd it watches, it ended the job as the command started; over the
    release pipe, the command never ran. The command gets them closed, as without ftgov run, and a descriptor the
    caller passed (here the pipe it reports on)."""
    report_r, report_w = os.pipe()
    command = ("import os, time\n"
               "def is_open(fd):\n"
               "    try:\n"
               "        return os.fstat(fd) is not None\n"
               "    except OSError:\n"
               "        return False\n"
               f"pin = open({str(orin / DEVFREQ / 'min_freq')!r}).read().strip()\n"
               f"os.write({report_w}, f'{{os.getpid()}} {{pin}} {{is_open(0)}} {{is_open(1)}}\\n'.encode())\n"
               "time.sleep(600)\n")
    proc = ftgov("run", "--socket", daemon.socket, *FEATURE_ARGS, "--", sys.executable, "-c", command,
                 pass_fds=(report_w,), preexec_fn=lambda: [os.close(fd) for fd in closed])
    os.close(report_w)
    try:
        with os.fdopen(report_r) as report:
            pid, pin, stdin_open, stdout_open = read_line(report).split()
        assert (int(pid), int(pin)) == (proc.pid, expected_pin(daemon))
        assert (stdin_open, stdout_open) == tuple(str(fd not in closed) for fd in (0, 1))
        keeper_of(daemon.socket)  # still there: it leaves once the command has exited
        with Connection(daemon.socket) as conn:
            assert [job["pid"] for job in conn.call("status")["jobs"]] == [proc.pid]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()
    daemon.wait_jobs(0)
    assert limits(orin) == BASELINE


def _next_call(lines) -> dict:
    """The next request that wants an answer (notifications have no id), read by a stand-in daemon."""
    while "id" not in (request := json.loads(lines.readline())):
        pass
    return request


def _answer(conn, request: dict, result: dict) -> None:
    conn.sendall(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode() + b"\n")


def test_ctrl_c_while_the_job_registers_ends_ftgov_run_by_sigint(tmp_path):
    """The command is this process from the start: a Ctrl-C while the keeper registers it (the driver's start, a slow
    daemon) ends it by SIGINT, as it would end the command, so that a shell stops its script there (bash goes on
    after a command that exited 130 of its own accord); the keeper, with nobody left to release, ends the job and
    leaves without a traceback. A stand-in daemon answers register only once the SIGINT has done its work."""
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    server.settimeout(30)
    proc = ftgov("run", "--socket", str(path), *FEATURE_ARGS, "--", "true", stderr=subprocess.PIPE)
    try:
        conn, _ = server.accept()
        conn.settimeout(30)
        lines = conn.makefile("rb")
        request = _next_call(lines)
        assert request["method"] == "register"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT
        _answer(conn, request, {"job_id": 1, "policy": "ffg", "freq_hz": 816000000, "reason": "stand-in",
                                "gpu": "0", "gpu_util": 80.0})
        request = _next_call(lines)
        assert request["method"] == "unregister"
        _answer(conn, request, {"job_id": 1, "duration_s": 0.1, "freq_hz": 816000000, "energy_j": 1.0, "steps": 0,
                                "ended": "unregistered"})
        err = proc.stderr.read()  # to its end: the keeper has left
        assert "Traceback" not in err, err
    finally:
        proc.kill()
        server.close()


def test_the_summary_after_the_command_overwrites_nothing_its_caller_wrote_since(tmp_path):
    """The keeper prints -v's summary after the command has exited, when whoever started `ftgov run` may have gone on
    writing to the same log (`ftgov run -v ... >log 2>&1; echo "exit $?" >>log`): at the offset it shared with the
    command, the summary overwrote that line. A stand-in daemon answers unregister only once the line is written."""
    path, log = tmp_path / "s.sock", tmp_path / "run.log"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    server.settimeout(30)
    with open(log, "w") as out:
        proc = ftgov("run", "-v", "--socket", str(path), *FEATURE_ARGS, "--", "sh", "-c", "echo training",
                     stdout=out, stderr=out)
    try:
        conn, _ = server.accept()
        conn.settimeout(30)
        lines = conn.makefile("rb")
        _answer(conn, _next_call(lines), {"job_id": 1, "policy": "ffg", "freq_hz": 816000000, "reason": "stand-in",
                                          "gpu": "0", "gpu_util": 80.0})
        request = _next_call(lines)
        assert request["method"] == "unregister"
        keeper = os.pidfd_open(keeper_of(str(path)))
        assert proc.wait(timeout=30) == 0
        with open(log, "a") as out:
            out.write("exit 0\n")
        _answer(conn, request, {"job_id": 1, "duration_s": 0.1, "freq_hz": 816000000, "energy_j": 1.0, "steps": 0,
                                "ended": "unregistered"})
        assert select.select([keeper], [], [], 30)[0], "the keeper has left"
        os.close(keeper)
        written = log.read_text().splitlines()
        assert written[1:3] == ["training", "exit 0"] and written[3].startswith("ftgov: job 1 ended: "), written
    finally:
        proc.kill()
        server.close()


def test_with_stderr_closed_an_error_is_not_written_to_the_commands_stdout(tmp_path):
    proc = ftgov("run", "--socket", str(tmp_path / "absent.sock"), *FEATURE_ARGS, "--", "no-such-command-ftgov",
                 stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (127, "")


def test_in_a_pid_namespace_of_its_own_the_daemon_holds_the_command_itself(daemon, orin):
    """A container with a pid namespace of its own numbers its processes from 1: ftgov run there as its first process
    sent pid=1, which the daemon, in the host's namespace, took for the host's PID 1 (held it, re-adopted it after a
    restart). The daemon now knows the command from the socket its process connected on."""
    pin = expected_pin(daemon)
    own_users = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    wrapper = [sys.executable, "-m", "governor.cli", "run", "--socket", daemon.socket, *FEATURE_ARGS, "--",
               *child_script(orin)]
    proc = subprocess.Popen(["unshare", *own_users, "--pid", "--fork", "--mount-proc", *wrapper],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, text=True, stdout=subprocess.PIPE)
    try:
        pid, min_freq = pid_and_min_freq(proc)
        assert (pid, min_freq) == (1, pin)  # the command is the namespace's PID 1, pinned from its start
        command = int(open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()[0])  # the host's number
        with Connection(daemon.socket) as conn:
            assert [job["pid"] for job in conn.call("status")["jobs"]] == [command]
        os.kill(command, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    daemon.wait_jobs(0)
    assert limits(orin) == BASELINE
