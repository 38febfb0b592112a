"""`ftgov run [features] -- CMD ARGS...`: run a command as a governed job, like `powerprofilesctl launch`.

The child is forked and registered with pid=<child> before it execs the command, so the pin is in place from the
command's first instruction and the daemon holds the child's own process (pidfd): the job ends when the command exits,
or when this wrapper's connection closes: a SIGKILLed wrapper ends the job at once, and the command runs on,
ungoverned. If the daemon is absent or refuses, the command runs anyway after one warning. The command gets the job's
id as $FTGOV_RUN_JOB, so that a client job inside it does not register the same process again.

Signals: the wrapper blocks the signals it forwards and waits for them with sigwaitinfo, together with SIGCHLD, so
there is no handler race and no polling. A signal sent to the wrapper by a process (kill, systemd, a scheduler) is
forwarded to the child. A signal the terminal sends (Ctrl-C, Ctrl-\\, a hangup) went to the whole foreground process
group, the child included, so it is not forwarded a second time (the way sudo tells them apart: si_code SI_KERNEL),
unless the command moved to a process group of its own.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import shutil
import signal
import sys
import warnings

from governor.cli.features import add_feature_arguments, features_from_args
from governor.client import RUN_JOB_ENV, GovernorWarning, Job, describe_reply
from governor.client.features import launched_gpu
from governor.errors import ConfigError

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                     signal.SIGWINCH)
# si_code of a signal the kernel raised itself, e.g. the tty driver for Ctrl-C (Linux <asm-generic/siginfo.h>).
SI_KERNEL = 0x80


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a command as a governed fine-tuning job",
                       description="Start CMD, register it with ftgovd for as long as it runs, forward signals to it "
                                   "and exit with its exit code (dying of the signal that killed it, which a shell "
                                   "reports as 128+N).")
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
        print("ftgov run: no command given (ftgov run [features] -- CMD ARGS...)", file=sys.stderr)
        return 2
    try:
        features = features_from_args(args)
    except ConfigError as e:
        print(f"ftgov run: {e}", file=sys.stderr)
        return 2
    return run_child(command, features, name=args.name or job_name(command), socket=args.socket,
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
    """Run command as a job; returns its exit code, or ends this process by the signal that killed it (die_of).

    The child is forked, registered while it waits on a pipe, then released to exec the command, so the pin is in
    place before the command's first instruction and the daemon never sees a pid that already exited. A command that
    cannot be run is refused before anything is registered.
    """
    executable, code, why = resolve(command[0])
    if executable is None:
        print(f"ftgov run: {command[0]}: {why}", file=sys.stderr)
        return code
    waited = set(FORWARDED_SIGNALS) | {signal.SIGCHLD}
    # With SIGCHLD ignored (as whoever started us may leave it), the kernel reaps the command itself and sends no
    # SIGCHLD: the wait below would never end, and every signal forwarded to a command that is gone.
    old_chld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    job = None
    try:
        pid, release, exec_error = _fork_gated(executable, command, old_mask, old_chld)
        job = _register(pid, features, name, socket, verbose)
        os.write(release, b"go" + (b"" if job.job_id is None else str(job.job_id).encode()))
        os.close(release)
        failure = _read_all(exec_error)  # EOF without data: the exec succeeded (the pipe was close-on-exec)
        status = _wait_forwarding(pid, waited)
        if failure:
            errno_ = int(failure)
            print(f"ftgov run: {command[0]}: {os.strerror(errno_)}", file=sys.stderr)
            return 127 if errno_ == errno.ENOENT else 126  # as a shell reports them
    finally:
        # The job ends with the signals still held: a Ctrl-C or a SIGTERM while a slow daemon answers unregister was
        # a KeyboardInterrupt traceback, or the wrapper's death by SIGTERM in place of the command's exit code. What
        # arrived meanwhile was meant for the command, which is gone: drained.
        if job is not None:
            job.close()
            if verbose and job.result:
                print(f"ftgov: job {job.job_id} ended: {describe_reply(job.result)}", file=sys.stderr)
        _drain(waited)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        signal.signal(signal.SIGCHLD, old_chld)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        die_of(-code)
        return 128 - code
    return code


def die_of(signo: int) -> None:
    """End this process by the signal that killed the command, as sudo and timeout(1) do, so that whoever waits on us
    sees what it would without the wrapper: a shell stops its script at a Ctrl-C only when the command died of the
    SIGINT (bash(1), SIGNALS; Python dies of it too, for that reason), and systemd counts a unit stopped by SIGTERM
    as clean, an exit 143 as failed. A shell reports 128+N. No core file of ours for the command's SIGQUIT or
    SIGSEGV. Returns only if the signal did not end us."""
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    sys.stdout.flush()
    sys.stderr.flush()
    if signo != signal.SIGKILL:
        signal.signal(signo, signal.SIG_DFL)  # SIGINT's is Python's KeyboardInterrupt
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
    os.kill(os.getpid(), signo)


def _fork_gated(executable: str, command: list[str], mask, sigchld) -> tuple[int, int, int]:
    """Fork a child that execs command once the parent writes to the release pipe and closes it; returns (pid,
    release, error).

    The parent writes "go", then the job's id when it registered one: the command gets it as $FTGOV_RUN_JOB
    (governor.client.RUN_JOB_ENV), so that a client job in it, or in its children, does not register the same
    process a second time. `ftgov run` has no other threads, so forking is safe; the child runs only a few system
    calls before exec, with ``mask`` and SIGCHLD's disposition ``sigchld`` as they were where we started.
    """
    gate_r, gate_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(gate_w)
            os.close(err_r)
            # An exec'd program expects default dispositions: Python ignores SIGPIPE and SIGXFSZ (subprocess's
            # restore_signals does the same) and set SIGINT to raise KeyboardInterrupt, but only where SIGINT was
            # at its default: one ignored by whoever started us (a script's `cmd &`) stays ignored in the command.
            for signo in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signo, signal.SIG_DFL)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
            release = _read_all(gate_r)
            if not release.startswith(b"go"):
                os._exit(125)  # the wrapper died before releasing us: do not run unsupervised
            env = dict(os.environ)
            if release[2:]:
                env[RUN_JOB_ENV] = release[2:].decode()
            if sigchld == signal.SIG_IGN:
                signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the command inherits what we did
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C that came while gated acts now
            os.execve(executable, command, env)
        except OSError as e:
            os.write(err_w, str(e.errno or 0).encode())
        finally:
            os._exit(126)
    os.close(gate_r)
    os.close(err_w)
    return pid, gate_w, err_r


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _register(pid: int, features: dict, name, socket, verbose: bool) -> Job:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GovernorWarning)
        job = Job(features, name=name, socket=socket, pid=pid, gpu=launched_gpu()).start()
    for w in caught:
        print(w.message, file=sys.stderr)
    if verbose and job.registration:
        print(f"ftgov: job {job.job_id}: {describe_reply(job.registration)}", file=sys.stderr)
    return job


def _wait_forwarding(pid: int, waited: set) -> int:
    """Forward signals until the child exits; returns its wait status."""
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return status
            continue
        try:
            if should_forward(info, os.getpgid(pid)):
                os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass  # it exited; its SIGCHLD is pending


def should_forward(info, child_pgid: int) -> bool:
    """Forward a signal unless the terminal sent it to our process group and the child is in that group too.

    A command that made its own process group (setsid, setpgid) gets nothing from the terminal, so it gets ours.
    """
    return not (info.si_code == SI_KERNEL and child_pgid == os.getpgrp())


def _drain(waited: set) -> None:
    """Discard what arrived after the child exited, so unblocking does not deliver it to us (a late Ctrl-C)."""
    for signo in signal.sigpending() & waited:
        signal.sigtimedwait([signo], 0)
