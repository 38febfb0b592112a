"""The daemon's lifecycle: start-up, the main loop, shutdown, signals.

serve() = start-up (adopt leftovers, listen, READY=1), the main loop, shutdown (restore unless configured not to).
Which connection and which process hold which job is governor.daemon.holds's. Nothing here polls: connections
(governor.daemon.connection), pidfds and signals are all waited on by the event loop; the timers are in
governor.daemon.ticks, the RPC methods in governor.daemon.rpc.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import resource
import signal
import socket
from collections import Counter
from collections.abc import Callable

from governor.backends.base import describe_text
from governor.config import Config
from governor.daemon import admission, peers, ratelimit
from governor.daemon.connection import READ_CHUNK, Connection
from governor.daemon.controller import Controller
from governor.daemon.groups import Groups
from governor.daemon.holds import Holds
from governor.daemon.jobs import Ended
from governor.daemon.joins import Joins
from governor.daemon.notify import Notifier
from governor.daemon.protocol import RpcFault
from governor.daemon.rpc import Methods
from governor.daemon.scheduler import SchedulerHolds
from governor.daemon.ticks import Ticker, defer_on_loop, status_line
from governor.daemon.utilization import UtilizationSampler
from governor.errors import LIMIT_EXCEEDED, PERMISSION_DENIED, FtgovError
from governor.units import mhz

log = logging.getLogger("ftgovd")

NODE_WAIT_PROBE_S = 1.0  # how often a GPU node is probed for while it is awaited after start (node_wait_s)


class Server:
    """``ticker`` must be one of the controller's listeners (main builds both): it turns changes into STATUS=."""

    def __init__(self, controller: Controller, config: Config, notifier: Notifier, ticker: Ticker,
                 reload: Callable[[Server], None] | None = None,
                 probe: Callable[[], list | None] | None = None, node_wait_s: float = 0.0,
                 groups: Groups | None = None):
        self.controller = controller
        self.probe = probe  # finds the GPUs again while none is governed (governor.daemon.main.probe_gpus)
        self.node_wait_s = node_wait_s  # with no GPU at start: how long its node is awaited, probing every second
        self._node_deadline: float | None = None  # loop time the wait ends; None: not waiting
        self.reload = reload  # on SIGHUP (governor.daemon.reload); None: SIGHUP is ignored
        self.config = config
        self.notifier = notifier
        self.ticker = ticker
        self.sampler = UtilizationSampler(controller, lambda: self.config)
        # A client's updates re-decide its job at most about once a second (each is a pin write and a state save).
        self.redecide = ratelimit.Coalescer(defer_on_loop)
        self.holds = Holds(self._job_ended, controller.register)
        self.groups = groups if groups is not None else Groups(lambda: controller.settings.tuner)
        self.scheduler = controller.scheduler = SchedulerHolds(controller, self.holds.end)
        controller.joins = Joins(self.scheduler, self.groups)
        self.methods = Methods(controller, self.holds, self.sampler, self.redecide, config,
                               self._gpu_search, self.scheduler, self.groups)
        self.call = self.methods.call  # a connection's requests go straight to the RPC methods
        self.conns: set[Connection] = set()
        self.conns_per_uid: Counter[int] = Counter()
        # One read buffer for every connection: see Connection.get_buffer.
        self.read_buffer = memoryview(bytearray(READ_CHUNK))
        self.group_gid = peers.group_id(config.socket.group)
        # The open-file limit as start-up left it (governor.daemon.admission.raise_fd_limit; a reload may raise
        # it), and the descriptors open before serving (counted in serve()): with two per connection and one per
        # job, what is in use now.
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.fd_limit: int | None = None if soft == resource.RLIM_INFINITY else soft
        self.base_fds = 0
        self._stop = asyncio.Event()

    # ---- start-up and shutdown --------------------------------------------------------------------------------------
    def adopt_leftovers(self) -> None:
        """Before serving: take back the state a previous daemon of this boot left, with the jobs whose processes
        still run (each held again, with its recorded start time against PID reuse); the controller re-applies."""
        state = self.controller.leftovers()
        if state is None:
            return
        self.scheduler.adopt(state.holds)  # before the pins are applied: a held GPU keeps its pin across the restart
        live, held = [], {}
        for rec in state.jobs:
            try:
                held[rec.job_id] = peers.hold_recorded(rec.pid, rec.start_ticks, rec.uid)
            except peers.ProcessGone as e:
                log.info("job %d from before the restart is gone: %s", rec.job_id, e)
                continue
            live.append(rec)
        adopted = self.controller.adopt(dataclasses.replace(state, jobs=live))
        self.groups.readopt(self.controller, adopted)
        for job in adopted:
            self.holds.hold(job, held.pop(job.job_id))
            if job.features.gpu_util is None and job.freq_hz is None:  # it was waiting for its measurement
                self.sampler.start(job)
        for process in held.values():  # left out by the controller (its GPU not here, its policy unknown)
            process.close()
        self.ticker.changed(self.controller)  # starts the tick, which retries a restore that failed just now

    async def serve(self, listen_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.holds.exits_fileno(), self.holds.processes_exited)
        self.adopt_leftovers()  # before READY=1: no client is served until leftovers are restored or re-adopted
        # backlog: asyncio calls listen() again with it; keep the queue that systemd's socket unit (or bind_socket)
        # made, so that a burst of clients waits in the queue, not in EAGAIN.
        # backlog is also how many connections asyncio accepts in one turn before any is checked (and on EMFILE it
        # retries that many times, logging each): a small batch; then the kernel's queue is set back to SOMAXCONN.
        listener = await loop.create_unix_server(lambda: Connection(self, self.holds), sock=listen_sock,
                                                 backlog=admission.ACCEPT_BATCH)
        listen_sock.listen(socket.SOMAXCONN)
        self.base_fds = len(os.listdir("/proc/self/fd")) - 1  # less listdir's own
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        # Everything allocated at start-up (modules, pydantic schemas, the tree) lives as long as the daemon: keep the
        # cyclic garbage collector from walking it again on every collection, which showed as latency spikes.
        gc.freeze()
        self.notifier.ready(self.status_line())
        log.info("ftgovd ready on %s (policy %s)", listen_sock.getsockname(), self.controller.policy.name)
        self.ticker.start_watchdog()
        if not self.controller.gpus and self.probe is not None:
            if self.node_wait_s > 0:
                self._node_deadline = loop.time() + self.node_wait_s
            loop.call_later(self._probe_interval_s(), self._probe_again)
        try:
            await self._stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            self.notifier.stopping()
            listener.close()
            tasks = [c.busy for c in self.conns if c.busy is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for conn in list(self.conns):
                conn.close()  # _stop is set: the jobs stay for shutdown() to decide on
            self.shutdown()
            loop.remove_reader(self.holds.exits_fileno())
            self.holds.close()

    def _stopping(self) -> None:
        self.holds.stopping = True  # connections that close from now on leave their jobs for shutdown()
        self._stop.set()

    def waiting_for_gpu(self) -> bool:
        """True while the GPU's node is awaited after start (node_wait_s)."""
        return self._node_deadline is not None

    def _gpu_search(self) -> str:
        if self.waiting_for_gpu():
            return f"ftgovd waits for it up to {self.node_wait_s:g} s after its start (node_wait_s)"
        return f"ftgovd probes again every {self.config.probe_retry_s:g} s"

    def _probe_interval_s(self) -> float:
        # A node that comes up during boot is taken within a second; after the wait, every probe_retry_s.
        retry_s = self.config.probe_retry_s
        return min(NODE_WAIT_PROBE_S, retry_s) if self.waiting_for_gpu() else retry_s

    def _probe_again(self) -> None:
        assert self.probe is not None, "scheduled only where there is a probe"
        why = "none found"
        try:
            gpus = self.probe()
        except FtgovError as e:
            log.debug("still no GPU: %s", e)
            gpus, why = None, str(e)
        loop = asyncio.get_running_loop()
        if not gpus:
            if self._node_deadline is not None and loop.time() >= self._node_deadline:
                self._node_deadline = None
                why += f" (waited {self.node_wait_s:g} s; node_wait_s in the config)"
                log.error("no GPU to govern: %s; serving without one and probing again every %g s (probe_retry_s)",
                          why, self.config.probe_retry_s)
                self.controller.no_gpu(why)
            loop.call_later(self._probe_interval_s(), self._probe_again)
            return
        self._node_deadline = None
        for gpu in gpus:
            log.info("GPU %s found: %s, levels %s MHz; governing it from now", gpu.id, describe_text(gpu),
                     " ".join(mhz(hz, unit=False) for hz in gpu.levels_hz))
        self.controller.add_gpus(gpus)

    def _reload(self) -> None:
        if self.reload is None:
            log.info("SIGHUP: nothing to reload")
            return
        try:
            self.reload(self)
        except Exception:  # a bug in reloading must not take the daemon (and its pins) down
            log.exception("reload failed; the running config and model stay")

    def shutdown(self) -> None:
        self.ticker.stop()
        if self.config.restore_on_stop:
            # Every GPU goes back to its baseline, and the jobs and holds stay in the state file: the next start
            # (systemctl restart, an upgrade) takes back those whose processes still run, as after a crash, and
            # their clients' resume finds them. Ending them here left a restart nothing to take back: every
            # running job trained on at the default clocks for good.
            self.controller.stopping = self.scheduler.suspended = True
            self.controller.reapply()
            if self.controller.jobs:
                log.info("restore_on_stop: every GPU restored; %d job(s) kept in the state file for the next start "
                         "(taken back while their processes run)", len(self.controller.jobs))
        elif self.controller.holds_pins():
            log.info("restore_on_stop is false: leaving %d job(s) and the pin in place for the next start",
                     len(self.controller.jobs))
        self.controller.flush()  # a save still waiting for its timer: the next start re-adopts from this file

    def status_line(self) -> str:
        return status_line(self.controller)

    # ---- connections ------------------------------------------------------------------------------------------------
    def _authorized(self, peer: peers.Peer, sock: socket.socket, process: peers.HeldProcess | None) -> bool:
        return peer.uid in (0, os.geteuid()) or peers.is_member(sock, peer, process, self.group_gid)

    def refusal(self, peer: peers.Peer, sock: socket.socket, process: peers.HeldProcess | None) -> RpcFault | None:
        """Why a new connection is refused (limits with root's reserve, permission), or None to serve it. ``process``
        is the connecting process held at accept (None: it had exited), for the group check where the socket cannot
        give the peer's groups."""
        full = admission.connection_refusal(self.config.limits, uid=peer.uid, total=len(self.conns),
                                            of_uid=self.conns_per_uid[peer.uid],
                                            fds_in_use=self._fds_in_use(sock, process), fd_limit=self.fd_limit)
        if full is not None:
            return RpcFault(LIMIT_EXCEEDED, full)
        if not self._authorized(peer, sock, process):
            log.warning("refused uid %d (pid %d): not root and not in group %s", peer.uid, peer.pid,
                        self.config.socket.group)
            return RpcFault(PERMISSION_DENIED, f"permission denied: uid {peer.uid} is not root and not in "
                            f"group {self.config.socket.group!r} (ask an administrator to add you to it)")
        return None

    def _fds_in_use(self, sock: socket.socket, process: peers.HeldProcess | None) -> int:
        """At least this many descriptors are open: the kernel gives the lowest free number, so every number below
        the newest is taken; and by count, those open before serving, a socket and a pidfd per connection, a pidfd
        per job, and this connection's two."""
        newest = max(sock.fileno(), process.pidfd if process is not None else -1)
        return max(newest + 1, self.base_fds + 2 * len(self.conns) + self.holds.processes() + 2)

    def opened(self, conn: Connection) -> None:
        self.conns.add(conn)
        self.conns_per_uid[conn.peer.uid] += 1

    def closed(self, conn: Connection) -> None:
        self.conns.discard(conn)
        self.conns_per_uid[conn.peer.uid] -= 1

    def idle_timeout_s(self) -> float:
        return self.config.limits.idle_timeout_s

    def _job_ended(self, job_id: int, why: str) -> Ended | None:
        """A job's end, once holds has released it: what waits for its measurements goes, then its pin."""
        self.sampler.forget(job_id)
        self.redecide.forget(job_id)
        ended = self.controller.end(job_id, why)
        self.groups.left(job_id, why)
        if ended is not None:
            self.scheduler.job_ended(ended)
        return ended
