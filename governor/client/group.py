"""A job group from the client's side: which run a rank belongs to, and, for a run whose ranks span nodes, the tuner
that its rank 0 runs in the training process (docs/distributed.md, "Across nodes").

The group key comes from the launcher's environment: TORCHELASTIC_RUN_ID (torchrun), else SLURM_JOB_ID and
SLURM_STEP_ID (srun), else what the caller gives. The rank and world size come from RANK/WORLD_SIZE (torchrun), else
SLURM_PROCID/SLURM_NTASKS, else what the caller gives; LOCAL_WORLD_SIZE says how many ranks share this node.

Each node's ftgovd tunes a group whose ranks are all its own. One whose ranks span nodes is tuned here: at every
window's edges (and at its sub-windows' edges, SUB_WINDOWS) each rank reads its GPU's energy from its own daemon
(job_energy), rank 0 gathers every rank's (energy, steps, seconds, compute time, the window's own uncertainty) over the
job's own torch.distributed process group (one all_gather of seven floats a rank), runs the OnlineTuner on the summed
energy per step and the slowest step, and broadcasts the level, the next window's length and whether its reads
inside are collectives; each rank then asks its
own daemon for it (set_level). While the search runs, each read inside a window is a collective too (five floats a
rank, and rank 0's verdict), so that a window already clearly worse than the tuner's reference closes there, as a
single job's does (early_close).

The windows are sized as the daemon sizes a single job's (its tuner.window_rule, told in the register reply's
``window``): the ranks must edge at the same step counts, so rank 0 sizes each window in steps from the last one's
slowest step time and uncertainty (at least the rule's time and meter updates, long enough for its target if the
last one's scatter holds, at most its max_s), a window behind a rule that closes on its own uncertainty. The first
edge comes ``window_steps`` after the first step seen; the stretch to it is measured as a window, which rank 0 ends at
a read inside where the rule would have closed it (long steps: the start's window), else it times the steps for the
first window.
Against an older daemon (no ``window``), every window is ``window_steps``. Once the tuner converged, if every rank
tells its compute time (job.compute_done()), rank 0 trims the ranks that wait (governor.policy.trim) the same way,
broadcasting each rank's level. Every rank takes part in every collective whatever its
daemon says (one that refused or is absent sends "not measured"), so that the collectives never hang on us.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from governor.client.connection import DaemonUnavailable
from governor.errors import FtgovError
from governor.units import mhz

if TYPE_CHECKING:  # imported where used: a rank outside a run across nodes never loads the tuner
    from governor.policy.trim import Trimmer
    from governor.policy.tuner import OnlineTuner

log = logging.getLogger("governor.client")

# Steps discarded after each move (the step during which the clock changed), then steps measured: all ranks edge at
# the same step counts, which a synchronous run keeps in step.
GROUP_WARMUP_STEPS = 1
GROUP_WINDOW_STEPS = 8  # every window without a rule; with one, the least, and the steps timed before the first
# A window's reads of its rank's energy: its two edges and SUB_WINDOWS - 1 at equal step counts inside (each a call to
# the rank's own daemon, well under a ms), whose scatter tells the window's own uncertainty (rank_window_noise). On the
# H200's traces 8 read windows as short as 4 did for the same spread of successive windows (docs/benchmarks.md).
SUB_WINDOWS = 8
# At a train start (shared_run_key), how long rank 0 waits for every rank to say it holds a callback, and each other
# rank for rank 0's word (and, where rank 0 has not opened this start yet, for it to). The ranks reach the hook within
# moments of each other (DDP's wrap, the frameworks' barriers line them up), but rank 0 may come late: the Trainer runs
# its other callbacks' train begin first, and the main process's loggers (wandb.init) may take seconds there. A rank
# whose peers hold no callback loses this once.
ANNOUNCE_WAIT_S = 5.0
DECISION_WAIT_S = 30.0
# The group key of a rank whose job stands alone whatever its launcher says (its ranks did not agree on a group).
NO_GROUP = ""
# In the process group's store: how many train starts rank 0 has opened (shared_run_key). Start g agrees under
# ftgov/<g>/: its open, each other rank's announce (rank/<r>) and the word (group).
GENERATION_KEY = "ftgov/gen"


_UNREAD = object()


class CollectiveFailed(Exception):
    """A collective of the group's coordination failed (GroupCoordinator.step ends the coordination on it)."""


@dataclass(frozen=True)
class GroupInfo:
    key: str
    rank: int | None
    world_size: int | None
    local_world_size: int | None  # ranks on this node (LOCAL_WORLD_SIZE); None: not told

    @property
    def spans_nodes(self) -> bool:
        return (self.world_size is not None and self.local_world_size is not None
                and self.local_world_size < self.world_size)


def _window_rule(fields: Any):
    """The daemon's window rule from its register reply's ``window`` (Groups.window_rule); None: fixed-step windows
    (an older daemon, fixed-step windows configured, or a GPU with no energy source)."""
    if not isinstance(fields, dict):
        return None
    from governor.policy.windows import TuningError, WindowRule

    try:
        return WindowRule(**fields)
    except (TypeError, TuningError) as e:
        log.warning("ftgov: group windows: the daemon's window rule %r: %s; fixed-step windows", fields, e)
        return None


def rank_window_noise(reads: list[tuple[float, float, float]], rule, prior=None) -> tuple[float | None, Any]:
    """A rank's window's own relative uncertainty from its reads ``(steps, energy_j, time_s)``, edges included
    (governor.policy.windows.window_noise_rel, the steps' scatter pooled with ``prior``, that of its windows so far),
    None where it cannot tell; and the steps' scatter pooled with this window's, the next window's prior."""
    from governor.policy.windows import step_scatter, window_noise_rel

    noise = window_noise_rel(reads, rule, prior)
    scatter = step_scatter(reads)
    if scatter.dof > 0:
        prior = scatter.pooled(prior, math.inf)
    return (noise if math.isfinite(noise) and noise > 0 else None), prior


def read_steps(begin: int, steps: int) -> list[int]:
    """The step counts of a window's reads inside it (SUB_WINDOWS - 1, evenly spaced), for one opened at ``begin``
    that measures ``steps``."""
    return sorted({begin + round(k * steps / SUB_WINDOWS) for k in range(1, SUB_WINDOWS)} - {begin, begin + steps})


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def _slurm_tasks_per_node(env: Mapping[str, str]) -> int | None:
    """The ranks on one of an srun step's nodes, from SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), which
    srun sets whether or not --ntasks-per-node was given: "2(x3),1" is 2 on each of three nodes, then 1. This node's
    entry (SLURM_NODEID) where the list says it, else the first: any entry of a list of several nodes is under the
    step's ranks, which is what tells a run across nodes."""
    value = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not value:
        return None
    counts: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x([1-9]\d*)\))?\s*", part)
        if m is None:
            return None
        counts += [int(m[1])] * int(m[2] or 1)
    node = _int(env, "SLURM_NODEID")
    return counts[node] if node is not None and node < len(counts) else counts[0]


# Where launchers say how many of a run's ranks share this node: torchrun, Open MPI's mpirun, MPICH's and Intel MPI's
# (Hydra), deepspeed's launcher (on each node of its pdsh runner, and its MPICH and Intel MPI runners), srun with
# --ntasks-per-node; then srun's per-node task list. A launcher's own before Slurm's: mpirun or deepspeed inside an
# allocation inherits the batch step's SLURM_* variables, which describe the allocation, not its ranks.
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE")


def group_from_env(group: str | None = None, rank: int | None = None, world_size: int | None = None,
                   env: Mapping[str, str] | None = None, local_world_size: int | None = None) -> GroupInfo | None:
    """The rank's group: what the caller gives wins over the launcher's environment; None outside any group, or where
    ``group`` is NO_GROUP."""
    if group == NO_GROUP:
        return None
    env = os.environ if env is None else env
    key = group
    if key is None and env.get("TORCHELASTIC_RUN_ID"):
        key = f"torchrun-{env['TORCHELASTIC_RUN_ID']}"
    if key is None and env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID"):
        key = f"slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    if key is None:
        return None
    if local_world_size is None:
        local_world_size = _int(env, *LOCAL_SIZE_VARS)
    if local_world_size is None and env.get("SLURM_STEP_ID"):
        local_world_size = _slurm_tasks_per_node(env)
    return GroupInfo(key, rank if rank is not None else _int(env, "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                                             "SLURM_PROCID"),
                     world_size if world_size is not None else _int(env, "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                                                    "PMI_SIZE", "SLURM_NTASKS"),
                     local_world_size)


def shared_run_key(prefix: str, own: str | None) -> str | None:
    """The run's group key, agreed by every rank of the process group up now at its train start: ``own`` (the caller's
    or the launcher's) where this rank has one, else rank 0's: its own, or one it makes for a launcher that sets none
    (Lightning's own DDP launchers, deepspeed's). NO_GROUP where not every rank took part in time (a callback on rank 0
    only): this rank's job stands alone. ``own`` without a process group of several ranks, or without a store to agree
    over (None if it has none).

    Agreed through the process group's store, never a collective: a collective that only the ranks holding a callback
    reach waits for good in the others' next one (DDP's all-reduce). Rank 0 numbers its train starts in the store
    (GENERATION_KEY) and opens each (``ftgov/<g>/open``); every other rank joins the start rank 0 is at (opened, no word
    yet), else waits up to DECISION_WAIT_S for rank 0 to open its next one, and says it is there. Rank 0 waits
    ANNOUNCE_WAIT_S for every rank, the others DECISION_WAIT_S for its word, and the first word set (compare_set) is
    every rank's: rank 0's key, or "none" from rank 0 (a rank missing) or from a rank that waited in vain. A rank whose
    wait for an opening ends in vain goes alone having said nothing, so that no start counts it. The starts are rank
    0's, not each process's own count: a start that one rank ran and the others did not (a Trainer with the callback on
    rank 0 only, then one with it on every rank: a notebook's cells) leaves the next ones agreeing. The price: a rank
    more than ANNOUNCE_WAIT_S late to a start that rank 0 has decided "none" without it waits DECISION_WAIT_S for a
    next opening before it goes alone (a rank reaches its train start with the others', after DDP's own collectives)."""
    dist = torch_distributed()
    if dist is None or dist.get_world_size() < 2:
        return own
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        store = dist.distributed_c10d._get_default_store()  # private: torch offers no public handle on it
    except Exception as e:  # noqa: BLE001 - gone or changed in some torch: the ranks cannot agree
        log.info("ftgov: no torch.distributed store to agree on a group key over (%s)", e)
        return own
    try:
        if rank == 0:
            start = store.add(GENERATION_KEY, 1)
            store.set(f"ftgov/{start}/open", "1")
            try:
                store.wait([f"ftgov/{start}/rank/{r}" for r in range(1, world_size)],
                           timedelta(seconds=ANNOUNCE_WAIT_S))
                word = "key:" + (own or f"{prefix}-{uuid.uuid4().hex[:12]}")
            except Exception:  # noqa: BLE001 - timed out (DistStoreError), or failed: every rank still reaches compare_set
                word = "none"
        else:
            joined = _start_to_join(store)
            if joined is None:
                return NO_GROUP  # said nothing: no start of rank 0's counts this rank
            start = joined
            store.set(f"ftgov/{start}/rank/{rank}", "1")
            try:
                store.wait([f"ftgov/{start}/group"], timedelta(seconds=DECISION_WAIT_S))
            except Exception:  # noqa: BLE001 - as rank 0's: a rank that skipped compare_set could stand alone in a group
                pass  # "none", unless rank 0's word comes first
            word = "none"
        agreed = store.compare_set(f"ftgov/{start}/group", "", word).decode()
    except Exception as e:  # noqa: BLE001 - the store failed: no group rather than a stopped training
        log.info("ftgov: agreeing on a group key over torch.distributed's store failed: %s", e)
        return NO_GROUP
    if not agreed.startswith("key:"):
        return NO_GROUP
    return own or agreed[len("key:"):]


def _start_to_join(store) -> int | None:
    """A rank other than 0: the train start of rank 0's that this one is (shared_run_key), None where rank 0 opened
    none in time. The one rank 0 is at where it has no word yet; else (none opened yet, or rank 0's last was decided:
    this rank is early, or that one went without it) rank 0's next, once opened. Rank 0 deciding its last and opening
    the next between the two reads here leaves the next: the one this rank is early for."""
    start = store.add(GENERATION_KEY, 0)
    if start >= 1 and not store.check([f"ftgov/{start}/group"]):
        return start
    opened = f"ftgov/{start + 1}/open"
    try:
        store.wait([opened], timedelta(seconds=DECISION_WAIT_S))
    except Exception:  # noqa: BLE001 - timed out, or failed: whether it opened meanwhile decides
        pass
    return start + 1 if store.check([opened]) else None


def torch_distributed():
    """torch.distributed when a process group is up, else None. Looked up, never imported: a process whose group is
    up has imported it, and one without torch pays no import attempt at every step."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


class GroupCoordinator:
    """The cross-node tuning of one rank (``job``: its governor.client.Job). ``step(steps)`` at every training step,
    on every rank; nothing else. ``dist`` is torch.distributed with the job's process group up.

    Counted for the benchmarks: ``bytes_sent`` (this rank's part of each collective), ``coord_s`` (time spent in the
    windows' edges here), ``window_costs_s`` (that time per window: its opening edge and its closing one) and
    ``windows`` (those rank 0's tuner observed)."""

    def __init__(self, job, dist, *, warmup_steps: int = GROUP_WARMUP_STEPS, window_steps: int = GROUP_WINDOW_STEPS,
                 clock: Callable[[], float] = time.monotonic):
        import torch

        from governor.policy.trim import Trimmer
        from governor.policy.tuner import OnlineTuner

        self._new_tuner, self._new_trimmer = OnlineTuner, Trimmer
        self._clock = clock  # this host's CLOCK_MONOTONIC, the daemon's reads' at_s (a simulated rank's own)
        self.job, self.dist, self.torch = job, dist, torch
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.warmup_steps, self.window_steps = warmup_steps, window_steps
        self._rule: Any = _UNREAD  # the daemon's window rule, read from the register reply once there is one
        self.next_window_steps = window_steps  # the open (or next) window's length, as rank 0 broadcast it
        self.steps = 0  # the job's steps, as step() was last told them
        # NCCL moves only device tensors; gloo (and the rest) host ones.
        self.device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
                       else torch.device("cpu"))
        self.tuner: OnlineTuner | None = None
        self.trimmer: Trimmer | None = None  # rank 0, after convergence, when every rank tells its compute time
        self.trimming = False  # every rank: rank 0 trims (its broadcasts after convergence go on)
        self.level_hz: int | None = None  # the group's level (rank 0's table)
        self.own_hz: int | None = (job.registration or {}).get("freq_hz")  # what this rank's GPU was last given
        self._given_hz: int | None = None  # the level last given to this rank (_apply): the group's, or its trimmed one
        self._job_id = job.job_id  # the registration the figures above follow (_registered)
        self.done = False
        self.status = "starting"
        self._edge: int | None = None  # the step count of the next edge
        self._opening = False  # the next edge opens a window (after the warm-up) rather than closing one
        # (energy_j, time_s, steps, compute_total_s, compute_steps_total) where the window opened
        self._mark: tuple[float, float, int, float, int] | None = None
        # The job's connection when the window opened: another (its daemon restarted; Job._resumed, _register_again)
        # reads another meter, counted from its own start.
        self._source: object = None
        self._reads: list[tuple[float, float, float]] = []  # (steps, energy_j, at_s) in the open window, with a rule
        self._sub_edges: list[int] = []  # the step counts of the open window's reads still to come
        # Every rank: whether the open window may close early at its reads inside (the search runs, with a rule); then
        # each read inside is also a collective (early_close), as a single job's window closes at any report.
        self._may_close = False
        # Every rank: a stretch out of training (left_training, back_to_training) inside the open window. One shorter
        # than SHORT_PHASE_S is training; a longer one is cut out of the window: its energy and seconds (_cut), from
        # its start (read then, or estimated from the window's reads) to a read as training comes back. Where that
        # cannot be done the window is measured again (_left).
        # (when the job left training, self._clock; its steps then; the energy read then, where one was)
        self._away: tuple[float, int, tuple[float, float] | None] | None = None
        self._cut = (0.0, 0.0)  # (energy_j, seconds) cut out of the open window so far
        self._left = False
        self._step_prior = None  # the steps' scatter over this rank's windows so far (rank_window_noise)
        self._stretch = False  # the open window is the stretch before the first edge
        self.bytes_sent = 0
        self.coord_s = 0.0
        self.window_costs_s: list[float] = []
        self._open_cost_s = 0.0
        self.windows = 0
        self.closed_early = 0  # windows closed at a read inside (early_close)
        self.last_window: dict[str, Any] | None = None  # rank 0: the last window its tuner observed
        self._told_steps: int | None = None  # rank 0: its job's length as its tuner was last told it

    @property
    def rule(self):
        """The window rule this rank's daemon told (the register reply's ``window``); None: fixed-step windows, or
        no reply yet. Read once the reply is there: a job that measures its seq_len from its first batches registers
        after the coordination began (its first step seen), and would otherwise never size its windows. Each rank's
        reads follow its own; only rank 0's decides what the ranks do together (the broadcasts)."""
        if self._rule is _UNREAD:
            if self.job.registration is None:
                return None
            self._rule = _window_rule(self.job.registration.get("window"))
        return self._rule

    # ---- the daemon ---------------------------------------------------------------------------------------------
    def _call(self, method: str, **params) -> dict | None:
        with self.job._talking:  # a thread of the user's may talk to the daemon on the job's connection meanwhile
            return self._call_now(method, **params)

    def _call_now(self, method: str, **params) -> dict | None:
        conn = self.job._conn
        if conn is None or self.job.job_id is None or self.job.disabled:
            return None
        try:
            return conn.call(method, job_id=self.job.job_id, **params)
        except DaemonUnavailable as e:  # no answer: not the daemon's judgement of the request
            # A daemon restarting: the job's next report finds it again (or gives the governor up, which this rank
            # says at the next edge: not able). The open window, which this read belonged to, is measured again.
            log.warning("ftgov: group %s: %s got no answer: %s", self.rank, method, e)
            self._left = True
            return None
        except FtgovError as e:
            log.warning("ftgov: group %s: %s refused: %s", self.rank, method, e)
            return None

    def _energy_j(self) -> tuple[float, float] | None:
        """This rank's GPU's energy so far and when its daemon read it (CLOCK_MONOTONIC, this host's)."""
        reply = self._call("job_energy")
        if self.job._conn is not self._source:
            self._left = True  # read from another meter than the window's first read: the window is measured again
        if reply is None or reply.get("energy_j") is None:
            return None
        return float(reply["energy_j"]), float(reply.get("at_s", self._clock()))

    def _own_level(self, level_hz: int) -> int | None:
        """The level of this rank's GPU for the group's level: the highest not above it (tables should be equal)."""
        levels = sorted((self.job.registration or {}).get("levels_hz") or [])
        if not levels:
            return None
        below = [hz for hz in levels if hz <= level_hz]
        return below[-1] if below else levels[0]

    # ---- the edges -----------------------------------------------------------------------------------------------
    def step(self, steps: int) -> None:
        self.steps = steps
        if self.job.job_id != self._job_id:
            self._registered()
        if self.done:
            return
        try:
            self._step(steps)
        except CollectiveFailed as e:
            # A rank gone (its process killed, its node down) or the process group's timeout: the run's own next
            # collective fails the same way, and says so in the training's words; the coordination ends here and the
            # GPU stays at its level until the job ends (its daemon restores it then).
            self.done, self.status = True, f"stopped: a collective failed: {e}"
            log.warning("ftgov: group tuning %s", self.status)

    # The collectives, and the host copies of what they brought, where an asynchronous backend's (NCCL's) error may
    # surface instead: torch.distributed's errors (DistBackendError and the rest) are RuntimeErrors.
    def _all_gather(self, mine) -> list[list[float]]:
        gathered = [self.torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            self.dist.all_gather(gathered, mine)
            return [t.tolist() for t in gathered] if self.rank == 0 else []
        except RuntimeError as e:
            raise CollectiveFailed(str(e)) from e

    def _broadcast(self, tensor) -> list[float]:
        try:
            self.dist.broadcast(tensor, src=0)
            return tensor.tolist()
        except RuntimeError as e:
            raise CollectiveFailed(str(e)) from e

    def _step(self, steps: int) -> None:
        if self._away is not None:  # a step without Job.phase("train") first: training came back by now
            self.back_to_training()
        if self._edge is None:
            # The first step every rank sees. The first edge (the start decided, the next window's length told) comes
            # window_steps later on every rank alike, whatever its daemon's rule: the ranks' daemons may differ (one
            # older, or sizing windows in fixed steps), and an edge some ranks reach at another step would hang the
            # collectives. The stretch to it is measured as a window: where it already is one by the rule (long
            # steps), the tuner takes it as the start's; else it times the steps, and rank 0 sizes the first window
            # by it (a first window of window_steps steps, at 10-40% noise on a 100 ms counter, would leave the
            # tuner unable to call any level clearly below the start: it keeps the start then).
            began = time.perf_counter()
            # Its reads inside are collectives on every rank (whatever its daemon's rule: the same collectives
            # everywhere), at which rank 0 ends the stretch where it already is a window.
            self._stretch = self._may_close = True
            self._open(steps, self.window_steps)
            self.coord_s += time.perf_counter() - began
        if steps < self._edge:
            if not self._sub_edges or steps < self._sub_edges[0]:
                return
            began = time.perf_counter()
            self._sub_read(steps)
            if not (self._may_close and self._early_close(steps)):
                cost_s = time.perf_counter() - began
                self._open_cost_s += cost_s  # the window's cost: its edges and the reads inside
                self.coord_s += cost_s
                return
            self.closed_early += 1  # the window closes here, as at its edge
        elif self._opening:
            began = time.perf_counter()
            self._open(steps, self.next_window_steps)
            self._opening = False
            self._open_cost_s += time.perf_counter() - began
            self.coord_s += time.perf_counter() - began
            return
        else:
            began = time.perf_counter()
        self._close_and_decide(steps)
        self.window_costs_s.append(self._open_cost_s + time.perf_counter() - began)
        self._open_cost_s = 0.0
        self.coord_s += time.perf_counter() - began

    def _registered(self) -> None:
        """The job registered, or registered again (Job._register_again: its daemon restarted without it): the new
        job's GPU is at what that daemon decided, its energy on a new meter, its window rule that daemon's. The GPU
        goes back to the level last given to this rank (the coordination may be done: nothing else would move it);
        the open window is measured again."""
        self._job_id = self.job.job_id
        self.own_hz = (self.job.registration or {}).get("freq_hz")
        self._rule = _UNREAD
        if self._mark is not None:
            self._left = True
        if self._given_hz is not None:
            self._apply(self._given_hz)

    def _open(self, steps: int, n: int) -> None:
        """A window opens at ``steps``, to measure ``n`` steps: its first read, and where its reads inside fall."""
        self._left, self._away, self._cut = False, None, (0.0, 0.0)  # a time out before the window: none of its
        self._source = self.job._conn
        read = self._energy_j()  # one that got no answer leaves the window to be measured again (_left)
        # Times are the daemon's reads' own (at_s: this host's CLOCK_MONOTONIC), as the energy is.
        self._mark = None if read is None else (read[0], read[1], steps, self.job.compute_total_s,
                                                self.job.compute_steps_total)
        self._reads = [] if read is None or self.rule is None else [(steps, read[0], read[1])]
        # Every rank reads at the same steps whether its own reads work or not (or its daemon sent no rule): the
        # reads inside may be collectives.
        self._sub_edges = read_steps(steps, n) if self.rule is not None or self._may_close else []
        self._edge = steps + n

    def left_training(self) -> None:
        """The job left training (Job.phase: an evaluation, a checkpoint, a batch's loading). Whether the stretch is
        training (short) or cut out of the window (long) is known only as it ends (back_to_training): where the window
        can estimate its energy at this instant then (a read of training since its mark), only the instant is kept;
        else the energy is read now, as the one edge that a long stretch's cut needs (one call, not two: the stretch's
        end is read only if it was long)."""
        if self._mark is None or self._away is not None or self._left:
            return
        start = None
        if not self._estimable():
            start = self._energy_j()
            if start is None:
                self._left = True  # the read failed: nothing to cut a long stretch from
        self._away = (self._clock(), self.steps, start)

    def _estimable(self) -> bool:
        """Whether the open window has read training since its mark (the power it carries on: back_to_training)."""
        return self._mark is not None and bool(self._reads) and self._reads[-1][2] > self._mark[1]

    def back_to_training(self) -> None:
        """Training goes on (Job.phase("train"), or the next step): the stretch out of training ends here.

        One shorter than SHORT_PHASE_S (governor.policy.windows, the daemon's rule for its own windows:
        governor.daemon.phases) is training: nothing is read, and its energy and seconds stay in the window. A loop
        that reports `data` around every batch's loading thus pays no call to its daemon for it where its windows
        read inside (time windows, past their first read), one where they do not, and its windows measure its steps
        with their data loading, as the same loop's without phase reports would.

        A longer one (an evaluation, a checkpoint save) is cut out of the window, as the daemon's windows cut it
        (ProbeWindow): the energy is read now, and the energy at the stretch's start is the read made then
        (left_training), or, where none was, estimated from the window's own reads: its mean power from its mark to
        its last read, carried on from that read to the instant the job left training (the training steps between,
        at most a sub-window's). The error is the scatter of those few steps' power about the window's mean, not the
        stretch's energy. Where a step was counted inside the stretch, or a read fails, the window is spoilt: this
        rank says so at its end, and rank 0 measures it again at the same level."""
        if self._away is None:
            return
        from governor.policy.windows import SHORT_PHASE_S

        (left_s, left_steps, start), self._away = self._away, None
        if self._clock() - left_s < SHORT_PHASE_S or self._mark is None or self._left:
            return
        if self.steps != left_steps:
            self._left = True
            return
        read = self._energy_j()
        if read is None:
            self._left = True
            return
        cut_j, cut_s = self._cut
        if start is not None:  # read as the job left training: the stretch's own energy and seconds
            self._cut = (cut_j + read[0] - start[0], cut_s + read[1] - start[1])
            return
        e0, t0 = self._mark[0], self._mark[1]
        _n, last_j, last_s = self._reads[-1]  # the window's own energy and time (the stretches before cut out)
        left_s = max(last_s, left_s - cut_s)
        # The window's energy as the job left training: its mean power so far, carried on from its last read; never
        # more than the window holds now.
        start_j = min(last_j + (last_j - e0) / (last_s - t0) * (left_s - last_s), read[0] - cut_j)
        self._cut = (read[0] - start_j, read[1] - left_s)

    def _window_read(self) -> tuple[float, float] | None:
        """This rank's energy and time now, as the open window counts them (the pauses cut out)."""
        read = self._energy_j()
        return None if read is None else (read[0] - self._cut[0], read[1] - self._cut[1])

    def _sub_read(self, steps: int) -> None:
        """A read inside the open window (a sub-window's edge); one that fails leaves the window with fewer."""
        while self._sub_edges and steps >= self._sub_edges[0]:
            self._sub_edges.pop(0)
        read = self._window_read() if self._reads else None
        if read is not None and read[0] >= self._reads[-1][1] and steps > self._reads[-1][0]:
            self._reads.append((steps, read[0], read[1]))

    def _early_close(self, steps: int) -> bool:
        """Every rank, at a read inside a window of the search: whether the group's window closes here. Each rank
        sends what its window read so far ([measured, energy_j, steps, seconds, noise_rel], one all_gather of five
        floats); rank 0 sums them as a closing edge would and closes the window where the sum already differs from
        the tuner's reference for it (WindowRule.may_decide and differs: the single job's early close, at decide_z,
        explore_z above an exploring reference), and broadcasts that. A window at a level far from the bottom thus
        costs its steps there only until it is clearly worse, as on one node (docs/distributed.md)."""
        torch = self.torch
        mine = torch.tensor(self._so_far(), dtype=torch.float64, device=self.device)
        so_far = self._all_gather(mine)
        self.bytes_sent += mine.numel() * mine.element_size()
        close = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            close[0] = float(self._is_window(so_far) if self._stretch else self._differs(so_far))
        (verdict,) = self._broadcast(close)
        if self.rank == 0:
            self.bytes_sent += close.numel() * close.element_size()
        return bool(verdict)

    def _so_far(self) -> list[float]:
        """This rank's window so far, from its reads: [measured, energy_j, steps, seconds, noise_rel (-1: unknown)]."""
        if len(self._reads) < 2 or self._left:
            return [0.0, 0.0, 0.0, 0.0, -1.0]
        from governor.policy.windows import window_noise_rel

        (n0, e0, t0), (n1, e1, t1) = self._reads[0], self._reads[-1]
        noise = window_noise_rel(self._reads, self.rule, self._step_prior)
        noise = noise if math.isfinite(noise) and noise > 0 else -1.0
        return [1.0, e1 - e0, n1 - n0, t1 - t0, noise]

    @staticmethod
    def _summed(so_far: list[list[float]]) -> tuple[float, float | None, float, float] | None:
        """The ranks' windows so far ([measured, energy_j, steps, seconds, noise_rel], _so_far) as one: the summed
        J/step, its relative uncertainty (None where a rank's is unknown), the fewest steps and the longest time; None
        where a rank has measured nothing."""
        if not all(measured > 0 and n > 0 and t > 0 for measured, _e, n, t, _u in so_far):
            return None
        from governor.policy.windows import summed_noise_rel

        per_rank = [e / n for _m, e, n, _t, _u in so_far]
        noise = summed_noise_rel([(j, w[4] if w[4] > 0 else None) for j, w in zip(per_rank, so_far, strict=True)])
        return sum(per_rank), noise, min(w[2] for w in so_far), max(w[3] for w in so_far)

    def _differs(self, so_far: list[list[float]]) -> bool:
        """Rank 0: whether the ranks' windows so far, summed, already differ from the tuner's reference."""
        summed = self._summed(so_far)
        if (self.tuner is None or self.tuner.converged or self.level_hz is None or self.rule is None
                or summed is None or summed[1] is None):
            return False
        reference = self.tuner.window_reference(self.level_hz)
        if reference is None:
            return False
        joules_per_step, noise, steps, seconds = summed
        return (joules_per_step > 0 and self.rule.may_decide(steps, seconds)
                and self.rule.differs(joules_per_step, noise, reference))

    def _measured(self, steps: int) -> list[float]:
        """This rank's part of an edge: [able, measured, energy_j, steps, seconds, compute_s, noise_rel]. able: its
        daemon holds its job in the group (0: absent or refused); measured: it has a window (at the first edge, the
        stretch since the first step; none after a refused read; -1: one whose time out of training could not be cut
        out); compute_s: its mean compute time per step in the window (job.compute_done()), -1: not told;
        noise_rel: the window's own relative uncertainty (window_noise_rel), -1: unknown (no rule)."""
        if self.job.registration is None and not self.job.disabled:
            return [-1.0, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0]  # not registered yet (its seq_len still measured)
        able = float(self.job.job_id is not None and not self.job.disabled
                     and bool((self.job.registration or {}).get("levels_hz")))
        none = [able, 0.0, 0.0, 0.0, 0.0, -1.0, -1.0]
        # measured -1: a time out it could not cut out, or a daemon that did not answer or restarted in the window
        again = [able, -1.0, 0.0, 0.0, 0.0, -1.0, -1.0]
        if not able:
            return none
        if self._left:
            return again
        if self._mark is None:
            return none
        read = self._window_read()
        e0, t0, n0, c0, cn0 = self._mark
        if self._left:
            return again
        if read is None or steps <= n0:
            return none
        counted = self.job.compute_steps_total - cn0
        compute = (self.job.compute_total_s - c0) / counted if counted > 0 else -1.0
        noise: float | None = None
        reads = [r for r in self._reads if r[0] < steps]  # a window closed early ends at its last read inside
        if self.rule is not None and reads and read[0] >= reads[-1][1]:
            noise, prior = rank_window_noise([*reads, (steps, read[0], read[1])], self.rule, self._step_prior)
            # The steps' scatter of the stretch before the first edge (the loop's first steps, which a real one
            # spends warming up) stays out of the later windows' prior, as when it only timed the steps.
            self._step_prior = self._step_prior if self._stretch else prior
        noise = -1.0 if noise is None else noise
        return [able, 1.0, read[0] - e0, float(steps - n0), read[1] - t0, compute, noise]

    def _close_and_decide(self, steps: int) -> None:
        torch = self.torch
        mine = torch.tensor(self._measured(steps), dtype=torch.float64, device=self.device)
        self._stretch = False
        gathered = self._all_gather(mine)
        self.bytes_sent += mine.numel() * mine.element_size()
        # converged, stop, done, the next window's steps, whether its reads inside are collectives, each rank's level
        decision = torch.zeros(5 + self.world_size, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            flags = self._decide(gathered)
            # Rank 0's rule alone says whether the next window may close early: the ranks' daemons may differ (one
            # older, or configured for fixed-step windows), and a collective that some ranks skip would hang them.
            flags.insert(4, float(self.rule is not None and not flags[0]))
            decision[:] = torch.tensor(flags, dtype=torch.float64)
        decided = self._broadcast(decision)
        if self.rank == 0:
            self.bytes_sent += decision.numel() * decision.element_size()
        converged, stop, done, window_steps, may_close, *levels = decided
        self._mark, self._reads, self._sub_edges = None, [], []
        self._left, self._away, self._cut = False, None, (0.0, 0.0)
        self._may_close = bool(may_close)
        self.next_window_steps = max(1, int(window_steps))
        if stop:
            self.done, self.status = True, "stopped: a rank has no measurement (its daemon absent or refusing)"
            log.warning("ftgov: group tuning %s", self.status)
            return
        if self.rank != 0 and max(levels) > 0:
            self.level_hz = int(max(levels))  # the group's: the slowest rank is never trimmed below it
        if levels[self.rank] > 0:  # 0: no level yet (the start waits for a rank to register)
            self._apply(int(levels[self.rank]))
        if converged and not done:
            self.status, self.trimming = "converged; trimming the ranks that wait", True
        elif not converged:
            self.status = f"searching: the group at {mhz(int(max(levels)))}"
        if done:
            self.done = True
            self.status = (f"converged on {mhz(int(max(levels)))}"
                           + ("; trimmed" if self.trimming else ""))
            if self.rank == 0:  # the windows are rank 0's to count
                log.info("ftgov: group tuning %s after %d windows", self.status, self.windows)
            else:
                log.info("ftgov: group tuning %s", self.status)
            return
        self._opening, self._edge = True, steps + self.warmup_steps

    def _decide(self, windows: list[list[float]]) -> list[float]:
        """Rank 0: the group's window into the tuner (or, once it converged, the trim), and what comes next:
        [converged, stop, done, the next window's steps] and each rank's level (_close_and_decide adds whether the
        next window's reads inside are collectives)."""
        n = self.world_size
        stop = [0.0, 1.0, 0.0, float(self.window_steps)] + [0.0] * n
        if self.tuner is None and any(able < 0 for able, *_ in windows) and all(able for able, *_ in windows):
            # A rank not registered yet (a job measuring its seq_len from its first batches): the start waits
            # another window_steps, every GPU where it is (level 0: unchanged).
            return [0.0, 0.0, 0.0, float(self.window_steps)] + [0.0] * n
        if not all(able > 0 for able, *_ in windows):
            return stop
        if self.tuner is None:
            start = (self.job.registration or {}).get("freq_hz")
            levels = (self.job.registration or {}).get("levels_hz") or []
            start_hz = start if start in levels else max(levels)
            self.tuner = self._new_tuner(levels, start_hz, probe_steps=self.warmup_steps + self.window_steps)
            self._tell_length()
            self.level_hz = start_hz
            timed = [w for w in windows if w[1] > 0 and w[3] > 0 and w[4] > 0]
            if len(timed) < n or not self._is_window([[w[1], w[2], w[3], w[4], w[6]] for w in timed]):
                # The stretch timed the steps: the first window is the rule's shortest at their pace (the slowest
                # rank's), whose scatter then sizes the next.
                first = (self.window_steps if not timed
                         else self.sized_steps(max(w[4] / w[3] for w in timed), self.window_steps, None))
                return [0.0, 0.0, 0.0, float(first)] + [float(start_hz)] * n
        if any(ok < 0 for _able, ok, *_ in windows):
            # A window that ran across an evaluation (a checkpoint) on some rank: not the level's steps alone. The
            # same window again, at the same levels.
            levels = ([self.trimmer.level_of(r) for r in range(n)] if self.trimmer is not None
                      else [self.level_hz] * n)
            return ([float(self.trimmer is not None or self.tuner.converged), 0.0, 0.0, float(self.next_window_steps)]
                    + [float(hz) for hz in levels])
        if not all(ok for _able, ok, *_ in windows) or any(w[3] <= 0 or w[4] <= 0 for w in windows):
            return stop
        seconds_per_step = max(w[4] / w[3] for w in windows)
        steps = int(min(w[3] for w in windows))
        self.windows += 1
        if self.trimmer is not None:
            self.trimmer.observe(seconds_per_step, {r: w[5] for r, w in enumerate(windows)})
            return ([1.0, 0.0, float(self.trimmer.done), float(self.next_window_steps)]
                    + [float(self.trimmer.level_of(r)) for r in range(n)])
        per_rank = [w[2] / w[3] for w in windows]
        joules_per_step = sum(per_rank)
        assert self.level_hz is not None, "a window was measured at a level"
        if not (math.isfinite(joules_per_step) and joules_per_step > 0):
            return stop
        from governor.policy.windows import summed_noise_rel

        noise = summed_noise_rel([(j, w[6] if w[6] > 0 else None) for j, w in zip(per_rank, windows, strict=True)])
        told = self.job.total_steps
        # The steps the run has left, when its length is known, as the daemon's tuners are told them: the windows'
        # steps alone undercount them.
        self.tuner.observe(self.level_hz, joules_per_step, seconds_per_step, noise_rel=noise,
                           steps_left=None if told is None else max(0, told - self.steps))
        self._tell_length()
        self.last_window = {"level_hz": self.level_hz, "joules_per_step": joules_per_step,
                            "seconds_per_step": seconds_per_step, "steps": steps,
                            "seconds": max(w[4] for w in windows), "noise_rel": noise}
        nxt = self.sized_steps(seconds_per_step, steps, noise)
        self.tuner.set_job(probe_steps=self.warmup_steps + nxt)
        self.level_hz = self.tuner.next_level_hz()
        converged = self.tuner.converged
        if converged and all(w[5] >= 0 for w in windows):
            # Every rank says how long its compute takes: trim the ranks that wait, the next window at the group's
            # level being the trim's reference.
            self.trimmer = self._new_trimmer(self.tuner.levels_hz, self.level_hz, list(range(n)))
            return [1.0, 0.0, 0.0, float(nxt)] + [float(self.level_hz)] * n
        return [float(converged), 0.0, float(converged), float(nxt)] + [float(self.level_hz)] * n

    def _tell_length(self) -> None:
        """Rank 0: its job's length (rank 0's is the group's: the ranks of one run tell the same), once told or changed
        (Job.set_total_steps, a callback's next run in one process), to its tuner while it searches: re-priced over
        the steps left, as the daemon's tuners are; a search it ends has converged at the next level asked for."""
        told = self.job.total_steps
        if self.tuner is None or told is None or told == self._told_steps:
            return
        self._told_steps = told
        if not self.tuner.converged:
            self.tuner.set_steps_left(max(0, told - self.steps))

    def _is_window(self, so_far: list[list[float]]) -> bool:
        """Rank 0: whether the stretch before the first edge, as the ranks measured it so far ([measured, energy_j,
        steps, seconds, noise_rel], _so_far), is a window the daemon's rule would have closed by then
        (WindowRule.closes; an unknown uncertainty only at the cap). Long steps: a few of them."""
        summed = self._summed(so_far)
        if self.rule is None or summed is None:
            return False
        _j, noise, steps, seconds = summed
        return self.rule.closes(steps, seconds, math.inf if noise is None else noise)

    def sized_steps(self, seconds_per_step: float, steps: int, noise_rel: float | None) -> int:
        """The next window's steps, from the last one's (``steps`` at ``seconds_per_step``, the slowest rank's, with
        the sum's relative uncertainty ``noise_rel``): the daemon's rule a window behind (WindowRule.next_steps),
        never under ``window_steps``; without a rule, ``window_steps``."""
        if self.rule is None:
            return self.window_steps
        return self.rule.next_steps(seconds_per_step, steps, noise_rel, least=self.window_steps)

    def _apply(self, level_hz: int) -> None:
        """This rank's GPU to ``level_hz`` (the group's level, or this rank's trimmed one)."""
        self._given_hz = level_hz
        own = self._own_level(level_hz)
        if own is not None and own != self.own_hz:
            reply = self._call("set_level", freq_hz=own)
            if reply is not None:
                self.own_hz = reply.get("freq_hz")

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "level_hz": self.level_hz, "own_hz": self.own_hz, "status": self.status,
                "windows": self.windows, "closed_early": self.closed_early, "window_steps": self.next_window_steps,
                "last_window": self.last_window,
                "bytes_sent": self.bytes_sent, "coord_s": self.coord_s}
