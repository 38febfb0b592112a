"""A physical energy model of one fine-tuning step on a Jetson AGX Orin 64GB, as a function of the GPU clock.

Not a fitted curve: time and power are built from the work a step does and from how CMOS power depends on voltage
and clock, and the constants (``Calibration``) are set so that the paper's 27 characterization configurations show
what the paper reports (docs/energy-model.md has the reasoning and the calibration table). In short:

- time: a synchronous host part + ``smoothmax(t_launch, t_gpu(f))``, ``t_gpu`` = compute cycles / f plus
  memory-bound kernels limited by DRAM bandwidth.
- power: GPU rail = SoC base + leakage(V) + C * V(f)^2 * f * activity, V(f) on a voltage floor below a knee and
  linear above it; CPU rail: the training loop's core(s); 5 V rail: board base + DRAM energy per byte.
- MAXN: the load-following default governor starts a busy loop at the top level and steps down while the load stays
  below its threshold, with a small ramp penalty in time.
- noise: per-step jitter plus a slow AR(1) drift, larger for workloads dominated by host-side time.

Nothing here is measured on a board: every constant is a calibration to published figures (unverified on hardware).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from governor.backends.rails import (
    ENERGY_RAILS,
    RAIL_CPU_CV,
    RAIL_CPU_GPU_CV,
    RAIL_GPU_SOC,
    RAIL_IN,
    RAIL_SOC,
    RAIL_SYS_5V0,
    RAIL_VDDQ,
)
from governor.sim.tree import JP6_LEVELS_HZ

ENCODER_VOCAB = 30522  # BERT word pieces; input embeddings tied with the MLM head (not trained for classification)
DECODER_VOCAB = 50304  # Pythia (GPT-NeoX tokenizer, padded); input and output embeddings untied


@dataclass(frozen=True)
class Workload:
    """What runs: the paper's features plus what the physics needs."""

    name: str
    model_type: str  # "encoder" | "decoder"
    num_layers: int
    hidden_size: int
    seq_len: float  # average tokens per sample (dynamic padding: the batch is padded to about this)
    batch_size: int = 32
    params_m: float | None = None  # millions of parameters, derived from layers/hidden when None

    def __post_init__(self):
        if self.model_type not in ("encoder", "decoder"):
            raise ValueError(f"model_type must be 'encoder' or 'decoder', got {self.model_type!r}")
        if self.num_layers < 1 or self.hidden_size < 1 or self.seq_len <= 0 or self.batch_size < 1:
            raise ValueError("num_layers, hidden_size, seq_len and batch_size must be positive")

    @property
    def total_params_m(self) -> float:
        if self.params_m is not None:
            return self.params_m
        return (_layer_params(self) + _embedding_params(self)) / 1e6


def workload_from_features(features: Mapping[str, Any] | Any, name: str, batch_size: int = 32) -> Workload:
    """The Workload of a job's features (a mapping, or an object with the fields, such as governor.features.Features):
    the one conversion every caller uses. ``gpu_util`` and other extra fields are ignored: the model derives the
    load."""
    get = features.get if isinstance(features, Mapping) else lambda key: getattr(features, key)
    return Workload(name=name, model_type=get("model_type"), num_layers=get("num_layers"),
                    hidden_size=get("hidden_size"), seq_len=get("seq_len"), batch_size=batch_size)


def nx_rails_mw(rails_mw: Mapping[str, float], cal: Calibration | None = None) -> dict[str, float]:
    """The AGX Orin rails of a step (the model's own split) as an Orin NX/Nano module's INA3221 reads them.

    VDD_IN is the module's input: the same total as the AGX energy sum, so energy per step is the same figure on
    both. VDD_SOC carries the SoC base; VDD_CPU_GPU_CV the rest of the GPU rail plus the CPU. An assumed split
    (unverified: the model is calibrated to AGX Orin figures; nothing here is measured on an NX).
    """
    soc_mw = (cal or Calibration()).soc_base_w * 1e3
    return {RAIL_IN: sum(rails_mw[r] for r in ENERGY_RAILS), RAIL_SOC: soc_mw,
            RAIL_CPU_GPU_CV: rails_mw[RAIL_GPU_SOC] - soc_mw + rails_mw[RAIL_CPU_CV]}


@dataclass(frozen=True)
class StepSample:
    """One training step at one frequency."""

    freq_hz: int | None  # None for MAXN (the load-following default governor)
    time_s: float
    gpu_util_pct: float
    rails_mw: dict[str, float]  # VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO (average over the step)
    energy_j: float  # time_s x sum of ENERGY_RAILS
    mean_freq_hz: float = 0.0  # the clock averaged over the step: the pin, or where MAXN's governor sat

    @property
    def power_mw(self) -> float:
        """Total over ENERGY_RAILS, mW."""
        return sum(self.rails_mw[r] for r in ENERGY_RAILS)


@dataclass(frozen=True)
class Calibration:
    """Every constant of the model, with its unit. Values: docs/energy-model.md says where each comes from."""

    # GPU throughput. Fine-tuning with fp16 autocast on the tensor cores: Orin's 64 tensor cores give 32768 dense FP16
    # FLOP/cycle (42.5 TFLOPS at 1.3 GHz).
    flop_per_cycle: float = 32768.0
    eff_max: float = 0.45  # best fraction of peak a large GEMM reaches
    eff_hidden_half: float = 512.0  # hidden size at which GEMM efficiency is half of eff_max (narrow matrices)
    eff_tokens_half: float = 256.0  # tokens per batch at which efficiency is half (small batches under-fill SMs)
    # Memory traffic: fp32 AdamW touches every parameter ~10 times per step (weights x3, grad x2, m and v x2, write).
    bytes_per_param: float = 40.0
    act_bytes_per_token_layer_hidden: float = 160.0  # activations written and re-read, incl. elementwise kernels
    dram_bw_bps: float = 120e9  # achievable LPDDR5 bandwidth (204.8 GB/s peak)
    # L2/crossbar bytes per GPU cycle: below ~750 MHz memory kernels slow with the clock
    sm_bytes_per_cycle: float = 160.0
    # Host side (PyTorch eager on the A78AE cores).
    launch_s_per_op: float = 40e-6  # PyTorch eager per op on the A78AE cores
    ops_per_layer: float = 110.0  # forward + backward + optimizer kernels per transformer layer
    ops_fixed: float = 200.0  # embeddings, head, loss, optimizer bookkeeping
    host_fixed_s: float = 0.018  # per step: Trainer loop, callbacks, lr schedule, loss.item() sync
    host_per_sample_s: float = 0.00035  # data loading and collation in the main process (num_workers=0)
    overlap_sharpness: float = 6.0  # p of the p-norm smooth max: CPU and GPU never overlap perfectly
    # Voltage/frequency curve of the GPU rail (GA10B DVFS table; unverified: shaped like published Ampere curves).
    v_floor: float = 0.58  # V, held for every clock up to the knee
    knee_hz: float = 420e6
    v_top: float = 1.05  # V at 1300.5 MHz
    v_curve_exponent: float = 1.65  # above the knee V rises convexly: each step up costs more voltage than the last
    top_hz: float = 1300.5e6
    # GPU rail power.
    c_eff_f: float = 1.6e-8  # switched capacitance of the whole GPU at activity 1, F
    act_compute_min: float = 0.75  # switching activity in compute kernels, rising with GEMM efficiency to 1.0
    act_memory: float = 0.30  # memory-bound kernels: SMs mostly stalled
    act_idle: float = 0.15  # clock tree and L2 while the GPU waits on the host (a pinned clock keeps running)
    leak_w_at_1v: float = 3.9  # leakage at 1 V and operating temperature; scales ~V^3 (DIBL + temperature)
    soc_base_w: float = 2.0  # rest of the SoC on the GPU_SOC rail (memory controller, fabric)
    # CPU rail: idle base, plus the training loop's busy core(s).
    cpu_idle_w: float = 0.8
    cpu_loop_w: float = 2.0  # the main Python thread: busy (spin-waiting on CUDA syncs) for the whole step
    cpu_host_extra_w: float = 1.4  # extra cores while the host part runs (collation, tokenizer threads)
    # 5 V system rail: board base and DRAM.
    sys_base_w: float = 3.6
    dram_j_per_byte: float = 45e-12  # LPDDR5 incl. PHY; VDDQ carries about a third of it
    vddq_base_w: float = 0.9
    vddq_share: float = 0.35
    # MAXN (nvhost_podgov): load target and its reaction cost.
    maxn_down_load: float = 0.65  # podgov steps the clock down while the load stays below this
    maxn_boost_share: float = 0.2  # below the top level: share of steps boosted back to the top by load spikes
    # Fraction of time lost ramping back up after host-side gaps, scaled by the gap share.
    maxn_ramp_penalty: float = 0.035
    # Noise (relative standard deviations at noise=1.0; the caller's noise argument scales them).
    jitter_rel: float = 0.03
    drift_rel: float = 0.015
    drift_rho: float = 0.995  # per step: a drift that lasts ~200 steps


@dataclass(frozen=True)
class _Work:
    """What one step of a workload costs, independent of the clock."""

    cycles: float  # GPU compute cycles
    mem_bytes: float  # DRAM traffic of memory-bound kernels
    launch_s: float  # CPU time to enqueue the step's kernels
    host_s: float  # synchronous host time, GPU idle
    activity: float  # switching activity of compute kernels


class OrinEnergyModel:
    """Time, utilization and rail power of one training step at a pinned GPU clock or under MAXN."""

    VERSION = "orin-energy/1.0"

    def __init__(self, noise: float = 0.0, seed: int = 0, calibration: Calibration | None = None,
                 levels_hz: tuple[int, ...] = JP6_LEVELS_HZ):
        if noise < 0:
            raise ValueError("noise must be >= 0")
        self.noise = noise
        self.cal = calibration or Calibration()
        self.levels_hz = tuple(levels_hz)
        self._rng = random.Random(seed)
        self._drift: dict[str, float] = {}  # per workload name: the slow component of the noise, in log units

    # -- public API ----------------------------------------------------------------------------------------------

    def expected(self, w: Workload, freq_hz: int | None) -> StepSample:
        """The noise-free step at a pinned clock (freq_hz) or under MAXN (None)."""
        if freq_hz is None:
            return self._maxn(w)
        if freq_hz <= 0:
            raise ValueError(f"freq_hz must be positive, got {freq_hz}")
        return self._pinned(w, float(freq_hz), reported_hz=freq_hz)

    def step(self, w: Workload, freq_hz: int | None) -> StepSample:
        """One step with run-to-run noise (when noise > 0): time and power each get jitter and a slow drift."""
        s = self.expected(w, freq_hz)
        if self.noise == 0:
            return s
        work = self._work(w)
        # Host-side time is where the jitter lives (Python, scheduler, page faults): small models are noisier.
        host_share = (work.host_s + work.launch_s) / s.time_s
        scale = self.noise * (0.4 + 1.6 * min(host_share, 1.0))
        drift = self._advance_drift(w.name, scale)
        time_s = s.time_s * math.exp(drift + self._rng.gauss(0.0, self.cal.jitter_rel * scale))
        power_factor = math.exp(0.5 * drift + self._rng.gauss(0.0, 0.5 * self.cal.jitter_rel * scale))
        rails = {k: v * power_factor for k, v in s.rails_mw.items()}
        util = min(100.0, max(0.0, s.gpu_util_pct * math.exp(self._rng.gauss(0.0, 0.02 * self.noise))))
        return _sample(s.freq_hz, time_s, util, rails, s.mean_freq_hz)

    def idle_rails_mw(self) -> dict[str, float]:
        """Board idle at the lowest clock, no job: what the rails read between jobs."""
        c = self.cal
        f = float(self.levels_hz[0])
        v = self.voltage(f)
        gpu_w = c.soc_base_w + self.leakage_w(v) + c.c_eff_f * v * v * f * c.act_idle * 0.5
        return {RAIL_GPU_SOC: gpu_w * 1e3, RAIL_CPU_CV: c.cpu_idle_w * 1e3, RAIL_SYS_5V0: c.sys_base_w * 1e3,
                RAIL_VDDQ: c.vddq_base_w * 1e3}

    def voltage(self, freq_hz: float) -> float:
        """GPU rail voltage at a clock: the floor up to the knee, then a convex rise to v_top at the top clock."""
        c = self.cal
        if freq_hz <= c.knee_hz:
            return c.v_floor
        x = (freq_hz - c.knee_hz) / (c.top_hz - c.knee_hz)
        return c.v_floor + (c.v_top - c.v_floor) * x ** c.v_curve_exponent

    def leakage_w(self, volts: float) -> float:
        return self.cal.leak_w_at_1v * volts ** 3

    # -- the physics ---------------------------------------------------------------------------------------------

    def _work(self, w: Workload) -> _Work:
        c = self.cal
        tokens = w.batch_size * w.seq_len
        layer_params = _layer_params(w)
        # Training FLOPs: 6 per parameter per token (forward 2, backward 4) plus attention scores, which grow with
        # seq_len^2 (QK^T and AV: 4 S^2 H per layer per sample forward, x3 with backward).
        flops = 6.0 * layer_params * tokens + 12.0 * w.num_layers * w.batch_size * w.seq_len ** 2 * w.hidden_size
        eff = (c.eff_max * w.hidden_size / (w.hidden_size + c.eff_hidden_half)
               * tokens / (tokens + c.eff_tokens_half))
        params = w.total_params_m * 1e6
        mem_bytes = (params * c.bytes_per_param
                     + c.act_bytes_per_token_layer_hidden * tokens * w.num_layers * w.hidden_size)
        launch_s = c.launch_s_per_op * (c.ops_per_layer * w.num_layers + c.ops_fixed)
        host_s = c.host_fixed_s + c.host_per_sample_s * w.batch_size
        activity = c.act_compute_min + (1.0 - c.act_compute_min) * eff / c.eff_max
        return _Work(flops / (c.flop_per_cycle * eff), mem_bytes, launch_s, host_s, activity)

    def _phases(self, work: _Work, freq_hz: float) -> tuple[float, float, float]:
        """(step time, compute time, memory time) at a clock."""
        c = self.cal
        compute_s = work.cycles / freq_hz
        memory_s = max(work.mem_bytes / c.dram_bw_bps, work.mem_bytes / (c.sm_bytes_per_cycle * freq_hz))
        gpu_s = compute_s + memory_s
        p = c.overlap_sharpness
        overlapped_s = (gpu_s ** p + work.launch_s ** p) ** (1.0 / p)
        return work.host_s + overlapped_s, compute_s, memory_s

    def _pinned(self, w: Workload, freq_hz: float, reported_hz: int | None) -> StepSample:
        work = self._work(w)
        time_s, compute_s, memory_s = self._phases(work, freq_hz)
        gpu_w = self._gpu_power_w(work, freq_hz, time_s, compute_s, memory_s)
        rails = self._rails_mw(w, work, time_s, gpu_w)
        util = 100.0 * (compute_s + memory_s) / time_s
        return _sample(reported_hz, time_s, util, rails, freq_hz)

    def _gpu_power_w(self, work: _Work, freq_hz: float, time_s: float, compute_s: float, memory_s: float) -> float:
        c = self.cal
        v = self.voltage(freq_hz)
        idle_s = time_s - compute_s - memory_s
        switched = (work.activity * compute_s + c.act_memory * memory_s + c.act_idle * idle_s) / time_s
        return c.soc_base_w + self.leakage_w(v) + c.c_eff_f * v * v * freq_hz * switched

    def _rails_mw(self, w: Workload, work: _Work, time_s: float, gpu_w: float) -> dict[str, float]:
        c = self.cal
        cpu_w = c.cpu_idle_w + c.cpu_loop_w + c.cpu_host_extra_w * work.host_s / time_s
        dram_w = c.dram_j_per_byte * work.mem_bytes / time_s
        return {RAIL_GPU_SOC: gpu_w * 1e3, RAIL_CPU_CV: cpu_w * 1e3, RAIL_SYS_5V0: (c.sys_base_w + dram_w) * 1e3,
                RAIL_VDDQ: (c.vddq_base_w + c.vddq_share * dram_w) * 1e3}

    def _maxn(self, w: Workload) -> StepSample:
        """The load-following governor (nvhost_podgov) in steady state.

        A training loop starts with the GPU busy, so podgov starts at the top level; it steps down while the load it
        sees stays below its down-threshold and stops at the first level where the load reaches it (a slower clock
        makes the GPU busy for more of the step). GPU-bound workloads never leave the top level; host-bound ones
        settle lower, but keep being boosted back to the top by the compute burst after each host gap. It reacts to
        load after the fact, so after each host-side gap the GPU restarts below its clock:
        a time penalty that grows with how much of the step those gaps are.
        """
        c = self.cal
        work = self._work(w)
        levels = sorted(self.levels_hz, reverse=True)
        settled_hz = next((f for f in levels if self._load(work, float(f)) >= c.maxn_down_load), levels[-1])
        s = self._pinned(w, float(settled_hz), reported_hz=None)
        if settled_hz != levels[0]:
            # Below the top, each compute burst after a host gap looks like a load spike: podgov boosts to the top
            # and falls back. A share of the steps runs at the top clock; the convexity of V^2 f makes that mix
            # cost more than its average clock would.
            top = self._pinned(w, float(levels[0]), reported_hz=None)
            d = c.maxn_boost_share
            time_s = (1 - d) * s.time_s + d * top.time_s
            rails = {k: ((1 - d) * s.time_s * s.rails_mw[k] + d * top.time_s * top.rails_mw[k]) / time_s
                     for k in s.rails_mw}
            util = ((1 - d) * s.time_s * s.gpu_util_pct + d * top.time_s * top.gpu_util_pct) / time_s
            mean_hz = ((1 - d) * s.time_s * settled_hz + d * top.time_s * levels[0]) / time_s
            s = _sample(None, time_s, util, rails, mean_hz)  # energy = the time-weighted mix of the two
        gap_share = work.host_s / s.time_s
        time_s = s.time_s * (1.0 + c.maxn_ramp_penalty * (0.3 + gap_share))
        # The ramp stretches the step at the same power: energy follows the longer step.
        return _sample(None, time_s, s.gpu_util_pct * s.time_s / time_s, s.rails_mw, s.mean_freq_hz)

    def _load(self, work: _Work, freq_hz: float) -> float:
        time_s, compute_s, memory_s = self._phases(work, freq_hz)
        return (compute_s + memory_s) / time_s

    def _advance_drift(self, name: str, scale: float) -> float:
        c = self.cal
        sd = c.drift_rel * scale
        prev = self._drift.get(name)
        if prev is None:
            value = self._rng.gauss(0.0, sd)
        else:
            value = c.drift_rho * prev + math.sqrt(1.0 - c.drift_rho ** 2) * self._rng.gauss(0.0, sd)
        self._drift[name] = value
        return value


def _sample(freq_hz: int | None, time_s: float, util: float, rails_mw: dict[str, float],
            mean_freq_hz: float) -> StepSample:
    energy_j = time_s * sum(rails_mw[r] for r in ENERGY_RAILS) / 1e3
    return StepSample(freq_hz, time_s, util, dict(rails_mw), energy_j, mean_freq_hz)


def _layer_params(w: Workload) -> float:
    """Attention (4 H^2) + MLP (8 H^2, 4x expansion) per layer: the weights the GEMMs multiply."""
    return 12.0 * w.num_layers * w.hidden_size ** 2


def _embedding_params(w: Workload) -> float:
    if w.model_type == "encoder":
        return (ENCODER_VOCAB + 512) * w.hidden_size
    return 2 * DECODER_VOCAB * w.hidden_size
