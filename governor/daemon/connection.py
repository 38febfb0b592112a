"""One client connection: an asyncio BufferedProtocol that frames lines, answers them in order and keeps back-pressure.

The transport (asyncio's selector transport) owns the socket, the reads and the write buffer; this object owns the
framing and the order of replies. A request is parsed, decided and answered in the callback that read it. Only a
request that has to wait (measuring gpu_util) becomes a task, and the lines behind it wait for it, in order: reading
pauses meanwhile. Replies a client does not read are buffered by the transport up to WRITE_HIGH_BYTES; past that it
calls pause_writing and the connection stops being read until resume_writing says the buffer drained. A connection's
lines take at most TURN_S of a loop turn: the rest wait, reading paused, for its next turn, after everyone else's.

The peer's credentials (SO_PEERCRED) are read and its process held (a pidfd: the socket's own where the kernel gives
one, governor.daemon.peers) when it connects, so that a registration does not open /proc again and the pid cannot
have been reused since the connect. A connection that holds no job and sends nothing for limits.idle_timeout_s is
closed (governor.daemon.admission). The log lines a request causes count against its uid (governor.daemon.ratelimit).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, Protocol, cast

from governor.daemon import admission, peers, protocol, ratelimit
from governor.daemon.holds import Holds
from governor.daemon.protocol import RpcFault
from governor.errors import INVALID_REQUEST, SERVER_ERROR, FtgovError

log = logging.getLogger("ftgovd")

READ_CHUNK = 65536
WRITE_HIGH_BYTES = 256 * 1024
# The most of a loop turn one connection's lines take. A 64 KiB read holds 1,800 `status` notifications (each reads
# sysfs and the rails, and none has a reply to fill the write buffer): answered in one callback, a member's 16
# connections took the loop for 8 s a turn, with no tick, nobody else served and no watchdog ping meanwhile.
TURN_S = 0.005


class Host(Protocol):
    """What a connection needs of the server that accepted it (governor.daemon.server.Server)."""

    read_buffer: memoryview

    def refusal(self, peer: peers.Peer, sock: socket.socket,
                process: peers.HeldProcess | None) -> RpcFault | None: ...

    def opened(self, conn: Connection) -> None: ...

    def closed(self, conn: Connection) -> None: ...

    def idle_timeout_s(self) -> float: ...

    def call(self, conn: Connection, method: str, params: Any) -> Any: ...


class Connection(asyncio.BufferedProtocol):
    """host: the server that accepted it. holds: who holds which job (this connection's jobs are asked there)."""

    peer: peers.Peer  # who connected: set by connection_made for every connection that serves requests

    def __init__(self, host: Host, holds: Holds):
        self.host = host
        self.holds = holds
        # Set by connection_made, before any other callback: read it through transport.
        self._transport: asyncio.Transport | None = None
        # The connecting process, held from the moment it connected: its jobs (pid left out) hold it through duplicates.
        self.process: peers.HeldProcess | None = None
        # One read buffer for all connections (the server's): the transport fills it and calls buffer_updated at
        # once, so no two connections hold it at the same time, and 50 idle connections do not cost 50 buffers.
        self._view = host.read_buffer
        self.rbuf = bytearray()
        self.scanned = 0  # rbuf[:scanned] holds no newline: a line that arrives in pieces is not searched again
        self.discarding = False  # inside an oversized line: drop bytes up to its newline
        self.busy: asyncio.Task | None = None  # a request that waits; the lines behind it wait too
        self.write_paused = False  # the transport's buffer is over WRITE_HIGH_BYTES
        self.reading = True
        self.yielded = False  # lines are left for the connection's next turn (TURN_S): reading waits for it
        self.eof = False
        self.closed = False
        self.counted = False  # in the server's connection counts
        self.idle: admission.IdleTimer | None = None

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "connection_made sets it first"
        return self._transport

    # ---- the transport's callbacks ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio gives a stream protocol a Transport (it reads, writes and pauses); BaseTransport is the base's type.
        self._transport = transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        process = None
        try:
            self.peer = peer = peers.peer_of(sock)
            # Held before the refusal check: where the socket cannot tell the peer's groups, the group check reads
            # them from this process, whose uid has been checked against the socket's.
            try:
                process = peers.hold_peer(sock, peer)
            except peers.ProcessGone:
                process = None  # exited already (or from another pid namespace): its registrations will say so
            token = ratelimit.caused_by(peer.uid)
            try:
                refusal = self.host.refusal(peer, sock, process)
            finally:
                ratelimit.done(token)
        except OSError as e:
            # Out of descriptors for the peer's pidfd (EMFILE), a peer already reset: refused, and nothing half-built
            # is left (a connection with no peer or no process would fail on its first request, its fds kept).
            if process is not None:
                process.close()
            self.closed = True
            transport.abort()
            known = self._peer_uid()
            token = ratelimit.caused_by(known)
            try:
                log.warning("refused a connection%s: %s", f" from uid {known}" if known is not None else "",
                            e.strerror or e)
            finally:
                ratelimit.done(token)
            return
        if refusal is not None:
            self.closed = True
            if process is not None:
                process.close()
            transport.write(protocol.error(None, refusal))  # a few hundred bytes into an empty socket buffer
            transport.close()
            return
        self.process = process
        transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES, low=WRITE_HIGH_BYTES)
        self.host.opened(self)
        self.counted = True
        self.idle = admission.IdleTimer(asyncio.get_running_loop(), self.host.idle_timeout_s(),
                                        lambda: self.holds.count(self) > 0 or self.busy is not None, self.close)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.rbuf += self._view[:nbytes]
        assert self.idle is not None, "a refused connection's transport reads no more"
        self.idle.touch()
        self.serve()

    def eof_received(self) -> bool:
        self.eof = True
        self._end_jobs()
        return False  # the transport sends what is still buffered, then closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.busy is None and not self.eof and not self.closed:
            self.serve()  # lines held back while the replies piled up

    # ---- requests ---------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        # Lines logged meanwhile, and in tasks started meanwhile (they copy the context), are this uid's.
        token = ratelimit.caused_by(self.peer.uid)
        try:
            self._process()
        except Exception:  # a bug must not leave this client's jobs pinned: drop the connection, keep serving
            self._internal_error()
        finally:
            ratelimit.done(token)

    def _internal_error(self) -> None:
        log.exception("internal error serving uid %d (pid %d); closing its connection", self.peer.uid, self.peer.pid)
        self.close()

    def _process(self) -> None:
        """Answer the complete lines in the read buffer, in order, until one has to wait or replies pile up."""
        buf = self.rbuf
        turn_ends_s = time.monotonic() + TURN_S
        # A transport that is closing has lost its peer (a reply's write failed: the client closed without reading)
        # or read its end: the lines left are no one's to answer, and a registration would pin for a lost connection.
        while (self.busy is None and not self.closed and not self.write_paused and not self.yielded
               and not self.transport.is_closing()):
            if time.monotonic() >= turn_ends_s and buf.find(b"\n", self.scanned) >= 0:
                self.yielded = True  # the others' turn: the lines left are answered on the next
                asyncio.get_running_loop().call_soon(self._next_turn)
                break
            nl = buf.find(b"\n", self.scanned)
            if nl < 0:
                self.scanned = len(buf)
                if len(buf) > protocol.MAX_LINE_BYTES:
                    if not self.discarding:
                        self.send(protocol.error(None, _too_long()))
                    self.discarding = True
                    buf.clear()
                    self.scanned = 0
                break
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            self.scanned = 0
            if self.discarding:
                self.discarding = False
                continue
            if len(line) > protocol.MAX_LINE_BYTES:
                self.send(protocol.error(None, _too_long()))
                continue
            if line.strip():
                self._dispatch(line)
        self._update_reading()

    def _next_turn(self) -> None:
        self.yielded = False
        if not self.closed:
            self.serve()

    def _dispatch(self, line: bytes) -> None:
        try:
            req = protocol.parse_line(line)
        except RpcFault as e:
            if not (e.data or {}).get("notification"):
                self.send(protocol.error((e.data or {}).get("id"), e))
            return
        try:
            value = self.host.call(self, req.method, req.params)
        except (RpcFault, FtgovError) as e:
            self._reply_error(req, e)
            return
        if asyncio.iscoroutine(value):  # it measures gpu_util first: the lines behind it wait for its answer
            self.busy = asyncio.get_running_loop().create_task(self._finish(req, value))
            return
        if not req.is_notification:
            self.send(protocol.result(req.id, value))

    async def _finish(self, req: protocol.Request, pending) -> None:
        try:
            value = await pending
        except (RpcFault, FtgovError) as e:
            self.busy = None
            self._reply_error(req, e)
        except asyncio.CancelledError:
            self.busy = None
            raise
        except Exception:
            self.busy = None
            self._internal_error()
            return
        else:
            self.busy = None
            if not req.is_notification:
                self.send(protocol.result(req.id, value))
        if not self.closed:
            self.serve()  # the lines that arrived meanwhile

    def _reply_error(self, req: protocol.Request, e: FtgovError | RpcFault) -> None:
        if not isinstance(e, RpcFault):
            log.warning("%s from uid %d failed: %s", req.method, self.peer.uid, e)
            e = RpcFault(SERVER_ERROR, str(e))
        if not req.is_notification:
            self.send(protocol.error(req.id, e))

    def send(self, data: bytes) -> None:
        # Not to a closing transport: its peer is gone (asyncio logs a warning for each write after the fifth).
        if not self.closed and not self.transport.is_closing():
            self.transport.write(data)  # calls pause_writing when the buffer passes WRITE_HIGH_BYTES

    def _update_reading(self) -> None:
        """Read while the connection can take requests: nothing waits and the replies drain."""
        if self.closed:
            return
        want = not self.eof and self.busy is None and not self.write_paused and not self.yielded
        if want != self.reading:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # ---- the end ----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close now, dropping unsent replies (a bug, or the daemon stopping)."""
        if self.closed:
            return
        self._forget()
        self.transport.abort()

    def _forget(self) -> None:
        if self.closed and not self.counted:
            return
        self.closed = True
        if self.idle is not None:
            self.idle.cancel()
        self._end_jobs()
        self.holds.forget(self)
        if self.counted:
            self.counted = False
            self.host.closed(self)
        if self.busy is not None and self.busy is not asyncio.current_task():
            self.busy.cancel()
        if self.process is not None:
            self.process.close()
            self.process = None

    def _end_jobs(self) -> None:
        self.holds.end_owner(self, "connection closed", self._peer_uid())

    def _peer_uid(self) -> int | None:
        """The peer's uid, None where connection_made could not read it."""
        peer = getattr(self, "peer", None)
        return None if peer is None else peer.uid


def _too_long() -> RpcFault:
    return RpcFault(INVALID_REQUEST, f"line longer than {protocol.MAX_LINE_BYTES} bytes")
