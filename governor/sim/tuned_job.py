"""One training job under the `tune` policy on the simulated Orin, step by step: what `ftgov evaluate` scores and
benchmarks/bench_tuner.py measures (written once, so that both see the same tuner the daemon runs).

The job starts pinned at ``start_hz`` (MLG's pick, as in the daemon). Every step runs on the noisy energy model at the
pinned level; its energy and time are added to cumulative counters, which a ``TuningSession`` reads as the daemon
reads the rails at each ``progress`` report; when a window closes and the tuner wants another level, the next step
runs there (the daemon re-pins right after the report, so that step is the warm-up). The tuner's knobs are the
daemon's (``governor.config.TunerConfig``), so the simulation cannot drift from what ftgovd does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from governor.config import TunerConfig
from governor.errors import FtgovError
from governor.policy.tuner import TuningSession
from governor.sim.energy import OrinEnergyModel, Workload


@dataclass
class TunedJob:
    """A finished simulated job. Energies and times are the noisy model's, summed over every step."""

    energy_j: float  # the whole job, exploration included
    time_s: float
    session: TuningSession
    steps_at_hz: dict[int, int] = field(default_factory=dict)  # level -> steps run there before the tuner converged

    @property
    def best_hz(self) -> int:
        return self.session.tuner.best_hz

    @property
    def profiled_steps(self) -> int:
        return self.session.profiled_steps


def run_tuned_job(w: Workload, start_hz: int, job_steps: int, noise: float, seed: int,
                  config: TunerConfig | None = None) -> TunedJob:
    """Simulate ``job_steps`` steps of ``w`` under the tuner from ``start_hz``; the model's noise is seeded by ``seed``.

    Raises FtgovError when the tuner has not converged by the end of the job (the job is too short for its budget).
    """
    cfg = config or TunerConfig.exact_meter()  # exact counters in model time; the pick frozen, as charged below
    model = OrinEnergyModel(noise=noise, seed=seed)
    session = cfg.new_session(cfg.new_tuner(model.levels_hz, start_hz), steps=0, total_steps=job_steps)
    job = TunedJob(0.0, 0.0, session)
    pinned_hz = session.level_hz
    for step in range(1, job_steps + 1):
        sample = model.step(w, pinned_hz)
        job.energy_j += sample.energy_j
        job.time_s += sample.time_s
        if not session.converged:
            job.steps_at_hz[pinned_hz] = job.steps_at_hz.get(pinned_hz, 0) + 1
        session.on_progress(step, job.energy_j, job.time_s)
        pinned_hz = session.level_hz
    if not session.converged:
        raise FtgovError(f"{w.name}: the tuner had not converged after {job_steps} steps "
                         f"({session.profiled_steps} profiled); use a longer job")
    return job
