"""The simulated board: makes the fake tree's load, cur_freq and INA3221 rails follow the pin and the running jobs.

On hardware the GPU load and rail power change because a training loop runs at the pinned clock. Here the daemon
tells the board (a listener on the job table) what runs; the board asks the energy model (governor.sim.energy) what a
training step at the pinned frequency costs and writes the files the daemon then reads, exactly as it would read a
real Orin's. Several jobs at once: the board runs the heaviest one (the GPU is time-shared; the busiest job sets the
power draw) — a simplification, stated here and in docs/energy-model.md.
"""

from __future__ import annotations


from governor.backends.devfreq import DevfreqGpu
from governor.sysfs import Root, read_int, write_text
from governor.sim import tree


class Board:
    def __init__(self, root: Root, gpu: DevfreqGpu, model=None, *, batch_size: int = 32):
        from governor.sim.energy import OrinEnergyModel, Workload

        self.root = root
        self.gpu = gpu
        self.model = model or OrinEnergyModel()
        self._workload_cls = Workload
        self.batch_size = batch_size

    def workload_of(self, features, name: str):
        return self._workload_cls(name=name, model_type=features.model_type, num_layers=features.num_layers,
                                  hidden_size=features.hidden_size, seq_len=features.seq_len,
                                  batch_size=self.batch_size)

    def update(self, governor) -> None:
        """Rewrite load, cur_freq and rails for what runs now at the limits the files hold."""
        jobs = list(governor.jobs.values())
        min_hz, max_hz = read_int(self.gpu.node / "min_freq"), read_int(self.gpu.node / "max_freq")
        if not jobs:
            write_text(self.gpu.load_path, "0\n")
            write_text(self.gpu.node / "cur_freq", f"{self.gpu.levels_hz[0]}\n")
            tree.write_rails(self.root, self.model.idle_rails_mw())
            return
        heaviest = max(jobs, key=lambda j: j.features.num_layers * j.features.hidden_size ** 2 * j.features.seq_len)
        workload = self.workload_of(heaviest.features, heaviest.name or f"job-{heaviest.job_id}")
        pinned = min_hz == max_hz and min_hz in self.gpu.levels_hz
        sample = self.model.expected(workload, min_hz if pinned else None)
        cur_hz = min_hz if pinned else (sample.freq_hz or self._clamp(self.gpu.levels_hz[-1], min_hz, max_hz))
        write_text(self.gpu.load_path, f"{round(sample.gpu_util_pct * 10)}\n")
        write_text(self.gpu.node / "cur_freq", f"{cur_hz}\n")
        tree.write_rails(self.root, sample.rails_mw)

    @staticmethod
    def _clamp(hz: int, lo: int, hi: int) -> int:
        return min(max(hz, lo), hi)
