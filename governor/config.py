"""ftgovd's configuration: a YAML file validated by pydantic when it is loaded.

A bad file or value is a ConfigError that names the key (``limits.max_connections: Input should be greater than 0``);
nothing is silently replaced by a default. An absent file means all defaults. Privileged settings come only from this
root-owned file, never from clients.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from governor import DEFAULT_SOCKET_PATH, SOCKET_GROUP, data, yamlfile
from governor.errors import ConfigError, ModelError
from governor.policy import tuner as _tuner
from governor.policy.estimates import ASSUMED_TOTAL_STEPS
from governor.policy.ffg import read_ffg_hz
from governor.policy.measured_saving import MAX_PARTS, WARMUP_BLOCK_S, BaselineParts, WarmUp

DEFAULT_STATE_DIR = "/run/ftgov"
MIN_FREQ_HZ = 1_000_000  # below any GPU's lowest clock: a smaller frequency was written in the wrong unit
MAX_GPU_CLOCK_HZ = 10_000_000_000  # above any GPU's top clock (an H200's is 1.98 GHz, an AGX Orin's 1.3 GHz)


class _Strict(BaseModel):
    # No key takes an infinity or NaN (YAML's .inf, .nan): node_wait_s: .inf waited for ever, and a NaN failed a
    # bound's check with a message about the bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_value(cls, v, info):
        # pydantic takes true for the number 1; YAML 1.1 reads yes, no, on and off as booleans too: `max_jobs: yes`
        # would be one job.
        if isinstance(v, bool) and cls.model_fields[info.field_name].annotation is not bool:
            raise ValueError(f"{str(v).lower()} is a boolean (YAML reads yes, no, on, off, true, false as one), "
                             "not a value of this key")
        return v


def _absolute(path: str) -> str:
    # ftgovd runs from / under systemd and from wherever it was started by hand: a relative path would name another
    # file under each, and root would make or read it there.
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is a relative path: give an absolute one")
    return path


AbsolutePath = Annotated[str, Field(min_length=1), AfterValidator(_absolute)]
AbsolutePathOrAuto = Annotated[str, Field(min_length=1), AfterValidator(lambda p: p if p == "auto" else _absolute(p))]


class SocketConfig(_Strict):
    path: AbsolutePath = DEFAULT_SOCKET_PATH
    mode: int = Field(0o660, description="file mode of the socket when ftgovd binds it itself (octal in YAML: 0660)")
    group: str = Field(SOCKET_GROUP, min_length=1, description="members of this group may register jobs")

    @field_validator("mode", mode="before")
    @classmethod
    def _octal(cls, v):
        # YAML 1.1 reads 0660 as octal already; accept the string "0660" too, and refuse anything world-writable.
        if isinstance(v, str):
            try:
                if not v.isascii():  # int() takes any script's digits ("٠٦٦٠")
                    raise ValueError(v)
                v = int(v, 8)
            except ValueError as e:
                raise ValueError(f"{v!r} is not an octal mode") from e
        if isinstance(v, int) and not isinstance(v, bool) and v & 0o002:
            raise ValueError("a world-writable socket would let any user pin the GPU")
        return v


DEFAULT_RANKS_PER_UID = 16  # two runs over 8 GPUs at once


class LimitsConfig(_Strict):
    max_connections: int = Field(256, gt=0, le=65536)
    max_connections_per_uid: int = Field(16, gt=0, le=65536, description=(
        "so that a few users cannot lock the others out: it takes max_connections / this many users to fill it"))
    root_reserve_connections: int = Field(16, ge=0, le=65536, description=(
        "connections root may open beyond max_connections, so that `ftgov status` works while members fill it"))
    idle_timeout_s: float = Field(60.0, gt=0, le=86400, description=(
        "a connection that holds no job and sends nothing this long is closed"))
    max_jobs_per_connection: int = Field(8, gt=0, le=1024)
    max_jobs_per_uid: int = Field(8, gt=0, le=65536, description=(
        "so that a few users cannot take every job slot; a job group counts once"))
    max_ranks_per_uid: int | None = Field(None, gt=0, le=65536, description=(
        "one user's jobs with every rank of its groups counted: max_jobs_per_uid counts a group once, so without "
        "this a member's groups, a rank on each GPU, would take max_jobs_per_uid times the GPUs' slots; default "
        f"{DEFAULT_RANKS_PER_UID}, or max_jobs_per_uid where that is higher (ranks_per_uid)"))
    max_jobs: int = Field(64, gt=0, le=4096, description=(
        "jobs in all; status lists each in a few KB (a name of 256 characters, escaped), and a client reads it whole "
        "(governor.client.connection.MAX_REPLY_BYTES)"))
    registrations_per_s: float = Field(2.0, gt=0, le=1e6, description=(
        "registrations a second per non-root user, on average: each pins the GPU and saves the state file, and so "
        "does the end of the job it makes"))
    registration_burst: int = Field(20, ge=1, le=1000000, description="registrations a user may make at once")
    repin_interval_s: float = Field(1.0, gt=0, le=60, description=(
        "a GPU's pin moves for phase changes and tuner probes at most once per this interval (each is a sysfs write "
        "and a state save); the latest move waits for the interval's end, and a tuned job's window for its pin"))

    @property
    def ranks_per_uid(self) -> int:
        """The rank cap in force: as set, else the default or max_jobs_per_uid, whichever is higher (a config that
        raised max_jobs_per_uid before the rank cap existed keeps working)."""
        if self.max_ranks_per_uid is not None:
            return self.max_ranks_per_uid
        return max(DEFAULT_RANKS_PER_UID, self.max_jobs_per_uid)

    @model_validator(mode="after")
    def _ranks_cover_jobs(self):
        if self.max_ranks_per_uid is not None and self.max_ranks_per_uid < self.max_jobs_per_uid:
            raise ValueError(f"max_ranks_per_uid ({self.max_ranks_per_uid}) must be at least max_jobs_per_uid "
                             f"({self.max_jobs_per_uid}): it counts the same jobs and every rank of a group besides")
        return self


class TunerConfig(_Strict):
    """The `tune` policy's online tuner (governor.policy.tuner; docs/tuner.md). Its defaults are the tuner's own, so
    the daemon never cuts the search short: the search's budget is energy (explore_budget_frac of the job's energy),
    and max_probes is only a safety cap. ``new_tuner`` and ``new_session`` build the tuner from these knobs for the
    daemon and for the simulations alike, so that they cannot drift."""

    window_steps: int = Field(_tuner.DEFAULT_WINDOW_STEPS, ge=1, description="measured training steps per window")
    warmup_steps: int = Field(_tuner.DEFAULT_WARMUP_STEPS, ge=0,
                              description="steps discarded after each frequency change")
    max_probes: int = Field(_tuner.DEFAULT_MAX_PROBES, ge=1, le=1000, description=(
        "measurement windows at most: a safety cap only; the energy budget ends the search first"))
    noise_rel: float = Field(_tuner.DEFAULT_NOISE_REL, gt=0, le=1,
                             description="relative noise of one window's energy per step")
    max_slowdown: float | None = Field(None, gt=0, le=10,
                                       description="e.g. 0.10: at most 10% slower than the fastest level")
    explore_budget_frac: float = Field(_tuner.DEFAULT_EXPLORE_BUDGET_FRAC, gt=0, le=1, description=(
        "exploration may cost at most this fraction of the job's energy (windows above the best level, in joules)"))
    confirm_windows: int = Field(_tuner.DEFAULT_CONFIRM_WINDOWS, ge=1, le=100, description=(
        "the fewest windows two levels within noise of each other get before the tuner may stop telling them apart"))
    confirm_contenders: int = Field(_tuner.CONFIRM_CONTENDERS_ON, ge=1, le=100, description=(
        "levels within noise of the best one that the search measures again, the closest in noise units first (on a "
        "real meter the second is often the level an excursion misread once)"))
    follow_up: bool = Field(True, description=(
        "after the search picks: confirm near-ties of the pick while the job's steps left pay for them, and search "
        "again when the pick's energy per step leaves its interval (the job's curve moved)"))
    drift_z: float = Field(_tuner.DEFAULT_DRIFT_Z, gt=0, le=100, description=(
        "follow_up: a window at the pick this many standard deviations off its estimate, twice in a row, is a drift"))
    max_follow_windows: int = Field(_tuner.DEFAULT_MAX_FOLLOW_WINDOWS, ge=0, le=1000, description=(
        "follow_up: windows away from the pick at most (confirming its near-ties)"))
    drift_rel: float = Field(_tuner.DRIFT_REL_ON, ge=0, le=1, description=(
        "the job's energy per step drifts while it runs (a host-bound job's by 3-15% at a fixed clock): the tuner "
        "compares windows far apart in time with that drift allowed for, its size learnt from the windows among 0, "
        "1/3, 1 and 3 times this, and windows noisier than they say allowed for too (0: windows are independent and "
        "as noisy as they say)"))
    drift_steps: float = Field(_tuner.DEFAULT_DRIFT_STEPS, gt=0, le=1e7, description=(
        "the steps over which the drift forgets (its correlation length)"))
    window_rule: Literal["steps", "time"] = Field("time", description=(
        "steps: a window is window_steps steps; time: it spans at least window_min_s, window_min_updates of the "
        "meter's updates and window_min_steps, then closes when its own uncertainty is within window_target_rel, "
        "or at window_max_s (docs/tuner.md)"))
    window_target_rel: float = Field(_tuner.WindowRule.target_rel, gt=0, le=1, description=(
        "window_rule time: a window closes once its own relative uncertainty is at most this"))
    window_min_s: float = Field(_tuner.WindowRule.min_s, gt=0, le=3600, description="window_rule time: seconds")
    window_max_s: float = Field(_tuner.WindowRule.max_s, gt=0, le=3600, description=(
        "window_rule time: a window closes after this many seconds whatever its uncertainty"))
    window_min_updates: int = Field(_tuner.WindowRule.min_updates, ge=0, le=1000, description=(
        "window_rule time: the fewest updates of the energy meter a window spans"))
    window_min_steps: int = Field(_tuner.WindowRule.min_steps, ge=1, le=100_000, description=(
        "window_rule time: the fewest steps a window spans"))
    window_decide_z: float = Field(_tuner.WindowRule.decide_z, ge=0, le=100, description=(
        "window_rule time: a window closes early once it differs from the estimate it is compared with (the "
        "incumbent, the pick) by this many standard deviations of the difference (0: never)"))
    window_explore_z: float = Field(_tuner.WindowRule.explore_z, gt=0, le=100, description=(
        "window_rule time: a window at a level the search is only ranking (on its way to the curve's bottom) that "
        "reads above the incumbent closes early at this many standard deviations instead (at most window_decide_z)"))
    settle_updates: float | None = Field(None, ge=0, le=100, description=(
        "after a change of clock or an unpin, no window opens before the energy meter has updated this many times "
        "(null: the meter's own, 1 for NVML's counter, 2 for the INA3221's average over its update_interval; 0: an "
        "exact meter)"))
    baseline_window: bool = Field(True, description=(
        "measure one window (warmup_steps + window_steps) at the default governor before the pin, so that the job's "
        "end reports a measured saving against it"))
    baseline_warmup_max_s: float = Field(120.0, ge=0, le=3600, description=(
        "the baseline window (its first part) opens once the job's steps have stopped speeding up (two successive "
        "blocks of at least 5 steps and 0.5 s, the later no more than 10% faster), so that a job's slow first steps "
        "are not taken for the default governor's cost; it waits this long at most (0: it opens at the first "
        "training report)"))
    baseline_min_steps: int = Field(30, ge=1, le=100_000, description=(
        "window_rule time: the fewest steps the baseline window spans. The measured saving rests on this one window: "
        "a few long steps that scatter (15% on real jobs) read its J/step several percent off, and its own estimate of "
        "that, from a handful of steps, runs low"))
    baseline_target_rel: float = Field(0.0075, gt=0, le=1, description=(
        "window_rule time: the baseline window closes once its own relative uncertainty is at most this (the "
        "measured saving's uncertainty is mostly the baseline's: 0.75% puts it within 2 points at p99)"))
    baseline_max_s: float = Field(600.0, gt=0, le=3600, description=(
        "window_rule time: the baseline window closes after this many seconds whatever its uncertainty"))
    baseline_max_share: float = Field(0.05, gt=0, le=1, description=(
        "window_rule time: the baseline window closes after this share of the job's total_steps (at least "
        "baseline_min_steps; a job that did not tell its length is taken as the tuner's 2,000 steps): its steps run "
        "at the default governor, which costs the saving on each"))
    baseline_parts: int = Field(5, ge=1, le=MAX_PARTS, description=(
        "the baseline's steps are measured in this many parts: the first at the job's start, the others at the "
        "default governor spread over the job while it runs converged, so that the baseline and the steps at the "
        "pick average over the same drift (a real GPU's steps drift by several percent over minutes: "
        "docs/benchmarks.md, 'baseline-drift'). Each part is a window of the baseline's rule with its share of the "
        "steps, at least window_min_s long; 1: the one window at the start. That many for a job of 2,000 steps, "
        "as many for every 2,000 steps of a longer one (at most 50): more, shorter parts cancel more of a long job's "
        "drift for less. Where the parts scatter by more than baseline_target_rel allows (the job drifts), more "
        "follow while the budget lasts (at most 50 in all)"))

    @classmethod
    def exact_meter(cls) -> TunerConfig:
        """The knobs for simulated jobs that read exact cumulative counters in the model's time (``ftgov evaluate``,
        governor.sim.learning): windows of steps (a 4-step window is exact there, and a WindowRule sizes windows by a
        real meter's updates), and the pick frozen at convergence, which their accounting charges the rest of the job
        at; no drift allowed for, since the model's steps are independent; and one near-tie confirmed, since an exact
        window reads no excursion to check again. The daemon's defaults on real meters are measured by
        benchmarks/bench_tuner.py's meter runs."""
        return cls(window_rule="steps", follow_up=False, drift_rel=0.0,
                   confirm_contenders=_tuner.DEFAULT_CONFIRM_CONTENDERS)

    def new_tuner(self, levels_hz, start_hz: int) -> _tuner.OnlineTuner:
        """An OnlineTuner with these knobs (the job's length is the session's to give: ``new_session``)."""
        return _tuner.OnlineTuner(levels_hz, start_hz, self.max_slowdown, noise_rel=self.noise_rel,
                                 max_probes=self.max_probes, explore_budget_frac=self.explore_budget_frac,
                                 confirm_windows=self.confirm_windows,
                                 probe_steps=max(1, self.warmup_steps + self.window_steps),
                                 follow_up=self.follow_up, drift_z=self.drift_z,
                                 max_follow_windows=self.max_follow_windows, drift_rel=self.drift_rel,
                                 drift_steps=self.drift_steps, confirm_contenders=self.confirm_contenders)

    @model_validator(mode="after")
    def _window_times(self):
        if self.window_max_s < self.window_min_s:
            raise ValueError(f"window_max_s ({self.window_max_s}) must be at least window_min_s ({self.window_min_s})")
        return self

    @property
    def edge_every_s(self) -> float:
        """How far apart the edges of an energy counter's updates are read (governor.daemon.energy.MeterFeed; a read
        has its cost): time windows take two in their shortest, fixed-step windows every update (0)."""
        return 0.0 if self.window_rule == "steps" else self.window_min_s / 2

    def window(self, meter_update_s: float) -> _tuner.WindowRule | None:
        """The rule windows follow on a meter that updates every ``meter_update_s``; None for fixed-step windows."""
        if self.window_rule == "steps":
            return None
        return _tuner.WindowRule(target_rel=self.window_target_rel, min_s=self.window_min_s, max_s=self.window_max_s,
                                 min_updates=self.window_min_updates, meter_update_s=meter_update_s,
                                 min_steps=self.window_min_steps, prior_rel=self.noise_rel,
                                 decide_z=self.window_decide_z, explore_z=self.window_explore_z)

    def baseline_budget_steps(self, total_steps: int | None = None) -> int | None:
        """The baseline's steps at most, all its parts together: baseline_max_share of the job's ``total_steps`` (None:
        unknown, priced as the tuner prices it, ASSUMED_TOTAL_STEPS), at least baseline_min_steps. None for
        fixed-step windows (each part is one window)."""
        if self.window_rule == "steps":
            return None
        steps = ASSUMED_TOTAL_STEPS if total_steps is None else total_steps
        return max(self.baseline_min_steps, int(self.baseline_max_share * steps))

    def baseline_parts_for(self, total_steps: int | None = None) -> int:
        """How many parts the baseline of a job of ``total_steps`` is planned in (None: unknown, taken as the tuner's
        ASSUMED_TOTAL_STEPS): baseline_parts for each ASSUMED_TOTAL_STEPS of the job, never fewer, at most MAX_PARTS
        (1 stays 1: the one window at the start). On the H200's replayed steps, jobs of 20,000 steps: one window put
        the measured saving 3.54 points off at p99, 50 parts (the default's) 1.90 (docs/benchmarks.md,
        "meter-saving-20000-parts"); 5 parts, as before this scaled, 2.87 for twice the energy."""
        if self.baseline_parts == 1:
            return 1
        steps = ASSUMED_TOTAL_STEPS if total_steps is None else total_steps
        return max(self.baseline_parts, min(MAX_PARTS, round(self.baseline_parts * steps / ASSUMED_TOTAL_STEPS)))

    def new_warmup(self) -> WarmUp:
        """What the baseline's first part waits for (the daemon's JobTuner and the simulated jobs alike): the job's
        steps to stop speeding up, for at most baseline_warmup_max_s; blocks of steps alone under fixed-step windows
        (window_rule steps), whose simulated jobs run in compressed time."""
        return WarmUp(self.baseline_warmup_max_s, block_s=0.0 if self.window_rule == "steps" else WARMUP_BLOCK_S)

    def new_baseline_parts(self, total_steps: int | None = None) -> BaselineParts:
        """The schedule of the baseline's parts for a job of ``total_steps`` (the daemon's JobTuner and the simulated
        jobs alike): baseline_parts_for it, within its budget, more where the parts say the job drifts."""
        return BaselineParts(self.baseline_parts_for(total_steps), self.baseline_budget_steps(total_steps),
                             total_steps, self.baseline_target_rel)

    def baseline_window_rule(self, meter_update_s: float,
                             total_steps: int | None = None) -> _tuner.WindowRule | None:
        """The rule of each of the baseline's baseline_parts windows: the windows' rule, together spanning at least
        baseline_min_steps steps, closing at baseline_target_rel (each part at that times sqrt(parts)), capped at
        baseline_max_s and at the baseline's budget (``baseline_budget_steps``), each part at its share of both.
        None for fixed-step windows."""
        rule = self.window(meter_update_s)
        budget = self.baseline_budget_steps(total_steps)
        if rule is None or budget is None:
            return None
        parts = self.baseline_parts_for(total_steps)
        min_steps = max(rule.min_steps, math.ceil(self.baseline_min_steps / parts))
        max_steps = max(min_steps, budget // parts)
        return dataclasses.replace(rule, min_steps=min_steps, max_s=max(rule.max_s, self.baseline_max_s / parts),
                                   target_rel=self.baseline_target_rel * math.sqrt(parts), max_steps=max_steps)

    def new_session(self, online: _tuner.OnlineTuner, steps: int, total_steps: int | None = None,
                    meter_update_s: float = 0.0, settle_s: float = 0.0) -> _tuner.TuningSession:
        """A TuningSession over ``online`` from step count ``steps``; ``total_steps`` is the count the job ends at
        (None: unknown, the tuner assumes its ASSUMED_TOTAL_STEPS); ``meter_update_s``: how often the job's energy
        meter updates (0: exact), for window_rule time and to tell a counter that has not updated yet from a stalled
        one; ``settle_s``: how long the meter takes to show a change of level (no window opens before)."""
        return _tuner.TuningSession(online, steps, self.warmup_steps, self.window_steps, total_steps=total_steps,
                                    rule=self.window(meter_update_s), meter_update_s=meter_update_s,
                                    settle_s=settle_s)


DEFAULT_STORE_PATH = "/var/lib/ftgov/measurements.sqlite"  # where the unit's StateDirectory=ftgov puts it


class StoreConfig(_Strict):
    """The measurement store (governor.store.measurements): every job's features, windows and outcome."""

    path: AbsolutePathOrAuto | None = Field("auto", description=(
        "SQLite file; auto: measurements.sqlite in systemd's $STATE_DIRECTORY (/var/lib/ftgov), and no store for a "
        "daemon started by hand (a test, a benchmark) unless a path is given; null: keep no store"))
    max_jobs: int = Field(20000, gt=0, le=10_000_000, description="the oldest jobs are dropped past this many")


class Config(_Strict):
    socket: SocketConfig = SocketConfig()
    sysfs_root: AbsolutePath = "/"
    state_dir: AbsolutePath = DEFAULT_STATE_DIR
    backend: Literal["auto", "devfreq", "nvml"] = "auto"
    policy: Literal["mlg", "ffg", "observe", "tune"] | None = Field(
        None, description="default: mlg on a Jetson; tune on NVML GPUs, where the Orin-trained tree does not transfer")
    power_cap_w: float | None = Field(None, gt=0, le=100_000, description=(
        "NVML only: also cap the GPU's power limit (W) while it is pinned; the previous limit is restored with it"))
    nvml_init_timeout_s: float = Field(15.0, gt=0, le=170, description=(
        "NVML only: how long nvmlInit may take at start (and in `ftgov restore`) before start fails; with persistence "
        "mode off it brings every GPU up. Each other NVML call is given 1 s (docs/nvml.md)"))
    model_file: AbsolutePath | None = Field(None,
                                   description="ftgov-tree/1 JSON; default: the tree shipped with ftgov")
    ffg_freq_hz: int | None = Field(None, description="FFG's frequency in Hz (nearest level at or above is pinned); "
                                    "default: the level with the least total energy in the training data (the "
                                    "ffg.json beside model_file, else the shipped one)")
    pin_above_power_mode: bool = Field(False, description=(
        "pin above the GPU's max_freq as found before the first pin (the nvpmodel power mode's cap); default never"))
    restore_on_stop: bool = True
    on_external_change: Literal["reapply", "stand_down"] = "reapply"
    low_phases: list[Literal["eval", "checkpoint", "data"]] = Field(
        default_factory=lambda: ["checkpoint", "data"],
        description="phases (reported with progress) during which a job needs only the lowest level, once one has "
        "lasted a second (or repin_interval_s): a shorter one is training; [] disables")
    limits: LimitsConfig = LimitsConfig()
    tuner: TunerConfig = TunerConfig()
    store: StoreConfig = StoreConfig()
    node_wait_s: float = Field(120.0, ge=0, le=86400,
                               description="how long to wait at start for the GPU node to appear")
    probe_retry_s: float = Field(30.0, gt=0, le=86400, description=(
        "with no GPU found at start: how often to probe again (the daemon serves meanwhile and governs nothing)"))
    sample_interval_s: float = Field(1.0, gt=0, le=3600, description="rails and pin check while jobs are active")
    util_sample_s: float = Field(0.5, ge=0, le=60, description=(
        "how long the GPU load is sampled for a job that gives no gpu_util (from its first training step)"))
    util_settle_s: float = Field(30.0, ge=0, le=3600, description=(
        "a job that gives no gpu_util and reports no progress: its load is sampled this long after it registers"))
    util_active_pct: float = Field(10.0, ge=0, le=100, description=(
        "such a job's loop counts as running once a window's mean load reaches this; until then it is still "
        "setting up (loading a model, initializing CUDA) and sampling goes on"))
    util_settle_max_s: float = Field(600.0, ge=0, le=86400, description=(
        "how long after registering such a job may still be setting up; then it is decided on the load it shows"))
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("ffg_freq_hz")
    @classmethod
    def _in_hz(cls, v):
        # 816 meant as MHz would pin every job at the lowest level: no GPU clock is below 1 MHz. A GPU's levels are
        # under 10000 in MHz and over it in kHz (cpufreq's unit, and the kernel's for devfreq's limit requests).
        if v is not None and v < MIN_FREQ_HZ:
            hint = (f"{v} kHz would be {v * 1_000}" if v >= 10_000 else f"{v} MHz would be {v * 1_000_000}" if v > 0
                    else "816 MHz is 816000000")
            raise ValueError(f"{v} Hz is below 1 MHz: the value is in Hz ({hint})")
        if v is not None and v > MAX_GPU_CLOCK_HZ:
            raise ValueError(f"{v} Hz is above any GPU's clock (10 GHz): the value is in Hz (816 MHz is 816000000)")
        return v


def store_path(config: Config, environ=os.environ) -> str | None:
    """The daemon's store file, or None for none (see StoreConfig.path)."""
    path = config.store.path
    if path != "auto":
        return path
    state_dir = environ.get("STATE_DIRECTORY", "").split(":")[0]  # systemd lists one per StateDirectory= entry
    return str(Path(state_dir) / "measurements.sqlite") if state_dir else None


def installed_store_path(config: Config) -> str:
    """The store an operator's command reads (ftgov history, report, model retrain): store.path, or for `auto` the
    file the unit's StateDirectory= gives the daemon; ConfigError when the config keeps none."""
    if config.store.path is None:
        raise ConfigError("the config keeps no measurement store (store.path: null); give --store")
    return DEFAULT_STORE_PATH if config.store.path == "auto" else config.store.path


MAX_ERRORS_SHOWN = 10  # a file of a thousand unknown keys is named by its first few, in one line of the log


def _sections() -> dict[str, type[BaseModel]]:
    """The config's sections (socket, limits, tuner, store): its keys that hold keys of their own."""
    return {name: field.annotation for name, field in Config.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}


def _unknown_key_hint(loc: tuple) -> str:
    """What a key the config does not know was likely meant to be: a section's key that lost its indent, else a
    known key of its own section that it misspells (``polcy``: policy)."""
    sections = _sections()
    if len(loc) == 1:
        owners = [name for name, model in sections.items() if loc[0] in model.model_fields]
        if owners:
            return f" (a key of {' or '.join(owners)}: indent it under its section)"
        model: type[BaseModel] | None = Config
    else:
        model = sections.get(str(loc[0])) if len(loc) == 2 else None
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?)" if close else ""


def _format_errors(e: ValidationError) -> str:
    lines = []
    errors = e.errors()
    for err in errors[:MAX_ERRORS_SHOWN]:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        hint = ""
        if err["type"] == "extra_forbidden":
            hint = _unknown_key_hint(err["loc"])
        lines.append(f"{key}: {err['msg']}{hint}")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"and {len(errors) - MAX_ERRORS_SHOWN} more")
    return "; ".join(lines)


def load_config(path: str | os.PathLike | None, overrides: dict | None = None, *, must_exist: bool = False) -> Config:
    """Load and validate the config; ``overrides`` (from the command line) win over the file, key by key."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        try:
            text = yamlfile.read(p)
        except FileNotFoundError as e:
            if must_exist:
                raise ConfigError(f"config file {p} does not exist") from e
            text = b""
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror or e}") from e
        except yamlfile.TooLarge as e:
            raise ConfigError(f"config file {p}: {e}") from e
        try:
            loaded = yamlfile.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
        if loaded is None:  # empty, or every key commented out: all defaults, as for an absent file
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of keys, not {type(loaded).__name__}")
        # A section whose every key is commented out is null: its defaults, as for a file whose every key is.
        data = {key: {} if value is None and key in _sections() else value for key, value in loaded.items()}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                break  # the file's own value there is no section (`socket:` with nothing under it): validation says so
        else:
            node[last] = value
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        where = f"config file {path}" if path else "configuration"
        raise ConfigError(f"{where}: {_format_errors(e)}") from e


FALLBACK_FFG_HZ = 612_000_000  # used only when the ffg.json found cannot be read (a broken install); logged


def default_ffg_hz(model_file: str | os.PathLike) -> tuple[int, str]:
    """FFG's frequency from ffg.json beside the model (written by `make model`, or `ftgov model ffg` in the directory
    of an operator's own tree, from the same data as the tree), and where from. A tree with none beside it (`ftgov
    model retrain`'s, a hand-written one) gets the shipped ffg.json's: no ffg.json of its data exists."""
    path = Path(model_file).with_name("ffg.json")
    if not os.path.lexists(path):
        path = data.path(data.FFG)
    try:
        return read_ffg_hz(path), str(path)
    except ModelError as e:
        return FALLBACK_FFG_HZ, f"built-in fallback ({e})"


def default_model_path() -> Path:
    """The tree shipped with ftgov, as package data (governor/data/), installed or in a checkout."""
    return data.path(data.MLG_TREE)
