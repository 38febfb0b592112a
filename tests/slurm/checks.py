"""End-to-end checks of `ftgov slurm prolog|epilog` under a real Slurm; run.sh runs this in the booted container, after
`make install BACKEND=nvml`.

Setup: ftgovd governs two fake NVML GPUs (tests/support/fakenvml, through a drop-in that puts it first on the
daemon's PYTHONPATH) whose device files are /dev/nvidia2 and /dev/nvidia1 (NVML's order and the files' differ), which
slurmd offers as GRES gpu:2 and shard:4 (gres.conf File=/dev/nvidia[1-2]; no shards before Slurm 22.05, SHARDS_SINCE);
munge, MariaDB, slurmdbd, slurmctld and slurmd are the container's release's (Debian's or Ubuntu's: run.sh),
configured here as docs/slurm.md says. The node is the container's host name, in partition gpu (every check's but
one) and het. A second node, HET_NODE, only in partition het, is a second slurmd in a UTS and mount namespace of its
own (start_second_slurmd says how), offering /dev/nvidia2 alone (also as mps:100):
Slurm starts a heterogeneous job only with each component on a node of its own (the heterogeneous job's check). Both
nodes' prologs talk to the one ftgovd. Jobs are submitted by an unprivileged user
and wait on a FIFO, so a check decides when a job ends without sleeping. Where Slurm gives no event (a job's state),
its state is read with squeue/sacct at a bounded pace. Standard library only (the container's python3).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent
CLIENT = [sys.executable, str(SRC / "tests/systemd/ctclient.py")]
JOB_USER = "ftgovci"
CLUSTER = "ftgovci"
CI_DIR = Path("/run/ftgov-ci")
NVML_CALLS = CI_DIR / "nvml-calls.log"
GATES = Path("/var/tmp/ftgov-gates")  # the jobs' FIFOs: /var/tmp, which slurmd's jobs and the checks both see
# The fake GPUs' device files in NVML's order: NVML's GPU 0 is /dev/nvidia2, its GPU 1 /dev/nvidia1 (the two orders
# differ, as on PrincetonUniversity/jobstats#34's nodes, and the files do not start at 0).
DEVICE_MINORS = (2, 1)
SLURMDBD_LIB = Path("/opt/ftgov-ci/slurmdbd-lib")  # run.sh's, on trixie (it says why)
STATE_POLL_S = 0.2  # the pace at which a job's state is read where Slurm gives no event
JOB_STATE_TIMEOUT_S = 60
# Slurm's shard GRES came with 22.05: 21.08's slurmd (Ubuntu jammy's) exits at a gres.conf Name=shard line ("fatal:
# Invalid GRES record for shard, count does not match File value"). Before it the node offers no shards, and the shard
# check is skipped.
SHARDS_SINCE = (22, 5)
# The node epilog runs once slurmctld has the job finished, when `scontrol update` no longer takes it: ftgov writes
# AdminComment into the job's accounting record with `sacctmgr modify job`, which sets it from Slurm 22.05 on. 21.08's
# sets Comment, DerivedExitCode and WCKey alone (sacctmgr(1); "You didn't give me anything to set"): there the job's
# AdminComment stays empty, the epilog says so, and the checks read the entry the epilog logged (recorded_entries).
ADMIN_COMMENT_SINCE = (22, 5)
# Slurm 21.08 gives an MPS job's prolog no SLURM_JOB_GPUS and its GPU's device file number in CUDA_VISIBLE_DEVICES
# (/dev/nvidia2's 2), as 19.05 did for a GPU job (docs/slurm.md); 22.05 gives the GPU's index in both. A number
# without SLURM_JOB_GPUS holds nothing (governor/cli/slurm.py, job_gpus): under 21.08 the MPS job runs unheld.
MPS_INDEX_SINCE = (22, 5)


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def sh(*cmd: str, check: bool = True, timeout_s: float = 60, **kwargs) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    if check and p.returncode != 0:
        raise CheckFailed(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def call(method: str, params: dict | None = None) -> dict:
    reply = json.loads(sh(*CLIENT, "call", method, json.dumps(params or {}), timeout_s=30).stdout)
    expect("result" in reply, f"{method}: error reply {reply}")
    return reply["result"]


def wait_for(what: str, probe, timeout_s: float = JOB_STATE_TIMEOUT_S):
    """Read ``probe()`` at STATE_POLL_S until it returns something true (Slurm gives no event for a job's state or
    for its accounting record); its last value otherwise fails the check."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout_s:g} s waiting for {what} (last: {value!r})")
        time.sleep(STATE_POLL_S)


# ---- setup ----------------------------------------------------------------------------------------------------------
SLURM_CONF = """\
ClusterName={cluster}
SlurmctldHost={host}(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# slurmctld asks the node to re-register every 20 pings, a ping every SlurmdTimeout/3 s: that registration is how it
# learns a batch job's slurmstepd is gone (check_killed_slurmstepd_restores), about every 20 s here.
SlurmdTimeout=4
InactiveLimit=0
KillWait=5
# ftgov: the prolog holds the job's GPUs with the node's ftgovd, the epilog restores them (docs/slurm.md).
Prolog=/usr/local/libexec/ftgov/slurm-prolog
Epilog=/usr/local/libexec/ftgov/slurm-epilog
PrologFlags=Alloc
GresTypes={gres_types}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# Heterogeneous jobs are started by the backfill scheduler only, every bf_interval (30 s by default).
SchedulerParameters=bf_interval=1
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres={host_gres} State=UNKNOWN
# The second node (start_second_slurmd): its own address and port, one GPU; only heterogeneous jobs go there.
NodeName={node2} NodeAddr={node2_addr} Port={node2_port} CPUs={cpus} Gres=gpu:1,mps:100 State=UNKNOWN
PartitionName=gpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
PartitionName=het Nodes={host},{node2} MaxTime=INFINITE State=UP
"""

SLURMDBD_CONF = """\
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=ftgovci
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
"""

FTGOV_DROPIN = """\
[Service]
# The CI's two GPUs: the fake pynvml, first on the daemon's path, with a log of every NVML call it receives.
Environment=PYTHONPATH={fake} FAKENVML_CONFIG=/etc/ftgov/fakenvml.json FAKENVML_LOG={calls}
ReadWritePaths={ci_dir}
"""

WRAPPER = """\
#!/bin/sh
# slurm.conf's Prolog=/Epilog= take a program, not a command line; slurmd discards its output: to the journal.
# (CI only: the GPUs slurmd names to the prolog, for check_slurms_numbers_are_its_own_index; a heterogeneous job's
# leader as the prolog sees it, for check_a_heterogeneous_jobs_components_are_held_and_joined; an array task's ids,
# for check_an_array_jobs_tasks_are_held_each_and_accounted_each.)
[ {action} = prolog ] && echo "$SLURM_JOB_GPUS;$CUDA_VISIBLE_DEVICES" > /run/ftgov-ci/prolog-gpus.$SLURM_JOB_ID
[ {action} = prolog ] && echo "${{SLURM_HET_JOB_ID-unset}}" > /run/ftgov-ci/prolog-het.$SLURM_JOB_ID
echo "${{SLURM_ARRAY_JOB_ID-unset}}/${{SLURM_ARRAY_TASK_ID-unset}}" > /run/ftgov-ci/{action}-array.$SLURM_JOB_ID
systemd-cat -t ftgov-slurm /usr/local/bin/ftgov slurm {action} || /usr/local/bin/ftgov slurm {action}
exit 0
"""

JOB_SCRIPT = """\
#!/bin/sh
# Never heard of ftgov. It says it started (its node's prolog is done by then), then waits on its FIFO until the check
# lets it end (or scancel ends it).
echo "$SLURM_JOB_ID" > {ready}
read line < {gate}
echo "released: $line"
"""


# A job that knows ftgov: its process registers through the installed client (governor.job), which sends the
# SLURM_JOB_ID slurmstepd gave it and the GPU of CUDA_VISIBLE_DEVICES, and so joins the prolog's hold.
CLIENT_JOB_SCRIPT = """\
#!/opt/ftgov/bin/python
import governor
with governor.job(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0) as job:
    with open("{ready}", "w") as ready:
        ready.write(f"{{job.registration['slurm']['slurm_job_id']}}\\n")
    with open("{gate}") as gate:
        gate.readline()
"""


# The second node: a second slurmd (-N) in a UTS and mount namespace of its own, sharing the container's network
# namespace (its own address on lo and its own port) and so its ftgovd. Its own spool directory, pid file and log go
# over the first slurmd's paths in its namespace (slurm.conf names one of each, for both; this needs no slurmd built
# --enable-multiple-slurmd, whose %n in those paths was not tried), and so does its own slurm.yaml (NODE2_SLURM_YAML).
HET_NODE = "node2"
HET_NODE_ADDR = "127.0.0.2"
HET_NODE_PORT = 6820
HET_NODE_DIR = Path("/var/lib/slurm") / HET_NODE
# This node offers /dev/nvidia2 alone, NVML's GPU 0, to which its Slurm GPU 0 refers: gpu_numbering index reads 0
# as NVML's 0, the right GPU here by construction. node_gpus_from_scontrol is off since the one ftgovd governs both
# GPUs while slurmd here offers one: a count that differs holds no numbered GPU (docs/slurm.md), a protection for a
# node that offers some of its GPUs, which this one, sharing the other node's ftgovd, only seems to be. (Slurm
# 22.05's gres.conf has no UniqueId=, which would name the GPU by UUID and need neither setting.)
NODE2_SLURM_YAML = "policy: ffg\npartitions: {}\ngpu_numbering: index\nnode_gpus_from_scontrol: false\n"


def start_second_slurmd() -> None:
    """The second node's slurmd, as a transient unit (the container's shutdown stops it). Each path it shares with
    the first slurmd is bound over in its own mount namespace; the bind mounts need the paths to exist."""
    spool, pid, log = HET_NODE_DIR / "spool", HET_NODE_DIR / "slurmd.pid", Path(f"/var/log/slurm/slurmd-{HET_NODE}.log")
    spool.mkdir(parents=True, exist_ok=True)
    yaml = Path(f"/etc/ftgov/slurm-{HET_NODE}.yaml")
    yaml.write_text(NODE2_SLURM_YAML)
    for path in (pid, log, Path("/run/slurmd.pid"), Path("/var/log/slurm/slurmd.log")):
        path.touch()
    script = (f"hostname {HET_NODE}\n"
              f"mount --bind {spool} /var/lib/slurm/slurmd\n"
              f"mount --bind {pid} /run/slurmd.pid\n"
              f"mount --bind {log} /var/log/slurm/slurmd.log\n"
              f"mount --bind {yaml} /etc/ftgov/slurm.yaml\n"
              f"exec /usr/sbin/slurmd -D -N {HET_NODE}\n")
    sh("systemd-run", "--quiet", f"--unit=slurmd-{HET_NODE}", "unshare", "--uts", "--mount", "--propagation",
       "private", "sh", "-ec", script)


# A heterogeneous job (sbatch ... : ...): component 0's batch script runs on the first node and starts a task of
# component 1 on the second (srun --het-group=1), which says what Slurm gave it and registers through the installed
# client (governor.job sends its SLURM_JOB_ID and, with no CUDA driver here, its CUDA_VISIBLE_DEVICES' number).
HET_JOB_SCRIPT = """\
#!/bin/sh
echo "$SLURM_JOB_ID" > {{ready}}
exec srun --het-group=1 {task}
"""

HET_TASK_SCRIPT = """\
#!/opt/ftgov/bin/python
import json, os
import governor
NAMES = ("SLURM_JOB_ID", "SLURM_HET_JOB_ID", "SLURM_JOB_ID_HET_GROUP_0", "SLURM_JOB_ID_HET_GROUP_1", "SLURM_STEP_ID",
         "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS")
seen = {{name: os.environ.get(name) for name in NAMES}}
with governor.job(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40.0, gpu_util=60.0) as job:
    seen["registered_as"] = job.registration["slurm"]["slurm_job_id"]
    with open("{ready}", "w") as ready:
        ready.write(json.dumps(seen) + "\\n")
    with open("{gate}") as gate:
        gate.readline()
"""


def setup() -> None:
    host = socket.gethostname()
    # The container has its own network namespace with only a loopback, where getaddrinfo's AI_ADDRCONFIG finds no
    # IPv4 address (glibc counts any but 127.0.0.1) and Slurm's daemons cannot listen: one more address on lo.
    sh("ip", "addr", "add", "10.254.254.1/32", "dev", "lo")
    hosts = Path("/etc/hosts")
    hosts.write_text(f"127.0.0.1 localhost {host}\n{HET_NODE_ADDR} {HET_NODE}\n"
                     + (hosts.read_text() if hosts.exists() else ""))
    CI_DIR.mkdir(exist_ok=True)
    # ftgovd on two fake NVML GPUs.
    Path("/etc/ftgov/fakenvml.json").write_text(json.dumps({"gpus": [{"minor_number": m} for m in DEVICE_MINORS]}))
    config = Path("/etc/ftgov/ftgov.yaml")
    # FFG's level (a hold's own pin) high, so that a registration that joins the hold shows by its lower pick.
    config.write_text(config.read_text() + "\nbackend: nvml\nffg_freq_hz: 1830000000\n")
    dropin = Path("/etc/systemd/system/ftgovd.service.d/50-ci.conf")
    dropin.write_text(FTGOV_DROPIN.format(fake=SRC / "tests/support/fakenvml", calls=NVML_CALLS, ci_dir=CI_DIR))
    Path("/etc/ftgov/slurm.yaml").write_text("policy: ffg\npartitions: {}\n")
    libexec = Path("/usr/local/libexec/ftgov")
    libexec.mkdir(parents=True, exist_ok=True)
    for action in ("prolog", "epilog"):
        wrapper = libexec / f"slurm-{action}"
        wrapper.write_text(WRAPPER.format(action=action))
        wrapper.chmod(0o755)
    sh("systemctl", "daemon-reload")
    sh("systemctl", "restart", "ftgovd.service")
    gpus = call("status")["gpus"]
    expect([g["backend"] for g in gpus] == ["nvml", "nvml"], f"ftgovd does not govern two NVML GPUs: {gpus}")
    # The device nodes gres.conf names (slurmd checks they are devices; nothing opens them): NVIDIA's major 195.
    for minor in DEVICE_MINORS:
        if not Path(f"/dev/nvidia{minor}").exists():
            sh("mknod", f"/dev/nvidia{minor}", "c", "195", str(minor))
    # Slurm, as docs/slurm.md says.
    if not Path("/etc/munge/munge.key").exists():
        sh("mungekey", "--create")
        sh("chown", "munge:munge", "/etc/munge/munge.key")
    sh("systemctl", "start", "munge.service", "mariadb.service")
    sh("mysql", "-e", "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'ftgovci'; "
       "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
    etc = Path("/etc/slurm")
    etc.mkdir(exist_ok=True)
    STATE["slurm"] = slurm_version()
    shards = STATE["slurm"] >= SHARDS_SINCE
    (etc / "slurm.conf").write_text(SLURM_CONF.format(cluster=CLUSTER, host=host, cpus=os.cpu_count() or 1,
                                                      node2=HET_NODE, node2_addr=HET_NODE_ADDR,
                                                      node2_port=HET_NODE_PORT,
                                                      gres_types="gpu,shard,mps" if shards else "gpu,mps",
                                                      host_gres="gpu:2,shard:4" if shards else "gpu:2"))
    files = f"/dev/nvidia[{min(DEVICE_MINORS)}-{max(DEVICE_MINORS)}]"
    (etc / "gres.conf").write_text(
        f"NodeName={host} Name=gpu File={files}\n"
        + (f"NodeName={host} Name=shard Count=4 File={files}\n" if shards else "")
        + f"NodeName={HET_NODE} Name=gpu File=/dev/nvidia{DEVICE_MINORS[0]}\n"  # NVML's GPU 0 (NODE2_SLURM_YAML)
        + f"NodeName={HET_NODE} Name=mps Count=100 File=/dev/nvidia{DEVICE_MINORS[0]}\n")  # the same GPU, as MPS
    dbd = etc / "slurmdbd.conf"
    dbd.write_text(SLURMDBD_CONF)
    sh("chown", "slurm:slurm", str(dbd))
    dbd.chmod(0o600)
    for d in ("/var/log/slurm", "/var/lib/slurm/slurmctld", "/var/lib/slurm/slurmd"):
        Path(d).mkdir(parents=True, exist_ok=True)
    sh("chown", "-R", "slurm:slurm", "/var/log/slurm", "/var/lib/slurm/slurmctld")
    if SLURMDBD_LIB.is_dir():  # run.sh put it there (trixie): a libmariadb3 with which slurmdbd runs
        dropin = Path("/etc/systemd/system/slurmdbd.service.d/50-ci.conf")
        dropin.parent.mkdir(parents=True, exist_ok=True)
        dropin.write_text(f"[Service]\nEnvironment=LD_LIBRARY_PATH={SLURMDBD_LIB}\n")
        sh("systemctl", "daemon-reload")
    sh("systemctl", "start", "slurmdbd.service")
    # slurmdbd answers once it has its tables: sacctmgr's own retry is the wait.
    wait_for("slurmdbd", lambda: sh("sacctmgr", "-i", "add", "cluster", CLUSTER, check=False).returncode == 0, 60)
    sh("systemctl", "start", "slurmctld.service", "slurmd.service")
    nodes = {f"{host} idle", f"{HET_NODE} idle"}
    wait_for("the node to be idle", lambda: f"{host} idle" in node_states())
    start_second_slurmd()
    wait_for(f"both nodes to be idle ({', '.join(nodes)})", lambda: node_states() == nodes)
    sh("useradd", "--create-home", "--groups", "ftgov", JOB_USER)  # ftgov: it may reach the daemon's socket
    GATES.mkdir(mode=0o777, exist_ok=True)
    GATES.chmod(0o1777)
    print("  slurm up:", "; ".join(sh("sinfo", "-h", "-o", "%P %N %T %G").stdout.split("\n")).strip("; "))


def slurm_version() -> tuple[int, int]:
    """Slurm's release as (year, month), from `slurmd -V` ("slurm 22.05.8", "slurm-wlm 21.08.5"), which needs no
    slurm.conf (sinfo --version does: it is read before slurm.conf is written)."""
    out = sh("slurmd", "-V").stdout
    m = re.search(r"(\d+)\.(\d+)\.", out)
    expect(m is not None, f"slurmd -V: {out!r}")
    return int(m[1]), int(m[2])


def admin_comment_written() -> bool:
    return STATE["slurm"] >= ADMIN_COMMENT_SINCE


def recorded_entries(jobs: str) -> dict[str, str]:
    """Each job's AdminComment as sacct shows it (``jobs``: sacct -j's list), by its raw id. Before Slurm 22.05
    (ADMIN_COMMENT_SINCE), each job's entry as its epilog logged it ("job ID: released; ENTRY"), for every job whose
    epilog also said it could not write it."""
    if admin_comment_written():
        out = sh("sacct", "-j", jobs, "-X", "-n", "-P", "-o", "JobIDRaw,AdminComment%400", check=False).stdout
        return dict(line.split("|", 1) for line in out.strip().splitlines() if "|" in line)
    log = sh("journalctl", "-t", "ftgov-slurm", "--no-pager", "-o", "cat", check=False).stdout
    refused = set(re.findall(r"job (\d+): AdminComment not written: this Slurm.s sacctmgr cannot", log))
    return {job: entry for job, entry in re.findall(r"job (\d+): released; (ftgov@\S+)", log) if job in refused}


def recorded_where() -> str:
    """Where recorded_entries read, for the checks' output."""
    return "sacct AdminComment" if admin_comment_written() else "AdminComment not written (Slurm 21.08), the epilog's"


def node_states() -> set[str]:
    """Each node's "NAME STATE" (sinfo lists a node once per partition)."""
    return set(sh("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.strip().splitlines())


# ---- jobs -----------------------------------------------------------------------------------------------------------
def submit(name: str, *args: str, script_text: str = JOB_SCRIPT) -> tuple[int, Path]:
    """Submit a job as JOB_USER that waits on its own FIFO, and wait until its script has started (the prolog is done
    then: slurmd starts the script after it); its id and the FIFO."""
    gate, ready = GATES / name, GATES / f"{name}.ready"
    for fifo in (gate, ready):
        os.mkfifo(fifo)
        fifo.chmod(0o666)
    script = Path(f"/home/{JOB_USER}/{name}.sh")
    script.write_text(script_text.format(gate=gate, ready=ready))
    script.chmod(0o755)
    out = sh("runuser", "-u", JOB_USER, "--", "sbatch", "--parsable", f"--job-name={name}",
             f"--output=/home/{JOB_USER}/{name}.out", *args, str(script), cwd=f"/home/{JOB_USER}").stdout
    job_id = int(out.strip().split(";")[0])
    started = read_fifo(ready, JOB_STATE_TIMEOUT_S)
    expect(started == str(job_id), f"job {job_id} did not start within {JOB_STATE_TIMEOUT_S} s (read {started!r}; "
           f"squeue: {job_state(job_id)!r}, why: "
           f"{sh('squeue', '-h', '-j', str(job_id), '-o', '%i %r', check=False).stdout.strip()!r})")
    return job_id, gate


def read_fifo(path: Path, timeout_s: float) -> str | None:
    """The first line written to a FIFO, waiting for its writer up to timeout_s (None: none came). The open blocks
    until the writer opens its end: a thread waits on it, so the wait is bounded."""
    got: list[str] = []

    def read() -> None:
        with open(path) as f:
            got.append(f.readline().strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if got:
        return got[0]
    try:  # unblock the reader: open the write end ourselves
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass
    return None


def job_state(job_id: int) -> str:
    """squeue's state of the job; "" once Slurm no longer lists it (ended, its epilog done)."""
    return sh("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()


def hold_of(job_id: int) -> dict | None:
    return next((h for h in call("status")["holds"] if h["slurm_job_id"] == job_id), None)


def wait_running_and_held(job_id: int) -> dict:
    hold = hold_of(job_id)  # the prolog ran before the job's script started (submit waited for that)
    expect(hold is not None, f"job {job_id} runs but ftgovd holds nothing for it: {call('status')['holds']}")
    return hold


def wait_gone(job_id: int, timeout_s: float = 90) -> None:
    wait_for(f"job {job_id} to leave the queue (its epilog done)", lambda: job_state(job_id) == "", timeout_s)


def release_gate(gate: Path) -> None:
    fd = os.open(gate, os.O_WRONLY)  # the job's reader has it open: it is RUNNING
    os.write(fd, b"go\n")
    os.close(fd)


def expect_restored(job_id: int) -> None:
    status = call("status")
    expect(all(g["pinned_hz"] is None for g in status["gpus"]),
           f"after job {job_id}: GPUs still pinned: {[g['pinned_hz'] for g in status['gpus']]}")
    expect(hold_of(job_id) is None, f"after job {job_id}: its hold is still there")


def resets() -> int:
    return NVML_CALLS.read_text().split().count("nvmlDeviceResetGpuLockedClocks") if NVML_CALLS.exists() else 0


# ---- checks ---------------------------------------------------------------------------------------------------------
STATE: dict = {}


def check_slurms_numbers_are_its_own_index() -> None:
    """Slurm gives the prolog its GRES index (docs/slurm.md): the first of gres.conf's files, /dev/nvidia1, is 0.
    Read by gpu_numbering auto, Slurm's 0 is ambiguous here (in NVML's order it is /dev/nvidia2, in the files' order
    /dev/nvidia1): the prolog holds nothing and says which setting decides. The rest of the checks run under
    device_file, which this gres.conf's numbering is."""
    job_id, gate = submit("ambiguous", "--gres=gpu:1")
    seen = (CI_DIR / f"prolog-gpus.{job_id}").read_text().strip()
    print(f"    job {job_id}: the prolog got SLURM_JOB_GPUS;CUDA_VISIBLE_DEVICES = {seen!r}")
    expect(seen == "0;0", f"the prolog's GPUs {seen!r}: not Slurm's index of the first GPU (its device file's is 1)")
    node = sh("sinfo", "-h", "-p", "gpu", "-o", "%N").stdout.strip()
    counted = sh("/opt/ftgov/bin/python", "-c", "from governor.cli.slurm import node_gpu_count as n; "
                 f"print(n({node!r}, 10))").stdout.strip()
    expect(counted == "2", f"the prolog reads slurmd's GPUs on {node} off scontrol as {counted}, want 2")
    expect(hold_of(job_id) is None, f"an ambiguous number was held: {call('status')['holds']}")
    log = sh("journalctl", "-t", "ftgov-slurm", "--no-pager", check=False).stdout
    expect("Slurm's GPU 0 is ambiguous on this node" in log and "gpu_numbering" in log,
           f"the prolog did not say why it held nothing: {log[-600:]}")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)
    Path("/etc/ftgov/slurm.yaml").write_text("policy: ffg\npartitions: {}\ngpu_numbering: device_file\n")


def check_gres_job_pins_both_gpus_and_restores() -> None:
    before = resets()
    job_id, gate = submit("two-gpus", "--gres=gpu:2")
    hold = wait_running_and_held(job_id)
    status = call("status")
    expect(set(hold["gpus"]) == {"0", "1"}, f"the hold is not on both GPUs: {hold}")
    expect(hold["policy"] == "ffg" and hold["uid"] == int(sh("id", "-u", JOB_USER).stdout),
           f"hold policy/uid: {hold}")
    pinned = [g["pinned_hz"] for g in status["gpus"]]
    expect(all(p is not None for p in pinned), f"GPUs not pinned while job {job_id} runs: {pinned}")
    print(f"    job {job_id}: GPUs 0 and 1 pinned at {pinned} Hz")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)
    expect(resets() - before == 2, f"{resets() - before} NVML resets after the job, want one per GPU")
    STATE["accounted"] = job_id


def check_sacct_shows_the_energy() -> None:
    job_id = STATE["accounted"]

    def admin_comment() -> str:
        comment = recorded_entries(str(job_id)).get(str(job_id), "")
        return comment if "ftgov@" in comment else ""

    try:
        comment = wait_for(f"sacct to show job {job_id}'s AdminComment", admin_comment, 30)
    except CheckFailed:
        print(sh("sacct", "-j", str(job_id), "-P", "-o", "JobID,State,AdminComment%200", check=False).stdout)
        raise
    expect(re.search(r"ftgov@[^:]+:energy_j=\d+(\.\d)?,", comment) is not None, f"AdminComment: {comment!r}")
    expect("gpus=0+1" in comment and "policy=ffg" in comment, f"AdminComment: {comment!r}")
    print(f"    job {job_id}: {recorded_where()}: {comment}")


def check_a_jobs_own_text_never_reaches_its_admincomment() -> None:
    """Slurm 22.05 prints AdminComment= only once the field is set, after WorkDir=; the user chooses the job's
    comment and work dir. A job whose --comment and work dir both carry " AdminComment=forged..." ends with ftgov's
    entry alone in the admin-only field (before, root wrote the user's text into it)."""
    work_dir = Path(f"/home/{JOB_USER}/d AdminComment=forged-dir")
    work_dir.mkdir(exist_ok=True)
    shutil.chown(work_dir, JOB_USER, JOB_USER)
    job_id, gate = submit("forge", "--gres=gpu:1", "--comment=c AdminComment=forged-comment", f"--chdir={work_dir}")
    wait_running_and_held(job_id)
    release_gate(gate)
    wait_gone(job_id)

    def admin_comment() -> str:
        comment = recorded_entries(str(job_id)).get(str(job_id), "")
        return comment if "ftgov@" in comment else ""

    comment = wait_for(f"sacct to show job {job_id}'s AdminComment", admin_comment, 30)
    expect("forged" not in comment and comment.count("ftgov@") == 1 and comment.startswith("ftgov@"),
           f"AdminComment: {comment!r}")
    if not admin_comment_written():  # nothing is written there: its record's field stays empty
        field = sh("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "AdminComment%400").stdout.strip()
        expect(field == "", f"job {job_id}'s AdminComment under Slurm 21.08: {field!r}")
    print(f"    job {job_id} (its comment and work dir carry AdminComment=): {recorded_where()}: {comment}")


def check_scancel_mid_job_restores() -> None:
    job_id, _gate = submit("cancelled", "--gres=gpu:2")
    wait_running_and_held(job_id)
    sh("scancel", str(job_id))
    wait_gone(job_id)
    expect_restored(job_id)


def check_killed_slurmstepd_restores() -> None:
    # --no-requeue: Slurm ends a job whose batch step vanished as a node failure, which requeues it by default.
    job_id, gate = submit("stepd-killed", "--gres=gpu:1", "--no-requeue")
    wait_running_and_held(job_id)
    pids = [int(p) for p in sh("pgrep", "-f", f"^slurmstepd: \\[{job_id}\\.batch\\]", check=False).stdout.split()]
    expect(bool(pids), f"no slurmstepd for job {job_id}: {sh('ps', 'axo', 'pid,args').stdout}")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    print(f"    job {job_id}: SIGKILLed slurmstepd {pids}")
    killed = time.monotonic()
    # slurmctld ends the job when the node's next registration lacks it ("missing from batch node": about 20 to 40 s
    # here, from SlurmdTimeout), then the epilog runs.
    wait_gone(job_id, 120)
    print(f"    job {job_id}: ended by Slurm {time.monotonic() - killed:.0f} s after the kill; epilog done")
    expect_restored(job_id)
    try:  # the job's own script may outlive its stepd (proctrack/linuxproc): let it end
        fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
    except OSError:
        pass


def check_comment_chooses_off() -> None:
    job_id, gate = submit("opted-out", "--gres=gpu:1", "--comment=ftgov=off")
    hold = wait_running_and_held(job_id)
    expect(hold["policy"] == "off", f"--comment ftgov=off gave {hold['policy']}")
    expect(all(g["pinned_hz"] is None for g in call("status")["gpus"]), "ftgov=off pinned a GPU")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)


def check_shard_jobs_are_held_on_their_gpu_and_share_it() -> None:
    """A node whose GPUs Slurm also offers as shards (gres.conf Name=shard, GresTypes=gpu,shard): a job given a
    shard gets the shard's GPU in SLURM_JOB_GPUS (Slurm 22.05: its index, as a GPU job's), so its prolog holds that
    GPU; two shard jobs on one GPU hold it together (ftgovd's rule for several holds), and it is restored only when
    the last of them ends."""
    first, first_gate = submit("shard-a", "--gres=shard:1")
    second, second_gate = submit("shard-b", "--gres=shard:1")
    envs = {job: (CI_DIR / f"prolog-gpus.{job}").read_text().strip() for job in (first, second)}
    holds = {job: wait_running_and_held(job) for job in (first, second)}
    gpus = {job: set(h["gpus"]) for job, h in holds.items()}
    expect(all(len(g) == 1 for g in gpus.values()), f"a shard job holds one GPU each: {gpus}")
    pinned = {g["id"]: g["pinned_hz"] for g in call("status")["gpus"]}
    expect(all(pinned[gid] is not None for g in gpus.values() for gid in g), f"shard jobs' GPUs not pinned: {pinned}")
    shared = gpus[first] == gpus[second]
    print(f"    shard jobs {first} and {second}: prolog SLURM_JOB_GPUS;CUDA_VISIBLE_DEVICES {envs[first]} and "
          f"{envs[second]}; held on GPU {', '.join(sorted(gpus[first]))} and {', '.join(sorted(gpus[second]))}"
          f"{' (one GPU, shared)' if shared else ''}")
    release_gate(first_gate)
    wait_gone(first)
    expect(hold_of(first) is None, f"job {first}'s hold outlived it")
    still = next(g["pinned_hz"] for g in call("status")["gpus"] if g["id"] in gpus[second])
    expect(still is not None, f"job {second}'s GPU was restored when job {first} ended")
    release_gate(second_gate)
    wait_gone(second)
    expect_restored(second)


def check_an_mps_job_is_held_on_its_gpu() -> None:
    """A job given a share of a GPU through CUDA MPS (gres.conf Name=mps on HET_NODE, --gres=mps:50) gets the GPU's
    index in SLURM_JOB_GPUS (Slurm 22.05), so its prolog holds that GPU (HET_NODE's /dev/nvidia2, NVML's 0) and its
    epilog restores it. (No MPS daemon runs here: Slurm's part, the environment, is what is checked.) Under Slurm
    21.08 (MPS_INDEX_SINCE) the prolog holds nothing and says why."""
    job_id, gate = submit("mps", "--partition=het", f"--nodelist={HET_NODE}", "--gres=mps:50")
    env = (CI_DIR / f"prolog-gpus.{job_id}").read_text().strip()
    if STATE["slurm"] < MPS_INDEX_SINCE:
        expect(env == f";{DEVICE_MINORS[0]}", f"job {job_id}'s prolog under Slurm 21.08: {env!r}")
        expect(hold_of(job_id) is None, f"job {job_id} held: {call('status')['holds']}")
        log = sh("journalctl", "-t", "ftgov-slurm", "--no-pager", check=False).stdout
        expect(f"job {job_id}: CUDA_VISIBLE_DEVICES={DEVICE_MINORS[0]} without SLURM_JOB_GPUS" in log,
               f"the prolog did not say why it held nothing: {log[-600:]}")
        print(f"    job {job_id} (mps:50): prolog SLURM_JOB_GPUS;CUDA_VISIBLE_DEVICES {env} (its device file's "
              "number): nothing held, the prolog says why")
        release_gate(gate)
        wait_gone(job_id)
        expect_restored(job_id)
        return
    hold = wait_running_and_held(job_id)
    expect(set(hold["gpus"]) == {"0"}, f"job {job_id} (mps:50 on {HET_NODE}) held {sorted(hold['gpus'])}, want 0")
    print(f"    job {job_id} (mps:50): prolog SLURM_JOB_GPUS;CUDA_VISIBLE_DEVICES {env}; held on GPU 0")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)


def check_a_job_that_registers_joins_its_hold() -> None:
    job_id, gate = submit("registers", "--gres=gpu:1", "--comment=ftgov=mlg", script_text=CLIENT_JOB_SCRIPT)
    hold = wait_running_and_held(job_id)
    status = call("status")
    jobs = status["jobs"]
    expect(len(jobs) == 1 and hold["joined"] == [jobs[0]["job_id"]], f"not joined: hold {hold}, jobs {jobs}")
    gid = jobs[0]["gpu"]
    expect(hold["gpus"][gid]["joined"] is True, f"hold on GPU {gid} not marked joined: {hold}")
    pinned = next(g["pinned_hz"] for g in status["gpus"] if g["id"] == gid)
    expect(pinned == jobs[0]["freq_hz"] < hold["gpus"][gid]["freq_hz"] and jobs[0]["policy"] == "mlg",
           f"GPU {gid} at {pinned}: want the joined job's {jobs[0]['policy']} pick {jobs[0]['freq_hz']}, below the "
           f"hold's {hold['gpus'][gid]['freq_hz']} (a second job beside the hold would leave the hold's)")
    print(f"    job {job_id}: its registration (daemon job {jobs[0]['job_id']}) joined the hold; GPU {gid} at "
          f"{pinned} Hz (mlg on its features; the hold alone: {hold['gpus'][gid]['freq_hz']} Hz)")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)
    expect(call("status")["jobs"] == [], "the joined registration outlived its Slurm job")


def check_a_heterogeneous_jobs_components_are_held_and_joined() -> None:
    """A heterogeneous job is a job per component, each with its own id, prolog, epilog and hold (docs/slurm.md).
    Component 0 (the leader) on the first node, component 1 on HET_NODE, each --gres=gpu:1: each prolog holds its
    node's GPU under its own id, the component's saying its leader's (SLURM_HET_JOB_ID); a task of component 1
    (srun --het-group=1) registers with the SLURM_JOB_ID Slurm gives it, printed here, and joins component 1's hold;
    both epilogs release and restore, each writing its own accounting record (the leader's also when it comes
    late)."""
    host = socket.gethostname()
    name = "heterogeneous"
    task_ready = GATES / f"{name}.task.ready"  # .ready: cleanup() leaves it alone
    os.mkfifo(task_ready)
    task_ready.chmod(0o666)
    task = Path(f"/home/{JOB_USER}/{name}-task.py")
    task.write_text(HET_TASK_SCRIPT.format(ready=task_ready, gate=GATES / name))
    task.chmod(0o755)
    component = ("--partition=het", "--gres=gpu:1", "--comment=ftgov=mlg")
    leader, gate = submit(name, f"--nodelist={host}", *component, ":", f"--nodelist={HET_NODE}", *component,
                          script_text=HET_JOB_SCRIPT.format(task=task))
    got = read_fifo(task_ready, JOB_STATE_TIMEOUT_S)
    expect(got is not None, f"job {leader}: component 1's task did not start: {sh('squeue', check=False).stdout}")
    seen = json.loads(got)
    # The components' own ids as Slurm lists them ("LEADER+OFFSET ID").
    ids = dict(line.split() for line in sh("squeue", "-h", "-j", str(leader), "-o", "%i %A").stdout.splitlines())
    expect(ids.get(f"{leader}+0") == str(leader) and f"{leader}+1" in ids, f"job {leader}'s components: {ids}")
    comp = int(ids[f"{leader}+1"])
    print(f"    job {leader}+1 (job {comp}): its task (srun --het-group=1, on {seen['SLURMD_NODENAME']}) sees "
          f"SLURM_JOB_ID={seen['SLURM_JOB_ID']}, SLURM_HET_JOB_ID={seen['SLURM_HET_JOB_ID'] or '(unset)'}, "
          f"SLURM_JOB_ID_HET_GROUP_1={seen['SLURM_JOB_ID_HET_GROUP_1']}, "
          f"CUDA_VISIBLE_DEVICES={seen['CUDA_VISIBLE_DEVICES']}; it registered as Slurm job {seen['registered_as']}")
    expect(seen["SLURMD_NODENAME"] == HET_NODE, f"component 1's task ran on {seen['SLURMD_NODENAME']}")
    expect(seen["registered_as"] == int(seen["SLURM_JOB_ID"]) and seen["registered_as"] in (leader, comp),
           f"the task registered as {seen['registered_as']}, not its SLURM_JOB_ID (leader {leader}, own {comp})")
    # (a) Each prolog held its node's GPU under its component's own id; the component's sent its leader's.
    prologs = {job: (CI_DIR / f"prolog-het.{job}").read_text().strip() for job in (leader, comp)}
    print(f"    the prologs' SLURM_HET_JOB_ID: job {leader}: {prologs[leader]}, job {comp}: {prologs[comp]}")
    status = call("status")
    holds = {h["slurm_job_id"]: h for h in status["holds"]}
    expect(set(holds) == {leader, comp}, f"holds {sorted(holds)}, want the components' {leader} and {comp}")
    # The first node's Slurm GPU 0 is /dev/nvidia1, NVML's 1 (device_file); HET_NODE's is /dev/nvidia2, NVML's 0.
    expect(set(holds[leader]["gpus"]) == {"1"} and set(holds[comp]["gpus"]) == {"0"},
           f"held GPUs: job {leader} {sorted(holds[leader]['gpus'])} (want 1), job {comp} "
           f"{sorted(holds[comp]['gpus'])} (want 0)")
    expect(holds[comp].get("het_job_id") == leader and "het_job_id" not in holds[leader],
           f"het_job_id: job {leader}'s {holds[leader].get('het_job_id')} (want none: it is the leader), job "
           f"{comp}'s {holds[comp].get('het_job_id')} (want {leader})")
    # The sweep of stale holds (the next prolog on a node) asks squeue by a hold's own id: a component's must be
    # listed, or a job's prolog would release a live component's hold.
    listed = sh("squeue", "-h", "-j", str(comp), "-o", "%T", check=False).stdout.split()
    expect(listed == ["RUNNING"], f"squeue -j {comp} (the sweep's question) lists {listed}, not RUNNING")
    # (c) The task's registration joined component 1's hold, whose GPU its own pick drives. With no CUDA driver here
    # the task names its GPU by CUDA_VISIBLE_DEVICES' number, 0; the one ftgovd holds both components' GPUs, so it
    # reads 0 as NVML's index (docs/slurm.md), HET_NODE's GPU by construction. On a real cluster each node's ftgovd
    # holds its own component's GPU alone.
    jobs = status["jobs"]
    expect(len(jobs) == 1 and holds[comp]["joined"] == [jobs[0]["job_id"]] and holds[leader]["joined"] == [],
           f"not joined to job {comp}'s hold: holds {holds}, jobs {jobs}")
    gid = jobs[0]["gpu"]
    pinned = {g["id"]: g["pinned_hz"] for g in status["gpus"]}
    expect(gid == "0" and holds[comp]["gpus"][gid]["joined"] is True, f"joined on GPU {gid}: {holds[comp]}")
    expect(pinned[gid] == jobs[0]["freq_hz"] < holds[comp]["gpus"][gid]["freq_hz"] and jobs[0]["policy"] == "mlg",
           f"GPU {gid} at {pinned[gid]}: want the joined job's mlg pick {jobs[0]['freq_hz']}, below the hold's "
           f"{holds[comp]['gpus'][gid]['freq_hz']}")
    expect(pinned["1"] == holds[leader]["gpus"]["1"]["freq_hz"], f"job {leader}'s GPU 1 at {pinned['1']}")
    print(f"    holds: job {leader} on GPU 1 at {pinned['1']} Hz; job {comp} (het_job_id {leader}) on GPU 0, joined by "
          f"daemon job {jobs[0]['job_id']}, at its pick {pinned[gid]} Hz")
    # (d) Both epilogs release and restore; each component's record has its own node's entry.
    release_gate(gate)
    wait_gone(leader)
    wait_gone(comp)
    expect_restored(leader)
    expect_restored(comp)
    expect(call("status")["jobs"] == [], "the joined registration outlived its Slurm job")

    def comments() -> dict[str, str] | None:
        got = recorded_entries(f"{leader},{comp}")
        return got if all("ftgov@" in got.get(str(job), "") for job in (leader, comp)) else None

    recorded = wait_for(f"sacct to show jobs {leader} and {comp}'s AdminComment", comments, 30)
    expect(recorded[str(leader)].startswith(f"ftgov@{host}:") and "gpus=1" in recorded[str(leader)]
           and recorded[str(comp)].startswith(f"ftgov@{HET_NODE}:") and "gpus=0" in recorded[str(comp)]
           and "ftgov@" not in recorded[str(leader)][1:] + recorded[str(comp)][1:], f"AdminComments: {recorded}")
    print(f"    {recorded_where()}: job {leader}: {recorded[str(leader)]}; job {comp}: {recorded[str(comp)]}")
    if not admin_comment_written():
        print("    (a late leader's epilog: not run, nothing is written to a record under Slurm 21.08)")
        return
    # The leader's epilog names its own record alone, also where it comes once slurmdbd knows the job's components
    # (slurmd's came before: about 1.5 s after the job's end here), when the leader's bare id names every component's
    # record to sacctmgr: made by hand here, a hold again and the epilog with slurmd's environment for the leader.
    wait_for(f"slurmdbd to list job {leader}'s components under its id", lambda: len(sh(
        "sacct", "-j", str(leader), "-X", "-n", "-o", "JobIDRaw", check=False).stdout.split()) == 2, 30)
    call("slurm_hold", {"slurm_job_id": leader, "uid": 0, "policy": "off", "gpus": [1], "gpu_numbering": "index",
                        "het_job_id": leader})
    out = sh("env", f"SLURM_JOB_ID={leader}", f"SLURM_HET_JOB_ID={leader}", f"SLURMD_NODENAME={host}",
             "/usr/local/bin/ftgov", "slurm", "epilog")
    expect(f"job {leader}: released" in out.stdout and "AdminComment" not in out.stderr, f"epilog: {out}")
    again = comments() or {}
    expect(again.get(str(comp)) == recorded[str(comp)] and "policy=off" in again.get(str(leader), ""),
           f"a late leader's epilog: AdminComments {again} (job {comp}'s was {recorded[str(comp)]!r})")
    expect_restored(leader)


def check_lost_epilog_is_caught_by_the_next_prolog() -> None:
    """A hold whose epilog never came (made here by hand, for a job id Slurm never had) is released by the next job's
    prolog on the node, which asks squeue about every held job."""
    lost = 999999
    call("slurm_hold", {"slurm_job_id": lost, "uid": 0, "policy": "ffg", "gpus": [1], "gpu_numbering": "index"})
    expect(next(g for g in call("status")["gpus"] if g["id"] == "1")["pinned_hz"] is not None, "lost hold not pinned")
    job_id, gate = submit("after-a-lost-epilog", "--gres=gpu:1")
    expect(hold_of(lost) is None, f"job {job_id}'s prolog left the lost hold of job {lost}: {call('status')['holds']}")
    log = sh("journalctl", "-t", "ftgov-slurm", "--no-pager", check=False).stdout
    expect(f"job {lost}: held, but Slurm no longer runs it" in log, f"the prolog did not say it released {lost}")
    release_gate(gate)
    wait_gone(job_id)
    expect_restored(job_id)


ARRAY_SCRIPT = """\
#!/bin/sh
# A task of a job array: says its ids, then waits on its own FIFO.
echo "$SLURM_JOB_ID $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID" > {base}.$SLURM_ARRAY_TASK_ID.ready
read line < {base}.$SLURM_ARRAY_TASK_ID
"""


def run_array(name: str, array_id_last: bool) -> None:
    """A two-task array, each task --gres=gpu:1: each held under its own job id on its own GPU, restored, and
    accounted in its own AdminComment; the task with the array's id ends last or first (see the check)."""
    base = GATES / name
    for task in (0, 1):
        for fifo in (GATES / f"{name}.{task}", GATES / f"{name}.{task}.ready"):
            os.mkfifo(fifo)
            fifo.chmod(0o666)
    script = Path(f"/home/{JOB_USER}/{name}.sh")
    script.write_text(ARRAY_SCRIPT.format(base=base))
    script.chmod(0o755)
    out = sh("runuser", "-u", JOB_USER, "--", "sbatch", "--parsable", f"--job-name={name}", "--array=0-1",
             "--gres=gpu:1", f"--output=/home/{JOB_USER}/{name}-%a.out", str(script),
             cwd=f"/home/{JOB_USER}").stdout
    array_id = int(out.strip().split(";")[0])
    tasks = {}
    for task in (0, 1):
        got = read_fifo(GATES / f"{name}.{task}.ready", JOB_STATE_TIMEOUT_S)
        expect(got is not None, f"array {array_id}: task {task} did not start: {sh('squeue', check=False).stdout}")
        job_id, seen_array, seen_task = (int(v) for v in got.split())
        expect(seen_array == array_id and seen_task == task, f"task {task} says {got!r}")
        tasks[task] = job_id
    expect(array_id in tasks.values(), f"no task has the array's id {array_id}: {tasks}")
    holds = {h["slurm_job_id"]: h for h in call("status")["holds"]}
    expect(set(holds) == set(tasks.values()), f"holds {sorted(holds)}, want the tasks' {sorted(tasks.values())}")
    gpus = [set(holds[job]["gpus"]) for job in tasks.values()]
    expect(gpus[0] | gpus[1] == {"0", "1"} and not gpus[0] & gpus[1], f"the tasks' GPUs: {gpus}")
    with_id = next(t for t, job in tasks.items() if job == array_id)
    order = (1 - with_id, with_id) if array_id_last else (with_id, 1 - with_id)
    for task in order:
        release_gate(GATES / f"{name}.{task}")
        # Its epilog's release (squeue -j of the array's id lists the array while any task runs).
        job = tasks[task]
        wait_for(f"job {job}'s hold to be released", lambda job=job: hold_of(job) is None, 90)
    wait_gone(array_id)
    expect_restored(array_id)
    envs = {job: (CI_DIR / f"epilog-array.{job}").read_text().strip() for job in tasks.values()}

    def comments() -> dict[str, str] | None:
        got = recorded_entries(",".join(f"{array_id}_{t}" for t in tasks))
        return got if all(got.get(str(job), "").count("ftgov@") == 1 for job in tasks.values()) else None

    try:
        recorded = wait_for(f"sacct to show array {array_id}'s tasks' AdminComment", comments, 30)
    except CheckFailed:
        print(sh("sacct", "-j", str(array_id), "-P", "-o", "JobID,JobIDRaw,State,AdminComment%200",
                 check=False).stdout)
        raise
    for job in tasks.values():
        held = "+".join(sorted(holds[job]["gpus"]))
        expect(recorded[str(job)].endswith(f"gpus={held}"), f"job {job}'s AdminComment: {recorded[str(job)]!r}")
    print(f"    array {array_id} (the task with its id ending {'last' if array_id_last else 'first'}): "
          + f"{recorded_where()}: "
          + "; ".join(f"task {t} job {job} (epilog's SLURM_ARRAY_JOB_ID/TASK_ID {envs[job]}): {recorded[str(job)]}"
                      for t, job in tasks.items()))


def check_an_array_jobs_tasks_are_held_each_and_accounted_each() -> None:
    """A job array (sbatch --array=0-1, a hyperparameter sweep's usual form) is a job per task, each with its own
    SLURM_JOB_ID; one of them has the array's own id, which could name every task to scontrol and sacctmgr, as a
    heterogeneous leader's does. Each task's prolog holds its GPU under its own id, each epilog restores it, and each
    task's AdminComment gets its own entry, whichever order they end in: the task with the array's id ending first,
    while the other runs, and ending last, after the other's record is written. (Under Slurm 22.05 the array's id
    names its own task to both here, and the epilog gets no SLURM_ARRAY_JOB_ID: printed.)"""
    run_array("array-first", array_id_last=False)
    run_array("array-last", array_id_last=True)


CHECKS = [check_slurms_numbers_are_its_own_index, check_gres_job_pins_both_gpus_and_restores,
          check_sacct_shows_the_energy, check_a_jobs_own_text_never_reaches_its_admincomment,
          check_scancel_mid_job_restores, check_killed_slurmstepd_restores,
          check_comment_chooses_off, check_shard_jobs_are_held_on_their_gpu_and_share_it,
          check_an_mps_job_is_held_on_its_gpu,
          check_a_job_that_registers_joins_its_hold,
          check_a_heterogeneous_jobs_components_are_held_and_joined,
          check_an_array_jobs_tasks_are_held_each_and_accounted_each, check_lost_epilog_is_caught_by_the_next_prolog]


# The checks a Slurm release before (year, month) cannot run, and why.
NEEDS = {check_shard_jobs_are_held_on_their_gpu_and_share_it: (SHARDS_SINCE, "shard GRES came with Slurm 22.05")}


def logs() -> None:
    for path in ("/var/log/slurm/slurmd.log", f"/var/log/slurm/slurmd-{HET_NODE}.log", "/var/log/slurm/slurmctld.log",
                 "/var/log/slurm/slurmdbd.log"):
        if Path(path).exists():
            print(f"----- {path} (last 40 lines) -----\n" + "\n".join(Path(path).read_text().splitlines()[-40:]))
    print("----- ftgov slurm prolog/epilog (journal) -----")
    print(sh("journalctl", "-t", "ftgov-slurm", "--no-pager", check=False).stdout)
    print("----- ftgovd journal (last 60 lines) -----")
    print(sh("journalctl", "-u", "ftgovd.service", "-n", "60", "--no-pager", check=False).stdout)


def cleanup() -> None:
    """No job left behind: the container then stops promptly (a job blocked on its FIFO would hold slurmd's stop)."""
    sh("scancel", "--user", JOB_USER, check=False)
    for gate in GATES.glob("*") if GATES.exists() else ():
        if gate.name.endswith(".ready"):
            continue
        try:
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no job reads it
        os.write(fd, b"go\n")
        os.close(fd)


def main() -> int:
    start = time.monotonic()
    skipped = 0
    try:
        print("setup")
        setup()
        print(f"  setup took {time.monotonic() - start:.1f} s")
        for check in CHECKS:
            t = time.monotonic()
            print(check.__name__)
            since, why = NEEDS.get(check, ((0, 0), ""))
            if STATE["slurm"] < since:
                print(f"  skipped: {why}, this is {'.'.join(f'{v:02d}' for v in STATE['slurm'])}")
                skipped += 1
                continue
            check()
            print(f"  ok ({time.monotonic() - t:.1f} s)")
    except (CheckFailed, subprocess.TimeoutExpired, OSError) as e:
        print(f"FAILED: {type(e).__name__}: {e}")
        logs()
        return 1
    finally:
        cleanup()
    print(f"all {len(CHECKS) - skipped} checks passed" + (f" ({skipped} skipped)" if skipped else "")
          + f" in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
