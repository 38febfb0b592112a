"""`ftgov run [features] -- CMD ARGS...`: run a command as a governed job, like `powerprofilesctl launch`.

The command runs in this very process (exec), so whoever started `ftgov run` holds the command's own pid: its
signals, its exit status and its death reach the command directly, once each, as with `nice` or `taskset`. A keeper
process (a grandchild, in a session of its own) registers the process, on a connection it made itself, while it
waits on a pipe, then lets it exec, so the pin is in place from the command's first instruction and the daemon holds
the command's own process (pidfd): the job ends when the command exits, or when the keeper's connection closes (a
SIGKILLed keeper ends the job at once, and the command runs on, ungoverned). If the daemon is absent or refuses, the
command runs anyway after one warning. The command gets the job's id as $FTGOV_RUN_JOB, so that a client job inside
it does not register the same process again.

Signals are not forwarded, because none needs to be: a wrapper that forwards them delivered a signal twice whenever
its sender signalled the process group (timeout(1), `kill -- -PGID`) or every process of the job (scancel, systemd's
KillMode=control-group). The keeper ignores the signals a job's processes are sent, and leaves when the command has
exited.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import select
import shutil
import signal
import stat
import sys
import traceback
import warnings

from governor.cli.features import add_feature_arguments, features_from_args
from governor.client import RUN_JOB_ENV, Connection, DaemonUnavailable, GovernorWarning, Job, describe_reply
from governor.client.features import launched_gpu
from governor.errors import ConfigError
from governor.text import made_up_name, name_problem


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a command as a governed fine-tuning job",
                       description="Run CMD (in this process, which keeps its pid: signals and the exit status are "
                                   "the command's) registered with ftgovd for as long as it runs.")
    add_feature_arguments(p)
    p.add_argument("--name", help="job name shown by `ftgov status` (default: the command's name; for an "
                                  "interpreter, its script's: `python3 train.py` is train.py)")
    p.add_argument("--socket", help="ftgovd's socket (default: $FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.add_argument("-v", "--verbose", action="store_true", help="print the daemon's pick and the job's summary")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        _say("ftgov run: no command given (ftgov run [features] -- CMD ARGS...)")
        return 2
    try:
        features = features_from_args(args)
    except ConfigError as e:
        _say(f"ftgov run: {e}")
        return 2
    problem = name_problem(args.name) if args.name else None
    if problem is not None:  # the daemon would refuse the job, and the command would run ungoverned
        print(f"ftgov run: --name: {problem}", file=sys.stderr)
        return 2
    return run_child(command, features, name=args.name or made_up_name(job_name(command)), socket=args.socket,
                     verbose=args.verbose)


# Commands that run a script named among their arguments (interpreters, and the launchers that start it on each
# GPU); the job is named after the script.
_INTERPRETER = re.compile(r"(python|pypy)[0-9.]*|(ba|da|z)?sh|perl|ruby|node|torchrun|accelerate|deepspeed")
_SCRIPT = re.compile(r".+\.(py|sh|pl|rb|js)")
# Modules that, run with -m, launch a script of their own arguments: the job is named after that script.
_LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"})


def job_name(command: list[str]) -> str:
    """The name a job gets without --name: the command's file name; for an interpreter or a launcher, its script's
    or module's (`python3 train.py` -> train.py, `python -m trainer.main` -> trainer.main, `accelerate launch
    train.py` and `python -m torch.distributed.run train.py` -> train.py)."""
    name = os.path.basename(command[0])
    if not _INTERPRETER.fullmatch(name):
        return name
    args = command[1:]
    while "-m" in args[:-1]:
        at = args.index("-m")
        name, args = args[at + 1], args[at + 2:]
        if name not in _LAUNCHER_MODULES:
            return name
    script = next((a for a in args if _SCRIPT.fullmatch(a)), None)
    return os.path.basename(script) if script else name


def resolve(program: str) -> tuple[str | None, int, str]:
    """(executable, 0, "") for a program that can be run, else (None, exit code, why) as a shell reports it:
    127 when there is no such command, 126 when there is one that cannot be executed."""
    if "/" not in program:
        found = shutil.which(program)
        return (found, 0, "") if found else (None, 127, "command not found")
    if not os.path.exists(program):
        return None, 127, os.strerror(errno.ENOENT)
    if os.path.isdir(program):
        return None, 126, os.strerror(errno.EISDIR)
    if not os.access(program, os.X_OK):
        return None, 126, os.strerror(errno.EACCES)
    return program, 0, ""


def run_child(command: list[str], features: dict, *, name: str | None = None, socket: str | None = None,
              verbose: bool = False) -> int:
    """Run command as a job in this process; returns only when the command cannot be run (its exit code).

    A keeper (a grandchild in a session of its own) registers this process while it waits on a pipe, then lets it
    exec the command, so the pin is in place before the command's first instruction. A command that cannot be run is
    refused before anything is registered.
    """
    executable, code, why = resolve(command[0])
    if executable is None:
        _say(f"ftgov run: {command[0]}: {why}")
        return code
    # This process is the command from here on: a Ctrl-C while the keeper registers it ends it by SIGINT, as it would
    # end the command (a shell stops its script only then), not as Python's KeyboardInterrupt and an exit of 130. A
    # SIGINT that whoever started us ignored (a script's `cmd &`) stays ignored.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    release = _start_keeper(features, name, socket, verbose)
    if not release.startswith(b"go"):
        # The keeper died before it answered (killed, out of memory): whether the command would be governed is unknown.
        _say("ftgov run: the process that registers the job with ftgovd died; the command was not started")
        return 125
    env = dict(os.environ)
    if release[2:]:
        env[RUN_JOB_ENV] = release[2:].decode()
    # An exec'd program expects default dispositions: Python ignores SIGPIPE and SIGXFSZ (subprocess's restore_signals
    # does the same).
    for signo in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signo, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started with the descriptor closed
            stream.flush()
    try:
        os.execve(executable, command, env)
    except OSError as e:  # resolved a moment ago, gone or changed since
        _say(f"ftgov run: {command[0]}: {os.strerror(e.errno or 0)}")
        return 127 if e.errno == errno.ENOENT else 126  # as a shell reports them; the keeper ends the job
    raise AssertionError("unreachable")  # execve returns only by raising


def _start_keeper(features: dict, name, socket, verbose: bool) -> bytes:
    """Start the keeper of this process's job; returns what it released us with: b"go" and the job's id when it
    registered one (the command gets it as $FTGOV_RUN_JOB, governor.client.RUN_JOB_ENV, so that a client job in it,
    or in its children, does not register the same process again), b"" when it died first.

    The keeper is a grandchild, so that the command never finds an unknown child of its own (a wait() for any child
    would reap it), in a session of its own, so that the terminal's and a process group's signals miss it.
    `ftgov run` has no other threads, so forking is safe.
    """
    pid = os.getpid()
    filled = _fill_stdio()
    try:
        watch = os.pidfd_open(pid)  # the keeper's watch on this process, which becomes the command
    except OSError as e:  # before Linux 5.3, or a system call filter: ftgovd cannot hold a process there either
        _close(filled)
        _say(f"ftgov run: cannot watch the command ({e.strerror}); it runs without the governor")
        return b"go"
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    # This process connects, and the keeper registers on that connection without a pid: the daemon knows the process
    # from the socket (SO_PEERCRED, SO_PEERPIDFD), in its own pid namespace. A pid number sent from inside a container
    # with a pid namespace of its own is that namespace's, and named another process to the daemon (the host's PID 1
    # for a command that was the container's). No daemon: the keeper tries again by pid, and warns.
    try:
        conn: Connection | None = Connection(socket)
    except DaemonUnavailable:
        conn = None
    try:
        first = os.fork()
    except OSError as e:  # EAGAIN: at the user's process limit
        _close([*filled, watch, gate_r, gate_w])
        _say(f"ftgov run: cannot start the process that holds the job ({e.strerror}); the command runs without the "
             "governor")
        return b"go"
    if first == 0:
        try:
            os.close(gate_r)
            os.setsid()
            if os.fork() == 0:
                _keep(pid, conn, watch, gate_w, features, name, socket, verbose)
        finally:
            os._exit(0)
    _close([*filled, watch, gate_w])  # the command gets closed what its caller closed
    try:
        os.waitpid(first, 0)
    except ChildProcessError:
        pass  # SIGCHLD ignored where we were started: the kernel reaped it
    chunks = []
    while chunk := os.read(gate_r, 64):
        chunks.append(chunk)
    os.close(gate_r)
    return b"".join(chunks)


def _fill_stdio() -> list[int]:
    """/dev/null on each of stdin, stdout and stderr that is closed (`cmd <&-`, a launcher that closes them) while
    `ftgov run` opens its own descriptors, so that these land above 2: the keeper's /dev/null over its stdin and stdout
    replaced its watch on the command (always readable: the job ended as the command started) or the release pipe.
    Returns the descriptors to close again before the command runs."""
    filled = []
    while (fd := os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)) <= 2:
        filled.append(fd)
    os.close(fd)
    return filled


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _keep(pid: int, conn: Connection | None, watch: int, gate: int, features: dict, name, socket,
          verbose: bool) -> None:
    """The keeper: register the command's process, release it, hold the job's connection until it exits, then end the
    job (its summary with -v). Never returns.

    Every signal is the command's: the keeper ignores the ones that a scheduler or systemd sends to every process of
    a job (scancel, KillMode=control-group), so that the job stays governed while the command shuts down, and the
    command gets each signal once, from its sender (with a wrapper that forwards signals, a signal sent to the
    process group or to every process reached the command twice). A SIGKILLed keeper ends the job at once; the
    command runs on, ungoverned.
    """
    code = 1
    try:
        for signo in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                      signal.SIGPIPE):
            signal.signal(signo, signal.SIG_IGN)
        # stdin and stdout on /dev/null: a caller that reads the command's output to its end does not wait for us.
        # stderr is kept for warnings, or /dev/null where it was closed: the job's socket must not land on 0-2.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            if fd != devnull and (fd < 2 or not _is_open(fd)):
                os.dup2(devnull, fd)
        if devnull > 2:
            os.close(devnull)
        kept = (0, 1, 2, watch, gate) + (() if conn is None else (conn.fileno(),))
        _close_all_but(kept)  # what the caller passed the command (a pipe's end) is not ours
        if conn is not None:
            conn.take_over()
        job = _register(pid, conn, features, name, socket, verbose)
        try:
            os.write(gate, b"go" + (b"" if job.job_id is None else str(job.job_id).encode()))
        except BrokenPipeError:  # the process died before its release (a Ctrl-C while it waited): no command runs
            job.close()
            code = 0
            return
        os.close(gate)
        if job.job_id is not None:
            # The pidfd is readable once the command has exited. poll, not select: a caller that passed us a thousand
            # descriptors put the pidfd above select's 1023, and the keeper died at once, ending the job.
            exited = select.poll()
            exited.register(watch, select.POLLIN)
            exited.poll()
            _append_to_stderr()
        job.close()
        if verbose and job.result:
            _say(f"ftgov: job {job.job_id} ended: {describe_reply(job.result)}")
        code = 0
    except BaseException:
        traceback.print_exc()  # the command was not released (125) or runs on; the job ends with this process
    finally:
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
        finally:
            os._exit(code)


def _say(text: object) -> None:
    """Print to stderr, where there is one: started with it closed, Python's is None, and print(file=None) would write
    to stdout, the command's output."""
    if sys.stderr is not None:
        print(text, file=sys.stderr)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _append_to_stderr() -> None:
    """Reopen stderr to append where it is a file, once the command has exited: whoever started it may have written
    to the file since (`ftgov run -v ... >log 2>&1; echo done >>log`), and at the offset the keeper shares with the
    command the summary overwrote that. (Not before: the command, writing at that offset, would overwrite the
    keeper's appended lines.)"""
    try:
        if not stat.S_ISREG(os.fstat(2).st_mode):
            return
        fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_APPEND)
    except OSError:  # closed, or not ours to open again (a file that root opened for us): written where it stands
        return
    os.dup2(fd, 2)
    os.close(fd)


def _close_all_but(kept: tuple[int, ...]) -> None:
    low = 0
    for fd in sorted(kept):
        if low < fd:  # os.closerange(0, 0) asks close_range(2) for 0 to -1, which it reads as every descriptor
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _register(pid: int, conn: Connection | None, features: dict, name, socket, verbose: bool) -> Job:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GovernorWarning)
        job = Job(features, name=name, socket=socket, pid=None if conn is not None else pid, connection=conn,
                  gpu=launched_gpu()).start()
    for w in caught:
        _say(w.message)
    if verbose and job.registration:
        _say(f"ftgov: job {job.job_id}: {describe_reply(job.registration)}")
    return job
