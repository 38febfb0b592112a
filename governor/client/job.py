"""The job that training code holds for its life: registration, progress reports, and the end on every way out."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from governor.client.connection import (
    DEFAULT_REPORT_EVERY_S,
    Connection,
    DaemonUnavailable,
    UnknownJob,
)
from governor.client.features import (
    batch_tokens,
    check_features,
    check_partial_features,
    cuda_pending,
    resolve_features,
    slurm_job_id,
    visible_gpu,
)
from governor.client.group import GroupCoordinator, GroupInfo, group_from_env, torch_distributed
from governor.client.warning import warn
from governor.errors import FtgovError
from governor.features import MIN_SEQ_LEN
from governor.text import name_problem
from governor.units import figure, mhz

log = logging.getLogger("governor.client")


# What the warning of a job that carries on without the daemon begins with (the rest: why).
WITHOUT_GOVERNOR = "ftgov: training goes on without the GPU frequency governor: "
# Set by `ftgov run` in its command's environment to the id of the job it registered for it: a process that inherits
# it (the command, its torchrun ranks) is governed already, and a job of its own would be a second job on it.
RUN_JOB_ENV = "FTGOV_RUN_JOB"
# What follows a registered job's loss of its daemon: nothing restored the clocks if the daemon was killed.
# resume found no such job: the restarted daemon ended it (its process exited) or, not re-adopting it, restored the
# clocks from its state file, which a daemon that lost that file could not.
RESTARTED_WITHOUT = ("ftgovd restarted and holds this job no more: it ended it or restored the clocks (unless it lost "
                     "its state file: then `ftgov restore`)")
# How often a job registers in all: once, and again after restarted daemons that had lost it (_register_again).
MAX_REGISTRATIONS = 3
PIN_LEFT = ("if ftgovd was killed, the GPU keeps this job's pin until ftgovd starts again (which restores the clocks, "
            "or holds the job again until this job ends) or `ftgov restore` runs")

_Method = TypeVar("_Method", bound=Callable)


def _talks(method: _Method) -> _Method:
    """``method`` talks to the daemon: one thread at a time (Job._talking). A forked child's copy of the job never
    talks (the connection is its parent's) and takes no lock: a thread of the parent's that held it at the fork would
    hold the child's copy for good."""
    @functools.wraps(method)
    def talking(self, *args, **kwargs):
        if self._pid not in (None, os.getpid()):
            return method(self, *args, **kwargs)
        with self._talking:
            return method(self, *args, **kwargs)
    return talking  # type: ignore[return-value]


class Job:
    """A fine-tuning job registered with ftgovd for the life of a ``with`` block (see ``job``).

    States: created -> started (connected) -> registered -> closed. When the daemon is absent or refuses, the job
    warns once and becomes a no-op: every method still works and does nothing, so training never stops for us.

    When seq_len is not given, registration waits until ``observe_batch`` has seen ``measure_batches`` batches, so the
    daemon decides once, on the measured average, instead of pinning a guess and moving the pin a few steps later.
    """

    def __init__(self, features: dict, *, name: str | None = None, socket: str | os.PathLike | None = None,
                 pid: int | None = None, gpu: str | int | None = None, tune: bool | None = None,
                 report_every_s: float = DEFAULT_REPORT_EVERY_S,
                 measure_batches: int = 8, timeout_s: float = 10.0, total_steps: int | None = None,
                 group: str | None = None, rank: int | None = None, world_size: int | None = None,
                 local_world_size: int | None = None, connection: Connection | None = None):
        if report_every_s < 0:
            raise ValueError("report_every_s must be >= 0")
        if measure_batches < 1:
            raise ValueError("measure_batches must be >= 1")
        if not timeout_s > 0:  # NaN too: the socket's timeout would refuse it only when the job starts
            raise ValueError("timeout_s must be > 0 (seconds to wait for ftgovd's answers)")
        _check_name(name)
        self.features = dict(features)
        self.name = name
        self.socket = socket
        self.pid = pid
        self.gpu = gpu
        self.tune = tune  # True: ask for the online tuner (policy tune) for this job
        # The step count the job ends at (same count as step()), when known: the tuner's exploration budget is a
        # fraction of the job's energy, so a short job explores less. None: the daemon's tuner assumes its default.
        self.total_steps = _check_total_steps(total_steps)
        self._sent_total_steps: int | None = None
        # A rank of a multi-GPU run (governor.client.group): given, else from the launcher's environment at register.
        # Read now, not at register: whether this rank takes part in the group's collectives must not depend on its
        # daemon's answer, or the ranks whose daemon answered would wait forever for one whose daemon did not.
        self.group_info: GroupInfo | None = group_from_env(group, rank, world_size,
                                                           local_world_size=local_world_size)
        self.coordinator: GroupCoordinator | None = None  # rank 0's tuner across nodes, on every rank
        self.report_every_s = report_every_s
        self.measure_batches = measure_batches
        self.timeout_s = timeout_s
        self.job_id: int | None = None
        self.registration: dict | None = None  # the daemon's answer to register: policy, freq_hz, reason, gpu
        self.result: dict | None = None  # the daemon's answer to unregister: duration_s, energy_j, steps
        self.steps = 0
        self.disabled = False
        self._conn: Connection | None = None
        # One thread at a time talks to the daemon (the connection's lines and replies, and which connection it is):
        # a thread of the user's may send update(gpu_util=...) while the training thread steps.
        self._talking = threading.RLock()
        # A connection made for this job by the process it is for (Connection.take_over): the daemon holds the process
        # that connected, known from the socket, where a pid number is the caller's namespace's.
        self._given_conn = connection
        # The daemon stopped answering this registered job (stopped, crashed, restarting): a restarted daemon holds it
        # again by its process, and the job asks it to hold it by a new connection (resume) to report and end it.
        self._lost = False
        self._pid: int | None = None  # the process that started the job: a forked child's copy never acts on it
        self._ended_meanwhile = False  # a restarted daemon holds no such job (RESTARTED_WITHOUT)
        # The steps counted before the daemon in force registered the job: 0, unless a restarted daemon had lost it and
        # it registered again (_register_again), its steps and length then counted from there.
        self._steps_before = 0
        self._registrations = 0
        self._started = False
        self._closed = False
        self._reported_steps = 0
        self._next_report_s = 0.0
        self._step_end_s: float | None = None  # CLOCK_MONOTONIC when the last counted step ended
        # A group's rank that calls compute_done(): its compute time per step, summed until the next report.
        self._compute_done_s: float | None = None
        self._compute_sum_s = 0.0
        self._compute_steps = 0
        self.compute_total_s = 0.0  # over the whole job (a run across nodes: rank 0's trim windows)
        self.compute_steps_total = 0
        self._phase: str | None = None
        self._tokens = 0.0
        self._samples = 0
        self._batches_seen = 0
        self._unmeasurable_batches = 0

    def __getstate__(self) -> dict:
        # An ended job pickles (a Lightning Trainer under ddp_spawn ships its callbacks, the last fit's job with them):
        # the lock is made anew.
        state = dict(self.__dict__)
        del state["_talking"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._talking = threading.RLock()

    def __enter__(self) -> Job:
        try:
            self.start()
        except BaseException:
            # Interrupted in start (Ctrl-C while register waits on the daemon): the with block's exit will not run,
            # and a notebook's traceback keeps this object alive, with its connection and the job the daemon made on it.
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def registered(self) -> bool:
        return self.job_id is not None and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def seq_len_known(self) -> bool:
        return "seq_len" in self.features

    def start(self) -> Job:
        """Connect, and register now if the features are complete. Idempotent."""
        if self._started or self.disabled:
            return self
        self._started = True
        self._pid = os.getpid()
        run_job = os.environ.get(RUN_JOB_ENV)
        if run_job:
            self._defer_to_run(run_job)
            return self
        try:
            self._conn = self._given_conn or Connection(self.socket, timeout_s=self.timeout_s)
        except DaemonUnavailable as e:
            self._disable(str(e))
            return self
        if self.seq_len_known:
            self._register()
        return self

    def observe_batch(self, batch=None, *, attention_mask=None) -> None:
        """Measure the average non-padding sequence length from the first batches; register once it is known.

        Costs nothing once the measurement is done (or when seq_len was given).
        """
        if self.seq_len_known or self.disabled or self._closed:
            return
        counted = batch_tokens(batch, attention_mask=attention_mask)
        if counted is None:
            self._unmeasurable_batches += 1
            if self._unmeasurable_batches == self.measure_batches and self._batches_seen == 0:
                self._disable("cannot measure the sequence length: the batches carry no 2-D attention_mask; "
                              "pass seq_len= (average tokens per sample)")
            return
        tokens, samples = counted
        self._tokens += tokens
        self._samples += samples
        self._batches_seen += 1
        if self._batches_seen >= self.measure_batches and self._tokens > 0:
            # Batches whose masks are mostly empty can average under a token a sample, which the daemon refuses.
            self.features["seq_len"] = max(self._tokens / self._samples, MIN_SEQ_LEN)
            log.info("ftgov: measured seq_len %.1f tokens/sample over %d samples", self.features["seq_len"],
                     self._samples)
            if self._started:
                self._register()

    def step(self, n: int = 1) -> None:
        """Count n training steps. Reports the total at most every report_every_s, so a step costs a clock read."""
        self.steps += n
        now_s = time.monotonic()
        done_s, last_end_s = self._compute_done_s, self._step_end_s
        if done_s is not None and last_end_s is not None and done_s >= last_end_s:
            self._compute_sum_s += done_s - last_end_s
            self._compute_steps += n
            self.compute_total_s += done_s - last_end_s
            self.compute_steps_total += n
        self._compute_done_s = None
        self._step_end_s = now_s
        if self.group_info is not None and self.group_info.spans_nodes and self.tune:
            self._coordinate()
        if self._conn is None or (self.job_id is not None and self._step_end_s < self._next_report_s):
            return
        if not self._talking.acquire(blocking=False):
            return  # another thread waits on the daemon (update()): not this step, the next report says the same
        try:
            self._step_talk()
        finally:
            self._talking.release()

    def _step_talk(self) -> None:
        """What a step says to the daemon: its report, or the registration it held back."""
        if self.job_id is None or self._conn is None:
            if self._conn is not None and self.seq_len_known and not self.disabled:
                self._register(at_step=True)  # held back until CUDA was up (_register); it reports the steps
                return
            if (self._conn is not None and not self.seq_len_known and self.steps >= self.measure_batches
                    and self._batches_seen == 0 and self._unmeasurable_batches == 0):
                self._disable("seq_len is unknown and no batch was observed: pass seq_len= "
                              "or call job.observe_batch(batch) on the first batches")
            return
        if self._step_end_s is not None and self._step_end_s >= self._next_report_s:
            self._next_report_s = self._step_end_s + self.report_every_s
            self._report()

    def compute_done(self) -> None:
        """Mark the end of this step's compute, before its collective (the all-reduce): in a job group, the daemon
        lowers the clocks of the ranks that finish early and then wait, while the group's step time holds
        (docs/distributed.md). Costs a clock read."""
        self._compute_done_s = time.monotonic()

    def phase(self, phase: str) -> None:
        """Tell the daemon what the job does now ("train", "eval", "checkpoint", "data"); sent only on a change."""
        if phase == self._phase:
            return
        self._phase = phase
        if self.coordinator is not None:
            if phase == "train":
                self.coordinator.back_to_training()
            else:
                self.coordinator.left_training()
        if self.job_id is not None and self._conn is not None:
            self._report()

    def set_total_steps(self, total_steps: int | None) -> None:
        """The job's length (the step count it ends at), once known: sent with register, or with the next progress
        report when the job is registered already."""
        self.total_steps = _check_total_steps(total_steps)
        if self.job_id is not None and self._conn is not None and self.total_steps != self._sent_total_steps:
            self._report()

    @_talks
    def update(self, *, gpu_util: float | None = None, seq_len: float | None = None) -> dict | None:
        """Send new feature values; the daemon may move the pin. Returns its answer, None when not registered.

        Raises ValueError for a value the daemon would refuse (the bounds of governor.features), before sending it.
        """
        check_partial_features({"seq_len": seq_len, "gpu_util": gpu_util})
        if seq_len is not None:
            self.features["seq_len"] = float(seq_len)
        if gpu_util is not None:
            self.features["gpu_util"] = float(gpu_util)
        if self.job_id is None or self._conn is None:
            if self._started and not self.disabled and self.seq_len_known:
                self._register()
            return None
        try:
            return self._conn.call("update", job_id=self.job_id, gpu_util=gpu_util, seq_len=seq_len)
        except DaemonUnavailable as e:
            self._lost = True
            self._disable(self._unanswered("update", e))
        except FtgovError as e:
            self._disable(f"update refused: {e}")
        return None

    @_talks
    def close(self) -> None:
        """Report the final step count, unregister and close. Idempotent; never raises for the daemon's sake."""
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and conn.inherited:
            # A forked child's copy of the job (an os.fork() inside its with block): the job is its parent's, which
            # goes on training under it.
            conn.close()
            return
        if conn is not None and self.job_id is not None and conn.closed_by_daemon():
            conn.close()  # the daemon went away under the job: whatever held the job there is gone with it
            conn, self._lost = None, True
        if conn is None and self._lost:
            # A restarted daemon that re-adopted the job (by its process) would hold its pin until this process
            # exits: a notebook's kernel, long after training. Held by a new connection, it ends here as any job.
            conn = self._resumed()
            if conn is None and self._ended_meanwhile:
                log.info("ftgov: job %s: %s; no end-of-job summary", self.job_id, RESTARTED_WITHOUT)
            elif conn is None:
                log.warning("ftgov: job %s: ftgovd restarted or stopped while the job ran and has not taken it back; "
                            "no end-of-job summary; %s", self.job_id, PIN_LEFT)
        if conn is None:
            return
        if self.job_id is None and not self.seq_len_known:
            # Connected and never disabled, so still waiting for seq_len: a run shorter than the measurement.
            warn(f"ftgov: the job was never registered: it ended after {self._batches_seen} of the "
                 f"{self.measure_batches} batches it measures seq_len over before registering; pass seq_len= "
                 "(average non-padding tokens per sample) to register at once")
        try:
            if self.job_id is not None:
                if self.steps != self._reported_steps:
                    conn.notify("progress", job_id=self.job_id, steps=self.steps - self._steps_before,
                                phase=self._phase, **self._step_end())
                self.result = conn.call("unregister", job_id=self.job_id)
                log.info("ftgov: job %s ended: %s", self.job_id, describe_reply(self.result))
        except UnknownJob:
            log.info("ftgov: job %s had already ended (its process exited)", self.job_id)
        except FtgovError as e:
            # The job is over either way: closing the connection below ends it daemon-side.
            log.warning("ftgov: unregister of job %s failed (%s); closing the connection ends it", self.job_id, e)
        finally:
            conn.close()

    @_talks
    def _register(self, *, at_step: bool = False) -> None:
        if self.job_id is not None or self._conn is None or self._pid != os.getpid():
            # A forked child's copy (observe_batch in a DataLoader worker's collate_fn): the job is its parent's to
            # register, on the parent's connection; connecting again here would register a second one, the child's.
            return
        try:
            features = check_features(self.features)
        except ValueError as e:
            self._disable(str(e))
            return
        if self.gpu is None and not at_step and cuda_pending():
            # torch has not initialized CUDA yet, so which GPU this process will train on is not chosen (a torchrun
            # rank calls set_device after making its job, say): asking would initialize CUDA on device 0 and name it.
            # By the first step CUDA is up (or this process trains on none): the job registers there.
            log.info("ftgov: the job registers at its first step, once CUDA has chosen its GPU")
            return
        if self._conn.closed_by_daemon():
            if self._given_conn is not None:
                # The connection names the process the job is for; one made here again would name this one.
                self._conn.close()
                self._conn = None
                self._disable("ftgovd closed the connection before the job registered (restarted?)")
                return
            # Measuring seq_len took longer than the daemon keeps a connection that holds no job (or the daemon
            # restarted): nothing was sent on it yet, so connecting again cannot register the job twice.
            log.info("ftgov: ftgovd closed the connection while the job started; connecting again")
            self._conn.close()
            try:
                self._conn = Connection(self.socket, timeout_s=self.timeout_s)
            except DaemonUnavailable as e:
                self._conn = None
                self._disable(str(e))
                return
        if self.gpu is None:
            self.gpu = visible_gpu()  # the GPU this process trains on (CUDA_VISIBLE_DEVICES / torch), when known
        grouped = {} if self.group_info is None else {
            "group": self.group_info.key, "rank": self.group_info.rank, "world_size": self.group_info.world_size}
        try:
            self.registration = self._conn.call(
                "register", **features.model_dump(exclude_none=True), name=self.name, pid=self.pid, gpu=self.gpu,
                tune=self.tune, total_steps=self._daemon_total(), slurm_job_id=slurm_job_id(), **grouped)
        except DaemonUnavailable as e:
            self._disable(self._unanswered("register", e))
            return
        except FtgovError as e:
            self._disable(f"register refused: {e}")
            return
        self.job_id = self.registration.get("job_id")
        self._registrations += 1
        self._sent_total_steps = self.total_steps
        log.info("ftgov: job %s registered: %s", self.job_id, describe_reply(self.registration))
        if self.registration.get("gpu_cannot_pin"):
            # The job is governed (measured, held, ended as any job) but its clocks are the driver's: said once, as
            # a refusal would have been, so that nobody reads a run's energy as a tuned one's.
            warn(f"ftgov: job {self.job_id} runs as observe (measured at the clocks the driver chooses, never "
                 f"pinned or tuned): GPU {self.registration.get('gpu')} cannot be pinned: "
                 f"{self.registration['gpu_cannot_pin']}")
        info = self.group_info
        if self.tune and info is not None and (info.world_size or 0) > 1 and info.local_world_size is None:
            # Each node's daemon tunes a group once every rank registered with it; one whose ranks span nodes is
            # tuned by rank 0 here, which needs to know that it does (GroupInfo.spans_nodes).
            warn(f"ftgov: how many of group {info.key!r}'s {info.world_size} ranks run on this node is not known (no "
                 "LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, MPI or deepspeed local size in the environment): if they "
                 "span nodes, the run is not tuned; pass local_world_size= to Job or set LOCAL_WORLD_SIZE")
        if self.steps > self._steps_before:
            self._report()

    def _coordinate(self) -> None:
        """A rank of a tuned run across nodes: every rank takes part in rank 0's windows (governor.client.group),
        whatever its own daemon said, from the first step at which the job's process group is up."""
        if self.coordinator is None:
            dist = torch_distributed()
            if dist is None:
                return
            self.coordinator = GroupCoordinator(self, dist)
        self.coordinator.step(self.steps)

    def _unanswered(self, method: str, e: DaemonUnavailable) -> str:
        """Why a request got no answer, told apart from a refusal (the daemon's RpcError): a stopped or stuck daemon
        is not one that judged the job."""
        pin_left = "" if self.job_id is None else f"; {PIN_LEFT}"
        if isinstance(e.__cause__, TimeoutError):
            return (f"ftgovd did not answer {method} within timeout_s={self.timeout_s:g} s (stopped or stuck; it did "
                    f"not refuse the job): {e}{pin_left}")
        return f"ftgovd did not answer {method} (it did not refuse the job): {e}{pin_left}"

    @_talks
    def _report(self) -> None:
        if self._pid != os.getpid():
            return  # a forked child's copy: the job and its connection are its parent's, which reports its steps
        if self._conn is None or self.job_id is None:
            return  # given up, or closed, by another thread since this one's caller looked
        total = self.total_steps if self.total_steps != self._sent_total_steps else None
        compute = {}
        if self._compute_steps:
            compute = {"compute_s": self._compute_sum_s / self._compute_steps}
            self._compute_sum_s, self._compute_steps = 0.0, 0
        for attempt in range(2):
            try:
                # Dropped, not waited for, when the daemon has stopped reading: the next report says the same.
                if self._conn.notify("progress", drop_if_busy=True, job_id=self.job_id,
                                     steps=self.steps - self._steps_before, phase=self._phase,
                                     total_steps=None if total is None else self._daemon_total(),
                                     **self._step_end(), **compute):
                    self._reported_steps = self.steps
                    self._sent_total_steps = self.total_steps
                return
            except DaemonUnavailable as e:
                self._conn.close()
                self._conn = self._resumed() if attempt == 0 else None
                if self._conn is None and self._ended_meanwhile and self._register_again():
                    return
                if self._conn is None:
                    self._lost = True
                    self._disable(f"{e}; " + (RESTARTED_WITHOUT if self._ended_meanwhile else PIN_LEFT))
                    return

    def _resumed(self) -> Connection | None:
        """A new connection holding this job again, once a restarted daemon has re-adopted it; None when the daemon
        does not answer or holds no such job (it restored the clocks instead)."""
        if self.job_id is None or self._pid != os.getpid():
            return None
        try:
            conn = Connection(self.socket, timeout_s=self.timeout_s)
        except DaemonUnavailable:
            return None
        try:
            conn.call("resume", job_id=self.job_id)
        except FtgovError as e:
            # No such job there (UnknownJob): the restarted daemon ended it when its process exited (`ftgov run`'s
            # command), or did not take it back and restored the clocks (RESTARTED_WITHOUT).
            self._ended_meanwhile = isinstance(e, UnknownJob)
            log.info("ftgov: job %s not resumed: %s", self.job_id, e)
            conn.close()
            return None
        log.info("ftgov: job %s held again by the restarted ftgovd", self.job_id)
        return conn

    def _register_again(self) -> bool:
        """A restarted daemon holds no such job and restored the clocks (it lost the job's record: a crash within
        moments of its registration, a state file it set aside): register it again, as a new job counted from here, so
        that the rest of the training is governed. Only a job for this very process (whose process evidently lives:
        ``ftgov run``'s, for its command, may have ended), and a few times at most. True where this handled the loss
        (registered, or refused and disabled with its own warning)."""
        if (self._given_conn is not None or self.pid not in (None, os.getpid())
                or self._registrations >= MAX_REGISTRATIONS):
            return False
        try:
            conn = Connection(self.socket, timeout_s=self.timeout_s)
        except DaemonUnavailable:
            return False
        lost = self.job_id
        self._conn, self.job_id, self.registration, self._ended_meanwhile = conn, None, None, False
        self._steps_before, self._reported_steps, self._sent_total_steps = self.steps, self.steps, None
        self._register(at_step=True)
        if self.job_id is not None:
            warn(f"ftgov: ftgovd restarted without job {lost} (it restored the clocks): the job registered again, "
                 f"as job {self.job_id}, its steps counted from step {self.steps}: "
                 f"{describe_reply(self.registration or {})}")
        return True

    def _daemon_total(self) -> int | None:
        """The job's length as the daemon in force counts its steps (from the registration it holds)."""
        return None if self.total_steps is None else max(1, self.total_steps - self._steps_before)

    def _step_end(self) -> dict:
        """When the last step counted ended (CLOCK_MONOTONIC, the daemon's host): windows are timed by the steps, not
        by when their reports arrive."""
        return {} if self._step_end_s is None else {"step_end_s": self._step_end_s}

    def _defer_to_run(self, run_job: str) -> None:
        """Do nothing under `ftgov run`: two jobs on one process would pin the higher of their two levels, and the
        daemon would count the same energy twice."""
        self.disabled = True
        warn(f"ftgov: this process is governed by `ftgov run`'s job {run_job} ({RUN_JOB_ENV}), so this job does not "
             "register; drop one of the two (tune=True needs this job or callback without `ftgov run`, which sends "
             "no step reports)")

    @_talks
    def _disable(self, why: str) -> None:
        """Warn once and carry on without the governor."""
        if self.disabled:
            return
        self.disabled = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        warn(f"{WITHOUT_GOVERNOR}{why}")


def _check_total_steps(total_steps):
    if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                    or total_steps < 1):
        raise ValueError(f"total_steps must be a positive integer (the step count the job ends at), "
                         f"got {total_steps!r}")
    return total_steps


def describe_reply(reply: dict) -> str:
    """One line for a register/update/unregister answer: policy, frequency, duration, steps, energy, reason."""
    parts = []
    if reply.get("policy"):
        parts.append(str(reply["policy"]))
    if reply.get("freq_hz"):
        parts.append(f"{mhz(reply['freq_hz'])}")
    if reply.get("duration_s") is not None:
        parts.append(f"{reply['duration_s']:.1f} s")
    if reply.get("steps") is not None:
        parts.append(f"{reply['steps']} steps")
    if reply.get("energy_j") is not None:
        parts.append(f"{reply['energy_j']:.1f} J")
    if reply.get("saved_pct") is not None:
        parts.append(f"saved {figure(reply['saved_pct'], 'g')}% energy per step vs the default governor, measured over "
                     f"{reply.get('saved_measured_steps')} steps")
    elif reply.get("saving_unmeasured"):
        parts.append(f"no saving measured: {reply['saving_unmeasured']}")
    if reply.get("reason"):
        parts.append(f"({reply['reason']})")
    return " ".join(parts)


FEATURE_KEYS = ("model_type", "num_layers", "hidden_size", "seq_len", "gpu_util")


def job(model=None, *, model_type: str | None = None, num_layers: int | None = None, hidden_size: int | None = None,
        seq_len: float | None = None, gpu_util: float | None = None, **options) -> Job:
    """A job to hold for the life of a training run::

        with governor.job(model, name="bert-sst2") as job:
            for batch in loader:
                job.observe_batch(batch)   # measures seq_len from the first batches, then registers
                ...
                job.step()

    ``model`` is a Hugging Face model or config (its model_type, layers and hidden size are read); explicit numbers
    override it. ``options`` are `Job`'s keywords (name, socket, pid, gpu, tune, report_every_s, measure_batches,
    timeout_s, total_steps, group, rank, world_size, local_world_size): this signature is the one that governor.hf and
    governor.lightning forward whole. Bad feature values raise ValueError here, before training starts; a daemon that
    is absent or refuses only warns (GovernorWarning), and the job does nothing. In a run started by torchrun or srun
    each rank joins the run's job group (governor.client.group).
    """
    features = resolve_features(model, **_numbers(dict(model_type=model_type, num_layers=num_layers,
                                                       hidden_size=hidden_size, seq_len=seq_len, gpu_util=gpu_util)))
    return Job(features, **options)


def _check_name(name: str | None) -> None:
    """A name the daemon would refuse fails where it is given: at register, the job would run on unpinned."""
    problem = None if name is None else name_problem(name)
    if problem is not None:
        raise ValueError(f"name: {problem}")


def split_options(options: dict) -> tuple[dict, dict]:
    """``job()``'s keywords as (explicit features, `Job`'s options). A keyword neither takes is a TypeError here, as
    it would be in ``job()``; a bad feature value is a ValueError."""
    features = {k: options[k] for k in FEATURE_KEYS if k in options}
    rest = {k: v for k, v in options.items() if k not in FEATURE_KEYS}
    inspect.signature(Job).bind({}, **rest)
    _check_name(rest.get("name"))
    check_partial_features(features)
    return features, rest


def start_job(model=None, **options) -> Job:
    """For the framework adapters: ``job(model, **options).start()``, except that features which cannot be read
    from the model warn and give a no-op job, because a callback added with no arguments must never stop training."""
    features, rest = split_options(options)
    try:
        resolved = resolve_features(model, **_numbers(features))
    except ValueError as e:
        idle = Job({}, **rest)
        idle._disable(str(e))
        return idle
    return Job(resolved, **rest).start()


def _numbers(features: dict) -> dict:
    return {k: (float(v) if k in ("seq_len", "gpu_util") and v is not None else v) for k, v in features.items()}
