"""Build a fake sysfs tree that mirrors a Jetson AGX Orin (jetson-orin.md), under any directory.

Layouts: ``jp6`` (L4T r36: 17000000.gpu under bus@0, of_node name "gpu") and ``jp5`` (L4T r35: 17000000.ga10b, of_node
name "ga10b"; its exact parent directory is unverified). Both carry the devfreq class symlink, the device's of_node,
a per-mille GPU load file, the INA3221 hwmon rails and an unrelated devfreq node (the VIC engine) that discovery
must skip. Links are relative, as the kernel makes them. Files are plain files: writes are stored as written (a real
kernel clamps reads to the table; the backend accepts either).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from governor.sysfs import Root

JP6_LEVELS_HZ = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000, 1020000000,
                 1122000000, 1224000000, 1300500000)
# JetPack 5's table (13 levels, ~102 MHz apart); the middle entries are interpolated from the third-party listing.
JP5_LEVELS_HZ = (114750000, 216750000, 318750000, 420750000, 522750000, 624750000, 726750000, 828750000,
                 930750000, 1032750000, 1134750000, 1236750000, 1300500000)

# INA3221 channels on AGX Orin: chip 1-0040 ch1..3, chip 1-0041 ch2 (jetson-orin.md). Idle power in mW, ~5 V inputs.
AGX_RAILS = {
    "1-0040": {1: "VDD_GPU_SOC", 2: "VDD_CPU_CV", 3: "VIN_SYS_5V0"},
    "1-0041": {2: "VDDQ_VDD2_1V8AO"},
}
IDLE_RAILS_MW = {"VDD_GPU_SOC": 3200.0, "VDD_CPU_CV": 800.0, "VIN_SYS_5V0": 3600.0, "VDDQ_VDD2_1V8AO": 900.0}
RAIL_MV = 5000

Layout = Literal["jp6", "jp5"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs makes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _devfreq_files(node: Path, levels_hz: tuple[int, ...], governor: str) -> None:
    files = {
        "name": node.name,
        "governor": governor,
        "available_governors": "nvhost_podgov userspace performance simple_ondemand",
        "cur_freq": str(levels_hz[0]),
        "target_freq": str(levels_hz[0]),
        "available_frequencies": " ".join(map(str, levels_hz)),
        "polling_interval": "25",
        "min_freq": str(levels_hz[0]),
        "max_freq": str(levels_hz[-1]),
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


def build(directory: str | os.PathLike, layout: Layout = "jp6", *, boot_id: str | None = None) -> Root:
    """Create the tree under ``directory`` (which may exist) and return its Root."""
    root = Root(directory)
    if layout == "jp6":
        device = root.path("/sys/devices/platform/bus@0/17000000.gpu")
        of = _of_node(root, "/proc/device-tree/bus@0/gpu@17000000", "gpu", "nvidia,ga10b")
        levels, release = JP6_LEVELS_HZ, "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64"
    elif layout == "jp5":
        device = root.path("/sys/devices/platform/17000000.ga10b")
        of = _of_node(root, "/proc/device-tree/gpu@17000000", "ga10b", "nvidia,ga10b")
        levels, release = JP5_LEVELS_HZ, "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64"
    else:
        raise ValueError(f"unknown layout {layout!r} (jp6 or jp5)")

    node = device / "devfreq" / device.name
    _devfreq_files(node, levels, "nvhost_podgov")
    _link(node / "device", device)
    _link(device / "of_node", of)
    _link(root.path("/sys/class/devfreq") / device.name, node)
    _write(device / "load", "0\n")
    _write(device / "railgate_enable", "1\n")
    platform = root.path("/sys/devices/platform")
    if device.parent != platform:
        _link(platform / device.name, device)
    _link(platform / "gpu.0", device)
    _link(device / "devfreq_dev", node)

    # An unrelated devfreq node that discovery must skip.
    vic = root.path("/sys/devices/platform/bus@0/15340000.vic")
    vic_node = vic / "devfreq" / vic.name
    _devfreq_files(vic_node, (115200000, 345600000, 729600000), "nvhost_podgov")
    _link(vic_node / "device", vic)
    _link(vic / "of_node", _of_node(root, "/proc/device-tree/bus@0/vic@15340000", "vic", "nvidia,tegra234-vic"))
    _link(root.path("/sys/class/devfreq") / vic.name, vic_node)

    i2c = root.path("/sys/devices/platform/bus@0/c240000.i2c/i2c-1")
    for n, (chip, channels) in enumerate(AGX_RAILS.items(), start=1):
        hwmon = i2c / chip / "hwmon" / f"hwmon{n}"
        _write(hwmon / "name", "ina3221\n")
        _write(hwmon / "update_interval", "140\n")
        for ch in (1, 2, 3):
            label = channels.get(ch, f"NC_{chip}_{ch}")
            _write(hwmon / f"in{ch}_label", label + "\n")
        _write(hwmon / "in7_label", "sum of shunt voltages\n")
        _link(root.path("/sys/bus/i2c/drivers/ina3221") / chip, i2c / chip)
        _link(root.path("/sys/class/hwmon") / f"hwmon{n}", hwmon)
    write_rails(root, IDLE_RAILS_MW)

    _write(root.path("/proc/device-tree/model"), "NVIDIA Jetson AGX Orin Developer Kit\0")
    _write(root.path("/proc/device-tree/compatible"),
           "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0")
    _write(root.path("/etc/nv_tegra_release"), release + "\n")
    if boot_id is None:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    _write(root.path("/proc/sys/kernel/random/boot_id"), boot_id + "\n")
    return root


def write_rails(root: Root, power_mw: dict[str, float]) -> None:
    """Set the rails' voltage and current files so that mV x mA / 1000 gives the wanted power."""
    for chip, channels in AGX_RAILS.items():
        hwmon = next(root.path("/sys/bus/i2c/drivers/ina3221").joinpath(chip, "hwmon").iterdir())
        for ch, label in channels.items():
            mw = power_mw.get(label, 0.0)
            _write(hwmon / f"in{ch}_input", f"{RAIL_MV}\n")
            _write(hwmon / f"curr{ch}_input", f"{round(mw * 1000 / RAIL_MV)}\n")
