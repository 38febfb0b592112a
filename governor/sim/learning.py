"""A simulated board that differs from the one the tree was trained on, and its stream of tuned jobs: what
benchmarks/learn.py (`make learn`) and the retraining tests feed into the measurement store.

BOARD is the Orin energy model with another calibration: a GPU whose voltage floor holds up to 900 MHz (as another
speed bin or DVFS table might; invented for the proof, unverified on hardware). On it the shipped tree, trained on
the default calibration, is wrong by a level or two. A tuned job is the daemon's OnlineTuner driven through a
TuningSession on the noisy model (the windows the daemon would measure), then the rest of the job at the converged
level; its record is what the daemon's Recorder writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

from governor.config import TunerConfig
from governor.features import Features
from governor.pipeline.workloads import MODELS, make_workload
from governor.sim.energy import Calibration, OrinEnergyModel, Workload
from governor.store.measurements import JobRecord, Window, measured_saving

BOARD = dataclasses.replace(Calibration(), knee_hz=900e6, v_floor=0.70, v_curve_exponent=2.2)
JOB_STEPS = 2000
SEQ_LENS_PER_MODEL = 4
NOISE = 1.0  # the energy model's nominal noise, as in ftgov evaluate and bench_tuner
BOARD_MODEL = "NVIDIA Jetson AGX Orin Developer Kit"


def board_model(noise: float = 0.0, seed: int = 0, calibration: Calibration = BOARD) -> OrinEnergyModel:
    return OrinEnergyModel(noise=noise, seed=seed, calibration=calibration)


def features_of(board: OrinEnergyModel, w: Workload) -> Features:
    """What the daemon sees at register: the job's shape and its GPU load under the default governor."""
    return Features(model_type=w.model_type, num_layers=w.num_layers, hidden_size=w.hidden_size, seq_len=w.seq_len,
                    gpu_util=round(board.expected(w, None).gpu_util_pct, 1))


def user_pool(seed: int, per_model: int = SEQ_LENS_PER_MODEL) -> list[Workload]:
    """The board's users' workloads: every model at a few sequence lengths drawn log-uniformly in 10..90 tokens."""
    rng = random.Random(seed)
    pool = []
    for m in MODELS:
        for _ in range(per_model):
            seq = round(math.exp(rng.uniform(math.log(10), math.log(90))), 1)
            pool.append(dataclasses.replace(make_workload(m, "sst2"), name=f"{m.name}/seq{seq:g}", seq_len=seq))
    return pool


@dataclasses.dataclass(frozen=True)
class TunedRun:
    windows: tuple[Window, ...]
    best_hz: int
    energy_j: float  # the whole job, exploration included
    time_s: float


def tuned_job(w: Workload, start_hz: int, seed: int, cfg: TunerConfig | None = None,
              calibration: Calibration = BOARD, job_steps: int = JOB_STEPS) -> TunedRun:
    cfg = cfg or TunerConfig.exact_meter()
    model = board_model(NOISE, seed, calibration)
    tuner = cfg.new_tuner(model.levels_hz, start_hz)
    session = cfg.new_session(tuner, steps=0, total_steps=job_steps)
    windows, energy_j, time_s, step = [], 0.0, 0.0, 0
    while not session.converged and step < job_steps:
        step += 1
        s = model.step(w, session.level_hz)
        energy_j, time_s = energy_j + s.energy_j, time_s + s.time_s
        m = session.on_progress(step, energy_j, time_s)
        if m is not None:
            windows.append(Window(m.level_hz, m.joules_per_step, m.seconds_per_step, m.measured_steps))
    rest = model.expected(w, tuner.best_hz)
    return TunedRun(tuple(windows), tuner.best_hz, energy_j + (job_steps - step) * rest.energy_j,
                    time_s + (job_steps - step) * rest.time_s)


def record(w: Workload, f: Features, run: TunedRun, start_hz: int, index: int, tree_id: str,
           board_name: str = BOARD_MODEL, ended_at0: float = 1.7e9) -> JobRecord:
    """The store's record of one simulated tuned job, as the daemon's Recorder would write it."""
    windows = tuple(dataclasses.replace(x, gpu_util=f.gpu_util) for x in run.windows)
    saved, basis = measured_saving(windows, run.best_hz, start_hz)
    return JobRecord(ended_at=ended_at0 + 3600.0 * index, duration_s=run.time_s, boot_id="sim",
                     daemon_job_id=index + 1, uid=1000, name=w.name, model_type=f.model_type,
                     num_layers=f.num_layers, hidden_size=f.hidden_size, seq_len=f.seq_len, gpu_util=f.gpu_util,
                     board_model=board_name, l4t_release="# R36 (release), REVISION: 4.3 (simulated board)",
                     backend="devfreq", gpu_name="17000000.gpu",
                     levels_hz=json.dumps(list(OrinEnergyModel().levels_hz)), model_version=tree_id,
                     model_source="trained", policy="tune", freq_hz=run.best_hz, reason="tune: converged",
                     steps=JOB_STEPS, energy_j=run.energy_j, start_hz=start_hz, converged=True, saved_rel=saved,
                     saved_basis=basis, ended="unregistered", windows=windows)


def stream(decide, n: int, seed: int = 0, cfg: TunerConfig | None = None, first_index: int = 0,
           board_name: str = BOARD_MODEL):
    """n records of tuned jobs on BOARD, drawn from the user pool, each starting at ``decide(features)``."""
    board = board_model()
    pool = user_pool(seed)
    rng = random.Random(seed + 1)
    for _ in range(first_index):
        rng.choice(pool)
    for i in range(first_index, first_index + n):
        w = rng.choice(pool)
        f = features_of(board, w)
        start = decide(f)
        yield record(w, f, tuned_job(w, start, 104729 * i + seed, cfg), start, i, "start-tree", board_name)
