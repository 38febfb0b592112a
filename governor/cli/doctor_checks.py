"""The checks of `ftgov doctor` (governor.cli.doctor): each reads the board through the configurable root, or asks the
running daemon, and says OK, WARN or FAIL with the fix."""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from governor.client import Connection, MethodNotFound
from governor.errors import BackendError, FtgovError, NodeNotFound
from governor.simpaths import start_simulated
from governor.sysfs import Root
from governor.units import mhz

OK, WARN, FAIL = "OK", "WARN", "FAIL"
START_SOCKET = "sudo systemctl enable --now ftgovd.socket"
# jtop's service listens here (jetson-stats documents mounting it into containers).
JTOP_SOCKET = "/run/jtop.sock"
NVPMODEL_CONF = "/etc/nvpmodel.conf"
# Where nvpmodel keeps the mode it last set, as "pmode:0002 ..." (unverified: from third-party reports, not L4T source).
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
NO_CAP_HZ = 2147483647  # nvpmodel's "no limit" for GPU MAX_FREQ (the value nvpmodel writes for MAXN); -1 in some confs


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Context:
    """What the checks share: where to look, who asks, and what the daemon (if it answers) said."""

    root: Root
    config: object  # governor.config.Config
    config_path: str
    socket: str
    uid: int
    session_gids: set[int]
    status: dict | None = None  # the daemon's status; None when it does not answer
    daemon_error: str = ""
    daemon_denied: bool = False  # it did not answer because this caller may not connect (check_socket says why)
    gpu: object = None  # the DevfreqGpu found by check_devfreq
    simulated: bool = False  # the tree is one ftgovd --simulate built (its socket is made for the caller)


# ---- board ------------------------------------------------------------------------------------------------------

def _read(root: Root, path: str) -> str | None:
    try:
        return root.resolve(root.path(path)).read_bytes().decode(errors="replace").replace("\0", " ").strip()
    except (OSError, BackendError):
        return None


def l4t_release(text: str) -> tuple[int, str] | None:
    """(major, "R36.4.3") from /etc/nv_tegra_release's first line: "# R36 (release), REVISION: 4.3, ..."."""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return (int(m.group(1)), f"R{m.group(1)}.{m.group(2)}") if m else None


JETPACK_OF_L4T = {36: "JetPack 6", 35: "JetPack 5", 34: "JetPack 5 (developer preview)", 32: "JetPack 4"}


def check_board(ctx: Context) -> list[Check]:
    model = _read(ctx.root, "/proc/device-tree/model")
    release_text = _read(ctx.root, "/etc/nv_tegra_release")
    if model is None and release_text is None:
        if ctx.config.backend == "nvml":
            return [Check("board", OK, "not a Jetson (no /proc/device-tree/model): the NVML backend is configured")]
        return [Check("board", WARN, f"no /proc/device-tree/model nor /etc/nv_tegra_release under {ctx.root.root}: "
                                     "not a Jetson?", "on an NVIDIA datacenter GPU, set backend: nvml in the config")]
    release = l4t_release(release_text or "")
    if release is None:
        return [Check("board", WARN, f"{model or 'unknown model'}; L4T release unknown "
                                     f"({'no /etc/nv_tegra_release' if release_text is None else repr(release_text)})")]
    major, name = release
    detail = f"{model or 'unknown model'}; L4T {name} ({JETPACK_OF_L4T.get(major, 'JetPack unknown')})"
    if major < 34:
        return [Check("board", FAIL, detail + ": kernel 4.9 puts the GPU node directly under /sys/devices, outside "
                                              "the unit's ReadWritePaths=/sys/devices/platform",
                      "JetPack 5 or 6 is needed (Orin); Xavier/Nano on JetPack 4 are not supported")]
    return [Check("board", OK, detail)]


# ---- devfreq node, pin ------------------------------------------------------------------------------------------

def _writable(path: Path) -> bool:
    """sysfs gives an attribute without a store method mode 0444, and then refuses the write even to root."""
    return bool(os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def check_devfreq(ctx: Context) -> list[Check]:
    from governor.backends import devfreq

    if ctx.config.backend == "nvml":
        return [Check("devfreq", OK, "backend: nvml: no devfreq node needed")]
    try:
        gpu = devfreq.probe(ctx.root)[0]
        reading = gpu.read()
    except NodeNotFound as e:
        # jetson_clocks powers the GPU up (railgate_enable=0) but also copies max_freq into min_freq and leaves it:
        # alone, it would hand ftgovd a held clock as its baseline. --store before and --restore after put back
        # min_freq and railgate_enable (the node comes with the GPU's first power-up).
        return [Check("devfreq", FAIL, str(e), "the node appears once the GPU has powered up: run any CUDA program "
                      "once, or `sudo jetson_clocks --store && sudo jetson_clocks && sudo jetson_clocks --restore` "
                      "(jetson_clocks alone leaves min_freq = max_freq, which ftgovd would take as its baseline); "
                      "ftgovd waits node_wait_s for it")]
    except BackendError as e:
        return [Check("devfreq", FAIL, f"the GPU devfreq node cannot be read: {e}")]
    ctx.gpu = gpu
    where = ctx.root.unroot(gpu.node)
    detail = (f"{gpu.node.name} at {where}: {len(gpu.levels_hz)} levels "
              f"{' '.join(mhz(hz, unit=False) for hz in gpu.levels_hz)} MHz; limits {mhz(reading.min_hz, none='?')}.."
              f"{mhz(reading.max_hz, none='?')}, now {mhz(reading.cur_hz, none='?')}")
    checks = [Check("devfreq", OK, detail)]
    if not devfreq.under_sandbox(where):
        checks = [Check("devfreq", FAIL, detail + ": outside /sys/devices/platform, which the unit's sandbox leaves "
                                                  "read-only", "add ReadWritePaths= for its parent in a drop-in "
                                                                   "(systemctl edit ftgovd)")]
    read_only = [name for name in ("min_freq", "max_freq") if not _writable(gpu.node / name)]
    if read_only:
        checks.append(Check("limits", FAIL, f"{' and '.join(read_only)} of {gpu.node.name} are read-only (no write "
                                            "permission for anyone): this kernel offers no user limits to pin",
                            "a kernel whose GPU devfreq node has writable min_freq/max_freq (L4T r35/r36 have)"))
    return checks


def check_pin(ctx: Context) -> list[Check]:
    """Whether the GPU can be pinned: through the daemon when it answers, else by root writing back what is there."""
    if ctx.status is not None:
        try:
            with Connection(ctx.socket, timeout_s=10.0) as conn:
                answer = conn.call("pin_check")
        except MethodNotFound:
            return [Check("pin", WARN, "this ftgovd has no pin_check (older than this ftgov)",
                          "upgrade ftgovd (make install; systemctl restart ftgovd) and run doctor again")]
        except FtgovError as e:
            return [Check("pin", FAIL, f"pin check through ftgovd failed: {e}", "journalctl -u ftgovd")]
        checks = []
        for g in answer.get("gpus") or []:
            how = " (no write: the pin is in place)" if not g.get("wrote") and g.get("pinned_hz") else ""
            checks.append(Check("pin", OK if g.get("ok") else FAIL, f"GPU {g.get('gpu')} through ftgovd: "
                                f"{g.get('detail')}{how}", "" if g.get("ok") else "journalctl -u ftgovd"))
        # A power cap a GPU refused (cannot_cap): its pins go on uncapped, which only status and the journal said.
        checks += [Check("power cap", WARN, f"GPU {g.get('id')}: power_cap_w is not applied there: {g['cannot_cap']}",
                         "a cap outside the GPU's range: set power_cap_w within it and reload ftgovd (systemctl "
                         "reload ftgovd); a GPU that refuses every power limit cannot be capped: remove power_cap_w "
                         "or leave it, its pins go on uncapped")
                   for g in ctx.status.get("gpus") or [] if g.get("cannot_cap")]
        return checks or [Check("pin", FAIL, "ftgovd governs no GPU")]
    if ctx.gpu is None:
        if ctx.config.backend == "nvml":
            return [Check("pin", FAIL, "ftgovd does not answer: the NVML pin cannot be checked", reach_daemon(ctx))]
        return [Check("pin", FAIL, "no GPU devfreq node to pin", "see 'devfreq' above")]
    if ctx.uid != 0:
        return [Check("pin", WARN, f"not checked: ftgovd does not answer and only root may write the limits "
                                   f"(you are uid {ctx.uid})", f"{reach_daemon(ctx)}, or run doctor as root")]
    return [write_back(ctx.gpu)]


def write_back(gpu) -> Check:
    """Root, ftgovd stopped: write min_freq and max_freq with what they read, through the backend's own restore
    writes (widen-first writes, then the read-back check), without restore's shortcut of writing nothing where the
    files read the limits already, which is always here. The kernel keeps one user request per limit and reads back
    the effective range, so writing back what it reads leaves the range as it was."""
    before = gpu.snapshot()
    try:
        gpu.write_limits(before)
    except BackendError as e:
        return Check("pin", FAIL, f"root write test: {e}",
                     "check the kernel log (dmesg) and SELinux/AppArmor; if the limits read back changed, something "
                     "else writes them: see 'holder'")
    return Check("pin", OK, f"root write test (ftgovd stopped): wrote back min {mhz(before.min_hz, none='?')} and max "
                            f"{mhz(before.max_hz, none='?')}; they read back the same")


def check_holder(ctx: Context) -> list[Check]:
    """jetson_clocks (it copies max_freq into min_freq) or another tool holding min = max outside ftgovd's pin."""
    if ctx.gpu is None:
        return []
    reading = ctx.gpu.read()
    gpu_status = next(iter((ctx.status or {}).get("gpus") or []), {})
    ours = gpu_status.get("pinned_hz")
    if reading.min_hz != reading.max_hz:
        return [Check("holder", OK, f"nothing holds the clock: min {mhz(reading.min_hz, none='?')} "
                                    f"< max {mhz(reading.max_hz, none='?')}")]
    if ours is not None and ours == reading.min_hz:
        return [Check("holder", OK, f"min = max = {mhz(ours, none='?')}: ftgovd's pin for "
                                    f"{len((ctx.status or {}).get('jobs') or [])} job(s)")]
    return [Check("holder", FAIL, f"min = max = {mhz(reading.min_hz, none='?')}, not ftgovd's pin: "
                                  "jetson_clocks (it copies "
                                  "max_freq into min_freq), a crashed characterize, or another tool holds the clock; "
                                  "ftgovd would take this pin as the baseline to restore",
                  "sudo jetson_clocks --restore (after a jetson_clocks --store), or set the power mode again "
                  "(sudo nvpmodel -m <mode>); then sudo systemctl restart ftgovd")]


THERMAL_CLASS = "/sys/class/thermal"


def check_cooling(ctx: Context) -> list[Check]:
    """Whether a thermal cap on the GPU would show in its max_freq. The reference leaves open whether L4T registers
    the GPU's devfreq as a cooling device ("if L4T enables one"); upstream's devfreq_cooling names it
    ``devfreq-<device>`` and caps the range through PM QoS, which max_freq then reads (unverified on a board). ftgovd
    takes a max that drops under its pin for another tool's change (nvpmodel's) and restores under it at the jobs'
    end: a cap of a hot spell would stay as the GPU's limit."""
    if ctx.gpu is None:
        return []
    wanted = f"devfreq-{ctx.gpu.node.name}"
    devices = sorted(ctx.root.path(THERMAL_CLASS).glob("cooling_device*"))
    types = {d.name: (_read(ctx.root, f"{THERMAL_CLASS}/{d.name}/type") or "").strip() for d in devices}
    found = [name for name, kind in types.items() if kind == wanted]
    # Before Linux 5.12 (JetPack 5's 5.10) devfreq_cooling named its device thermal-devfreq-<number> (upstream's
    # drivers/thermal/devfreq_cooling.c), which says not which devfreq device it caps: on a Jetson the GPU's is likely
    # (unverified on a board).
    numbered = [name for name, kind in types.items() if re.fullmatch(r"thermal-devfreq-\d+", kind)]
    if not found and numbered:
        return [Check("cooling", WARN, f"{numbered[0]} ({types[numbered[0]]}) is a devfreq cooling device, and this "
                                       "kernel names no device for it (before Linux 5.12): if it is the GPU's, its cap "
                                       "reads in max_freq, and ftgovd takes a max that drops under its pin for "
                                       "nvpmodel's, which the jobs' end restores (a hot spell's cap would stay)",
                      "after a hot spell, check the limits (ftgov doctor) and set the power mode again if they stay "
                      "low (sudo nvpmodel -m <mode>); please report this board and JetPack release (docs/hardware.md)")]
    if not found:
        return [Check("cooling", OK, f"no cooling device {wanted}: thermal throttling shows in cur_freq, not in the "
                                     "limits ftgovd pins")]
    return [Check("cooling", WARN, f"{found[0]} ({wanted}) caps the GPU's range when hot: its cap reads in max_freq, "
                                   "and ftgovd takes a max that drops under its pin for nvpmodel's, which the jobs' "
                                   "end restores (a hot spell's cap would stay)",
                  "after a hot spell, check the limits (ftgov doctor) and set the power mode again if they stay low "
                  "(sudo nvpmodel -m <mode>); please report this board and JetPack release (docs/hardware.md)")]


def check_jtop(ctx: Context) -> list[Check]:
    path = ctx.root.path(JTOP_SOCKET)
    if not path.is_socket():
        return [Check("jtop", OK, "no jtop service running")]
    return [Check("jtop", WARN, f"jtop's service runs ({JTOP_SOCKET}): it shows ftgovd's pins (min = max) as "
                                "\"jetson_clocks running\"; that is ftgovd, not jetson_clocks. Turning jetson_clocks "
                                "on in jtop does change the limits under ftgovd's pin",
                  "nothing to fix; leave jetson_clocks off in jtop while ftgovd governs")]


# ---- power mode -------------------------------------------------------------------------------------------------

def parse_nvpmodel(text: str) -> tuple[dict[int, tuple[str, int | None]], int | None]:
    """{mode id: (name, GPU max Hz or None for no cap)} and the default mode, from an nvpmodel conf: sections
    `< POWER_MODEL ID=2 NAME=MODE_30W >` with a line `GPU MAX_FREQ 612000000`, and `< PM_CONFIG DEFAULT=2 >`.
    The layout follows NVIDIA's published Orin confs (unverified against every L4T release)."""
    modes: dict[int, tuple[str, int | None]] = {}
    default, current = None, None
    for line in text.splitlines():
        line = line.strip()
        header = re.match(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>", line)
        if header:
            current = int(header.group(1))
            modes[current] = (header.group(2), None)
            continue
        pm = re.match(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", line)
        if pm:
            default, current = int(pm.group(1)), None
            continue
        if line.startswith("<"):
            current = None
            continue
        cap = re.match(r"GPU\s+MAX_FREQ\s+(-?\d+)", line)
        if cap and current is not None:
            hz = int(cap.group(1))
            modes[current] = (modes[current][0], None if hz <= 0 or hz >= NO_CAP_HZ else hz)
    return modes, default


def check_nvpmodel(ctx: Context) -> list[Check]:
    if ctx.config.backend == "nvml":
        return []
    text = _read(ctx.root, NVPMODEL_CONF)
    if text is None:
        return [Check("power mode", WARN, f"no {NVPMODEL_CONF}: the power mode and its GPU cap are unknown",
                      "on a Jetson: sudo apt install nvidia-l4t-nvpmodel")]
    modes, default = parse_nvpmodel(text)
    status = _read(ctx.root, NVPMODEL_STATUS) or ""
    m = re.search(r"pmode:(\d+)", status)
    # Whether members may read the status file is unverified: unread, the conf's default stands in, and says so.
    mode, source = ((int(m.group(1)), NVPMODEL_STATUS) if m else
                    (default, f"the conf's default; {NVPMODEL_STATUS} absent, unreadable or without a pmode"))
    if mode not in modes:
        return [Check("power mode", WARN, f"mode {mode} ({source}) is not among {sorted(modes)} in {NVPMODEL_CONF}",
                      "sudo nvpmodel -q shows the mode")]
    name, cap_hz = modes[mode]
    if cap_hz is None:
        return [Check("power mode", OK, f"mode {mode} {name} (from {source}): no GPU cap")]
    top = ctx.gpu.levels_hz[-1] if ctx.gpu is not None else None
    detail = f"mode {mode} {name} (from {source}): the GPU is capped at {mhz(cap_hz, none='?')}"
    if top is not None and cap_hz < top:
        return [Check("power mode", WARN, detail + f", below the table's top {mhz(top, none='?')}: "
                                                   "levels above the cap "
                                                   "are not reachable in this mode",
                      "for the full range choose a mode without a GPU cap (sudo nvpmodel -m 0 is MAXN on AGX Orin)")]
    return [Check("power mode", OK, detail)]


# ---- rails, socket, daemon, model, state ------------------------------------------------------------------------

def check_rails(ctx: Context) -> list[Check]:
    from governor.backends import rails as rails_mod

    if ctx.config.backend == "nvml":
        return []
    rails = rails_mod.discover(ctx.root)
    if rails is None:
        return [Check("rails", WARN, "no INA3221 power rails under /sys/class/hwmon: jobs' energy is not reported "
                                     "(pins still work)", "the ina3221 hwmon driver must be loaded (L4T loads it)")]
    sum_of = rails.energy_rails
    try:
        now = f", now {rails.total_mw(rails.read_mw()):.0f} mW"
    except BackendError as e:
        return [Check("rails", WARN, f"rails {', '.join(rails.names)} found but unreadable: {e}")]
    if not sum_of:
        return [Check("rails", WARN, f"rails {', '.join(rails.names)}: none of them is in the energy sum, so energy "
                                     "is not reported on this board", "")]
    return [Check("rails", OK, f"rails {', '.join(rails.names)}; job energy sums {'+'.join(sum_of)}{now}")]


def socket_access(path: str, uid: int, session_gids: set[int]) -> Check:
    """Whether this caller may connect: root always; else the socket's group must be among the session's groups
    (a user added to the group is a member only after logging in again)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Check("socket", FAIL, f"no socket at {path}: ftgovd.socket is not listening", START_SOCKET)
    except OSError as e:
        return Check("socket", FAIL, f"cannot look at {path}: {e.strerror or e}",
                     "the socket's directory must be traversable (/run/ftgov is 0755)")
    if not stat.S_ISSOCK(st.st_mode):
        return Check("socket", FAIL, f"{path} is not a socket", f"remove it, then {START_SOCKET}")
    try:
        group = grp.getgrgid(st.st_gid)
    except KeyError:
        group = None
    group_name = group.gr_name if group else str(st.st_gid)
    detail = f"{path}: group {group_name}, mode {stat.S_IMODE(st.st_mode):04o}"
    if stat.S_IMODE(st.st_mode) & 0o002:
        return Check("socket", FAIL, detail + ": world-writable: any user may pin the GPU",
                     "use the shipped ftgovd.socket (SocketMode=0660)")
    if uid == 0:
        return Check("socket", OK, detail + "; you are root")
    if st.st_uid == uid or st.st_gid in session_gids:
        return Check("socket", OK, detail + f"; you (uid {uid}) are in group {group_name}")
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    if st.st_gid == 0:  # joining root's group would open every file root shares with it, not this socket alone
        return Check("socket", FAIL, detail + f"; you ({user}) are not root, and the socket is root's group's",
                     "run as root, or give the socket a group of its own (socket.group, the ftgov group "
                     "make install adds)")
    if group is not None and user in group.gr_mem:
        return Check("socket", FAIL, detail + f"; {user} is in group {group_name} in /etc/group, but not in this "
                                              "login session", "log out and in again (or run: newgrp "
                                                               f"{group_name})")
    return Check("socket", FAIL, detail + f"; you ({user}) are not in group {group_name}, so you cannot register jobs",
                 f"sudo usermod -aG {group_name} {user}, then log out and in again")


def check_socket(ctx: Context) -> list[Check]:
    if ctx.simulated:  # ftgovd --simulate serves whoever started it: no systemd socket, no ftgov group to agree with
        if not os.path.exists(ctx.socket):
            return [Check("socket", FAIL, f"no socket at {ctx.socket}: ftgovd --simulate is not running",
                          start_simulated(ctx.config.state_dir, ctx.socket))]
        return [socket_access(ctx.socket, ctx.uid, ctx.session_gids)]
    checks = [socket_access(ctx.socket, ctx.uid, ctx.session_gids)]
    want = ctx.config.socket.group
    try:
        want_gid = grp.getgrnam(want).gr_gid
    except KeyError:
        return checks + [Check("socket", FAIL, f"the config's socket.group {want!r} does not exist",
                               "sudo systemd-sysusers (make install adds the ftgov group)")]
    if checks[0].status == OK and os.stat(ctx.socket).st_gid != want_gid:
        checks.append(Check("socket", WARN, f"the socket's group is not the config's socket.group ({want})",
                            "make SocketGroup= in ftgovd.socket and socket.group agree"))
    return checks


def start_daemon(ctx: Context) -> str:
    """How the daemon doctor checks is started: systemd's socket, or the simulation whose tree it is."""
    return start_simulated(ctx.config.state_dir, ctx.socket) if ctx.simulated else START_SOCKET


def reach_daemon(ctx: Context) -> str:
    """The fix for a daemon that does not answer: start it, or, where it runs and this caller may not connect,
    what the socket check says (starting another would find the socket taken)."""
    return "see 'socket' below" if ctx.daemon_denied else start_daemon(ctx)


def check_daemon(ctx: Context) -> list[Check]:
    if ctx.status is None:
        return [Check("daemon", WARN, f"ftgovd does not answer: {ctx.daemon_error}", reach_daemon(ctx))]
    s = ctx.status
    return [Check("daemon", OK, f"ftgovd answers on {ctx.socket}: policy {s.get('policy')}, "
                                f"{len(s.get('jobs') or [])} job(s), {len(s.get('gpus') or [])} GPU(s)")]


def check_numbering(ctx: Context) -> list[Check]:
    """On a node of several NVML GPUs: whether NVML's order of them is their device files', which a Slurm prolog's
    GPU numbers depend on (docs/slurm.md)."""
    from governor.backends.gpuid import orders_differ

    minors: dict[str, int | None] = {}
    for gpu in (ctx.status or {}).get("gpus") or []:
        path = gpu.get("device_file")
        if gpu.get("backend") != "nvml" or not isinstance(path, str) or not path.removeprefix("/dev/nvidia").isdigit():
            return []
        minors[str(gpu.get("id"))] = int(path.removeprefix("/dev/nvidia"))
    if len(minors) < 2:
        return []
    differ = orders_differ(minors)
    if differ is None:
        return [Check("numbering", OK, "NVML's order of the GPUs is their device files' (a Slurm prolog's GPU "
                                       "numbers read the same either way)")]
    return [Check("numbering", WARN, differ,
                  "where Slurm runs: set gpu_numbering in /etc/ftgov/slurm.yaml (docs/slurm.md)")]


def check_model(ctx: Context) -> list[Check]:
    from governor.config import default_model_path
    from governor.errors import ModelError
    from governor.policy.tree import DecisionTree

    policy = (ctx.status or {}).get("policy") or ctx.config.policy or "mlg"
    path = ctx.config.model_file or str(default_model_path())
    origin = "the config's model_file" if ctx.config.model_file else "the tree shipped with ftgov"
    if policy == "ffg":
        return [Check("model", OK, f"policy {policy}: no tree needed")]
    try:
        tree = DecisionTree.load(path)
    except ModelError as e:
        # tune starts each job from the tree's pick (governor.policy): without it, from FFG's level, and tunes on.
        fallback = ("the tuner starts each job from a fixed frequency (FFG) instead of the tree's pick"
                    if policy == "tune" else "MLG falls back to a fixed frequency (FFG)")
        return [Check("model", WARN if policy in ("observe", "tune") else FAIL,
                      f"{path} ({origin}) does not load: {e}; policy {policy}: {fallback}",
                      "reinstall (make install) or point model_file in the config at an ftgov-tree/1 export")]
    return [Check("model", OK, f"{path} ({origin}): {len(tree.nodes)} nodes, source {tree.source}, leaves "
                               f"{', '.join(mhz(hz, unit=False) for hz in tree.leaves_hz())} MHz "
                               "(ftgovd reads it at start)")]


def check_state(ctx: Context) -> list[Check]:
    from governor.errors import StateError
    from governor.store.state import StateFile, boot_id

    state_file = StateFile(ctx.config.state_dir)
    if ctx.uid != 0:  # a board's file and its directory are root's and private: judged as the daemon would, by root
        try:
            owner = os.stat(state_file.path).st_uid
        except (FileNotFoundError, NotADirectoryError):
            return [Check("state", OK, f"{state_file.path}: no state file")]
        except PermissionError:
            owner = 0  # its directory is closed to us: root's
        if owner != ctx.uid:  # a daemon of this user (ftgovd --simulate) keeps one this user may judge
            return [Check("state", WARN, f"{state_file.path} is readable by root only (you are uid {ctx.uid})",
                          "run doctor as root to check it")]
    try:
        state = state_file.read(boot_id(ctx.root), set_aside=False)
    except StateError as e:
        return [Check("state", FAIL, str(e), f"sudo rm {state_file.path} once the limits are restored")]
    if state is None or not state.gpus:
        what = "no state file" if not state_file.path.exists() else "no pin recorded for this boot"
        return [Check("state", OK, f"{state_file.path}: {what}")]
    # A GPU kept under its UUID was not there (or did not answer) when its baseline was due back: ftgovd and
    # `ftgov restore` keep it so, for the start or restore that finds it back (governor.store.state.absent).
    away = {gid for gid, g in state.gpus.items() if gid == g.describe.get("uuid")}
    pins = ", ".join(f"GPU {gid}{' (away when last restored)' if gid in away else ''} pinned at "
                     f"{mhz(g.pinned_hz, none='?')}, baseline {mhz(g.baseline.min_hz, none='?')}.."
                     f"{mhz(g.baseline.max_hz, none='?')}" for gid, g in state.gpus.items())
    if ctx.status is not None:
        return [Check("state", OK, f"{state_file.path}: {pins} (the running ftgovd's)")]
    if away == set(state.gpus):  # a clean stop leaves these too: no crash, and nothing to restore until it is back
        return [Check("state", FAIL, f"{state_file.path}: {pins}, kept while the GPU is off the bus, being reset or "
                                     "not answering: a lock of ftgovd's may stand on it once it is back",
                      "once nvidia-smi lists the GPU again: sudo ftgov restore (or start ftgovd)")]
    return [Check("state", FAIL, f"{state_file.path}: {pins}, but ftgovd does not run: a crashed daemon left the pin",
                  "sudo ftgov restore (systemd's ExecStopPost does this after a crash)")]


CHECKS: tuple[Callable[[Context], list[Check]], ...] = (
    check_board, check_devfreq, check_daemon, check_pin, check_holder, check_cooling, check_jtop, check_nvpmodel,
    check_rails, check_socket, check_numbering, check_model, check_state)
