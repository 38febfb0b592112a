"""End-to-end checks of the installed ftgovd under a real systemd; run.sh runs this inside the booted container.

The checks follow one operator's session in order (each builds on the state the previous one left), so the first failure
stops the run and prints the daemon's journal. The daemon governs a simulated Orin tree under SIM_ROOT, selected by a
drop-in that points FTGOV_CONFIG at a copy of the default config. Standard library only: the container's python3 has no
ftgov packages; the daemon's own venv is the thing under test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent
SIM_ROOT = Path("/var/lib/ftgov-sim")
CI_CONFIG = Path("/etc/ftgov/ftgov-ci.yaml")
DROPIN = Path("/etc/systemd/system/ftgovd.service.d/50-ci.conf")
SOCKET = Path("/run/ftgov/ftgov.sock")
JOB_USER = "ftgovci"
RESULT_DIR = Path("/run/ftgov-ci")
CLIENT = [sys.executable, str(HERE / "ctclient.py")]


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def sh(*cmd: str, check: bool = True, timeout_s: float = 60) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if check and p.returncode != 0:
        raise CheckFailed(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def show(unit: str, *props: str) -> dict[str, str]:
    out = sh("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def call(method: str, params: dict | None = None) -> dict:
    """One request as root; the reply's result (an error reply fails the check)."""
    out = sh(*CLIENT, "call", method, json.dumps(params or {}), timeout_s=30).stdout
    reply = json.loads(out)
    expect("result" in reply, f"{method}: error reply {reply}")
    return reply["result"]


def gpu_node() -> Path:
    """The simulated GPU's devfreq directory, found as the daemon finds it: the class link whose of_node says GPU."""
    for link in sorted((SIM_ROOT / "sys/class/devfreq").iterdir()):
        name = (link / "device/of_node/name").read_bytes().rstrip(b"\0").decode()
        if name in ("gpu", "ga10b") or "gpu" in name:
            return link.resolve()
    raise CheckFailed(f"no GPU devfreq node under {SIM_ROOT}")


def limits_hz() -> tuple[int, int]:
    node = gpu_node()
    return int((node / "min_freq").read_text()), int((node / "max_freq").read_text())


def at_baseline() -> bool:
    try:
        return limits_hz() == STATE["baseline"]
    except ValueError:
        # The simulated tree holds plain files, which a concurrent write can leave empty for an instant (real sysfs
        # attributes are never read half-written).
        return False


def journal(*matches: str) -> list[dict]:
    sh("journalctl", "--sync")
    out = sh("journalctl", "-b", "-o", "json", "--no-pager", *matches).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def start_job(name: str) -> tuple[dict, int]:
    """A training-job stand-in as a transient unit of a member of the ftgov group; returns (register reply, its pid).

    Type=notify: systemd-run returns once ctclient has registered and said READY=1, so no waiting here."""
    result = RESULT_DIR / f"{name}.json"
    result.unlink(missing_ok=True)
    sh("systemd-run", f"--unit={name}", "--quiet", "--property=Type=notify", "--property=NotifyAccess=main",
       f"--uid={JOB_USER}", "--property=TimeoutStartSec=20s", *CLIENT, "job", str(result), name)
    reply = json.loads(result.read_text())
    expect("result" in reply, f"register failed: {reply}")
    return reply["result"], reply["pid"]


def stop_job(name: str) -> None:
    sh("systemctl", "stop", name)


def wait_until(predicate, what: str, timeout_s: float = 10.0) -> None:
    """For state that has no event to wait on from outside the daemon (it notices a job's exit on a pidfd)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


def verify_units() -> None:
    p = sh("systemd-analyze", "verify", "--man=no", "ftgovd.service", "ftgovd.socket", check=False)
    expect(p.returncode == 0 and not p.stderr.strip(), f"systemd-analyze verify is not clean:\n{p.stdout}{p.stderr}")


# ---- setup --------------------------------------------------------------------------------------------------------

def setup() -> None:
    """Shipped units verified as installed, then the CI drop-in, the simulated tree and a job user added."""
    verify_units()
    sh("/opt/ftgov/bin/ftgov", "sim-tree", str(SIM_ROOT))
    default = Path("/etc/ftgov/ftgov.yaml").read_text()
    expect("\nsysfs_root: /\n" in default, "the default config has no `sysfs_root: /` line to point elsewhere")
    CI_CONFIG.write_text(default.replace("\nsysfs_root: /\n", f"\nsysfs_root: {SIM_ROOT}\n"))
    DROPIN.parent.mkdir(parents=True, exist_ok=True)
    DROPIN.write_text(
        "# CI: govern the simulated Orin tree instead of /sys, and fail fast if READY=1 never comes.\n"
        "[Service]\n"
        f"Environment=FTGOV_CONFIG={CI_CONFIG}\n"
        f"ReadWritePaths={SIM_ROOT}\n"
        "TimeoutStartSec=15s\n"
        "# Short, so that check_watchdog_pings sees a ping within a second or two.\n"
        "WatchdogSec=2s\n")
    # A member of the ftgov group to run jobs as, made the way the package makes its group.
    p = subprocess.run(["systemd-sysusers", "-"], input=f'u {JOB_USER} - "ftgov CI job" /\nm {JOB_USER} ftgov\n',
                       text=True, capture_output=True)
    expect(p.returncode == 0, f"systemd-sysusers: {p.stderr}")
    RESULT_DIR.mkdir(exist_ok=True)
    sh("chown", f"{JOB_USER}:", str(RESULT_DIR))
    sh("systemctl", "daemon-reload")


# ---- checks -------------------------------------------------------------------------------------------------------

def check_verify_with_dropin() -> None:
    verify_units()


def check_socket_activation() -> None:
    sh("systemctl", "start", "ftgovd.socket")
    expect(show("ftgovd.socket", "ActiveState")["ActiveState"] == "active", "ftgovd.socket is not active")
    expect(show("ftgovd.service", "ActiveState")["ActiveState"] == "inactive",
           "ftgovd.service runs before anyone connected")
    st = SOCKET.stat()
    expect(oct(st.st_mode & 0o777) == "0o660", f"socket mode {oct(st.st_mode & 0o777)}, want 0660")
    expect(st.st_gid == int(sh("getent", "group", "ftgov").stdout.split(":")[2]), "socket group is not ftgov")
    expect(call("ping") == {}, "ping did not return {}")
    svc = show("ftgovd.service", "ActiveState", "StatusText", "NRestarts")
    expect(svc["ActiveState"] == "active", f"the first connection did not start ftgovd: {svc}")
    expect(svc["StatusText"] != "", "ftgovd sent no STATUS=")
    print(f"    STATUS={svc['StatusText']}")


def check_sandbox_in_effect() -> None:
    pid = show("ftgovd.service", "MainPID")["MainPID"]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    for key, want in (("CapEff", 0), ("CapBnd", 0), ("NoNewPrivs", 1), ("Seccomp", 2)):
        expect(int(status[key].strip(), 16 if key.startswith("Cap") else 10) == want,
               f"ftgovd's {key} is {status[key].strip()}, want {want}")
    mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    expect(any(line.split()[4] == "/sys/devices/platform" for line in mounts),
           "ReadWritePaths=/sys/devices/platform is not a mount point in ftgovd's namespace")
    score = sh("systemd-analyze", "security", "--no-pager", "ftgovd.service").stdout.strip().splitlines()[-1]
    print(f"    systemd-analyze security: {score}")


def check_watchdog_pings() -> None:
    """WATCHDOG=1 arrives (systemd stamps each ping), at the interval WATCHDOG_USEC asks for."""
    first = show("ftgovd.service", "WatchdogTimestampMonotonic", "WatchdogUSec")
    expect(first["WatchdogUSec"] == "2s", f"WatchdogUSec={first['WatchdogUSec']}, the drop-in sets 2s")
    wait_until(lambda: show("ftgovd.service", "WatchdogTimestampMonotonic") != {
        "WatchdogTimestampMonotonic": first["WatchdogTimestampMonotonic"]}, "a WATCHDOG=1 ping", timeout_s=3.0)


STATE: dict = {}


def check_job_pins_tree() -> None:
    STATE["baseline"] = baseline = limits_hz()
    job, pid = start_job("ftgov-ci-job1")
    STATE.update(job=job, pid=pid)
    freq = job["freq_hz"]
    print(f"    job {job['job_id']}: {job['policy']} picked {freq} Hz ({job.get('reason')}); baseline {baseline}")
    expect(limits_hz() == (freq, freq), f"tree holds {limits_hz()}, want the pin ({freq}, {freq})")
    expect((freq, freq) != baseline, "the pin equals the baseline: the check would prove nothing")
    jobs = call("status")["jobs"]
    mine = [j for j in jobs if j["job_id"] == job["job_id"]]
    expect(len(mine) == 1, f"status does not list job {job['job_id']}: {jobs}")
    uid = int(sh("id", "-u", JOB_USER).stdout)
    expect((mine[0]["pid"], mine[0]["uid"]) == (pid, uid),
           f"status says pid/uid {mine[0]['pid']}/{mine[0]['uid']}, the job is {pid}/{uid} (SO_PEERCRED)")
    status_text = show("ftgovd.service", "StatusText")["StatusText"]
    print(f"    STATUS={status_text}")
    expect(re.search(r"\b1 job", status_text) and f"{freq / 1e6:g} MHz" in status_text,
           f"STATUS= does not give the job count and the pinned {freq / 1e6:g} MHz: {status_text!r}")


def check_journal_fields() -> None:
    job, pid = STATE["job"], STATE["pid"]
    entries = journal("-u", "ftgovd.service", f"JOB_ID={job['job_id']}")
    expect(entries, f"journalctl -u ftgovd JOB_ID={job['job_id']} finds nothing")
    decisions = [e for e in entries if e.get("FREQ_HZ") == str(job["freq_hz"])]
    expect(decisions, f"no entry of job {job['job_id']} carries FREQ_HZ={job['freq_hz']}: {entries}")
    d = decisions[0]
    for field, want in (("POLICY", job["policy"]), ("JOB_NAME", "ftgov-ci-job1"), ("JOB_PID", str(pid))):
        expect(d.get(field) == want, f"decision entry has {field}={d.get(field)!r}, want {want!r}: {d}")
    # Where in the code a line comes from is kept (systemd-python sends the record's file and line).
    expect(d.get("CODE_FILE", "").endswith("controller.py") and int(d.get("CODE_LINE") or 0) > 0,
           f"decision entry has CODE_FILE={d.get('CODE_FILE')!r} CODE_LINE={d.get('CODE_LINE')!r}")
    print(f"    {len(entries)} entries; decision: {d.get('MESSAGE')!r}")


def check_kill_restarts_and_restores() -> None:
    before = show("ftgovd.service", "MainPID", "NRestarts")
    sh("systemctl", "kill", "--signal=KILL", "ftgovd.service")
    # The socket stays open across the crash, so this connection waits in its backlog until a daemon accepts it.
    expect(call("ping") == {}, "no ping reply after the crash")
    after = show("ftgovd.service", "MainPID", "NRestarts", "ActiveState")
    expect(after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"], f"not restarted: {after}")
    expect(int(after["NRestarts"]) == int(before["NRestarts"]) + 1,
           f"NRestarts {before['NRestarts']} -> {after['NRestarts']}: Restart=on-failure did not bring it back")
    # The job outlived the crash (its unit still runs), so the new daemon takes it back from the state file under its
    # job id, pinned as before; its end, below, is noticed on the pidfd the new daemon opened.
    job, pid = STATE["job"], STATE["pid"]
    expect(show("ftgov-ci-job1", "ActiveState")["ActiveState"] == "active", "the job died with the daemon")
    adopted = [j for j in call("status")["jobs"] if j["pid"] == pid]
    expect([j["job_id"] for j in adopted] == [job["job_id"]],
           f"the live job {job['job_id']} (pid {pid}) was not taken back after the crash: status lists {adopted}")
    expect(limits_hz() == (job["freq_hz"],) * 2, f"job re-adopted but tree holds {limits_hz()}")
    print(f"    live job re-adopted as {adopted[0]['job_id']}, pin held")
    stop_job("ftgov-ci-job1")
    wait_until(at_baseline, "the baseline after the job ended")


def check_stop_restores() -> None:
    """systemctl stop restores the GPU (restore_on_stop) and keeps the running job in the state file: the next start
    (systemctl restart, an upgrade) takes it back and pins again, and its end is recorded when it ends."""
    job, _ = start_job("ftgov-ci-job2")
    expect(limits_hz() == (job["freq_hz"],) * 2, f"second job: tree holds {limits_hz()}")
    sh("systemctl", "stop", "ftgovd.service")
    expect(limits_hz() == STATE["baseline"], f"after systemctl stop the tree holds {limits_hz()}")
    expect(show("ftgovd.service", "Result")["Result"] == "success", "stop did not end cleanly")
    sh("systemctl", "start", "ftgovd.service")  # returns at READY=1, which comes after the leftovers are taken back
    expect(limits_hz() == (job["freq_hz"],) * 2, f"the restart did not take the running job back: {limits_hz()}")
    stop_job("ftgov-ci-job2")
    wait_until(lambda: limits_hz() == STATE["baseline"], "the job's end to restore the GPU")
    sh("systemctl", "stop", "ftgovd.service")  # as the checks after this one expect it: the next job starts it
    ends = [e for e in journal("-u", "ftgovd.service", f"JOB_ID={job['job_id']}", "JOB_NAME=ftgov-ci-job2")
            if "ENERGY_J" in e and "DURATION_S" in e]
    expect(ends, f"no entry of job {job['job_id']} carries ENERGY_J and DURATION_S (its end)")
    print(f"    end: {ends[-1].get('MESSAGE')!r}")


def check_restore_on_stop_false() -> None:
    """restore_on_stop: false leaves the pin at stop (ExecStopPost's restore --on-stop honours it); by hand it
    restores."""
    default = CI_CONFIG.read_text()
    expect("\nrestore_on_stop: true\n" in default, "the config has no `restore_on_stop: true` line")
    CI_CONFIG.write_text(default.replace("\nrestore_on_stop: true\n", "\nrestore_on_stop: false\n"))
    try:
        job, _ = start_job("ftgov-ci-job3")
        STATE["job3"] = job
        sh("systemctl", "stop", "ftgovd.service")
        expect(limits_hz() == (job["freq_hz"],) * 2, f"restore_on_stop: false, yet stop left {limits_hz()}")
        sh("/opt/ftgov/bin/ftgov", "restore", "--config", str(CI_CONFIG), "--state-dir", "/run/ftgov")
        expect(limits_hz() == STATE["baseline"], f"ftgov restore by hand left {limits_hz()}")
    finally:
        CI_CONFIG.write_text(default)
        stop_job("ftgov-ci-job3")


NO_PIDFD_DROPIN = DROPIN.with_name("60-ci-no-pidfd.conf")


def check_pidfd_refused_is_said() -> None:
    """Where the unit's system call filter refuses pidfd_open (JetPack 5's systemd 245 and libseccomp may: unverified),
    ftgovd says so at start with the fix, and a registration that names a process is refused in the same words, the
    GPU left at its baseline. Root names a process by pid (as `ftgov run` and Slurm do): that path opens a pidfd on
    any kernel, where a client's own connection may carry one (SO_PEERPIDFD, Linux 6.5)."""
    NO_PIDFD_DROPIN.write_text("[Service]\nSystemCallFilter=~pidfd_open\n")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        sh("systemctl", "daemon-reload")
        sh("systemctl", "restart", "ftgovd.service")
        said = [e["MESSAGE"] for e in journal("-u", "ftgovd.service", "-p", "err")
                if "pidfd_open is refused" in str(e.get("MESSAGE", ""))]
        expect(said and "SystemCallFilter=pidfd_open" in said[-1], f"no start-up error names the fix: {said}")
        reply = json.loads(sh(*CLIENT, "call", "register", json.dumps({
            "model_type": "decoder", "num_layers": 6, "hidden_size": 512, "seq_len": 128, "gpu_util": 60,
            "pid": sleeper.pid, "name": "ftgov-ci-nopidfd"})).stdout)
        message = reply.get("error", {}).get("message", "")
        expect("pidfd_open is refused" in message and "SystemCallFilter=pidfd_open" in message,
               f"register under the filter got: {reply}")
        expect(at_baseline(), f"the GPU is not at its baseline: {limits_hz()}")
        print(f"    start-up: {said[-1][:90]!r}...")
    finally:
        sleeper.kill()
        sleeper.wait()
        NO_PIDFD_DROPIN.unlink(missing_ok=True)
        sh("systemctl", "daemon-reload")
        sh("systemctl", "restart", "ftgovd.service")
    expect(call("ping") == {}, "ftgovd does not answer after the filter was lifted")


def check_outsider_refused() -> None:
    as_nobody = sh("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *CLIENT, "call", "ping",
                   check=False)
    expect(as_nobody.returncode == 3, f"a user outside ftgov got: rc {as_nobody.returncode} {as_nobody.stdout}"
                                      f"{as_nobody.stderr}")
    as_member = sh("setpriv", f"--reuid={JOB_USER}", f"--regid={JOB_USER}", "--init-groups", *CLIENT, "call", "ping",
                   check=False)
    expect(as_member.returncode == 0, f"a member of ftgov was refused: {as_member.stdout}{as_member.stderr}")


def doctor(*as_user: str) -> tuple[int, dict[str, list[dict]]]:
    p = sh(*as_user, "/opt/ftgov/bin/ftgov", "doctor", "--json", "--config", str(CI_CONFIG), check=False)
    try:
        out = json.loads(p.stdout)
    except ValueError as e:
        raise CheckFailed(f"ftgov doctor gave no JSON (rc {p.returncode}): {p.stdout}{p.stderr}") from e
    checks: dict[str, list[dict]] = {}
    for c in out["checks"]:
        checks.setdefault(c["name"], []).append(c)
    return p.returncode, checks


def check_doctor() -> None:
    """`ftgov doctor` on the installed system: the daemon's pin check writes through the sandbox and restores; a member
    of ftgov may use the socket; an outsider is told the fix."""
    rc, checks = doctor()
    fails = [c for cs in checks.values() for c in cs if c["status"] == "FAIL"]
    expect(rc == 0 and not fails, f"doctor as root: rc {rc}, FAIL lines {fails}")
    pin = checks["pin"][0]
    expect(pin["status"] == "OK" and "restored" in pin["detail"], f"doctor's pin check: {pin}")
    expect(limits_hz() == STATE["baseline"], f"after doctor's pin check the tree holds {limits_hz()}")
    print(f"    root: {pin['detail']}")
    rc, checks = doctor("setpriv", f"--reuid={JOB_USER}", f"--regid={JOB_USER}", "--init-groups")
    expect(checks["socket"][0]["status"] == "OK", f"doctor as a member of ftgov: {checks['socket']}")
    rc, checks = doctor("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
    socket = checks["socket"][0]
    expect(rc == 1 and socket["status"] == "FAIL" and "usermod -aG ftgov" in socket["fix"],
           f"doctor as an outsider: rc {rc}, {socket}")


def check_unit_order_and_reload() -> None:
    """Ordered after the boot-time power-mode write; `systemctl reload` sends SIGHUP to the daemon."""
    svc = show("ftgovd.service", "After", "ExecReload")
    after = svc["After"].split()
    for unit in ("nvpmodel.service", "nvpower.service", "ftgovd.socket"):
        expect(unit in after, f"ftgovd.service is not ordered after {unit}: After={svc['After']}")
    expect("/bin/kill" in svc["ExecReload"] and "-HUP" in svc["ExecReload"], f"ExecReload={svc['ExecReload']}")


PRIORITY_PROBE = """
import sys
sys.modules["systemd"] = None  # as installed with EXTRAS=: no systemd-python
from governor.daemon import logs
log = logs.setup("info")
log.info("ftgov-ci-priority info line")
log.error("ftgov-ci-priority error line")
logs.flush()
"""


def check_priorities_without_systemd_python() -> None:
    """Without systemd-python, lines on the journal's stderr stream still carry their priority: `journalctl -p
    warning` finds the error and not the info line."""
    unit = "ftgov-ci-priority"
    sh("systemd-run", "--quiet", "--wait", f"--unit={unit}", "/opt/ftgov/bin/python", "-c", PRIORITY_PROBE)

    def entries(*args: str) -> list[dict]:
        return [e for e in journal("-u", unit, *args) if "ftgov-ci-priority" in str(e.get("MESSAGE", ""))]

    # journald reads the stream asynchronously: the unit's end does not mean its lines are stored yet.
    wait_until(lambda: len(entries()) >= 2, "the probe's two lines in the journal")
    warnings = entries("-p", "warning")
    expect([e.get("PRIORITY") for e in warnings] == ["3"] and "error line" in warnings[0]["MESSAGE"],
           f"journalctl -p warning gives {warnings}")
    expect(re.search(r"\[<string>:\d+\]$", warnings[0]["MESSAGE"]), f"no code location: {warnings[0]['MESSAGE']!r}")
    info = [e for e in entries() if "info line" in e["MESSAGE"]]
    expect([e.get("PRIORITY") for e in info] == ["6"], f"the info line: {info}")
    print(f"    {warnings[0]['MESSAGE']!r} at priority 3")


NVML_DROPIN = Path("/etc/systemd/system/ftgovd.service.d/nvml.conf")


def check_nvml_dropin() -> None:
    """`make install BACKEND=nvml` adds the drop-in that opens the NVIDIA device nodes to the sandboxed daemon. The
    container has no GPU: what is checked is the unit's effective sandbox, and that the daemon still starts in it."""
    sh("make", "-C", str(SRC), "--no-print-directory", "install", "WHEELHOUSE=/wheelhouse", "BACKEND=nvml",
       timeout_s=120)
    expect(NVML_DROPIN.exists(), f"make install BACKEND=nvml did not install {NVML_DROPIN}")
    verify_units()
    sh("/opt/ftgov/bin/python", "-c", "import pynvml")  # the nvml extra came with it
    props = show("ftgovd.service", "PrivateDevices", "DevicePolicy", "DeviceAllow", "CapabilityBoundingSet",
                 "DropInPaths")
    print(f"    {props}")
    expect(str(NVML_DROPIN) in props["DropInPaths"], f"drop-in not loaded: DropInPaths={props['DropInPaths']}")
    expect(props["PrivateDevices"] == "no", f"PrivateDevices={props['PrivateDevices']}: /dev/nvidia* stay hidden")
    expect(props["DevicePolicy"] == "closed", f"DevicePolicy={props['DevicePolicy']}: want closed")
    expect("char-nvidia* rw" in props["DeviceAllow"], f"DeviceAllow={props['DeviceAllow']}: NVIDIA nodes not allowed")
    expect(props["CapabilityBoundingSet"] == "cap_sys_admin",
           f"CapabilityBoundingSet={props['CapabilityBoundingSet']}: NVML's clock controls need CAP_SYS_ADMIN only")
    sh("systemctl", "restart", "ftgovd.service")
    expect(call("ping") == {}, "ftgovd does not answer under the NVML drop-in")
    pid = show("ftgovd.service", "MainPID")["MainPID"]
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    expect(int(status["CapBnd"].strip(), 16) == 1 << 21, f"CapBnd={status['CapBnd'].strip()}: want CAP_SYS_ADMIN only")
    # A plain upgrade keeps the operator's backend choice.
    sh("make", "-C", str(SRC), "--no-print-directory", "install", "WHEELHOUSE=/wheelhouse", timeout_s=120)
    expect(NVML_DROPIN.exists(), "a plain make install removed the NVML drop-in")


def check_install_keeps_edited_config() -> None:
    config = Path("/etc/ftgov/ftgov.yaml")
    edited = config.read_text().replace("log_level: info", "log_level: debug")
    config.write_text(edited)
    # The whole install again, over the running one, as an upgrade would; from a root shell whose umask is 000.
    sh("sh", "-c", f"umask 000 && exec make -C {SRC} --no-print-directory install WHEELHOUSE=/wheelhouse",
       timeout_s=120)
    expect(config.read_text() == edited, "make install overwrote an edited ftgov.yaml")
    # What ftgovd runs as root is root's alone to write: no file or folder of it writable by its group or others.
    writable = [str(p) for top in ("/opt/ftgov", "/etc/ftgov", "/etc/systemd/system/ftgovd.service")
                for p in ([Path(top)] + (list(Path(top).rglob("*")) if Path(top).is_dir() else []))
                if not p.is_symlink() and p.stat().st_mode & 0o022]
    expect(not writable, f"make install under umask 000 left {len(writable)} writable by others: {writable[:5]}")
    expect(call("ping") == {}, "ftgovd does not answer after a reinstall")
    expect(Path(f"{config}.new").read_text() == (SRC / "etc/ftgov.yaml").read_text(), "no ftgov.yaml.new next to it")


def check_uninstall() -> None:
    """Nothing is left pinned with no ftgov left to restore it: not even a pin restore_on_stop: false keeps."""
    good = CI_CONFIG.read_text()
    CI_CONFIG.write_text(good.replace("\nrestore_on_stop: true\n", "\nrestore_on_stop: false\n"))
    try:
        sh("systemctl", "restart", "ftgovd.service")
        start_job("ftgov-ci-job6")
        expect(not at_baseline(), "the job did not pin: the check would prove nothing")
        sh("make", "-C", str(SRC), "--no-print-directory", "uninstall")
        expect(at_baseline(), f"make uninstall left the GPU pinned at {limits_hz()}")
    finally:
        CI_CONFIG.write_text(good)
        stop_job("ftgov-ci-job6")
    for gone in ("/opt/ftgov", "/usr/local/bin/ftgov", "/usr/local/bin/ftgovd", "/etc/systemd/system/ftgovd.service",
                 "/etc/systemd/system/ftgovd.socket", "/usr/lib/sysusers.d/ftgov.conf", "/etc/ftgov/ftgov.yaml.new",
                 str(NVML_DROPIN)):
        expect(not os.path.lexists(gone), f"{gone} is left after make uninstall")
    expect(Path("/etc/ftgov/ftgov.yaml").exists(), "make uninstall removed an edited config")
    expect(show("ftgovd.socket", "ActiveState")["ActiveState"] == "inactive", "the socket still listens")


def check_job_ids_unique_per_boot() -> None:
    """JOB_ID names one job for the whole boot, across daemon restarts, or `journalctl JOB_ID=N` mixes stories."""
    job3 = STATE["job3"]
    names = {e.get("JOB_NAME") for e in journal("-u", "ftgovd.service", f"JOB_ID={job3['job_id']}")} - {None}
    expect(names == {"ftgov-ci-job3"}, f"JOB_ID={job3['job_id']} in this boot's journal names jobs {sorted(names)}")


def history() -> list[dict]:
    out = sh("/opt/ftgov/bin/ftgov", "history", "--json", "--config", str(CI_CONFIG)).stdout
    return json.loads(out)["jobs"]


def logged(text: str) -> bool:
    return any(text in str(e.get("MESSAGE", "")) for e in journal("-u", "ftgovd.service"))


def check_store_survives_restart() -> None:
    """Every ended job is in the measurement store under StateDirectory= (/var/lib/ftgov, 0700), and stays there
    across a restart of the daemon."""
    mode = Path("/var/lib/ftgov").stat().st_mode & 0o777
    expect(mode == 0o700, f"/var/lib/ftgov has mode {mode:o}, not 0700")
    before = history()
    names = {j.get("name") for j in before}
    expect({"ftgov-ci-job1", "ftgov-ci-job2"} <= names, f"the store holds jobs {sorted(map(str, names))}")
    recorded = call("status")["store"]
    expect(recorded is not None and recorded.get("jobs", 0) >= len(before), f"status store: {recorded}")
    sh("systemctl", "restart", "ftgovd.service")
    expect(call("ping") == {}, "no ping reply after the restart")
    after = history()
    ids = lambda jobs: [(j["daemon_job_id"], j["ended_at"]) for j in jobs]  # noqa: E731
    expect(ids(after) == ids(before), f"after a restart the store holds {ids(after)}, before {ids(before)}")
    print(f"    {len(after)} job(s) in the store before and after the restart")


def check_reload_switches_the_tree() -> None:
    """`systemctl reload ftgovd` loads another model file: same process, a held job keeps its pin, the journal says
    which tree was loaded; a bad config on reload is refused and the old one kept."""
    job, _ = start_job("ftgov-ci-job4")
    pinned = limits_hz()
    pid = show("ftgovd.service", "MainPID")["MainPID"]
    paper = sh("/opt/ftgov/bin/python", "-c",
               "from governor import data; print(data.path(data.PAPER_TREE))").stdout.strip()
    good = CI_CONFIG.read_text()
    try:
        CI_CONFIG.write_text(good + f"\nmodel_file: {paper}\n")
        sh("systemctl", "reload", "ftgovd.service")
        wait_until(lambda: logged(f"MLG tree loaded from {paper}"), "the reloaded tree's log line")
        expect(show("ftgovd.service", "MainPID")["MainPID"] == pid, "reload restarted the daemon")
        expect(limits_hz() == pinned, f"the job's pin {pinned} became {limits_hz()} at the reload")
        expect(any(j["job_id"] == job["job_id"] for j in call("status")["jobs"]), "the job was dropped at the reload")
        # A value the schema refuses, in the file's own limits: block (appending a second `limits:` would be refused
        # as a duplicate key, which proves less).
        expect("\n  max_jobs: 64\n" in good, "the config has no `  max_jobs: 64` line under limits:")
        CI_CONFIG.write_text(good.replace("\n  max_jobs: 64\n", "\n  max_jobs: -1\n") + f"\nmodel_file: {paper}\n")
        sh("systemctl", "reload", "ftgovd.service")
        wait_until(lambda: any("reload refused" in str(e.get("MESSAGE", "")) and "max_jobs" in str(e.get("MESSAGE"))
                               for e in journal("-u", "ftgovd.service")),
                   "the refused reload's log line naming limits.max_jobs")
        refused = [e["MESSAGE"] for e in journal("-u", "ftgovd.service") if "reload refused" in str(e.get("MESSAGE"))]
        expect("duplicate" not in refused[-1].lower(), f"refused for another reason: {refused[-1]!r}")
        expect(show("ftgovd.service", "MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"},
               "a bad config on reload stopped the daemon")
        expect(limits_hz() == pinned, "a refused reload moved the pin")
        print(f"    reloaded onto {paper}; a bad config refused; pin {pinned} held throughout")
    finally:
        CI_CONFIG.write_text(good)
        sh("systemctl", "reload", "ftgovd.service")
        stop_job("ftgov-ci-job4")
        wait_until(at_baseline, "the baseline after the job ended")


CHECKS = [check_verify_with_dropin, check_socket_activation, check_sandbox_in_effect, check_watchdog_pings,
          check_job_pins_tree,
          check_journal_fields, check_kill_restarts_and_restores, check_stop_restores,
          check_restore_on_stop_false, check_pidfd_refused_is_said, check_outsider_refused, check_doctor,
          check_unit_order_and_reload,
          check_store_survives_restart, check_reload_switches_the_tree,
          check_priorities_without_systemd_python,
          check_install_keeps_edited_config, check_nvml_dropin, check_uninstall,
          check_job_ids_unique_per_boot]


def main() -> int:
    started = time.monotonic()
    try:
        setup()
        for check in CHECKS:
            t0 = time.monotonic()
            check()
            print(f"ok  {check.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
    except (CheckFailed, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
        print(f"FAIL {e}", flush=True)
        print("---- journal of ftgovd (last 80 lines) ----")
        print(sh("journalctl", "-b", "--no-pager", "-n", "80", "-u", "ftgovd.service", "-u", "ftgovd.socket",
                 check=False).stdout)
        return 1
    print(f"all {len(CHECKS)} checks passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
