"""`ftgov slurm prolog|epilog|check`: hold a Slurm job's GPUs with the node's ftgovd for the job's life (docs/slurm.md).

slurmd runs the prolog and the epilog as root on each node of a job, with the job's facts in the environment
(SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_PARTITION, SLURM_JOB_GPUS). A prolog that exits non-zero drains the node, so
both warn and exit 0 whenever ftgov cannot help (no daemon, a bad config, a daemon error): the job then runs at the
default clocks. Every call (to the daemon, to scontrol and squeue) has a timeout, and an alarm bounds the whole run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import time
import traceback
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from governor import yamlfile
from governor.backends.gpuid import SlurmNumbering
from governor.errors import ConfigError, FtgovError
from governor.units import figure

DEFAULT_SLURM_CONFIG = "/etc/ftgov/slurm.yaml"
# YAML 1.1 reads an unquoted `off` as false: that is what the operator wrote, so it means the policy off.
Policy = Annotated[Literal["tune", "mlg", "ffg", "off"], BeforeValidator(lambda v: "off" if v is False else v)]
COMMENT_CHOICE = re.compile(r"(?:^|[\s,;])ftgov=(\S+?)(?=$|[\s,;])")
MAX_ADMIN_COMMENT = 1024
# The calls a prolog makes before the job is held, each bounded by timeout_s: scontrol show job (the comment),
# scontrol show node (node_gpus_from_scontrol), ftgovd's connect and its answer, and one to spare. The whole run is
# bounded at as many; the sweep of stale holds (a squeue call for each), after the hold, stops short of the bound.
CALLS_AT_MOST = 5
# How long a heterogeneous job's leader's epilog waits for slurmdbd to know the job's components (write_admin_comment).
HET_RECORD_WAIT_S = 5.0


class SlurmConfig(BaseModel):
    """The prolog's own config file (/etc/ftgov/slurm.yaml): which policy a job gets. Strict: a misspelt key or an
    unknown policy is an error naming it, never a silent default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    policy: Policy = "ffg"  # every job's, unless its partition or the job itself says otherwise
    partitions: dict[str, Policy] = Field(default_factory=dict)  # partition name -> policy
    job_choice: bool = True  # a job may choose with --comment ftgov=POLICY (one of the four; off opts out)
    comment_from_scontrol: bool = True  # read the comment with scontrol when slurmd does not pass SLURM_JOB_COMMENT
    admin_comment: bool = True  # the epilog writes the energy into the job's AdminComment (sacct -o AdminComment)
    timeout_s: float = Field(default=10.0, gt=0, le=120)  # each call to the daemon, scontrol and squeue
    socket: str | None = None  # default: $FTGOV_SOCKET, else /run/ftgov/ftgov.sock
    sweep_stale: bool = True  # the prolog releases holds of jobs Slurm no longer runs (a lost epilog)
    # How Slurm numbers this node's GPUs, where its numbers and NVML's differ (docs/slurm.md): index (as NVML does),
    # device_file (as /dev/nvidiaN), or auto (only numbers that name the same GPU either way; the others hold nothing)
    gpu_numbering: SlurmNumbering = "auto"
    # Read how many GPUs slurmd offers on this node (scontrol show node): where it offers fewer than the node has (a
    # gres.conf listing some, MIG instances), Slurm's numbers fit no numbering, and a numbered job is not held
    node_gpus_from_scontrol: bool = True


def load_slurm_config(path: str, *, must_exist: bool) -> SlurmConfig:
    try:
        text = yamlfile.read(path)
    except FileNotFoundError:
        if must_exist:
            raise ConfigError(f"{path}: no such file") from None
        return SlurmConfig()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from e
    except yamlfile.TooLarge as e:
        raise ConfigError(f"{path}: {e}") from e
    try:
        data = yamlfile.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    try:
        return SlurmConfig.model_validate({} if data is None else data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {key}: {err['msg']}") from e


def choose_policy(config: SlurmConfig, partition: str | None, comment: str | None) -> tuple[str, str]:
    """The job's policy and where it came from: the job's --comment (ftgov=POLICY), else its partition's, else the
    default. An unknown choice in the comment is ignored with a warning (the user's typo must not drain a node)."""
    if config.job_choice and comment:
        m = COMMENT_CHOICE.search(comment)
        if m:
            value = m.group(1)
            if value in ("tune", "mlg", "ffg", "off"):
                return value, "the job's --comment"
            warn(f"--comment ftgov={value!r} is none of tune, mlg, ffg, off: ignored")
    if partition is not None and partition in config.partitions:
        return config.partitions[partition], f"partition {partition}"
    return config.policy, "the default"


class NoSlurmIndex(FtgovError):
    """The prolog's environment numbers the job's GPUs without SLURM_JOB_GPUS: Slurm 19.05 wrote device-file numbers
    (/dev/nvidiaN's N) there, today's Slurm the index that SLURM_JOB_GPUS carries; which one it is cannot be told."""


def job_gpus(env: dict[str, str]) -> list[str | int] | None:
    """The job's GPUs on this node as slurm_hold's ``gpus``: the UUIDs of the prolog's CUDA_VISIBLE_DEVICES where
    Slurm gives them (reported of Slurm 25.11; unverified), else the numbers of SLURM_JOB_GPUS (Slurm's own index:
    ftgovd maps them by gpu_numbering); None when Slurm names none (a node without GRES, a Jetson). NoSlurmIndex
    where only CUDA_VISIBLE_DEVICES or GPU_DEVICE_ORDINAL number them: today's Slurm writes SLURM_JOB_GPUS beside
    them, from the same list (gres_common_prep_set_env); Slurm 19.05 wrote neither SLURM_JOB_GPUS nor its index but
    each device file's number (its gres_gpu.c, epilog_set_env), which read as the index would name another GPU."""
    named = {name: _keys(env[name]) for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "GPU_DEVICE_ORDINAL")
             if name in env}
    uuids = named.get("CUDA_VISIBLE_DEVICES")
    if uuids and all(isinstance(k, str) for k in uuids):
        return uuids
    if "SLURM_JOB_GPUS" in named:
        return named["SLURM_JOB_GPUS"]
    for name in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        if named.get(name):
            raise NoSlurmIndex(
                f"{name}={env[name]} without SLURM_JOB_GPUS: a Slurm that does not give the prolog SLURM_JOB_GPUS "
                "(19.05 did not) numbers device files there, not its index; nothing numbered is held (a Slurm that "
                "names the GPUs by UUID in CUDA_VISIBLE_DEVICES needs neither: docs/slurm.md)")
        if name in named:
            return []
    return None


def _keys(value: str) -> list[str | int]:
    """A GPU list as CUDA reads CUDA_VISIBLE_DEVICES (up to its first entry that names no GPU: Slurm writes
    "NoDevFiles" where gres.conf names no device files), numbers as ints."""
    from governor.client.features import visible_entries

    return [int(e) if e.isdigit() else e for e in visible_entries(value)]


# slurmd gives the prolog and the epilog a bare environment: PATH may be unset or not name Slurm's commands.
SLURM_BIN_DIRS = "/usr/bin:/usr/local/bin:/opt/slurm/bin"
# How Slurm's commands' output is decoded. `scontrol show job` prints the job's name, comment and paths as the user's
# bytes, which need not be UTF-8: a strict decode raised, and a prolog or epilog that fails drains the node.
# surrogateescape keeps those bytes, so that a field written back (AdminComment) is what was read.
OUTPUT_ERRORS = "surrogateescape"


def slurm_command(name: str) -> str:
    """Where a Slurm command is: on PATH, else in the usual install directories; the bare name otherwise (its run
    then fails, and is reported, as a missing command)."""
    return shutil.which(name) or shutil.which(name, path=SLURM_BIN_DIRS) or name


def warn(message: str) -> None:
    print(f"ftgov slurm: warning: {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    print(f"ftgov slurm: {message}", flush=True)


def add_parser(sub) -> None:
    p = sub.add_parser("slurm", help="Slurm prolog/epilog: hold a job's GPUs with ftgovd for the job's life",
                       description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("prolog", "epilog", "check"),
                   help="prolog/epilog: run by slurmd as root (Prolog=, Epilog= in slurm.conf); check: validate "
                        "the config and show the policy this environment's job would get")
    p.add_argument("--config", default=None, help=f"the prolog's config (default {DEFAULT_SLURM_CONFIG})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.action == "check":
        config = load_slurm_config(args.config or DEFAULT_SLURM_CONFIG, must_exist=args.config is not None)
        policy, source = choose_policy(config, env.get("SLURM_JOB_PARTITION"), env.get("SLURM_JOB_COMMENT"))
        try:
            gpus = job_gpus(env)
            named = ("none named by Slurm (a Jetson's GPU is held; elsewhere none)" if gpus is None
                     else ", ".join(str(g) for g in gpus) or "an empty list")
        except NoSlurmIndex as e:
            named = f"none held: {e}"
        info(f"config OK; a job here gets {policy} (from {source}); GPUs: {named} (read by gpu_numbering "
             f"{config.gpu_numbering})")
        return 0
    try:
        config = load_slurm_config(args.config or DEFAULT_SLURM_CONFIG, must_exist=args.config is not None)
    except ConfigError as e:
        warn(f"{e}: the job runs at the default clocks (ftgov slurm check shows the problem)")
        return 0
    # The last guard: whatever hangs, the prolog ends, and ends with 0, before slurmd's PrologEpilogTimeout where that
    # is set above this bound (slurmd drains a node whose prolog or epilog it ends for that timeout: slurm.conf(5),
    # unverified here against its text).
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(int(config.timeout_s * CALLS_AT_MOST) + 1)
    try:
        return (prolog if args.action == "prolog" else epilog)(config, env)
    except FtgovError as e:
        warn(f"{e}: the job runs at the default clocks")
        return 0
    except Exception as e:  # a bug here must not drain the node: slurmd drains it on any non-zero exit
        traceback.print_exc()
        warn(f"unexpected {type(e).__name__}: {e} (a bug in ftgov: the traceback above); the job runs at the default "
             "clocks")
        return 0
    finally:
        signal.alarm(0)


def _out_of_time(signum, frame) -> None:
    warn("out of time: giving up (the job runs at the default clocks)")
    os._exit(0)


def _job_id(env: dict[str, str], name: str = "SLURM_JOB_ID") -> int | None:
    value = env.get(name, "")
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None


def _connect(config: SlurmConfig, env: dict[str, str], script: str, nothing: str):
    """The job's id and a connection to ftgovd; (None, None) after a warning when either is missing (the script then
    exits 0: a failing prolog drains the node). ``script``: prolog or epilog; ``nothing``: what is then not done."""
    from governor.client.connection import Connection, DaemonUnavailable

    job_id = _job_id(env)
    if job_id is None:
        warn(f"SLURM_JOB_ID is not set: not run by slurmd as {script}? {nothing}")
        return None, None
    try:
        return job_id, Connection(config.socket, timeout_s=config.timeout_s)
    except DaemonUnavailable as e:
        warn(f"ftgovd is not reachable ({e}): {nothing}")
        return None, None


def prolog(config: SlurmConfig, env: dict[str, str]) -> int:
    from governor.client.connection import InvalidParams

    # Within run's alarm (CALLS_AT_MOST calls of timeout_s, plus 1 s): the sweep, last, stops before it.
    deadline = time.monotonic() + config.timeout_s * CALLS_AT_MOST
    job_id, conn = _connect(config, env, "a prolog", "nothing held, the job runs at the default clocks")
    if conn is None:
        return 0
    with conn:
        partition = env.get("SLURM_JOB_PARTITION")
        comment = env.get("SLURM_JOB_COMMENT")
        if comment is None and config.job_choice and config.comment_from_scontrol:
            try:
                comment = scontrol_field(own_record(job_id, env), "Comment",
                                         config.timeout_s)
            except AmbiguousField as e:
                warn(f"job {job_id}: the comment is not read: {e}")
        policy, source = choose_policy(config, partition, comment)
        uid = env.get("SLURM_JOB_UID", "")
        told = False  # the job's log has said why nothing is held
        try:
            gpus = job_gpus(env)
        except NoSlurmIndex as e:
            told = True
            warn(f"job {job_id}: {e}: the job runs at the default clocks")
            gpus = []  # held on none; a former run's hold under this id, on whichever GPUs, is released
        node_gpus = None
        if config.node_gpus_from_scontrol and gpus and any(isinstance(g, int) for g in gpus):
            node = env.get("SLURMD_NODENAME") or socketlib.gethostname()
            node_gpus = node_gpu_count(node, config.timeout_s)
            if node_gpus is None:
                warn(f"job {job_id}: slurmd's GPU count for node {node} could not be read (scontrol show node -o "
                     f"{node}): Slurm's numbers are read without that check (node_gpus_from_scontrol)")
        hold = {"slurm_job_id": job_id, "uid": int(uid) if uid.isdigit() else 0, "policy": policy, "gpus": gpus,
                "partition": partition, "gpu_numbering": config.gpu_numbering, "node_gpus": node_gpus}
        het_job_id = _job_id(env, "SLURM_HET_JOB_ID")  # a heterogeneous job's: its leader
        try:
            try:
                reply = conn.call("slurm_hold", **hold, het_job_id=het_job_id)
            except InvalidParams as e:
                if het_job_id is None or not isinstance(e.data, dict) or e.data.get("field") != "het_job_id":
                    raise
                # An ftgovd from before heterogeneous jobs (installed over, not restarted yet): hold all the same.
                warn(f"job {job_id}: ftgovd does not know heterogeneous jobs (restart it after an upgrade): held "
                     "without its leader's id, so a registration from its steps runs beside the hold")
                reply = conn.call("slurm_hold", **hold)
        except FtgovError as e:
            warn(f"{e}: the job runs at the default clocks")
        else:
            held = reply.get("gpus") or {}
            if not held and not told:
                info(f"job {job_id}: nothing held ({reply.get('why', 'no GPU')})")
            elif held:
                taken = reply.get("policy", policy)
                as_taken = "" if taken == policy else f", held as {taken} by ftgovd (its own policy: see its log)"
                info(f"job {job_id}: {policy} (from {source}{as_taken}) on GPU(s) " + ", ".join(
                    f"{gid} at {_mhz(g.get('freq_hz'))}" for gid, g in held.items()))
        # After the job's own hold: the sweep makes a squeue call for every other hold here, more than the alarm's
        # bound allows where slurmctld is slow, and the alarm then ended the prolog before the job was held.
        if config.sweep_stale:
            sweep_stale_holds(conn, config, job_id, deadline)
    return 0


def _mhz(hz) -> str:
    return "no pin" if hz is None else f"{hz / 1e6:.0f} MHz"


def epilog(config: SlurmConfig, env: dict[str, str]) -> int:
    from governor.client.connection import UnknownJob

    job_id, conn = _connect(config, env, "an epilog", "nothing released")
    if conn is None:
        return 0
    with conn:
        try:
            out = conn.call("slurm_release", slurm_job_id=job_id, why="epilog")
        except UnknownJob:
            info(f"job {job_id}: nothing held on this node")
            return 0
    summary = admin_comment_entry(out, env.get("SLURMD_NODENAME") or socketlib.gethostname())
    info(f"job {job_id}: released; {summary}")
    if not out.get("restored", True):
        warn(f"job {job_id}: a GPU's restore failed; ftgovd retries it (journalctl -u ftgovd)")
    if config.admin_comment:
        write_admin_comment(job_id, summary, config.timeout_s, record=own_record(job_id, env))
    return 0


def admin_comment_entry(out: dict, node: str) -> str:
    """This node's part of the job's AdminComment: ``ftgov@NODE:energy_j=...,saved_pct=...,policy=...,gpus=...``."""
    energy = out.get("energy_j")
    parts = [f"energy_j={'unknown' if energy is None else f'{energy:.1f}'}"]
    if out.get("saved_pct") is not None:
        err = out.get("saved_pct_err")
        parts.append(f"saved_pct={figure(out['saved_pct'], 'g')}" + ("" if err is None else f"+-{err:g}"))
    gpus = sorted(out.get("gpus") or {}, key=lambda gid: (len(gid), gid))  # NVML's indexes in order, as nvidia-smi's
    parts += [f"policy={out.get('policy')}", f"gpus={'+'.join(gpus)}"]
    return f"ftgov@{node}:" + ",".join(parts)


def merged_admin_comment(existing: str | None, entry: str) -> str:
    """The job's AdminComment with this node's entry replaced or added (each node of a job writes its own; other
    text in the field is kept)."""
    node = entry.split(":", 1)[0]
    kept = [p for p in (existing or "").split(";") if p and p != "(null)" and not p.startswith(node + ":")]
    return ";".join([*kept, entry])[-MAX_ADMIN_COMMENT:]


def write_admin_comment(job_id: int, entry: str, timeout_s: float, record: str | None = None) -> None:
    """Put this node's entry into the job's AdminComment, which `sacct -j ID -o AdminComment` shows
    (AccountingStorageType=accounting_storage/slurmdbd). ``scontrol update`` while slurmctld still lets the job be
    updated; once the job has finished (the node epilog usually runs after that), the accounting record itself, with
    ``sacctmgr modify job``. ``record``: how each command names the job's own record (own_record; the bare id
    without)."""
    target = record or str(job_id)
    try:
        existing, own = admin_comment_now(job_id, target, timeout_s)
    except AmbiguousField as e:
        warn(f"job {job_id}: AdminComment not written: {e}")
        return
    value = merged_admin_comment(existing, entry)
    done = _run([slurm_command("scontrol"), "update", f"JobId={own}", f"AdminComment={value}"], timeout_s)
    if done is not None and done.returncode != 0 and "already finished" in done.stderr:
        done = _run(_modify_admin_comment(own, value), timeout_s)
        # An array task's ARRAY_TASK names its record alone to Slurm 24.11's sacctmgr (its raw id, where that is the
        # array's, every task's); Slurm 22.05's finds no record by it, and its raw id names the task alone
        # (tests/slurm, bookworm and trixie).
        if own != target and _affected_nothing(done):
            done = _run(_modify_admin_comment(target, value), timeout_s)
        # ID+0 matches the leader's record only once slurmdbd has the job's heterogeneous fields, which reach it a
        # moment after the job ends (about 1.5 s in tests/slurm): until then sacctmgr says it changed nothing.
        waited, delay = 0.0, 0.25
        while target != str(job_id) and _affected_nothing(done) and waited + delay <= HET_RECORD_WAIT_S:
            time.sleep(delay)
            waited, delay = waited + delay, min(2 * delay, 1.0)
            done = _run(_modify_admin_comment(target, value), timeout_s)
    if done is None:
        warn(f"job {job_id}: could not write AdminComment")
    elif done.returncode != 0 and "didn't give me anything to set" in done.stderr + done.stdout:
        # Slurm 21.08's `sacctmgr modify job` sets Comment, DerivedExitCode and WCKey alone (tests/slurm on jammy).
        warn(f"job {job_id}: AdminComment not written: this Slurm's sacctmgr cannot set it in a finished job's "
             "record (Slurm before 22.05); admin_comment: false in slurm.yaml stops the epilog trying")
    elif done.returncode != 0:
        warn(f"job {job_id}: writing AdminComment failed: {(done.stderr or done.stdout).strip() or done.returncode}")


def _modify_admin_comment(record: str, value: str) -> list[str]:
    return [slurm_command("sacctmgr"), "-i", "modify", "job", "where", f"jobid={record}", "set",
            f"AdminComment={value}"]


def _affected_nothing(done: subprocess.CompletedProcess | None) -> bool:
    """sacctmgr found no record of that name (or the caller may not change it: Slurm says both at once)."""
    return done is not None and done.returncode != 0 and "didn't affect anything" in done.stderr + done.stdout


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, errors=OUTPUT_ERRORS, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        warn(f"{args[0]}: {e}")
        return None


def node_gpu_count(node: str, timeout_s: float) -> int | None:
    """How many GPUs slurmd offers on ``node``: the gpu entries of `scontrol show node -o NODE`'s Gres= summed
    ("gpu:4", "gpu:a100:2(S:0-1),gpu:v100:2", MIG profiles' counts too; shards and MPS are not GPUs). Slurm's GPU
    numbers count these. None when scontrol fails or names none."""
    done = _run([slurm_command("scontrol"), "show", "node", "-o", node], timeout_s)
    if done is None or done.returncode != 0:
        return None
    m = re.search(r"(?:^|\s)Gres=(\S+)", done.stdout)
    if m is None or m.group(1) == "(null)":
        return None
    total = 0
    for entry in re.sub(r"\([^)]*\)", "", m.group(1)).split(","):
        parts = entry.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        if not (parts[-1].isascii() and parts[-1].isdigit()):
            return None  # a count this reading does not know: better none than a wrong one
        total += int(parts[-1])
    return total


class AmbiguousField(FtgovError):
    """A field of `scontrol show job -o` that appears more than once: the job's own text (its name, its command,
    its directories, all the user's) carries ``Key=`` of it, and which one is Slurm's cannot be told."""


def own_record(job_id: int, env: dict[str, str]) -> str:
    """How scontrol and sacctmgr name the job's own record: ID+0 for a heterogeneous job's leader (SLURM_HET_JOB_ID
    is its own id), whose bare id names every component's (Slurm 22.05: `scontrol show job` prints them all,
    `scontrol update` and `sacctmgr modify job` change them all); ID otherwise. A job array's task is named by
    ARRAY_TASK where its AdminComment is read and written (admin_comment_now, from squeue): its prolog and epilog get
    no SLURM_ARRAY_JOB_ID to tell it by (Slurm 22.05 and 24.11, tests/slurm)."""
    return f"{job_id}+0" if _job_id(env, "SLURM_HET_JOB_ID") == job_id else str(job_id)


def scontrol_field(job: str, name: str, timeout_s: float) -> str | None:
    """One field of `scontrol show job -o JOB` (``job``: own_record's; None when scontrol fails or lacks it). The
    field runs to the next ``Key=`` of scontrol's one-line format, whose keys begin with a capital (JobId=, StdErr=,
    Socks/Node=): a comment "my run ftgov=off" is read whole, not cut at its own lower-case choice. AmbiguousField
    when ``name=`` appears twice in the whole output with two values (the job's own name or paths carry it). Twice
    with one value is read: `scontrol show job` of a job array's id prints every task of the array (Slurm 22.05),
    whose comments are one, and the prolog and epilog get no SLURM_ARRAY_TASK_ID to name the task alone by. The
    output is not cut into lines: Slurm prints the job's name, command and directories with their newlines, so a
    line that begins JobId=ID can end in the user's text, before Slurm's own field. The job's Comment is the user's
    own, all of that text the one user's: an optional field that only the admin sets (AdminComment) is read by
    admin_comment_now."""
    try:
        done = subprocess.run([slurm_command("scontrol"), "show", "job", "-o", job], capture_output=True,
                              text=True, errors=OUTPUT_ERRORS, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        warn(f"scontrol show job {job}: {e}")
        return None
    if done.returncode != 0:
        return None
    line = done.stdout.strip()
    # Slurm 22.05 pads some fields (AdminComment=, Comment=) with a second space: not the field's.
    values = {m.group(1).strip() for m in re.finditer(rf"(?:^|\s){name}=(.*?)(?=\s[A-Z][A-Za-z:/]*=|$)", line)}
    if len(values) > 1:
        raise AmbiguousField(f"scontrol show job {job}: {name}= appears more than once, with different values (the "
                             "job's own name, command or paths carry it)")
    value = values.pop() if values else None
    return None if value in (None, "", "(null)") else value


def admin_comment_now(job_id: int, job: str, timeout_s: float) -> tuple[str | None, str]:
    """The job's AdminComment as slurmctld holds it (None: unset), read off `scontrol show job -o JOB` (``job``:
    own_record's) where Slurm prints it, and the name that shows and changes the job's record alone: ``job``, or an
    array task's ARRAY_TASK. The task that has the array's id is named so too: under Slurm 24.11 `sacctmgr modify job
    where jobid=ID` changes every task of the array ID (tests/slurm on trixie: the last task's entry replaced the
    other task's), under 22.05 that task's alone (whose sacctmgr knows no ARRAY_TASK: write_admin_comment); and
    `scontrol show job` of the array's id shows every task (22.05).

    Slurm prints AdminComment= only when the field is set, and then right after WorkDir= (src/api/job_info.c:
    "WorkDir=%s", then, if set, "AdminComment=%s "). The user chooses the work dir, the job's name, command, comment
    and output paths, any of which can carry " AdminComment=...": where the field is unset, that would be the only
    one, and root would write the user's text into the admin-only field. So the field is read only right after
    "WorkDir=" and the work dir that squeue gives alone (`squeue -o %A|%F|%K|%Z`, the line of this job id), and
    WorkDir=, which Slurm prints once a record, must appear once after a space (the user's text can carry it after
    anything else: "JobName=WorkDir=/home/u AdminComment=..."). AmbiguousField where this cannot be told (squeue
    does not answer or lists the id twice, a work dir with a newline, WorkDir= twice)."""
    listed = _run([slurm_command("squeue"), "-h", "-t", "all", "-j", str(job_id), "-o", "%A|%F|%K|%Z"], timeout_s)
    lines = [] if listed is None or listed.returncode != 0 else listed.stdout.rstrip("\n").split("\n")
    fields = [line.split("|", 3) for line in lines]
    if not lines or any(len(f) != 4 or not f[0].isdigit() for f in fields):
        raise AmbiguousField(f"squeue -j {job_id} did not list the job's work dir, after which AdminComment is printed")
    mine = [f for f in fields if f[0] == str(job_id)]
    if len(mine) != 1:
        raise AmbiguousField(f"squeue -j {job_id} lists job {job_id} {len(mine)} times")
    _, array_id, task, work_dir = mine[0]
    if array_id.isdigit() and task.isdigit():
        job = f"{array_id}_{task}"  # the task's record alone
    done = _run([slurm_command("scontrol"), "show", "job", "-o", job], timeout_s)
    if done is None or done.returncode != 0:
        raise AmbiguousField(f"scontrol show job {job} did not answer")
    out = done.stdout.rstrip("\n")
    # Slurm's WorkDir= follows a space; one after anything else is the user's text (JobName=WorkDir=/home/u ...).
    keys = [m.end() for m in re.finditer(r"(?:^|\s)WorkDir=", out)]
    if len(keys) != 1:
        raise AmbiguousField(f"scontrol show job {job}: WorkDir= appears {len(keys)} times (the job's own name, "
                             "command or paths carry it)")
    if not out.startswith(work_dir, keys[0]):
        raise AmbiguousField(f"scontrol show job {job}: its WorkDir= is not {work_dir!r}, the work dir squeue gives")
    # Slurm 22.05 pads AdminComment= with a second space: not the field's.
    m = re.match(r"\s+AdminComment=(.*?)(?=\s[A-Z][A-Za-z:/]*=|$)", out[keys[0] + len(work_dir):])
    value = None if m is None else m.group(1).strip()
    return (None if value in (None, "", "(null)") else value), job


def sweep_stale_holds(conn, config: SlurmConfig, job_id: int, deadline: float | None = None) -> None:
    """Release the holds of jobs that Slurm no longer runs: their epilog was lost (slurmd killed, the epilog timed
    out). A job Slurm still lists (running, completing) keeps its hold; when squeue cannot answer, nothing goes.
    Stops where a squeue and a release might not end before ``deadline`` (time.monotonic()): the next prolog goes on.
    A hold released meanwhile (its epilog ended while squeue was asked) is passed over."""
    from governor.client.connection import UnknownJob

    holds = conn.call("status").get("holds") or []
    for hold in holds:
        other = hold.get("slurm_job_id")
        if other == job_id or not isinstance(other, int):
            continue
        if deadline is not None and time.monotonic() + 2 * config.timeout_s > deadline:
            warn("out of time for the sweep of stale holds: the next prolog goes on with it")
            return
        if slurm_knows(other, config.timeout_s) is False:
            try:
                conn.call("slurm_release", slurm_job_id=other, why="stale")
            except UnknownJob:
                continue  # its epilog released it after the status was read
            warn(f"job {other}: held, but Slurm no longer runs it (its epilog was lost): released")


def slurm_knows(job_id: int, timeout_s: float) -> bool | None:
    """Whether Slurm still lists the job (True/False), None when squeue cannot tell."""
    try:
        done = subprocess.run([slurm_command("squeue"), "-h", "-j", str(job_id), "-o", "%T"], capture_output=True,
                              text=True, errors=OUTPUT_ERRORS, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return False if "Invalid job id" in done.stderr else None
    return bool(done.stdout.strip())
