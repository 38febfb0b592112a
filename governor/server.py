"""The daemon's event loop: the Unix socket, one task per connection, process watching, the tick while jobs run.

serve() = start-up (adopt leftovers, bind, READY=1), the main loop, shutdown (restore unless configured not to).
A job's hold is tied to its connection and its process: whichever ends first ends the job. Nothing here polls:
connections, pidfds and signals are all waited on by the event loop; the only timers are the measurement tick while
jobs run (rails, pin check) and the systemd watchdog.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import stat
from dataclasses import dataclass, field
from typing import Callable, Optional

from governor import peers, protocol
from governor.config import Config
from governor.errors import FtgovError
from governor.jobs import Governor, Job
from governor.notify import Notifier
from governor.policy import Decision
from governor.protocol import RpcError

log = logging.getLogger("ftgovd")

READ_CHUNK = 65536
ENDED_KEPT = 16


@dataclass(eq=False)  # identity: each connection is its own
class Conn:
    peer: peers.Peer
    writer: asyncio.StreamWriter
    task: Optional[asyncio.Task] = None
    job_ids: set[int] = field(default_factory=set)
    # Summaries of this connection's jobs that ended without unregister (their process exited first, as with
    # `ftgov run`): a late unregister still gets the figures. Bounded: the oldest are dropped.
    ended: dict[int, dict] = field(default_factory=dict)


class Server:
    def __init__(self, governor: Governor, config: Config, notifier: Optional[Notifier] = None,
                 tuner_factory: Optional[Callable] = None):
        self.gov = governor
        self.config = config
        self.notifier = notifier or Notifier({})
        self.tuner_factory = tuner_factory
        self.conns: set[Conn] = set()
        self.held: dict[int, peers.HeldProcess] = {}
        self.group_gid = peers.group_id(config.socket.group)
        self._tick: Optional[asyncio.TimerHandle] = None
        self._status_pending = False
        self._stop = asyncio.Event()
        self.gov.listeners.append(lambda _g: self._changed())
        self.gov.defer = lambda fn: asyncio.get_running_loop().call_soon(fn)

    # ---- start-up and shutdown --------------------------------------------------------------------------------------
    def adopt_leftovers(self) -> None:
        """Before serving: take back the baseline from a state file of this boot, re-adopt live jobs, restore the rest."""
        state = self.gov.state_file.read(self.gov.boot_id)
        if state is None:
            return
        self.gov.next_job_id = max(self.gov.next_job_id, state.next_job_id)
        for gid, gs in state.gpus.items():
            if gid in self.gov.gpus:
                ctl = self.gov.gpus[gid]
                # The hardware may hold a pin we no longer stand behind: force the next apply to write, either the
                # re-adopted jobs' pin or the baseline.
                ctl.baseline, ctl.pinned_hz, ctl.restore_failed = gs.baseline, gs.pinned_hz, True
                log.info("state file: GPU %s baseline %d..%d Hz, left pinned at %s", gid, gs.baseline.min_hz,
                         gs.baseline.max_hz, gs.pinned_hz)
        for rec in state.jobs:
            try:
                held = peers.hold(rec.pid, rec.start_time)
            except peers.ProcessGone as e:
                log.info("job %d from before the restart is gone: %s", rec.job_id, e)
                continue
            from governor.features import Features

            job = self.gov.admit(pid=rec.pid, start_time=rec.start_time, uid=rec.uid, name=rec.name, gpu_id=rec.gpu,
                                 features=Features(**rec.features), job_id=rec.job_id)
            job.adopted = True
            job.decision = Decision(rec.policy, rec.freq_hz, "re-adopted after a daemon restart")
            self._watch(job, held)
            log.info("%s re-adopted after a daemon restart at %s", job.label(),
                     "no pin" if rec.freq_hz is None else f"{rec.freq_hz / 1e6:g} MHz", extra=job.fields())
        for gid in self.gov.gpus:
            self.gov._apply_quietly(gid)
        self._changed()  # starts the tick, which retries a restore that failed just now

    async def serve(self, listen_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.adopt_leftovers()  # before READY=1: no client is served until leftovers are restored or re-adopted
        server = await asyncio.start_unix_server(self._client, sock=listen_sock, limit=READ_CHUNK)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        # Everything allocated at start-up (modules, pydantic schemas, the tree) lives as long as the daemon: keep the
        # cyclic garbage collector from walking it again on every collection, which showed as latency spikes.
        gc.freeze()
        self.notifier.ready(self._status_line())
        log.info("ftgovd ready on %s (policy %s)", listen_sock.getsockname(), self.gov.policy.name)
        self._watchdog()
        try:
            await self._stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self.notifier.stopping()
            server.close()
            tasks = [c.task for c in self.conns if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
        if self.config.restore_on_stop:
            for job_id in list(self.gov.jobs):
                self._end(job_id, "daemon stopping")
            for gid in self.gov.gpus:
                self.gov._apply_quietly(gid)
        elif any(c.pinned_hz is not None for c in self.gov.gpus.values()):
            log.info("restore_on_stop is false: leaving %d job(s) and the pin in place for the next start",
                     len(self.gov.jobs))
        for held in self.held.values():
            held.close()
        self.held.clear()

    # ---- connections ------------------------------------------------------------------------------------------------
    def _authorized(self, peer: peers.Peer) -> bool:
        if peer.uid in (0, os.geteuid()):
            return True
        return self.group_gid is not None and self.group_gid in peers.groups_of(peer.pid, peer.gid)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peers.peer_of(writer.get_extra_info("socket"))
        if len(self.conns) >= self.config.limits.max_connections:
            await self._refuse(writer, protocol.LIMIT_EXCEEDED, "too many connections (limits.max_connections)")
            return
        if sum(1 for c in self.conns if c.peer.uid == peer.uid) >= self.config.limits.max_connections_per_uid:
            await self._refuse(writer, protocol.LIMIT_EXCEEDED, f"too many connections from uid {peer.uid} "
                               "(limits.max_connections_per_uid)")
            return
        if not self._authorized(peer):
            log.warning("refused uid %d (pid %d): not root and not in group %s", peer.uid, peer.pid,
                        self.config.socket.group)
            await self._refuse(writer, protocol.PERMISSION_DENIED,
                               f"permission denied: uid {peer.uid} is not root and not in group "
                               f"{self.config.socket.group!r} (ask an administrator to add you to it)")
            return
        conn = Conn(peer, writer, asyncio.current_task())
        self.conns.add(conn)
        try:
            await self._read_lines(conn, reader)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # cancelled: the daemon is stopping, and shutdown() decides what happens to the jobs
        finally:
            self.conns.discard(conn)
            if not self._stop.is_set():
                for job_id in list(conn.job_ids):
                    self._end(job_id, "connection closed")
            writer.close()

    async def _refuse(self, writer: asyncio.StreamWriter, code: int, message: str) -> None:
        try:
            writer.write(protocol.error(None, RpcError(code, message)))
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    async def _read_lines(self, conn: Conn, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        discarding = False  # inside an oversized line: drop bytes up to its newline
        while True:
            chunk = await reader.read(READ_CHUNK)
            if not chunk:
                return
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > protocol.MAX_LINE_BYTES:
                        if not discarding:
                            await self._send(conn, protocol.error(None, RpcError(
                                protocol.INVALID_REQUEST, f"line longer than {protocol.MAX_LINE_BYTES} bytes")))
                        discarding = True
                        buf.clear()
                    break
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if discarding:
                    discarding = False
                    continue
                if len(line) > protocol.MAX_LINE_BYTES:
                    await self._send(conn, protocol.error(None, RpcError(
                        protocol.INVALID_REQUEST, f"line longer than {protocol.MAX_LINE_BYTES} bytes")))
                    continue
                if line.strip():
                    reply = await self._handle_line(conn, line)
                    if reply is not None:
                        await self._send(conn, reply)

    async def _send(self, conn: Conn, data: bytes) -> None:
        conn.writer.write(data)
        await conn.writer.drain()

    async def _handle_line(self, conn: Conn, line: bytes) -> Optional[bytes]:
        try:
            req = protocol.parse_line(line)
        except RpcError as e:
            if (e.data or {}).get("notification"):
                return None
            return protocol.error((e.data or {}).get("id"), e)
        try:
            value = await getattr(self, f"_rpc_{req.method}")(conn, req.params)
        except RpcError as e:
            return None if req.is_notification else protocol.error(req.id, e)
        except FtgovError as e:
            log.warning("%s from uid %d failed: %s", req.method, conn.peer.uid, e)
            return None if req.is_notification else protocol.error(req.id, RpcError(protocol.SERVER_ERROR, str(e)))
        return None if req.is_notification else protocol.result(req.id, value)

    # ---- methods ----------------------------------------------------------------------------------------------------
    async def _rpc_ping(self, conn: Conn, params) -> dict:
        return {}

    async def _rpc_status(self, conn: Conn, params) -> dict:
        return self.gov.status()

    async def _rpc_predict(self, conn: Conn, params) -> dict:
        features = params.features()
        gid = self.gov.default_gpu()
        why = ""
        if features.gpu_util is None:
            util, why = await self._measure_util(gid)
            features = features.model_copy(update={"gpu_util": util})
        d = self.gov.policy.decide(features, self.gov.gpus[gid].gpu.levels_hz)
        return {"policy": d.policy, "freq_hz": d.freq_hz, "reason": d.reason + (f"; {why}" if why else "")}

    async def _rpc_register(self, conn: Conn, params) -> dict:
        if len(conn.job_ids) >= self.config.limits.max_jobs_per_connection:
            raise RpcError(protocol.LIMIT_EXCEEDED, f"this connection already holds {len(conn.job_ids)} jobs "
                           "(limits.max_jobs_per_connection)")
        pid = params.pid or conn.peer.pid
        try:
            held = peers.hold(pid, known_uid=conn.peer.uid if pid == conn.peer.pid else None)
        except peers.ProcessGone as e:
            raise RpcError(protocol.INVALID_PARAMS, f"pid: {e}", {"field": "pid"}) from e
        if conn.peer.uid != 0 and held.uid != conn.peer.uid:
            held.close()
            raise RpcError(protocol.PERMISSION_DENIED, f"pid: process {pid} belongs to uid {held.uid}, not to you "
                           f"(uid {conn.peer.uid})", {"field": "pid"})
        if params.tune and self.gov.policy.name == "observe":
            held.close()
            raise RpcError(protocol.INVALID_PARAMS, "tune: this daemon runs the observe policy and pins nothing",
                           {"field": "tune"})
        try:
            gpu_id = self.gov.find_gpu(params.gpu)
        except FtgovError as e:
            held.close()
            raise RpcError(protocol.INVALID_PARAMS, f"gpu: {e}", {"field": "gpu"}) from e
        try:
            job = self.gov.admit(pid=pid, start_time=held.start_time, uid=conn.peer.uid, name=params.name,
                                 gpu_id=gpu_id, features=params.features(), policy="tune" if params.tune else None)
        except FtgovError as e:
            held.close()
            raise RpcError(protocol.LIMIT_EXCEEDED, str(e)) from e
        conn.job_ids.add(job.job_id)
        self._watch(job, held)
        why = ""
        if job.features.gpu_util is None:
            util, why = await self._measure_util(gpu_id)
            if job.job_id not in self.gov.jobs:  # its process exited while we measured
                raise RpcError(protocol.INVALID_PARAMS, f"pid: process {pid} exited during registration")
            job.features = job.features.model_copy(update={"gpu_util": util})
        try:
            decision = self.gov.decide(job, why_util=why)
        except FtgovError:
            conn.job_ids.discard(job.job_id)
            self._unwatch(job.job_id)
            raise
        if self.tuner_factory is not None:
            self.tuner_factory(self.gov, job)
        return {"job_id": job.job_id, "policy": decision.policy, "freq_hz": decision.freq_hz,
                "reason": decision.reason, "gpu": gpu_id, "gpu_util": job.features.gpu_util}

    def _own_job(self, conn: Conn, job_id: int) -> Job:
        if job_id not in conn.job_ids:
            raise RpcError(protocol.UNKNOWN_JOB, f"job_id: no job {job_id} on this connection", {"field": "job_id"})
        return self.gov.jobs[job_id]

    async def _rpc_update(self, conn: Conn, params) -> dict:
        job = self._own_job(conn, params.job_id)
        changes = {k: v for k, v in (("gpu_util", params.gpu_util), ("seq_len", params.seq_len)) if v is not None}
        if changes and any(getattr(job.features, k) != v for k, v in changes.items()):
            old = job.features
            job.features = job.features.model_copy(update=changes)
            try:
                self.gov.decide(job)
            except FtgovError:
                job.features = old
                raise
            if self.tuner_factory is not None:
                self.tuner_factory(self.gov, job)
        d = job.decision
        return {"job_id": job.job_id, "policy": d.policy, "freq_hz": d.freq_hz, "reason": d.reason}

    async def _rpc_progress(self, conn: Conn, params) -> dict:
        job = self._own_job(conn, params.job_id)
        job.steps = max(job.steps, params.steps)
        self.gov.set_phase(job, params.phase)
        if job.tuner is not None:
            job.tuner.progress(self.gov, job)
        return {}

    async def _rpc_unregister(self, conn: Conn, params) -> dict:
        if params.job_id in conn.ended:
            return conn.ended.pop(params.job_id)
        self._own_job(conn, params.job_id)
        conn.job_ids.discard(params.job_id)
        return self._summary(self._end(params.job_id, "unregistered"))

    # ---- job ends, processes, timers --------------------------------------------------------------------------------
    def _watch(self, job: Job, held: peers.HeldProcess) -> None:
        self.held[job.job_id] = held
        asyncio.get_running_loop().add_reader(held.pidfd, self._process_exited, job.job_id)

    def _unwatch(self, job_id: int) -> None:
        held = self.held.pop(job_id, None)
        if held is not None:
            asyncio.get_running_loop().remove_reader(held.pidfd)
            held.close()

    def _process_exited(self, job_id: int) -> None:
        owner = next((c for c in self.conns if job_id in c.job_ids), None)
        ended = self._end(job_id, "process exited")
        if owner is not None:
            owner.job_ids.discard(job_id)
            if ended is not None:
                owner.ended[job_id] = self._summary(ended)
                while len(owner.ended) > ENDED_KEPT:
                    owner.ended.pop(next(iter(owner.ended)))

    @staticmethod
    def _summary(ended) -> dict:
        return {"job_id": ended.job.job_id, "duration_s": round(ended.duration_s, 3), "freq_hz": ended.job.freq_hz,
                "energy_j": protocol.finite(ended.energy_j), "steps": ended.job.steps, "ended": ended.why}

    def _end(self, job_id: int, why: str):
        self._unwatch(job_id)
        return self.gov.end(job_id, why)

    async def _measure_util(self, gpu_id: str) -> tuple[float, str]:
        """Average the GPU load file over util_sample_s (the job is already running when it registers)."""
        gpu = self.gov.gpus[gpu_id].gpu
        samples = []
        deadline = asyncio.get_running_loop().time() + self.config.util_sample_s
        while True:
            try:
                load = gpu.read().load_pct
            except FtgovError:
                load = None
            if load is not None:
                samples.append(load)
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(min(0.05, self.config.util_sample_s))
        if not samples:
            return 100.0, "gpu_util not given and the GPU reports no load: assumed 100%"
        util = sum(samples) / len(samples)
        return util, f"gpu_util measured from the GPU's load: {util:.1f}% over {len(samples)} samples"

    def _changed(self) -> None:
        # One STATUS= per event-loop turn, however many changes a burst of requests made in it.
        if not self._status_pending:
            self._status_pending = True
            asyncio.get_running_loop().call_soon(self._send_status)
        if self._tick is None and (self.gov.jobs or self.gov.pending_restores()):
            self._tick = asyncio.get_running_loop().call_later(self.config.sample_interval_s, self._on_tick)

    def _send_status(self) -> None:
        self._status_pending = False
        self.notifier.status(self._status_line())

    def _on_tick(self) -> None:
        self._tick = None
        self.gov.sample()
        self.gov.check_pins()
        if self.gov.pending_restores():
            self.gov.retry()
        self._changed()

    def _watchdog(self) -> None:
        if self.notifier.watchdog_s:
            self.notifier.watchdog()
            asyncio.get_running_loop().call_later(self.notifier.watchdog_s / 3, self._watchdog)

    def _status_line(self) -> str:
        pins = [f"GPU {gid} {'pinned to %g MHz' % (c.pinned_hz / 1e6) if c.pinned_hz else 'at baseline'}"
                for gid, c in self.gov.gpus.items()]
        return f"{len(self.gov.jobs)} job(s); " + ", ".join(pins)


def bind_socket(path: str, mode: int, group: Optional[str]) -> socket.socket:
    """Bind the socket ourselves (started by hand): no window where it exists with a looser mode than configured."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FtgovError(f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: its daemon is gone
        else:
            raise FtgovError(f"another ftgovd is already listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    gid = peers.group_id(group) if group else None
    if gid is not None and os.geteuid() == 0:
        os.chown(path, 0, gid)
    os.chmod(path, mode)
    sock.listen(128)
    return sock
