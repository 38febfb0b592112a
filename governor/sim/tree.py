"""Build a fake sysfs tree that mirrors a Jetson Orin's, under any directory: the paths, names and units of the board.

Layouts (``LAYOUTS``):
- ``jp6``: AGX Orin, JetPack 6 (L4T r36): the node under ``platform/bus@0/17000000.gpu``, of_node name "gpu", the
  driver's ``bus@0/gpu.0``, ``platform/gpu.0`` and ``platform/17000000.gpu`` links; unused INA3221 channels have no
  label file.
- ``jp5``: AGX Orin, JetPack 5 (L4T r35): the node under ``platform/17000000.ga10b``, of_node name "ga10b" (so its
  device-tree node is ``ga10b@17000000``: a platform device from the device tree is named unit-address.node-name),
  the driver's links one level up (``/sys/devices/17000000.ga10b``, ``/sys/devices/gpu.0``) and ``platform/gpu.0``,
  and no ``devfreq_dev`` link (the reference lists it for JetPack 6 only; nothing in ftgov reads it); unused INA3221
  channels are labelled ``NC``.
- ``nx-jp6``: Orin NX / Orin Nano, JetPack 6: the JetPack 6 layout with the NX rails (VDD_IN, VDD_CPU_GPU_CV, VDD_SOC).

Every tree has the devfreq class symlink, the device's of_node, a per-mille GPU load file, the INA3221 hwmon rails and
an unrelated devfreq node (the VIC engine) that discovery must skip. Links are relative, as the kernel makes them.

The files are plain files. What a kernel does on a write (clamp min_freq/max_freq to the effective range) and what
the hardware does (cur_freq, load, rails following the work) is the simulated board's: ``python -m
governor.sim.board --tree DIR`` (governor.sim.board). ``ftgov-sim/`` at the top of the tree is that board's own
directory (the layout's name, the jobs that run, scratch space for its atomic writes): nothing on a real board.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from governor.sysfs import Root

# AGX Orin 64GB, JetPack 6: the paper's 11 levels (a third-party listing; unverified on our side).
JP6_LEVELS_HZ = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000,
                 1122000000, 1224000000, 1300500000)
# AGX Orin, JetPack 5: 13 levels, matching two independent third-party listings.
JP5_LEVELS_HZ = (114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
                 930750000, 1032750000, 1134750000, 1236750000, 1300500000)
# Orin NX 16GB (25 W), JetPack 6: only the range 306..918 MHz is known; the levels in between are assumed to be
# the AGX JetPack 6 steps (unverified: no listing of the NX table was available). An Orin Nano tops out lower
# (about 625 MHz at 15 W, unverified); the nx-jp6 tree stands for both modules with the NX's table.
NX_LEVELS_HZ = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000)

RAIL_MV = 5000  # every simulated rail reads 5 V; its current carries the power
SIM_DIR = "/ftgov-sim"  # the simulated board's private directory at the top of the tree
JOBS_DIR = SIM_DIR + "/jobs"  # one JSON file per simulated job that runs (governor.sim.job)
# A thermal cap on the clock the running board lets the GPU run at, in Hz (absent: none). L4T's thermal throttling
# can hold the clock below a pinned min without the limit files showing it (cur_freq does): the board shows that.
THERMAL_CAP = SIM_DIR + "/thermal_cap_hz"
# "ina3221": the running board's rails report as the sensor does (an average over update_interval, refreshed at it;
# power in phases within a step: governor.sim.board). Absent: the model's mean power, at once. Read when the board
# starts.
METERS = SIM_DIR + "/meters"
# The exact meters' hwmon update_interval: the daemon's sampler reads the rails at it. Tests run jobs in scaled time
# (a step of 60 ms in 9), so the tree says 20 ms: about as many samples a step as a board's 140 ms gives steps of
# 0.3-1 s. (An INA3221's update_interval is writable down to a few ms: fewer conversions averaged.)
EXACT_UPDATE_INTERVAL_MS = 20
INA3221_BUS = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1"  # the I2C bus the rails' INA3221s sit on
TMP_DIR = SIM_DIR + "/tmp"  # where atomic writes are staged: same file system as the tree, outside /sys


# AGX Orin power modes: nvpmodel id -> (name, GPU max Hz, None: no cap). The caps are NVIDIA's AGX Orin conf; the ids
# and MODE_30W as the default follow NVIDIA's published conf (unverified on a board).
AGX_POWER_MODES = {0: ("MAXN", None), 1: ("MODE_15W", 408000000), 2: ("MODE_30W", 612000000),
                   3: ("MODE_50W", 816000000)}
AGX_DEFAULT_MODE = 2
NVPMODEL_CONF = "/etc/nvpmodel.conf"
# Where nvpmodel keeps the mode it last set, "pmode:0002 ..." (unverified: from third-party reports).
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"


@dataclass(frozen=True)
class Layout:
    """One board and JetPack release: where the GPU sits, its table, its INA3221 channels."""

    name: str
    description: str
    device: str  # the GPU's platform device
    of_node: str  # its device-tree node
    of_name: str  # what of_node/name reads
    levels_hz: tuple[int, ...]
    rails: dict[str, dict[int, str]]  # INA3221 chip (i2c address) -> channel -> label; other channels are unused
    unused_label: str | None  # what an unused channel's label reads, None: no label file (JetPack 6)
    links: tuple[str, ...]  # the driver's symlinks to the device
    model: str
    compatible: str
    release: str
    idle_rails_mw: dict[str, float]  # what the rails of a static tree read (a board process rewrites them)
    devfreq_dev: bool = True  # the device's devfreq_dev link to its node (JetPack 6's nvgpu)


_AGX_RAILS = {"1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"}, "1-0041": {2: "VDDQ_VDD2_1V8AO"}}
# The NX/Nano module carries one INA3221; its address is assumed to be the AGX's first chip's (unverified).
_NX_RAILS = {"1-0040": {1: "VDD_IN", 2: "VDD_CPU_GPU_CV", 3: "VDD_SOC"}}
# Idle power in mW; the NX split of the same board power is governor.sim.energy.nx_rails_mw's.
_AGX_IDLE_MW = {"VDD_GPU_SOC": 3200.0, "VDD_CPU_CV": 800.0, "VIN_SYS_5V0": 3600.0, "VDDQ_VDD2_1V8AO": 900.0}
_NX_IDLE_MW = {"VDD_IN": 7600.0, "VDD_CPU_GPU_CV": 2000.0, "VDD_SOC": 2000.0}
_JP6_DEVICE = "/sys/devices/platform/bus@0/17000000.gpu"
_JP6_LINKS = ("/sys/devices/platform/bus@0/gpu.0", "/sys/devices/platform/gpu.0", "/sys/devices/platform/17000000.gpu")
_JP6_RELEASE = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64"
_AGX_MODEL, _AGX_COMPATIBLE = "NVIDIA Jetson AGX Orin Developer Kit", "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005"

LAYOUTS: dict[str, Layout] = {
    "jp6": Layout("jp6", "Jetson AGX Orin, JetPack 6", _JP6_DEVICE, "/proc/device-tree/bus@0/gpu@17000000", "gpu",
                  JP6_LEVELS_HZ, _AGX_RAILS, None, _JP6_LINKS, _AGX_MODEL, _AGX_COMPATIBLE, _JP6_RELEASE, _AGX_IDLE_MW),
    "jp5": Layout("jp5", "Jetson AGX Orin, JetPack 5", "/sys/devices/platform/17000000.ga10b",
                  "/proc/device-tree/ga10b@17000000", "ga10b", JP5_LEVELS_HZ, _AGX_RAILS, "NC",
                  ("/sys/devices/17000000.ga10b", "/sys/devices/gpu.0", "/sys/devices/platform/gpu.0"),
                  _AGX_MODEL, _AGX_COMPATIBLE,
                  "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64", _AGX_IDLE_MW,
                  devfreq_dev=False),
    # The NX's model and compatible strings follow the p3767 module naming (unverified).
    "nx-jp6": Layout("nx-jp6", "Jetson Orin NX / Orin Nano, JetPack 6", _JP6_DEVICE,
                     "/proc/device-tree/bus@0/gpu@17000000", "gpu", NX_LEVELS_HZ, _NX_RAILS, None, _JP6_LINKS,
                     "NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                     "nvidia,p3768-0000+p3767-0000\0nvidia,p3767-0000", _JP6_RELEASE, _NX_IDLE_MW),
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs makes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _devfreq_files(node: Path, levels_hz: tuple[int, ...], governor: str, max_hz: int) -> None:
    files = {
        "name": node.name,
        "governor": governor,
        "available_governors": "nvhost_podgov userspace performance simple_ondemand",
        "cur_freq": str(levels_hz[0]),
        "target_freq": str(levels_hz[0]),
        "available_frequencies": " ".join(map(str, levels_hz)),
        "polling_interval": "25",
        "min_freq": str(levels_hz[0]),
        "max_freq": str(max_hz),
        "trans_stat": "",
        "timer": "deferrable",
    }
    for name, text in files.items():
        _write(node / name, text + "\n")


def _of_node(root: Root, dt_path: str, name: str, compatible: str) -> Path:
    of = root.path(dt_path)
    _write(of / "name", name + "\0")
    _write(of / "compatible", compatible + "\0")
    return of


def build(directory: str | os.PathLike, layout: str = "jp6", *, boot_id: str | None = None,
          max_hz: int | None = None, power_mode: int | None = None) -> Root:
    """Create the tree under ``directory`` (which may exist) and return its Root.

    ``max_hz`` is the baseline max_freq, as a power mode leaves it (AGX Orin MODE_30W: 612000000); by default the
    table's top (MAXN). Any integer is taken: a capped max need not be a table level. ``power_mode`` (an AGX Orin
    nvpmodel id, AGX_POWER_MODES) also writes nvpmodel's conf and status under the root and sets max_hz to the
    mode's cap.
    """
    try:
        spec = LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown layout {layout!r} ({', '.join(LAYOUTS)})") from None
    if power_mode is not None:
        if spec.rails is not _AGX_RAILS or power_mode not in AGX_POWER_MODES:
            raise ValueError(f"power mode {power_mode!r}: the simulated modes are AGX Orin's "
                             f"({', '.join(f'{i} {n}' for i, (n, _) in AGX_POWER_MODES.items())})")
        cap_hz = AGX_POWER_MODES[power_mode][1]
        if max_hz is not None and max_hz != (cap_hz or spec.levels_hz[-1]):
            raise ValueError(f"max_hz {max_hz} contradicts power mode {power_mode}'s cap")
        max_hz = cap_hz
    if max_hz is not None and not spec.levels_hz[0] <= max_hz <= spec.levels_hz[-1]:
        raise ValueError(f"max_hz {max_hz} is outside the {spec.name} table "
                         f"({spec.levels_hz[0]}..{spec.levels_hz[-1]} Hz)")
    root = Root(directory)
    device = root.path(spec.device)
    of = _of_node(root, spec.of_node, spec.of_name, "nvidia,ga10b")
    node = device / "devfreq" / device.name
    _devfreq_files(node, spec.levels_hz, "nvhost_podgov", max_hz or spec.levels_hz[-1])
    _link(node / "device", device)
    _link(device / "of_node", of)
    _link(root.path("/sys/class/devfreq") / device.name, node)
    _write(device / "load", "0\n")
    _write(device / "railgate_enable", "1\n")
    for link in spec.links:
        _link(root.path(link), device)
    if spec.devfreq_dev:
        _link(device / "devfreq_dev", node)

    # An unrelated devfreq node that discovery must skip.
    vic = root.path("/sys/devices/platform/bus@0/15340000.vic")
    vic_node = vic / "devfreq" / vic.name
    _devfreq_files(vic_node, (115200000, 345600000, 729600000), "nvhost_podgov", 729600000)
    _link(vic_node / "device", vic)
    _link(vic / "of_node", _of_node(root, "/proc/device-tree/bus@0/vic@15340000", "vic", "nvidia,tegra234-vic"))
    _link(root.path("/sys/class/devfreq") / vic.name, vic_node)

    _ina3221(root, spec)
    _write(root.path("/proc/device-tree/model"), spec.model + "\0")
    _write(root.path("/proc/device-tree/compatible"), spec.compatible + "\0nvidia,tegra234\0")
    _write(root.path("/etc/nv_tegra_release"), spec.release + "\n")
    if boot_id is None:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    _write(root.path("/proc/sys/kernel/random/boot_id"), boot_id + "\n")
    if power_mode is not None:
        _nvpmodel(root, power_mode, spec)
    _write(root.path(SIM_DIR) / "layout", spec.name + "\n")
    root.path(JOBS_DIR).mkdir(parents=True, exist_ok=True)
    root.path(TMP_DIR).mkdir(parents=True, exist_ok=True)
    return root


def set_update_interval(root: Root, ms: int) -> None:
    """Every INA3221's hwmon update_interval, as writing to it on a board sets it (the rails read it when found)."""
    for hwmon in root.path(INA3221_BUS).glob("*/hwmon/hwmon*"):
        _write(hwmon / "update_interval", f"{ms}\n")


def _ina3221(root: Root, spec: Layout) -> None:
    i2c = root.path(INA3221_BUS)
    for n, (chip, channels) in enumerate(spec.rails.items(), start=1):
        hwmon = i2c / chip / "hwmon" / f"hwmon{n}"
        _write(hwmon / "name", "ina3221\n")
        _write(hwmon / "update_interval", "140\n")
        for ch in (1, 2, 3):
            if ch in channels:
                _write(hwmon / f"in{ch}_label", channels[ch] + "\n")
            elif spec.unused_label is not None:
                _write(hwmon / f"in{ch}_label", spec.unused_label + "\n")
                _write(hwmon / f"in{ch}_input", "0\n")
                _write(hwmon / f"curr{ch}_input", "0\n")
            else:
                # The kernel fails these reads with ENODATA, which a plain file cannot; empty files fail to parse.
                _write(hwmon / f"in{ch}_input", "")
                _write(hwmon / f"curr{ch}_input", "")
        _write(hwmon / "in7_label", "sum of shunt voltages\n")
        _link(root.path("/sys/bus/i2c/drivers/ina3221") / chip, i2c / chip)
        _link(root.path("/sys/class/hwmon") / f"hwmon{n}", hwmon)
    write_rails(root, spec.idle_rails_mw)


def _nvpmodel(root: Root, mode: int, spec: Layout) -> None:
    """nvpmodel's conf (the GPU part of each mode, in the layout of NVIDIA's published confs) and its status. The
    conf names the limit files through the driver's links: JetPack 6's gpu.0/devfreq_dev, JetPack 5's one level up
    (which of JetPack 5's links its confs use is unverified: the reference says only that they write through them)."""
    name = Path(spec.device).name
    gpu_dir = "/sys/devices/platform/gpu.0/devfreq_dev" if spec.devfreq_dev else f"/sys/devices/{name}/devfreq/{name}"
    lines = ["< PARAM TYPE=CLOCK NAME=GPU >", f"MIN_FREQ {gpu_dir}/min_freq", f"MAX_FREQ {gpu_dir}/max_freq"]
    for mode_id, (name, cap_hz) in AGX_POWER_MODES.items():
        lines += [f"< POWER_MODEL ID={mode_id} NAME={name} >", "GPU MIN_FREQ 0", f"GPU MAX_FREQ {cap_hz or -1}"]
    lines.append(f"< PM_CONFIG DEFAULT={AGX_DEFAULT_MODE} >")
    _write(root.path(NVPMODEL_CONF), "\n".join(lines) + "\n")
    _write(root.path(NVPMODEL_STATUS), f"pmode:{mode:04d} fmode:quiet\n")


def layout_of(root: Root) -> Layout:
    """The layout a tree was built with (its ``ftgov-sim/layout``)."""
    path = root.path(SIM_DIR) / "layout"
    try:
        name = path.read_text().strip()
    except OSError as e:
        raise ValueError(f"{root.root} is not a simulated tree ({path}: {e.strerror or e})") from e
    if name not in LAYOUTS:
        raise ValueError(f"{path} names an unknown layout {name!r}")
    return LAYOUTS[name]


def set_thermal_cap(root: Root, cap_hz: int | None) -> None:
    """Throttle the running board's GPU to at most cap_hz (the highest level under it), or stop (None)."""
    path = root.path(THERMAL_CAP)
    if cap_hz is None:
        path.unlink(missing_ok=True)
    else:
        replace_file(root, path, f"{int(cap_hz)}\n")


def replace_file(root: Root, path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in one step (staged, then renamed into place), as a sysfs read sees an attribute:
    never a reader that catches the file truncated and empty."""
    tmp_dir = root.path(TMP_DIR)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{os.getpid()}-{path.name}"
    tmp.write_text(text)
    os.replace(tmp, path)


def write_rails(root: Root, power_mw: dict[str, float]) -> None:
    """Set the labelled rails' voltage and current files so that mV x mA / 1000 gives the wanted power (labels not
    in ``power_mw`` are left as they are)."""
    drivers = root.path("/sys/bus/i2c/drivers/ina3221")
    for chip in sorted(os.listdir(drivers)):
        for hwmon in (drivers / chip / "hwmon").iterdir():
            for ch in (1, 2, 3):
                try:
                    label = (hwmon / f"in{ch}_label").read_text().strip()
                except FileNotFoundError:
                    continue
                if label in power_mw:
                    replace_file(root, hwmon / f"in{ch}_input", f"{RAIL_MV}\n")
                    replace_file(root, hwmon / f"curr{ch}_input", f"{round(power_mw[label] * 1000 / RAIL_MV)}\n")
