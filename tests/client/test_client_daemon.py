"""The client core in a plain training loop, against the real ftgovd on a fake Orin tree."""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import governor
from governor.client import Connection, GovernorWarning
from tests.support import REPO
from tests.support.daemon import limits

BASELINE = (306000000, 1300500000)
SMALL = dict(model_type="encoder", num_layers=2, hidden_size=32)


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()


def predicted_hz(daemon, **features) -> int:
    with Connection(daemon.socket) as conn:
        return conn.call("predict", **features)["freq_hz"]


def test_plain_loop_holds_the_pin_for_the_with_block(daemon, orin):
    pin = predicted_hz(daemon, **SMALL, seq_len=40.0, gpu_util=90.0)
    seen = []
    with governor.job(**SMALL, seq_len=40, gpu_util=90, name="loop", socket=daemon.socket, report_every_s=0) as job:
        for _ in range(5):
            seen.append(limits(orin))
            job.step()
    assert seen == [(pin, pin)] * 5
    assert limits(orin) == BASELINE
    assert job.result["steps"] == 5
    assert re.search(rf"job {job.job_id} 'loop' .*ended \(unregistered\) after [\d.]+ s, 5 steps", daemon.log())


def test_exception_in_the_loop_ends_the_job(daemon, orin):
    with pytest.raises(ZeroDivisionError):
        with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket) as job:
            job.step()
            raise ZeroDivisionError
    assert limits(orin) == BASELINE
    assert re.search(rf"job {job.job_id} .*ended \(unregistered\) after [\d.]+ s, 1 steps", daemon.log())


def test_sequence_length_measured_from_masks_then_registered(daemon, orin):
    torch.manual_seed(0)
    lengths = torch.randint(5, 60, (8, 16))  # 8 batches of 16 samples padded to 64 tokens
    masks = [(torch.arange(64)[None, :] < row[:, None]).long() for row in lengths]
    seen = []
    with governor.job(**SMALL, gpu_util=90, socket=daemon.socket, measure_batches=3) as job:
        for mask in masks:
            job.observe_batch({"input_ids": torch.ones_like(mask), "attention_mask": mask})
            seen.append(limits(orin))
            job.step()
    measured = lengths[:3].float().mean().item()
    assert job.features["seq_len"] == pytest.approx(measured)
    pin = predicted_hz(daemon, **SMALL, seq_len=measured, gpu_util=90.0)
    assert seen[:2] == [BASELINE] * 2 and seen[2:] == [(pin, pin)] * 6
    assert re.search(rf"job {job.job_id} .*seq {measured:g} ", daemon.log()), daemon.log()


def test_update_moves_the_pin(daemon, orin):
    short = predicted_hz(daemon, **SMALL, seq_len=10.0, gpu_util=90.0)
    long = predicted_hz(daemon, **SMALL, seq_len=500.0, gpu_util=90.0)
    assert short != long, "the shipped tree splits on seq_len for small models"
    with governor.job(**SMALL, seq_len=10, gpu_util=90, socket=daemon.socket) as job:
        assert limits(orin) == (short, short)
        assert job.update(seq_len=500)["freq_hz"] == long
        assert limits(orin) == (long, long)


def test_refused_registration_lets_the_loop_run(daemon, orin):
    with pytest.warns(GovernorWarning, match=r"register refused: register: gpu: no GPU .*\(field 'gpu'\)"):
        with governor.job(**SMALL, seq_len=40, gpu=7, socket=daemon.socket) as job:
            for _ in range(3):
                job.step()
    assert job.disabled and job.steps == 3
    assert limits(orin) == BASELINE


def test_a_start_slower_than_the_idle_timeout_still_registers(start_daemon, orin):
    """The client connects at start and registers only once seq_len is measured; the daemon closes a connection that
    holds no job after limits.idle_timeout_s. The client connects again, once, rather than lose the job."""
    daemon = start_daemon(config={"limits": {"idle_timeout_s": 0.2}})
    pin = predicted_hz(daemon, **SMALL, seq_len=3.0, gpu_util=90.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GovernorWarning)
        with governor.job(**SMALL, gpu_util=90, socket=daemon.socket, measure_batches=2) as job:
            job.observe_batch({"attention_mask": [[1, 1, 1, 0]]})
            ready, _, _ = select.select([job._conn._sock], [], [], 10)  # the daemon's close: EOF turns it readable
            assert ready
            job.observe_batch({"attention_mask": [[1, 1, 1, 0]]})
            assert job.registered and limits(orin) == (pin, pin)
            job.step()
    assert job.result["steps"] == 1 and limits(orin) == BASELINE


def test_a_daemon_restart_under_a_job_hands_the_job_back_to_it(daemon, orin, caplog):
    """The restarted daemon re-adopts the job by its process, which would keep the pin until the process exits (a
    notebook's kernel, long after training). The job connects again and holds it (resume): its end ends it, with the
    summary, and no warning."""
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
        job.step()
        daemon.stop(signal.SIGKILL)  # returns once the process is gone, its end of the connection closed
        daemon.start()
        caplog.clear()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert job.result is not None and job.result["ended"] == "unregistered"
    daemon.wait_jobs(0)
    assert limits(orin) == BASELINE and not job.disabled


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "clean-restart"])
def test_a_job_reports_on_to_a_restarted_daemon(daemon, orin, how):
    """A report that finds the connection gone asks the restarted daemon for the job: training goes on governed,
    after a crash and after a clean restart (systemctl restart, an upgrade), whose stop restored the clocks and ended
    the job for good before."""
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
        job.step()
        daemon.stop(how)
        if how == signal.SIGTERM:
            assert limits(orin) == BASELINE  # restore_on_stop: nothing pinned while no daemon runs
        daemon.start()
        for _ in range(5):
            job.step()
        assert not job.disabled
        [held] = Connection(daemon.socket).call("status")["jobs"]
        assert (held["job_id"], held["steps"], held["adopted"]) == (job.job_id, 6, True)
    assert job.result["steps"] == 6
    assert limits(orin) == BASELINE


def test_a_daemon_that_stops_reading_does_not_hold_up_the_steps(daemon, orin):
    """A stopped daemon (SIGSTOP, a hang) reads nothing: once the socket's buffer is full, each report waited
    timeout_s and the job then gave up on the governor. Reports are dropped instead while the socket takes none
    (the next carries the same totals), and the job goes on governed once the daemon reads again."""
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0, timeout_s=2) as job:
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", GovernorWarning)
                for _ in range(30000):  # ~3.6 MB of reports: the socket's buffer many times over
                    job.step()
            assert not job.disabled
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
    assert job.result is not None and job.result["steps"] == 30000
    assert limits(orin) == BASELINE


def test_a_daemon_restarted_without_the_job_registers_it_again(daemon, orin):
    """The restarted daemon did not take the job back (its record had not reached the state file, or it set the file
    aside) and restored the clocks: the job registers again, as a new job counted from there, and the rest of the
    training is governed (it went on at the default clocks, warned, for as long as it ran: hours of a fine-tuning
    run after an upgrade). Said once; the new job's steps and length are its own."""
    import json

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0,
                          total_steps=100) as job:
            job.step()
            first = job.job_id
            daemon.stop(signal.SIGKILL)
            state = daemon.state_dir / "state.json"
            state.write_text(json.dumps({**json.loads(state.read_text()), "jobs": []}))
            daemon.start()
            assert limits(orin) == BASELINE  # restored at the restart: the job was not taken back
            job.step()
            job.step()
            job.step()
            assert not job.disabled and job.job_id != first
            status = Connection(daemon.socket)
            [held] = status.call("status")["jobs"]
            status.close()
            assert (held["job_id"], held["steps"], held["total_steps"]) == (job.job_id, 2, 98), held
            assert limits(orin) != BASELINE  # pinned again
    [warned] = [str(w.message) for w in caught]
    assert warned.startswith(f"ftgov: ftgovd restarted without job {first} (it restored the clocks): the job "
                             f"registered again, as job {job.job_id}"), warned
    assert job.result["steps"] == 2
    assert limits(orin) == BASELINE


def test_a_killed_daemon_leaves_the_pin_and_the_warning_says_so(daemon, orin):
    pin = predicted_hz(daemon, **SMALL, seq_len=40.0, gpu_util=90.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
            job.step()
            daemon.stop(signal.SIGKILL)
            job.step()
            job.step()
    [warned] = [str(w.message) for w in caught]
    # EPIPE, or ECONNRESET where the daemon died with the first report unread.
    assert warned.startswith("ftgov: training goes on without the GPU frequency governor: lost the connection to "
                             f"ftgovd at {daemon.socket}: ")
    assert warned.endswith("; if ftgovd was killed, the GPU keeps this job's pin until ftgovd starts again (which "
                           "restores the clocks, or holds the job again until this job ends) or `ftgov restore` "
                           "runs")
    assert limits(orin) == (pin, pin), "what the warning says: nothing restored the clocks"


def test_a_killed_daemon_does_not_kill_a_process_that_takes_sigpipe(daemon, orin):
    """A training script that restores SIGPIPE's default (the idiom for `python train.py | head`), or Python embedded
    in a program that never ignored it: the first report to a daemon that was killed wrote to a closed socket, and
    the kernel's SIGPIPE killed the training. A report must fail as an error (EPIPE), never as a signal."""
    code = f"""
import signal, sys, governor
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
with governor.job(model_type="encoder", num_layers=2, hidden_size=32, seq_len=40, gpu_util=90,
                  socket={str(daemon.socket)!r}, report_every_s=0) as job:
    job.step()
    print("registered", flush=True)
    sys.stdin.readline()
    job.step()
    job.step()
print("trained on:", job.steps, "steps; governed:", not job.disabled)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == "registered\n"
    daemon.stop(signal.SIGKILL)
    out, err = proc.communicate("\n", timeout=60)
    assert (proc.returncode, out) == (0, "trained on: 3 steps; governed: False\n"), err
    assert "lost the connection to ftgovd" in err


def test_a_thread_that_updates_the_job_beside_the_training_loop(daemon, orin):
    """A thread of the user's that measures the GPU load and sends it (job.update(gpu_util=...), "at any time") while
    the training thread steps: the step's report switched the shared socket to non-blocking for its send, the other
    thread's reply read found nothing there and took it for the daemon's close, the job ended, and the training
    thread's next step raised AttributeError on the connection closed under it. One thread at a time talks to the
    daemon; a step whose report would wait for the other's reply drops it (the next carries the same totals)."""
    import threading

    done, failed = threading.Event(), []

    def train():
        try:
            while not done.is_set():
                job.step()
        except BaseException as e:  # noqa: BLE001 - what the training loop would have raised
            failed.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error", GovernorWarning)
        with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
            trainer = threading.Thread(target=train)
            trainer.start()
            try:
                for i in range(200):
                    assert job.update(gpu_util=50 + i % 40) is not None, i
            finally:
                done.set()
                trainer.join()
            assert failed == [] and not job.disabled
    assert job.result["steps"] == job.steps
    assert limits(orin) == BASELINE


def test_a_forked_childs_end_leaves_its_parents_job(daemon, orin):
    """A child forked inside the with block (os.fork) holds a copy of the job and its socket: its way out of the block
    must not unregister the job its parent trains under."""
    pin = predicted_hz(daemon, **SMALL, seq_len=40.0, gpu_util=90.0)
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
        job.step()
        pid = os.fork()
        if pid == 0:  # the child: leave the block, as an exception or a return would
            try:
                job.step()
                job.__exit__(None, None, None)
            finally:
                os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert job.registered and limits(orin) == (pin, pin)
        job.step()
    assert job.result["steps"] == 2 and limits(orin) == BASELINE


def in_a_forked_child(job, *calls) -> int:
    """Run ``calls`` on the job's copy in a forked child: its exit code counts the warnings given, plus 10 where the
    copy gave up (disabled) and 20 where it registered a job of its own; 0 is a copy that said and did nothing."""
    parents = job.job_id
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                for call in calls:
                    call()
            code = len(said) + (10 if job.disabled else 0) + (20 if job.job_id != parents else 0)
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_childs_steps_say_nothing_of_its_parents_job(daemon, orin):
    """A forked child that counts steps on its copy of the job (a worker that calls job.step()) cannot report them
    (the connection is its parent's: Connection refuses to write). It warned that training went on without the
    governor and that a killed ftgovd leaves the pin, both untrue of its parent's job: its steps now go unreported,
    silently, and the parent's job is as it was."""
    pin = predicted_hz(daemon, **SMALL, seq_len=40.0, gpu_util=90.0)
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, report_every_s=0) as job:
        job.step()
        assert in_a_forked_child(job, job.step, job.step) == 0
        assert job.registered and not job.disabled and limits(orin) == (pin, pin)
        job.step()
    assert job.result["steps"] == 2 and limits(orin) == BASELINE


def test_a_forked_child_that_measures_batches_registers_nothing(daemon, orin):
    """A child forked while the job still measures seq_len (a collate_fn that calls job.observe_batch in a forked
    DataLoader worker) completed the measurement on its copy and registered on its parent's connection: refused (the
    connection is the parent's), it warned that training went on without the governor, untrue of its parent's job; and
    where the daemon had closed that idle connection it would have connected again and registered a second job, its
    own. The child's copy registers nothing; the parent's job registers from its own batches."""
    mask = torch.ones(4, 32, dtype=torch.long)
    batch = {"input_ids": mask, "attention_mask": mask}
    with governor.job(**SMALL, gpu_util=90, socket=daemon.socket, measure_batches=2, report_every_s=0) as job:
        assert in_a_forked_child(job, lambda: job.observe_batch(batch), lambda: job.observe_batch(batch), job.step) == 0
        assert daemon.client().call("status")["jobs"] == [] and limits(orin) == BASELINE
        job.observe_batch(batch)
        job.observe_batch(batch)
        job.step()
        pin = predicted_hz(daemon, **SMALL, seq_len=32.0, gpu_util=90.0)
        assert job.registered and not job.disabled and limits(orin) == (pin, pin)
    assert job.result["steps"] == 1 and limits(orin) == BASELINE


def test_a_job_dropped_after_a_timeout_ends_though_a_loader_worker_holds_its_socket(daemon, orin):
    """A daemon too slow to answer: the job closes its connection to end its hold. A persistent DataLoader worker,
    forked after the job connected, holds a copy of the socket; the daemon must still see the connection close."""
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    with governor.job(**SMALL, seq_len=40, gpu_util=90, socket=daemon.socket, timeout_s=0.5) as job:
        for _ in loader:  # forks the worker, which lives on with the loader
            job.step()
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.warns(GovernorWarning, match="did not answer update within timeout_s=0.5 s"):
                job.update(seq_len=100)
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        daemon.wait_jobs(0)
        assert limits(orin) == BASELINE
    del loader


# A torch built with CUDA as a process sees it before its first CUDA call: nothing is initialized; current_device()
# initializes CUDA on device 0 (a context there), as torch's does; set_device(n) chooses n.
FAKE_CUDA_TORCH = '''
import types
_device = None
def _is_initialized():
    return _device is not None
def _set_device(n):
    global _device
    _device = n
def _current_device():
    global _device
    if _device is None:
        _device = 0
    return _device
cuda = types.SimpleNamespace(
    is_initialized=_is_initialized, is_available=lambda: True, set_device=_set_device,
    current_device=_current_device,
    get_device_properties=lambda n: types.SimpleNamespace(uuid=f"8f1c2d3e-0000-1111-2222-33334444555{n}"))
backends = types.SimpleNamespace(cuda=types.SimpleNamespace(is_built=lambda: True))
'''


def test_a_job_made_before_set_device_touches_no_cuda_and_registers_the_ranks_gpu(daemon, orin, tmp_path):
    """A torchrun rank that holds its job before torch.cuda.set_device(LOCAL_RANK): asking torch for the current
    device then initialized CUDA on device 0 (a context of some hundred MB there, from every rank) and named GPU 0 for
    every rank. The job touches no CUDA before training does, and registers at its first step, on the rank's GPU."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_CUDA_TORCH)
    code = f"""
import torch, governor
with governor.job(model_type="encoder", num_layers=2, hidden_size=32, seq_len=40, gpu_util=90,
                  socket={str(daemon.socket)!r}, report_every_s=0) as job:
    print("cuda initialized by the job:", torch.cuda.is_initialized())
    torch.cuda.set_device(1)  # the rank's GPU (LOCAL_RANK 1)
    job.step()
    print("gpu:", job.gpu, "registered:", job.registered)
    job.step()
print("steps:", job.result["steps"])
"""
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}, timeout=60)
    assert out.stdout.splitlines() == [
        "cuda initialized by the job: False",
        "gpu: GPU-8f1c2d3e-0000-1111-2222-333344445551 registered: True",
        "steps: 2"], out.stderr
    assert limits(orin) == BASELINE
