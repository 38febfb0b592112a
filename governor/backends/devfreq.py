"""Jetson GPU devfreq backend: find the GPU's devfreq node, pin min_freq = max_freq, restore.

The node is found by scanning /sys/class/devfreq (JetPack 6 names it 17000000.gpu, JetPack 5 17000000.ga10b) and
matching the device's of_node name or compatible; other devfreq nodes (vic, DLA) are skipped. The class link leads to
the real node under /sys/devices/platform on both releases, not to the driver's links (JetPack 5's
/sys/devices/17000000.ga10b and /sys/devices/gpu.0, JetPack 6's bus@0/gpu.0).
Frequencies in these files are in Hz. On 5.10/5.15 kernels min_freq/max_freq accept any integer and reads return the
effective, clamped range, so every pin writes in the order that keeps min <= max at each step and reads both back.
"""

from __future__ import annotations

import os
from pathlib import Path

from governor.backends.base import GpuBase, Limits, Reading
from governor.errors import BackendError, NodeNotFound, PinError
from governor.sysfs import Root, excerpt, read_int, read_text, write_text

DEVFREQ_CLASS = "/sys/class/devfreq"
GPU_OF_NAMES = frozenset({"ga10b", "gv11b", "gp10b", "gb10b", "gpu"})
GPU_COMPATIBLE = "nvidia,ga10b"


def _of_node_matches(device: Path) -> bool:
    of_node = device / "of_node"
    try:
        name = (of_node / "name").read_bytes().rstrip(b"\0\n").decode(errors="replace")
    except OSError:
        name = ""
    try:
        # compatible is a NUL-separated list in device-tree files.
        compatible = (of_node / "compatible").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        compatible = []
    return name in GPU_OF_NAMES or "gpu" in name or GPU_COMPATIBLE in [c.strip() for c in compatible]


# The unit's ReadWritePaths= (systemd/ftgovd.service): a node outside it is read-only to the daemon under systemd.
SANDBOX_WRITABLE = "/sys/devices/platform/"


def under_sandbox(node_path: str) -> bool:
    """Whether a devfreq node (its path on the board) lies where the shipped unit lets the daemon write."""
    return str(node_path).startswith(SANDBOX_WRITABLE)


def find_node(root: Root) -> Path:
    """The GPU's devfreq directory (resolved under root), or NodeNotFound."""
    class_dir = root.path(DEVFREQ_CLASS)
    try:
        entries = sorted(os.listdir(class_dir))
    except OSError as e:
        raise NodeNotFound(f"no devfreq class at {DEVFREQ_CLASS} under {root.root}: {e.strerror or e}") from e
    for entry in entries:
        node = root.resolve(class_dir / entry)
        device = root.resolve(node / "device")
        if _of_node_matches(device):
            return node
    raise NodeNotFound(f"no GPU devfreq node among {entries or 'no entries'} in {DEVFREQ_CLASS} under {root.root}")


def _load_file(root: Root, device: Path) -> Path | None:
    """The GPU's per-mille load file: on the device itself, or on the gpu.0 platform device."""
    for candidate in (device / "load", root.path("/sys/devices/platform/gpu.0/load")):
        if candidate.exists():
            return candidate
    return None  # Thor has no load file


class DevfreqGpu(GpuBase):
    """The Orin's single GPU, driven through its devfreq node."""

    id = "0"

    def __init__(self, root: Root, node: Path):
        self.root = root
        self.node = node
        self.device = root.resolve(node / "device")
        self.load_path = _load_file(root, self.device)
        text = read_text(node / "available_frequencies")
        try:
            levels = sorted({int(x) for x in text.split()})
        except ValueError as e:
            raise BackendError(f"{root.unroot(node)}/available_frequencies holds {excerpt(text)}, not a list of "
                               "frequencies") from e
        if not levels:
            raise BackendError(f"{root.unroot(node)}/available_frequencies is empty")
        self.levels_hz: tuple[int, ...] = tuple(levels)
        self._pinned_hz: int | None = None

    def describe(self) -> dict:
        return {
            "backend": "devfreq",
            "devfreq": self.root.unroot(self.node),
            "name": self.node.name,
            "load_file": self.root.unroot(self.load_path) if self.load_path else None,
        }

    def snapshot(self) -> Limits:
        return Limits(read_int(self.node / "min_freq"), read_int(self.node / "max_freq"))

    def _write_limits(self, min_hz: int, max_hz: int) -> None:
        current_max = read_int(self.node / "max_freq")
        # Widen first: raising, write max then min; lowering, min then max. min <= max holds after each write.
        if max_hz >= current_max:
            order = (("max_freq", max_hz), ("min_freq", min_hz))
        else:
            order = (("min_freq", min_hz), ("max_freq", max_hz))
        for name, value in order:
            write_text(self.node / name, f"{value}\n")  # as `echo` writes it; devfreq's store takes "%lu"

    def pin(self, freq_hz: int) -> None:
        if freq_hz not in self.levels_hz:
            raise PinError(f"{freq_hz} Hz is not a level of {self.node.name} ({', '.join(map(str, self.levels_hz))})")
        self._pinned_hz = freq_hz
        self._write_limits(freq_hz, freq_hz)
        got = self.snapshot()
        if (got.min_hz, got.max_hz) != (freq_hz, freq_hz):
            raise PinError(f"pin to {freq_hz} Hz did not take: {self.node.name} reads min {got.min_hz} "
                           f"max {got.max_hz}")

    def pin_holds(self, reading: Reading | None = None) -> bool:
        """The files still read min = max = our pin (the last level pinned through this object)."""
        if self._pinned_hz is None:
            return True
        limits = self.snapshot() if reading is None else Limits(reading.min_hz, reading.max_hz)
        return limits == Limits(self._pinned_hz, self._pinned_hz)

    def restore(self, limits: Limits) -> None:
        self._pinned_hz = None
        # The two files are the whole of what a pin changes: where they read the limits already there is nothing to
        # put back. A pin whose first write failed (a node the sandbox leaves read-only) left them so, and writing
        # them again would fail too, and be retried on every tick for as long as the daemon runs.
        if self.snapshot() == Limits(limits.min_hz, limits.max_hz):
            return
        self.write_limits(limits)

    def write_limits(self, limits: Limits) -> None:
        """Write min_freq and max_freq (widen first) even where they read these already, and check the read-back:
        restore's writes without its shortcut (`ftgov doctor`'s root write test)."""
        self._write_limits(limits.min_hz, limits.max_hz)
        got = self.snapshot()
        if (got.min_hz, got.max_hz) != (limits.min_hz, limits.max_hz):
            # The kernel clamps reads to the table; a baseline of 0 / 2147483647 (nvpmodel MAXN) reads back as the
            # table's ends. Accept a clamped read-back when it equals the clamp of what we wrote.
            want = (self._clamp(limits.min_hz), self._clamp(limits.max_hz))
            if (got.min_hz, got.max_hz) != want:
                raise BackendError(f"restore of {self.node.name} to {limits.min_hz}..{limits.max_hz} Hz reads back "
                                   f"{got.min_hz}..{got.max_hz}")

    def _clamp(self, hz: int) -> int:
        return min(max(hz, self.levels_hz[0]), self.levels_hz[-1])

    def read(self) -> Reading:
        limits = self.snapshot()
        try:
            cur_hz = read_int(self.node / "cur_freq")
        except BackendError:
            cur_hz = None
        load_pct = None
        if self.load_path is not None:
            try:
                # Per-mille. Clamped: a value past 1000 (none seen on a board) would otherwise reach a job's gpu_util
                # and make the daemon's saved state fail its own check at the next start.
                load_pct = min(max(read_int(self.load_path) / 10.0, 0.0), 100.0)
            except BackendError:
                load_pct = None
        return Reading(limits.min_hz, limits.max_hz, cur_hz, load_pct)


def probe(root: Root) -> list[DevfreqGpu]:
    """Find the Orin GPU (reads only). NodeNotFound when there is none yet: the daemon waits and retries."""
    return [DevfreqGpu(root, find_node(root))]
