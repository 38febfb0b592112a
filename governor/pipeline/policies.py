"""The policies `ftgov evaluate` compares, behind one small interface.

A policy sees a workload the way the daemon does (its Features, gpu_util measured under MAXN) and picks a level, or
None for MAXN. MAXN, FFG and the trees decide through the daemon's own code (governor.policy.Policy.decide, with the
sweep's levels as the GPU's table), so the evaluation scores the decisions ftgovd would make: MAXN is the daemon's
`observe` (no pin, the default governor runs), FFG its `ffg`, a tree its `mlg`.

``probe`` gives the noise-free measurement of a level from the sweep (per-step energy, time and utilization); a
policy that explores before settling reports the steps it spent at each level in ``Pick.probe_steps``, and the
evaluation charges them to it.

``Tune`` is the daemon's `tune` policy: MLG's pick, then the online tuner (governor/policy/tuner.py). It does not use
``probe``: a real tuner never sees noise-free values, so its windows come from the noisy energy model, one step at a
time (governor/sim/tuned_job.py), and only its decisions (the levels it ran at, for how long, and where it
settled) are taken from that simulation; they are then scored on the same sweep as every other policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from governor.errors import FtgovError
from governor.pipeline.dataset import Sweep
from governor.pipeline.workloads import characterization_workloads, held_out_workloads, make_workload, model_by_name
from governor.policy import Policy
from governor.policy.ffg import read_ffg_hz
from governor.policy.tree import DecisionTree
from governor.sim.energy import OrinEnergyModel, Workload
from governor.sim.tuned_job import ModelBoard, run_tuned_job

if TYPE_CHECKING:
    from governor.config import TunerConfig


@dataclass(frozen=True)
class Probe:
    """What a job running at one level for a while would show: per-step energy and time, utilization."""

    freq_hz: int
    energy_j: float  # per step
    time_s: float  # per step
    gpu_util_pct: float


ProbeFn = Callable[[int], Probe]


@dataclass(frozen=True)
class Pick:
    freq_hz: int | None  # None: MAXN
    probe_steps: dict[int, int] = field(default_factory=dict)  # level -> steps spent there before settling

    @property
    def profiled_steps(self) -> int:
        return sum(self.probe_steps.values())


class EvaluatedPolicy(Protocol):
    name: str

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick: ...


def _daemon_pick(policy: Policy, sweep: Sweep) -> Pick:
    return Pick(policy.decide(sweep.features, sweep.levels_hz).freq_hz)


@dataclass(frozen=True)
class Maxn:
    """No pin: the daemon's `observe`, under which the board's default governor runs."""

    name: str = "maxn"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return _daemon_pick(Policy("observe", 0, None), sweep)


@dataclass(frozen=True)
class Fixed:
    """FFG: one level for every workload (the daemon's `ffg`: the nearest level at or above it)."""

    freq_hz: int
    name: str = "ffg"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return _daemon_pick(Policy("ffg", self.freq_hz, None), sweep)


@dataclass(frozen=True)
class Tree:
    """MLG: a decision tree over the workload's features, decided as the daemon's `mlg` decides (its evaluator, not
    scikit-learn). ``ffg_freq_hz`` is the daemon's fallback, used only by a policy without a tree."""

    tree: DecisionTree
    name: str
    ffg_freq_hz: int = 0

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return _daemon_pick(Policy("mlg", self.ffg_freq_hz, self.tree), sweep)


@dataclass(frozen=True)
class Oracle:
    """The per-workload optimum, known only after measuring every level: the bound no policy can beat."""

    name: str = "oracle"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        return Pick(sweep.optimum_hz)


def _daemon_tuner_config() -> TunerConfig:
    from governor.config import TunerConfig  # pydantic: imported when a tuned job runs, not when `ftgov` starts

    return TunerConfig.exact_meter()


@dataclass(frozen=True)
class TuneSettings:
    """How the simulated tuned jobs run: job length, the energy model's noise scale and seed, the tuner's knobs."""

    job_steps: int = 2000  # a short fine-tuning run, the job length the tuner's figures use
    # The energy model's nominal noise, the one the held-out set was generated with: 4.2% step-to-step energy
    # jitter on average (benchmarks/bench_tuner.py prints it); 0.71 gives 3% step-to-step noise.
    noise: float = 1.0
    seed: int = 0
    config: TunerConfig = field(default_factory=_daemon_tuner_config)  # the daemon's defaults


@dataclass(frozen=True)
class Tune:
    """The daemon's `tune` policy: start at ``start``'s pick (the trained MLG), run the online tuner on noisy windows.

    Each workload's noise is seeded with ``1000 * i + settings.seed``, i its index in the simulator's catalogue
    (held-out workloads first, in order), the seeds benchmarks/bench_tuner.py gives its ``--seeds`` runs; so the
    same --seed always gives the same picks.
    """

    start: Tree
    settings: TuneSettings = field(default_factory=TuneSettings)
    name: str = "tune"

    def pick(self, sweep: Sweep, probe: ProbeFn) -> Pick:
        start_hz = self.start.pick(sweep, probe).freq_hz
        index, workload = simulated_workload(sweep)
        board = ModelBoard(workload, self.settings.noise, 1000 * index + self.settings.seed)
        job = run_tuned_job(board, start_hz, self.settings.job_steps, config=self.settings.config)
        return Pick(job.best_hz, dict(job.steps_at_hz))


def simulated_workload(sweep: Sweep) -> tuple[int, Workload]:
    """The energy model's workload behind a sweep, with its index in the catalogue (for seeding)."""
    catalogue = held_out_workloads() + characterization_workloads()
    names = [w.name for w in catalogue]
    if sweep.workload not in names:
        raise FtgovError(f"{sweep.workload}: not a workload of the simulated Orin's catalogue; the tune policy "
                         "simulates its job on the energy model, so it can only be evaluated on simulated sweeps")
    index = names.index(sweep.workload)
    w = make_workload(model_by_name(sweep.model), sweep.task)
    f = sweep.features
    if (w.model_type, w.num_layers, w.hidden_size) != (f.model_type, f.num_layers, f.hidden_size) \
            or abs(w.seq_len - f.seq_len) > 0.01:
        raise FtgovError(f"{sweep.workload}: the sweep's features {f} do not match the simulator's workload {w}")
    levels = OrinEnergyModel().levels_hz
    if tuple(sweep.levels_hz) != tuple(levels):
        raise FtgovError(f"{sweep.workload}: measured at {list(sweep.levels_hz)}, the simulator has {list(levels)}")
    return index, w


def model_energy_j(sweeps: list[Sweep]) -> dict[str, dict[int, float]] | None:
    """workload -> level -> the energy model's noise-free energy per step; None unless every sweep is simulated.

    The sweep's own rows carry measurement noise (the held-out set: 50 steps at noise 1.0, drift included), so its
    argmin, the "oracle", is partly a lucky reading; the noise-free curve is the yardstick that shows how close each
    policy's level is to the true bottom of the U.
    """
    model = OrinEnergyModel()
    out = {}
    for s in sweeps:
        try:
            _, w = simulated_workload(s)
        except FtgovError:
            return None
        out[s.workload] = {hz: model.expected(w, hz).energy_j for hz in s.levels_hz}
    return out


def build_policies(ffg_path: Path, paper_tree: Path, mlg_tree: Path, extra: list[EvaluatedPolicy] | None = None,
                   tune: TuneSettings | None = None) -> list[EvaluatedPolicy]:
    """MAXN first (the baseline every saving is measured against), the oracle last; with ``tune``, the tuner
    (started from the trained MLG) right after MLG. A missing or bad file is an error here, not a fallback: an
    evaluation of a policy that is not there would score FFG under its name."""
    ffg_hz = read_ffg_hz(ffg_path)
    mlg = Tree(DecisionTree.load(mlg_tree), "mlg", ffg_hz)
    policies: list[EvaluatedPolicy] = [Maxn(), Fixed(ffg_hz), Tree(DecisionTree.load(paper_tree), "paper", ffg_hz),
                                       mlg]
    if tune is not None:
        policies.append(Tune(mlg, tune))
    return policies + list(extra or []) + [Oracle()]
