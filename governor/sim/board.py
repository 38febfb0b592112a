"""The simulated board: a process that makes a simulated tree behave as a Jetson Orin does under what is written to it.

    python -m governor.sim.board --tree DIR [--build jp6|jp5|nx-jp6 [--max-hz HZ] [--meters ina3221|exact]]

It runs beside ftgovd (``ftgovd --simulate`` starts one) and knows nothing of the daemon: like a board, it sees only
the files. It waits (inotify, no polling) for writes to the GPU devfreq node's ``min_freq``/``max_freq`` (kept as the
kernel keeps a user's QoS request: kHz, min rounded down, max rounded up, 0 on max meaning no limit; both files
rewritten with the effective range, clamped to the table, a moment after the write where a real sysfs does it inside
it), and for simulated jobs (governor.sim.job) announcing themselves under ``ftgov-sim/jobs/``.

Then it rewrites ``cur_freq``, the per-mille GPU ``load`` (only while a job's steps run, as on a real GPU) and the
INA3221 rails from the energy model (governor.sim.energy): the model's mean power at once, or, where
``ftgov-sim/meters`` reads ``ina3221`` (tree.METERS), as the sensor reports (governor.sim.meters): the mean over the
hwmon ``update_interval`` before its last refresh, the GPU rail following a step's phases, steps scattering as real
ones do, in the jobs' compressed time where they run faster than the model. Several jobs at once: the board runs the
heaviest one. Idle rails are the model's idle at the lowest clock. The simplifications: docs/energy-model.md.

A job whose steps run at ``time_scale`` of the model's time (governor.sim.job) draws the model's power divided by
time_scale while they run: the daemon integrates power over wall time, so its steps take the workload's energy
whatever the scale, and a store's J/step is the workload's (the rails read high instead: a simulated GPU faster and
hungrier alike). The model's power would make every scale a board of its own, and retrain pools jobs by features.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from dataclasses import fields
from pathlib import Path

from governor.backends import rails as rails_backend
from governor.backends.devfreq import DevfreqGpu, find_node
from governor.backends.rails import RAIL_CPU_GPU_CV, RAIL_GPU_SOC, RAIL_IN
from governor.errors import FtgovError
from governor.sim import tree
from governor.sim.energy import OrinEnergyModel, Workload, nx_rails_mw
from governor.sim.inotify import IN_CLOSE_WRITE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO, Inotify
from governor.sim.meters import Ina3221
from governor.sysfs import Root

S32_MAX = 2**31 - 1  # PM QoS values are s32 kHz; the max request's default is "no limit"
LIMIT_FILES = ("min_freq", "max_freq")
_WORKLOAD_FIELDS = {f.name for f in fields(Workload)}


def _int(text: str) -> int | None:
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


# The rails whose power swings within a step: the GPU's (AGX Orin: GPU+SoC; Orin NX/Nano: CPU+GPU+CV).
PHASED_RAILS = (RAIL_GPU_SOC, RAIL_CPU_GPU_CV)


class Board:
    """One simulated board over one tree: ``react()`` after writes into it, ``serve()`` waits for them and for the
    rails' refreshes. ``clock``: monotonic seconds (a test may drive it)."""

    def __init__(self, root: Root, clock=time.monotonic):
        self.root = root
        self.clock = clock
        self.layout = tree.layout_of(root)
        self.node = find_node(root)
        gpu = DevfreqGpu(root, self.node)
        self.levels_hz, self.load_path = gpu.levels_hz, gpu.load_path
        self.jobs_dir = root.path(tree.JOBS_DIR)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self._models: dict[tuple[int, ...], OrinEnergyModel] = {}
        has_nx_rails = any(RAIL_IN in channels.values() for channels in self.layout.rails.values())
        self._rails_of = nx_rails_mw if has_nx_rails else dict
        self._khz = {"min_freq": 0, "max_freq": S32_MAX}
        # Each limit file as the board last took or wrote it: ((inode, mtime, size), text).
        self._seen: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._written: dict[Path, str] = {}  # what the board last wrote to each output file
        self._rails_written: dict[str, float] | None = None
        found = rails_backend.discover(root)
        update_s = found.update_interval_s if found is not None else rails_backend.DEFAULT_UPDATE_INTERVAL_S
        self.update_s = update_s
        try:
            realistic = root.path(tree.METERS).read_text().strip() == "ina3221"
        except FileNotFoundError:
            realistic = False
        self.ina = Ina3221(clock(), update_s, PHASED_RAILS) if realistic else None
        # The running job's steps take this fraction of the model's time: the meters run as fast, the power is
        # divided by it (the module's docstring says why).
        self.time_scale = 1.0
        self._pidfds: dict[int, int] = {}  # pidfd -> pid of a job's process

    # -- the kernel's side: requests and the effective range ---------------------------------------------------

    def _take_request(self, name: str, text: str) -> None:
        """``text``, written to min_freq or max_freq, as the new request (a non-number is refused, as the kernel
        refuses it with EINVAL: the request stays as it was)."""
        try:
            hz = int(text.split()[0])
        except (ValueError, IndexError):
            return
        if hz < 0:
            return
        if name == "min_freq":
            self._khz[name] = min(hz // 1000, S32_MAX)
        else:
            khz = -(-hz // 1000)
            self._khz[name] = S32_MAX if khz == 0 else min(khz, S32_MAX)

    def effective(self) -> tuple[int, int]:
        """(min, max) in Hz as the kernel reads them back: the requests within the table, min := max if they cross."""
        lo, hi = self.levels_hz[0], self.levels_hz[-1]
        min_hz = max(lo, self._khz["min_freq"] * 1000)
        max_hz = hi if self._khz["max_freq"] == S32_MAX else min(hi, self._khz["max_freq"] * 1000)
        return min(min_hz, max_hz), max_hz

    def _show_limits(self) -> None:
        """Take every write not yet taken, then rewrite the files that do not read the effective range.

        A file's identity (inode, mtime, size) and text tell a new write from the board's own rewrite: an event read
        late (for a write that the board has already taken and clamped) is no new request, and a write that lands
        after its event was read is one, so the board never overwrites a newer write with an older range.
        """
        in_flight = set()
        for name in LIMIT_FILES:
            path = self.node / name
            try:
                st, text = os.stat(path), path.read_text()
            except OSError:
                in_flight.add(name)
                continue
            if not text.strip():  # truncated by a write still in progress: its close event follows
                in_flight.add(name)
            elif ((st.st_ino, st.st_mtime_ns, st.st_size), text) != self._seen.get(name):
                self._take_request(name, text)
                self._seen[name] = ((st.st_ino, st.st_mtime_ns, st.st_size), text)
        for name, hz in zip(LIMIT_FILES, self.effective(), strict=True):
            if name in in_flight or (name in self._seen and _int(self._seen[name][1]) == hz):
                continue
            path = self.node / name
            tree.replace_file(self.root, path, f"{hz}\n")
            st = os.stat(path)
            self._seen[name] = ((st.st_ino, st.st_mtime_ns, st.st_size), f"{hz}\n")

    # -- what runs ---------------------------------------------------------------------------------------------

    def running_workloads(self) -> list[tuple[Workload, float]]:
        """The workloads of announced jobs whose steps run now and whose process lives (stale files are removed), each
        with its time scale."""
        out = []
        for path in sorted(self.jobs_dir.glob("*.json")):
            try:
                job = json.loads(path.read_text())
                pid = int(job["pid"])
                workload = Workload(**{k: v for k, v in job["workload"].items() if k in _WORKLOAD_FIELDS})
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                print(f"governor.sim.board: ignoring {path}: {e}", file=sys.stderr, flush=True)
                continue
            if not self._watch_pid(pid):
                path.unlink(missing_ok=True)
                continue
            if job.get("stepping"):
                out.append((workload, float(job.get("time_scale", 1.0))))
        return out

    def _watch_pid(self, pid: int) -> bool:
        """True when the process lives; its exit then wakes the loop (a pidfd turns readable)."""
        if pid in self._pidfds.values():
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        if select.select([fd], [], [], 0)[0]:  # exited, not yet reaped (a zombie): dead, and it would wake us forever
            os.close(fd)
            return False
        self._pidfds[fd] = pid
        return True

    def _model(self, allowed: tuple[int, ...]) -> OrinEnergyModel:
        if allowed not in self._models:
            self._models[allowed] = OrinEnergyModel(levels_hz=allowed)
        return self._models[allowed]

    def thermal_cap_hz(self) -> int | None:
        """The highest level under the tree's thermal cap (tree.THERMAL_CAP), or None without one."""
        try:
            cap = _int(self.root.path(tree.THERMAL_CAP).read_text())
        except FileNotFoundError:
            cap = None
        if cap is None:
            return None
        return next((hz for hz in reversed(self.levels_hz) if hz <= cap), self.levels_hz[0])

    def update(self) -> None:
        """Rewrite cur_freq, load and rails for what runs now within the effective range (and under a thermal cap,
        which holds the clock down whatever the range says, as L4T's throttling does)."""
        min_hz, max_hz = self.effective()
        allowed = tuple(hz for hz in self.levels_hz if min_hz <= hz <= max_hz)
        throttle_hz = self.thermal_cap_hz()
        workloads = self.running_workloads()
        step_s, self.time_scale = None, 1.0
        if not workloads:
            cur_hz, load, rails = min_hz, 0, self._model(self.levels_hz).idle_rails_mw()
            if throttle_hz is not None:
                cur_hz = min(cur_hz, throttle_hz)
        else:
            heaviest, self.time_scale = max(workloads, key=lambda ws: ws[0].num_layers * ws[0].hidden_size ** 2 *
                                            ws[0].seq_len)
            if throttle_hz is not None and throttle_hz < (allowed[-1] if allowed else max_hz):
                cur_hz = throttle_hz  # throttled below what the range allows
                sample = self._model(self.levels_hz).expected(heaviest, cur_hz)
            elif len(allowed) > 1:  # the load-following governor moves within the range: a busy loop sits on top
                sample, cur_hz = self._model(allowed).expected(heaviest, None), allowed[-1]
            else:  # one clock: a pin (or a range between two levels, which the clock cannot leave)
                cur_hz = allowed[0] if allowed else max_hz
                sample = self._model(self.levels_hz).expected(heaviest, cur_hz)
            load, rails, step_s = round(sample.gpu_util_pct * 10), sample.rails_mw, sample.time_s
        power_mw = {name: mw / self.time_scale for name, mw in self._rails_of(rails).items()}
        if self.ina is None:
            self._write_rails(power_mw)
        else:
            self._set_ina(power_mw, step_s)
        # Rails, then load, then cur_freq: a reader that sees a new load sees the rails' reading then (the sensor's
        # average catches up at its next refreshes), one that sees a new clock sees both.
        if self.load_path is not None:
            self._show(self.load_path, f"{load}\n")
        self._show(self.node / "cur_freq", f"{cur_hz}\n")

    def _set_ina(self, power_mw: dict[str, float], step_s: float | None) -> None:
        first = not self.ina.steady_mw
        now = self.clock()
        self.ina.rescale(now, self.update_s * self.time_scale)
        self.ina.set(now, power_mw, None if step_s is None else step_s * self.time_scale)
        if first:  # a tree's rails read the board's state from the start, not an average of nothing
            self._write_rails(self.ina.steady_mw)
        else:
            self.refresh()

    def refresh(self) -> None:
        """Write the rails' reading now (each the mean over the interval before the sensor's last refresh)."""
        if self.ina is not None:
            self._write_rails(self.ina.reading(self.clock()))

    def _write_rails(self, power_mw: dict[str, float]) -> None:
        if self.ina is not None:
            power_mw = {name: round(mw, 1) for name, mw in power_mw.items()}
        if power_mw != self._rails_written:
            tree.write_rails(self.root, power_mw)
            self._rails_written = power_mw

    def refresh_timeout_s(self) -> float | None:
        """Seconds to the sensor's next refresh while one can change the readings (steps run, or the readings have
        not settled on the steady power); None when none can."""
        if self.ina is None:
            return None
        steady, written = self.ina.steady_mw, self._rails_written or {}
        settled = steady.keys() == written.keys() and all(abs(written[k] - mw) <= 0.5 for k, mw in steady.items())
        if not self.ina.stepping and settled:
            return None
        now = self.clock()
        return max(0.0, self.ina.next_refresh_s(now) - now)

    def _show(self, path: Path, text: str) -> None:
        if self._written.get(path) != text:
            tree.replace_file(self.root, path, text)
            self._written[path] = text

    # -- the loop ----------------------------------------------------------------------------------------------

    def react(self) -> None:
        """After a batch of events: which limit files were written is read from the files themselves."""
        self._show_limits()
        self.update()

    def serve(self, stop_fd: int | None = None, on_ready=None) -> None:
        """React until ``stop_fd`` (a pipe's read end) reaches EOF, or forever without one."""
        watcher = Inotify()
        watcher.watch(self.node, IN_CLOSE_WRITE)
        watcher.watch(self.jobs_dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)
        watcher.watch(self.root.path(tree.SIM_DIR), IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE)  # the thermal cap
        self.react()
        if on_ready is not None:
            on_ready()
        while True:
            waiting = [watcher.fd, *self._pidfds, *([stop_fd] if stop_fd is not None else [])]
            ready, _, _ = select.select(waiting, [], [], self.refresh_timeout_s())
            if not ready:  # the sensor's refresh: a timer, as the chip's own
                self.refresh()
                continue
            if stop_fd in ready and not os.read(stop_fd, 4096):
                return
            for fd in ready:
                if fd in self._pidfds:  # a job's process ended
                    del self._pidfds[fd]
                    os.close(fd)
            watcher.read()  # drained: the files say what changed
            self.react()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m governor.sim.board", description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", required=True, help="the simulated tree (made by ftgov sim-tree, or by --build)")
    p.add_argument("--build", choices=sorted(tree.LAYOUTS), help="build a tree of this layout at --tree first")
    p.add_argument("--max-hz", type=int, help="with --build: the baseline max_freq (a power mode's cap)")
    p.add_argument("--power-mode", type=int, help="with --build: an AGX Orin nvpmodel mode (conf, status, its cap)")
    p.add_argument("--meters", choices=["exact", "ina3221"],
                   help="with --build: how the rails report (tree.METERS; absent: exact, the model's mean power)")
    p.add_argument("--until-stdin-closes", action="store_true",
                   help="exit when standard input reaches EOF (the process that started the board has ended)")
    args = p.parse_args(argv)
    try:
        if args.build:
            root = tree.build(args.tree, args.build, max_hz=args.max_hz, power_mode=args.power_mode)
            if args.meters is not None:
                root.path(tree.METERS).write_text(f"{args.meters}\n")
            if args.meters == "exact":
                tree.set_update_interval(root, tree.EXACT_UPDATE_INTERVAL_MS)
        else:
            root = Root(args.tree)
        board = Board(root)
    except (ValueError, OSError, FtgovError) as e:
        print(f"governor.sim.board: {args.tree}: {e}", file=sys.stderr)
        return 1

    def ready() -> None:
        print("ready", flush=True)

    try:
        board.serve(sys.stdin.fileno() if args.until_stdin_closes else None, on_ready=ready)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
