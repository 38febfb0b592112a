"""The daemon's event loop: the Unix socket and its connections, process watching, the tick while jobs run.

serve() = start-up (adopt leftovers, bind, READY=1), the main loop, shutdown (restore unless configured not to).
A job's hold is tied to its connection and its process: whichever ends first ends the job. Nothing here polls:
connections, pidfds and signals are all waited on by the event loop; the only timers are the measurement tick while
jobs run (rails, pin check) and the systemd watchdog.

Connections are non-blocking sockets read and written straight from the loop's readiness callbacks, with no stream
objects or task per connection: a request is parsed, decided and answered in the callback that read it. Only a
request that has to wait (measuring gpu_util) becomes a task, and the lines behind it wait for it, in order. Replies
a client does not read are buffered up to WRITE_HIGH_BYTES; past that the connection is not read until they drain.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import select
import signal
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from governor.daemon import admission, peers, protocol, ratelimit, redact
from governor.daemon import state as state_mod
from governor.daemon.config import Config
from governor.errors import FtgovError
from governor.daemon.pins import Governor, Job
from governor.daemon.notify import Notifier
from governor.policy import Decision
from governor.daemon.protocol import RpcError

log = logging.getLogger("ftgovd")

READ_CHUNK = 65536
WRITE_HIGH_BYTES = 256 * 1024
ACCEPT_BATCH = 128  # connections accepted per readiness of the listening socket, so that requests are not starved
ACCEPT_RETRY_S = 1.0  # out of file descriptors: the kernel keeps the connection queued; try again after this
ENDED_KEPT = 16


@dataclass(eq=False)  # identity: each connection is its own
class Conn:
    peer: peers.Peer
    sock: socket.socket
    # The connecting process, held from the moment it connected: its jobs (pid left out) hold it through duplicates,
    # so a registration does not open and read /proc again, and the pid cannot have been reused since the connect.
    process: Optional[peers.HeldProcess] = None
    job_ids: set[int] = field(default_factory=set)
    # Summaries of this connection's jobs that ended without unregister (their process exited first, as with
    # `ftgov run`): a late unregister still gets the figures. Bounded: the oldest are dropped.
    ended: dict[int, dict] = field(default_factory=dict)
    rbuf: bytearray = field(default_factory=bytearray)
    scanned: int = 0  # rbuf[:scanned] holds no newline: a line that arrives in pieces is not searched again
    discarding: bool = False  # inside an oversized line: drop bytes up to its newline
    wbuf: bytearray = field(default_factory=bytearray)
    busy: Optional[asyncio.Task] = None  # a request that waits (measuring gpu_util); the lines behind it wait too
    reading: bool = False
    writing: bool = False
    eof: bool = False  # the client closed its side: flush what is left to send, then close
    closed: bool = False
    idle: Optional[admission.IdleTimer] = None


class Server:
    def __init__(self, governor: Governor, config: Config, notifier: Optional[Notifier] = None,
                 tuner_factory: Optional[Callable] = None):
        self.gov = governor
        self.config = config
        self.notifier = notifier or Notifier({})
        self.tuner_factory = tuner_factory
        self.conns: set[Conn] = set()
        self.conns_per_uid: Counter[int] = Counter()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.held: dict[int, peers.HeldProcess] = {}
        # Jobs' pidfds wait in an epoll of their own, which the loop watches as one file: joining it is one cheap
        # epoll_ctl, where the loop's own add_reader costs several times that on every registration.
        self._exits = select.epoll()
        self._exit_job: dict[int, int] = {}  # pidfd -> job id
        self.group_gid = peers.group_id(config.socket.group)
        self._tick: Optional[asyncio.TimerHandle] = None
        self._status_pending = False
        self._stop = asyncio.Event()
        self.gov.listeners.append(lambda _g: self._changed())
        self.gov.defer = self._defer
        self.redecide = ratelimit.Coalescer(self._defer)

    @staticmethod
    def _defer(fn: Callable[[], None], delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        if delay_s > 0:
            loop.call_later(delay_s, fn)
        else:
            loop.call_soon(fn)

    # ---- start-up and shutdown --------------------------------------------------------------------------------------
    def adopt_leftovers(self) -> None:
        """Before serving: take back the baseline from a state file of this boot, re-adopt live jobs, restore the rest."""
        state = state_mod.checked(self.gov.state_file.read(self.gov.boot_id),
                                  {gid: c.gpu.levels_hz for gid, c in self.gov.gpus.items()})
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
                held = peers.hold_recorded(rec.pid, rec.start_time, rec.uid)
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
        loop = self._loop = asyncio.get_running_loop()
        loop.add_reader(self._exits.fileno(), self._processes_exited)
        self.adopt_leftovers()  # before READY=1: no client is served until leftovers are restored or re-adopted
        listen_sock.setblocking(False)
        loop.add_reader(listen_sock.fileno(), self._accept, listen_sock)
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
            loop.remove_reader(listen_sock.fileno())
            tasks = [c.busy for c in self.conns if c.busy is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for conn in list(self.conns):
                self._close(conn)  # _stop is set: the jobs stay for shutdown() to decide on
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
        self.gov.flush()  # a save still waiting for its timer: the next start re-adopts from this file
        for held in self.held.values():
            held.close()
        self.held.clear()
        self._exit_job.clear()
        self._loop.remove_reader(self._exits.fileno())
        self._exits.close()

    # ---- connections ------------------------------------------------------------------------------------------------
    def _authorized(self, peer: peers.Peer, sock: socket.socket, process: Optional[peers.HeldProcess]) -> bool:
        return peer.uid in (0, os.geteuid()) or peers.is_member(sock, peer, process, self.group_gid)

    def _accept(self, listen_sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _addr = listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: the connection waits in the backlog meanwhile
                log.error("cannot accept a connection: %s; retrying in %g s", e, ACCEPT_RETRY_S)
                self._loop.remove_reader(listen_sock.fileno())
                self._loop.call_later(ACCEPT_RETRY_S, self._loop.add_reader, listen_sock.fileno(), self._accept,
                                      listen_sock)
                return
            sock.setblocking(False)
            self._open(sock)

    def _open(self, sock: socket.socket) -> None:
        try:
            peer = peers.peer_of(sock)
        except OSError:
            sock.close()
            return
        try:
            process = peers.hold_peer(sock, peer)
        except peers.ProcessGone:
            process = None  # exited already (or from another pid namespace): its registrations will say so
        token = ratelimit.caused_by(peer.uid)
        try:
            refusal = self._refusal(peer, sock, process)
        finally:
            ratelimit.done(token)
        if refusal is not None:
            try:
                sock.send(protocol.error(None, refusal))  # a few hundred bytes into an empty socket buffer
            except OSError:
                pass
            if process is not None:
                process.close()
            sock.close()
            return
        conn = Conn(peer, sock, process)
        conn.idle = admission.IdleTimer(self._loop, self.config.limits.idle_timeout_s,
                                        lambda: bool(conn.job_ids) or conn.busy is not None, lambda: self._close(conn))
        self.conns.add(conn)
        self.conns_per_uid[peer.uid] += 1
        self._update_io(conn)

    def _refusal(self, peer: peers.Peer, sock: socket.socket, process) -> Optional[RpcError]:
        full = admission.connection_refusal(self.config.limits, uid=peer.uid, total=len(self.conns),
                                            of_uid=self.conns_per_uid[peer.uid])
        if full is not None:
            return RpcError(protocol.LIMIT_EXCEEDED, full)
        if not self._authorized(peer, sock, process):
            log.warning("refused uid %d (pid %d): not root and not in group %s", peer.uid, peer.pid,
                        self.config.socket.group)
            return RpcError(protocol.PERMISSION_DENIED, f"permission denied: uid {peer.uid} is not root and not in "
                            f"group {self.config.socket.group!r} (ask an administrator to add you to it)")
        return None

    def _update_io(self, conn: Conn) -> None:
        """Read while the connection can take requests (nothing waits, replies drain); write while replies wait."""
        if conn.closed:
            return
        read = not conn.eof and conn.busy is None and len(conn.wbuf) <= WRITE_HIGH_BYTES
        if read != conn.reading:
            conn.reading = self._watch_io(conn, read, self._loop.add_reader, self._loop.remove_reader, self._readable)
        write = bool(conn.wbuf)
        if write != conn.writing:
            conn.writing = self._watch_io(conn, write, self._loop.add_writer, self._loop.remove_writer, self._writable)

    @staticmethod
    def _watch_io(conn: Conn, want: bool, add, remove, callback) -> bool:
        if want:
            add(conn.sock.fileno(), callback, conn)
        else:
            remove(conn.sock.fileno())
        return want

    def _readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset by the peer: the same as a close
        if not data:
            conn.eof = True
            if not conn.wbuf:
                self._close(conn)  # which ends its jobs
            else:
                self._end_jobs(conn, "connection closed")
                self._update_io(conn)  # the replies still queued go out first, then _writable closes
            return
        conn.rbuf += data
        conn.idle.touch()
        self._serve(conn)

    def _serve(self, conn: Conn) -> None:
        token = ratelimit.caused_by(conn.peer.uid)
        try:
            self._process(conn)
        except Exception:  # a bug must not leave this client's jobs pinned: drop the connection, keep serving
            self._internal_error(conn)
        finally:
            ratelimit.done(token)

    def _internal_error(self, conn: Conn) -> None:
        log.exception("internal error serving uid %d (pid %d); closing its connection", conn.peer.uid, conn.peer.pid)
        self._close(conn)

    def _process(self, conn: Conn) -> None:
        """Answer the complete lines in the read buffer, in order, until one has to wait or replies pile up."""
        buf = conn.rbuf
        while conn.busy is None and not conn.closed and len(conn.wbuf) <= WRITE_HIGH_BYTES:
            nl = buf.find(b"\n", conn.scanned)
            if nl < 0:
                conn.scanned = len(buf)
                if len(buf) > protocol.MAX_LINE_BYTES:
                    if not conn.discarding:
                        self._send(conn, protocol.error(None, RpcError(
                            protocol.INVALID_REQUEST, f"line longer than {protocol.MAX_LINE_BYTES} bytes")))
                    conn.discarding = True
                    buf.clear()
                    conn.scanned = 0
                break
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            conn.scanned = 0
            if conn.discarding:
                conn.discarding = False
                continue
            if len(line) > protocol.MAX_LINE_BYTES:
                self._send(conn, protocol.error(None, RpcError(
                    protocol.INVALID_REQUEST, f"line longer than {protocol.MAX_LINE_BYTES} bytes")))
                continue
            if line.strip():
                self._dispatch(conn, line)
        self._update_io(conn)

    def _dispatch(self, conn: Conn, line: bytes) -> None:
        try:
            req = protocol.parse_line(line)
        except RpcError as e:
            if not (e.data or {}).get("notification"):
                self._send(conn, protocol.error((e.data or {}).get("id"), e))
            return
        try:
            value = getattr(self, f"_rpc_{req.method}")(conn, req.params)
        except (RpcError, FtgovError) as e:
            self._reply_error(conn, req, e)
            return
        if asyncio.iscoroutine(value):  # it measures gpu_util first: the lines behind it wait for its answer
            conn.busy = self._loop.create_task(self._finish(conn, req, value))
            return
        if not req.is_notification:
            self._send(conn, protocol.result(req.id, value))

    async def _finish(self, conn: Conn, req: protocol.Request, pending) -> None:
        try:
            value = await pending
        except (RpcError, FtgovError) as e:
            conn.busy = None
            self._reply_error(conn, req, e)
        except asyncio.CancelledError:
            conn.busy = None
            raise
        except Exception:
            conn.busy = None
            self._internal_error(conn)
            return
        else:
            conn.busy = None
            if not req.is_notification:
                self._send(conn, protocol.result(req.id, value))
        if not conn.closed:
            self._serve(conn)  # the lines that arrived meanwhile

    def _reply_error(self, conn: Conn, req: protocol.Request, e: FtgovError | RpcError) -> None:
        if not isinstance(e, RpcError):
            log.warning("%s from uid %d failed: %s", req.method, conn.peer.uid, e)
            e = RpcError(protocol.SERVER_ERROR, str(e))
        if not req.is_notification:
            self._send(conn, protocol.error(req.id, e))

    def _send(self, conn: Conn, data: bytes) -> None:
        if conn.closed:
            return
        if not conn.wbuf:
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the client is gone (EPIPE, ECONNRESET)
                self._close(conn)
                return
            if sent == len(data):
                return
            data = data[sent:]
        conn.wbuf += data
        self._update_io(conn)

    def _writable(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        del conn.wbuf[:sent]
        if conn.eof and not conn.wbuf:
            self._close(conn)
        elif len(conn.wbuf) <= WRITE_HIGH_BYTES and conn.busy is None and not conn.eof:
            self._serve(conn)  # lines held back while the replies piled up
        else:
            self._update_io(conn)

    def _end_jobs(self, conn: Conn, why: str) -> None:
        if not self._stop.is_set():  # stopping: shutdown() decides what happens to the jobs
            for job_id in list(conn.job_ids):
                self._end(job_id, why)
            conn.job_ids.clear()

    def _close(self, conn: Conn) -> None:
        if conn.closed:
            return
        self._end_jobs(conn, "connection closed")
        conn.closed = True
        if conn.idle is not None:
            conn.idle.cancel()
        self.conns.discard(conn)
        self.conns_per_uid[conn.peer.uid] -= 1
        fd = conn.sock.fileno()
        if conn.reading:
            self._loop.remove_reader(fd)
        if conn.writing:
            self._loop.remove_writer(fd)
        if conn.busy is not None and conn.busy is not asyncio.current_task():
            conn.busy.cancel()
        if conn.process is not None:
            conn.process.close()
        conn.sock.close()

    # ---- methods ----------------------------------------------------------------------------------------------------
    # Each answers at once with a dict, or, when it has to measure gpu_util first, with a coroutine that will.
    def _rpc_ping(self, conn: Conn, params) -> dict:
        return {}

    def _rpc_status(self, conn: Conn, params) -> dict:
        return redact.status_for(self.gov.status(), conn.peer.uid)

    def _rpc_predict(self, conn: Conn, params):
        features = params.features()
        gid = self.gov.default_gpu()
        if features.gpu_util is None:
            return self._predict_measured(features, gid)
        return self._predict(features, gid, "")

    async def _predict_measured(self, features, gid: str) -> dict:
        util, why = await self._measure_util(gid)
        return self._predict(features.model_copy(update={"gpu_util": util}), gid, why)

    def _predict(self, features, gid: str, why: str) -> dict:
        d = self.gov.policy.decide(features, self.gov.gpus[gid].gpu.levels_hz)
        return {"policy": d.policy, "freq_hz": d.freq_hz, "reason": d.reason + (f"; {why}" if why else "")}

    def _rpc_register(self, conn: Conn, params):
        limits = self.config.limits
        if len(conn.job_ids) >= limits.max_jobs_per_connection:
            raise RpcError(protocol.LIMIT_EXCEEDED, f"this connection already holds {len(conn.job_ids)} jobs "
                           "(limits.max_jobs_per_connection)")
        held_by_uid = sum(1 for j in self.gov.jobs.values() if j.uid == conn.peer.uid)
        if held_by_uid >= limits.max_jobs_per_uid:
            raise RpcError(protocol.LIMIT_EXCEEDED, f"uid {conn.peer.uid} already holds {held_by_uid} jobs "
                           "(limits.max_jobs_per_uid)")
        pid = params.pid or conn.peer.pid
        try:
            held = peers.process_for_job(conn.process, conn.peer, params.pid)
        except peers.NotTheirs as e:
            raise RpcError(protocol.PERMISSION_DENIED, f"pid: {e}", {"field": "pid"}) from e
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
        if job.features.gpu_util is None:
            return self._register_measured(conn, job)
        return self._decide_new(conn, job, "")

    async def _register_measured(self, conn: Conn, job: Job) -> dict:
        util, why = await self._measure_util(job.gpu_id)
        if job.job_id not in self.gov.jobs:  # its process exited while we measured
            raise RpcError(protocol.INVALID_PARAMS, f"pid: process {job.pid} exited during registration")
        job.features = job.features.model_copy(update={"gpu_util": util})
        return self._decide_new(conn, job, why)

    def _decide_new(self, conn: Conn, job: Job, why: str) -> dict:
        try:
            decision = self.gov.decide(job, why_util=why)
        except FtgovError:
            conn.job_ids.discard(job.job_id)
            self._unwatch(job.job_id)
            raise
        if self.tuner_factory is not None:
            self.tuner_factory(self.gov, job)
        return {"job_id": job.job_id, "policy": decision.policy, "freq_hz": decision.freq_hz,
                "reason": decision.reason, "gpu": job.gpu_id, "gpu_util": job.features.gpu_util}

    def _own_job(self, conn: Conn, job_id: int) -> Job:
        if job_id not in conn.job_ids:
            raise RpcError(protocol.UNKNOWN_JOB, f"job_id: no job {job_id} on this connection", {"field": "job_id"})
        return self.gov.jobs[job_id]

    def _rpc_update(self, conn: Conn, params) -> dict:
        job = self._own_job(conn, params.job_id)
        changes = {k: v for k, v in (("gpu_util", params.gpu_util), ("seq_len", params.seq_len)) if v is not None}
        deferred_s = 0.0
        if changes and any(getattr(job.features, k) != v for k, v in changes.items()):
            old = job.features
            job.features = job.features.model_copy(update=changes)
            deferred_s = self.redecide.request(job.job_id, lambda: self._redecide(job, old))
        d = job.decision
        reply = {"job_id": job.job_id, "policy": d.policy, "freq_hz": d.freq_hz, "reason": d.reason}
        if changes and deferred_s:  # within a second of the last re-decision: decided when the window ends
            reply["deferred_s"] = round(deferred_s, 3)
        return reply

    def _redecide(self, job: Job, old) -> None:
        """Decide again on the job's changed features (at once, or deferred by the coalescer: ratelimit)."""
        if job.job_id not in self.gov.jobs:
            return
        try:
            self.gov.decide(job)
        except FtgovError:
            job.features = old
            raise
        if self.tuner_factory is not None:
            self.tuner_factory(self.gov, job)

    def _rpc_progress(self, conn: Conn, params) -> dict:
        job = self._own_job(conn, params.job_id)
        job.steps = max(job.steps, params.steps)
        self.gov.set_phase(job, params.phase)
        if job.tuner is not None:
            job.tuner.progress(self.gov, job)
        return {}

    def _rpc_unregister(self, conn: Conn, params) -> dict:
        if params.job_id in conn.ended:
            return conn.ended.pop(params.job_id)
        self._own_job(conn, params.job_id)
        conn.job_ids.discard(params.job_id)
        return self._summary(self._end(params.job_id, "unregistered"))

    # ---- job ends, processes, timers --------------------------------------------------------------------------------
    def _watch(self, job: Job, held: peers.HeldProcess) -> None:
        self.held[job.job_id] = held
        self._exit_job[held.pidfd] = job.job_id
        self._exits.register(held.pidfd, select.EPOLLIN)  # readable once the process has exited

    def _unwatch(self, job_id: int) -> None:
        held = self.held.pop(job_id, None)
        if held is not None:
            del self._exit_job[held.pidfd]
            self._exits.unregister(held.pidfd)
            held.close()

    def _processes_exited(self) -> None:
        for pidfd, _events in self._exits.poll(0):
            job_id = self._exit_job.get(pidfd)
            if job_id is not None:  # not ended by an earlier one of these
                self._process_exited(job_id)

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
        self.redecide.forget(job_id)
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
