"""The JSON-RPC connection to ftgovd: one request per line, the daemon's errors as exceptions, and what each
failure to connect means for the user."""

from __future__ import annotations

import grp
import json
import logging
import os
import select
import socket as socketlib
import stat

from governor import DEFAULT_SOCKET_PATH, SOCKET_ENV, errors, simpaths
from governor.errors import FtgovError
from governor.simpaths import PRINT_ENV, simulated_state_dir, start_simulated

log = logging.getLogger("governor.client")

DEFAULT_SOCKET = DEFAULT_SOCKET_PATH
# Progress goes out at most this often. A fine-tuning step on an Orin takes 100 ms or more, so every step is reported
# (the tuner times steps from these reports); faster loops are sampled, and a step costs a clock read.
DEFAULT_REPORT_EVERY_S = 0.1
# One reply line is a few hundred bytes; status up to ~5 KB a job (a name of 256 characters outside the BMP is 3 KB
# of JSON escapes), at limits.max_jobs' ceiling of 4096 jobs about 20 MB. Anything past this is not ftgovd. At 1 MiB,
# a member's 300 jobs so named made root's `ftgov status` and the exporter fail where max_jobs had been raised.
MAX_REPLY_BYTES = 64 << 20


class DaemonUnavailable(FtgovError):
    """ftgovd cannot be reached: no socket, nobody listening, or the connection broke."""


class SocketPermissionError(DaemonUnavailable):
    """The socket exists but this user may not connect to it."""


class RpcError(FtgovError):
    """ftgovd answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data=None, method: str | None = None):
        self.code = code
        self.message = message
        self.data = data
        self.method = method
        field = data.get("field") if isinstance(data, dict) else None
        where = f" (field {field!r})" if field else ""
        super().__init__(f"{method + ': ' if method else ''}{message}{where} [JSON-RPC {code}]")


class ParseError(RpcError):
    """-32700: the daemon could not parse what was sent."""


class InvalidRequest(RpcError):
    """-32600: not a valid JSON-RPC request."""


class MethodNotFound(RpcError):
    """-32601: the daemon has no such method (an older daemon?)."""


class InvalidParams(RpcError):
    """-32602: a parameter is missing or out of range; ``data["field"]`` names it."""


class ServerError(RpcError):
    """-32000: the daemon could not do it (a failed pin, a backend error)."""


class NotPermitted(RpcError):
    """-32001: the daemon refused this caller (e.g. registering a process it does not own)."""


class LimitExceeded(RpcError):
    """-32002: a daemon limit (connections, jobs) is reached."""


class UnknownJob(RpcError):
    """-32003: no such job on this connection (it ended: its process exited, or it was unregistered)."""


_ERROR_CLASSES: dict[int, type[RpcError]] = {
    errors.PARSE_ERROR: ParseError,
    errors.INVALID_REQUEST: InvalidRequest,
    errors.METHOD_NOT_FOUND: MethodNotFound,
    errors.INVALID_PARAMS: InvalidParams,
    errors.SERVER_ERROR: ServerError,
    errors.PERMISSION_DENIED: NotPermitted,
    errors.LIMIT_EXCEEDED: LimitExceeded,
    errors.UNKNOWN_JOB: UnknownJob,
}


def rpc_error(code: int, message: str, data=None, method: str | None = None) -> RpcError:
    """The RpcError subclass for a JSON-RPC error code (RpcError itself for codes we do not know)."""
    return _ERROR_CLASSES.get(code, RpcError)(code, message, data, method)


class GovernorWarning(UserWarning):
    """Training goes on, but without the governor (the daemon is absent or refused the job)."""


def socket_path(socket: str | os.PathLike | None = None) -> str:
    """Where the daemon listens: the ``socket`` argument, else $FTGOV_SOCKET, else /run/ftgov/ftgov.sock."""
    if socket:
        return os.fspath(socket)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class Connection:
    """A synchronous JSON-RPC 2.0 connection to ftgovd: one JSON object per line over a Unix stream socket.

    Not thread-safe: one connection belongs to one thread (the training loop).
    """

    def __init__(self, socket: str | os.PathLike | None = None, timeout_s: float = 10.0):
        self.path = socket_path(socket)
        self.timeout_s = timeout_s
        self._next_id = 1
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise _connect_error(self.path, e) from e
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._pending = b""  # the rest of a line a dropping notify could send only part of (drop_if_busy)
        # A forked child (a DataLoader's worker) inherits the socket: only this process may use it or end it.
        self._pid = os.getpid()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._sock is None

    @property
    def inherited(self) -> bool:
        """Whether this process is a forked child of the one that connected: the connection is its parent's."""
        return self._pid != os.getpid()

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    def take_over(self) -> None:
        """Make this process the connection's owner: a forked child that the process which connected handed it to
        (`ftgov run`'s keeper takes the connection that the process which becomes the command made, so that the
        daemon knows that process from the socket itself). The process that connected must then leave it alone (its
        copy closes on exec)."""
        self._pid = os.getpid()

    def closed_by_daemon(self) -> bool:
        """Whether ftgovd has closed its end (read without waiting, nothing consumed): it closes a connection that
        holds no job and sends nothing for its limits.idle_timeout_s, and it may have restarted meanwhile."""
        if self._sock is None:
            return True
        poll = select.poll()
        poll.register(self._sock, select.POLLIN)
        if not poll.poll(0):
            return False
        try:
            return self._sock.recv(1, socketlib.MSG_PEEK | socketlib.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:  # reset by the daemon
            return True

    def close(self) -> None:
        """Close the connection. The daemon ends any job still held by it.

        Shut down first: a forked child (a DataLoader's worker) holds a copy of the socket, and the daemon sees the
        connection close only once every copy is closed, which a persistent worker delays for the loader's life. In
        such a child, only its own copy is closed: the connection stays its parent's."""
        if self._sock is not None:
            if not self.inherited:
                try:
                    self._sock.shutdown(socketlib.SHUT_RDWR)
                except OSError:
                    pass  # the daemon reset it already
            self._reader.close()
            self._sock.close()
            self._sock = None

    def call(self, method: str, **params) -> dict:
        """Send a request and wait for its reply; a JSON-RPC error becomes an RpcError subclass."""
        request_id = self._next_id
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": _drop_none(params)})
        reply = self._receive(method)
        # An error with a null id answers whatever we sent last: a refusal at connect time, an unparsable line.
        if reply.get("id") != request_id and not ("error" in reply and reply.get("id") is None):
            self.close()
            raise DaemonUnavailable(f"{method}: reply for request {reply.get('id')!r}, expected {request_id}")
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise rpc_error(int(error.get("code", -32603)), str(error.get("message", "unknown error")),
                            error.get("data"), method)
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    def notify(self, method: str, *, drop_if_busy: bool = False, **params) -> bool:
        """Send a notification: no id, and the daemon sends no reply. With ``drop_if_busy``, one the socket cannot
        take at once (the daemon has stopped reading, a SIGSTOP or a hang, and the buffer is full) is dropped, and
        False returned, rather than block the caller for up to timeout_s: a training step must not wait on us, and
        the next progress report carries the same totals."""
        line = self._line({"jsonrpc": "2.0", "method": method, "params": _drop_none(params)})
        if not drop_if_busy:
            self._send_line(line)
            return True
        try:
            if self._pending:
                self._send_now(self._pending)  # a line cut short goes first, whole, or nothing new goes
                if self._pending:
                    return False
            return self._send_now(line)
        except OSError as e:  # the daemon went away (EPIPE, ECONNRESET)
            raise self._lost(e) from e

    def _send_now(self, data: bytes) -> bool:
        """Send what the socket takes of ``data`` without waiting; False when it took nothing. Of a line it took only
        part of, the rest is kept (``_pending``) to go before anything else: a line cut short would run into the
        next one."""
        assert self._sock is not None
        self._sock.settimeout(0.0)
        try:
            sent = self._sock.send(data, socketlib.MSG_NOSIGNAL)
        except BlockingIOError:
            sent = 0
        finally:
            self._sock.settimeout(self.timeout_s)
        if sent:
            self._pending = data[sent:]
        return sent > 0

    def _line(self, message: dict) -> bytes:
        if self._sock is None:
            raise DaemonUnavailable(f"connection to {self.path} is closed")
        if self.inherited:  # its lines would interleave with the parent's, and its requests act on the parent's job
            raise DaemonUnavailable(f"the connection to {self.path} belongs to this process's parent (forked after "
                                    "it connected)")
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"

    def _send(self, message: dict) -> None:
        self._send_line(self._line(message))

    def _send_line(self, line: bytes) -> None:
        assert self._sock is not None
        try:
            # MSG_NOSIGNAL: to a daemon that died, EPIPE and not SIGPIPE, which kills a process that restored its
            # default (`signal(SIGPIPE, SIG_DFL)`, for `train.py | head`; Python embedded in a program that never
            # ignored it).
            self._sock.sendall(self._pending + line, socketlib.MSG_NOSIGNAL)  # a line left half-sent goes first
            self._pending = b""
        except OSError as e:  # the daemon went away (EPIPE), or stopped reading for timeout_s
            raise self._lost(e) from e

    def _lost(self, e: OSError) -> DaemonUnavailable:
        """A send failed: the connection is closed, and what to raise says so."""
        self.close()
        return DaemonUnavailable(f"lost the connection to ftgovd at {self.path}: {e}")

    def _receive(self, method: str) -> dict:
        # Lines without an id would be notifications from the daemon; the protocol has none yet, so skip them.
        while True:
            try:
                line = self._reader.readline(MAX_REPLY_BYTES)
            except OSError as e:  # includes the timeout
                self.close()
                raise DaemonUnavailable(f"{method}: no reply from ftgovd at {self.path}: {e}") from e
            if not line:
                self.close()
                raise DaemonUnavailable(f"{method}: ftgovd closed the connection at {self.path}")
            if not line.endswith(b"\n"):
                self.close()
                raise DaemonUnavailable(f"{method}: reply longer than {MAX_REPLY_BYTES} bytes")
            try:
                reply = json.loads(line)
            except ValueError as e:
                self.close()
                raise DaemonUnavailable(f"{method}: ftgovd sent something that is not JSON: {line[:80]!r}") from e
            if isinstance(reply, dict) and ("id" in reply or "error" in reply):
                return reply


def _simulated_dir(path: str) -> str | None:
    """The state dir of the simulated daemon whose socket ``path`` is: one whose tree lies beside it, or --simulate's
    default socket before its first start has built the tree (the shell was pointed at it by --print-env)."""
    state_dir = simulated_state_dir(path)
    default_dir = simpaths.simulate_runtime_dir()
    if state_dir is None and os.path.abspath(path) == str(default_dir / simpaths.SOCKET_NAME):
        return str(default_dir)
    return state_dir


def _permission_fix(path: str) -> str:
    """Who may connect to the socket at ``path``, and how to become one: its own group, which is the config's
    socket.group (``ftgov`` unless the operator chose another), or, where the socket cannot even be looked at, the
    directory that keeps it."""
    try:
        st = os.stat(path)
    except OSError:  # a directory on the way is closed to this user: no group of the socket's would help
        return (f"a directory on its path is closed to you, so no group of the socket's would help: run as that "
                f"directory's owner or root, or point {SOCKET_ENV} / --socket at a socket you may reach")
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    if st.st_gid == 0:  # joining root's group would open every file root shares with it, not this socket alone
        return "its group is root: run as root"
    if not st.st_mode & stat.S_IWGRP:
        return f"only its owner may connect (mode {stat.S_IMODE(st.st_mode):04o}): run as its owner or root"
    return f"join the group '{group}' (sudo usermod -aG {group} $USER, then log in again), or run as root"


def _connect_error(path: str, e: OSError) -> DaemonUnavailable:
    if isinstance(e, PermissionError):
        return SocketPermissionError(f"permission denied on {path}: {_permission_fix(path)}")
    state_dir = _simulated_dir(path)
    if isinstance(e, FileNotFoundError):
        if state_dir is not None:  # a simulated daemon's socket (its tree beside it, or --simulate's default)
            return DaemonUnavailable(f"ftgovd --simulate is not running: no socket at {path} (start it: "
                                     f"{start_simulated(state_dir, path)})")
        # A simulated daemon listens elsewhere: a shell never pointed at it looks here and finds no board's daemon.
        simulated = f"; for ftgovd --simulate's: {PRINT_ENV}" if path == DEFAULT_SOCKET else ""
        return DaemonUnavailable(
            f"ftgovd is not running: no socket at {path} "
            f"(start it with 'systemctl start ftgovd', or point {SOCKET_ENV} / --socket at its socket{simulated})")
    if isinstance(e, BlockingIOError):  # EAGAIN: a Unix socket's listen queue is full, and connect does not wait
        return DaemonUnavailable(f"ftgovd at {path} takes no connection now: its listen queue is full (many clients "
                                 "connecting at once, or the daemon is stuck)")
    if isinstance(e, ConnectionRefusedError):
        if not _is_socket(path):  # connect() refuses a regular file or a directory the same way
            return DaemonUnavailable(f"{path} is not a socket: point {SOCKET_ENV} / --socket at ftgovd's socket "
                                     f"(ftgovd --simulate prints its path)")
        if state_dir is not None:
            return DaemonUnavailable(f"nothing listens on {path}: ftgovd --simulate stopped and left its socket "
                                     f"behind (start it again: {start_simulated(state_dir, path)})")
        return DaemonUnavailable(f"nothing listens on {path}: ftgovd stopped and left its socket behind (start it "
                                 "again with 'systemctl start ftgovd')")
    return DaemonUnavailable(f"cannot connect to ftgovd at {path}: {e}")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return True  # gone since connect(): say what connect() said


def _drop_none(params: dict) -> dict:
    return {k: v for k, v in params.items() if v is not None}
