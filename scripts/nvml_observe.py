#!/usr/bin/env python3
"""Observe a real fine-tuning run on an NVIDIA GPU: energy per step, utilization and clocks. READ ONLY.

It trains a Hugging Face model built from a config (random weights, synthetic tokens) on one GPU and records, per
training step and per eval / checkpoint / data phase, the energy from NVML's counter, the utilization and the clocks,
read two ways: directly through NVML, and through ftgovd running with the NVML backend in the ``observe`` policy
(which pins nothing), as a client job that reports its progress and phase. Without the daemon (``--daemon off``, or
governor.daemon not importable under ``--daemon auto``) it records the direct reads alone.

It changes nothing on the machine: NVML is opened through a read-only handle that refuses every Set*/Reset* call;
the daemon is started with ``policy: observe`` and the script aborts before training if the daemon reports any other
policy or a pin; the power limit is read before and after and any difference is reported.

Output under --out: segments.csv (one row per step or phase block), samples.csv (the sampler's time series),
summary.md (the tables), run.json (machine, GPU, model, clock table), ftgovd.log when the daemon ran.
See docs/nvml-observe.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from governor.backends.gpuid import GpuNotFound, find_gpu
from governor.backends.nvml import MHZ, NvmlGpu, probe
from governor.client import Connection
from governor.client.features import visible_gpu
from governor.errors import FtgovError

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the CSV, markdown and JSON output")
    p.add_argument("--arch", choices=["gpt2", "bert"], default="gpt2", help="decoder (GPT-2) or encoder (BERT, MLM)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=300, help="training steps")
    p.add_argument("--warmup-steps", type=int, default=10, help="first steps left out of the steady-state figures")
    p.add_argument("--eval-every", type=int, default=100, help="an eval block after every N steps (0: none)")
    p.add_argument("--eval-steps", type=int, default=20)
    p.add_argument("--checkpoint-every", type=int, default=150, help="save a checkpoint after every N steps (0: none)")
    p.add_argument("--data-every", type=int, default=100, help="a CPU-bound data preparation block every N steps")
    p.add_argument("--data-tokens", type=int, default=2_000_000, help="tokens the data block prepares on the CPU")
    p.add_argument("--idle-s", type=float, default=3.0, help="idle baseline measured before training")
    p.add_argument("--sample-interval-s", type=float, default=0.1)
    p.add_argument("--status-every", type=int, default=5, help="ask the daemon for status every N steps")
    p.add_argument("--device", default="cuda", help="torch device to train on (cpu for a dry run on a fake NVML)")
    p.add_argument("--gpu", help="the NVML GPU to observe (index or UUID); default: the one torch trains on")
    p.add_argument("--daemon", choices=["auto", "on", "off"], default="auto",
                   help="start ftgovd in observe mode (auto: when governor.daemon is importable)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# ---- the daemon, spoken to in its own protocol (one JSON object per line) ----
class Daemon:
    """ftgovd in the observe policy with the NVML backend, on a private socket and state dir, its log under the
    output."""

    def __init__(self, out: Path):
        from governor.sim.launch import Daemon as Launcher

        self.dir = Path(tempfile.mkdtemp(prefix="ftgov-observe-"))  # short: a Unix socket path has ~100 bytes
        config = self.dir / "ftgov.yaml"
        # The caller's PYTHONPATH is kept: it may put a pynvml stand-in first (tests/support/fakenvml).
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        self.launcher = Launcher(None, workdir=self.dir, config_file=str(config), log_path=out / "ftgovd.log",
                                 log_level="info", env={"PYTHONPATH": pythonpath})
        self.socket_path = self.launcher.socket
        self.log_path = self.launcher.log_path
        config.write_text(
            "# written by scripts/nvml_observe.py: observe only, never pin\n"
            f"backend: nvml\npolicy: observe\nrestore_on_stop: false\nstate_dir: {self.launcher.state_dir}\n"
            f"socket:\n  path: {self.socket_path}\n  mode: '0600'\n")

    def start(self, timeout_s: float = 60.0) -> Connection:
        """Start ftgovd and wait for its READY=1 (sd_notify, the readiness signal systemd would get)."""
        try:
            self.launcher.start(timeout_s=timeout_s)
        except (TimeoutError, RuntimeError) as e:
            raise FtgovError(f"ftgovd did not become ready:\n{self.log_tail()}") from e
        return Connection(self.socket_path, timeout_s=30.0)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int | None:
        code = self.launcher.stop(timeout_s=20)
        self.launcher.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


def check_observe_only(status: dict, gpu_id: str) -> None:
    """Refuse to train if the daemon could change this GPU: any policy but observe, or any pin."""
    if status.get("policy") != "observe":
        raise FtgovError(f"ftgovd runs policy {status.get('policy')!r}, not observe: refusing to run on a shared GPU")
    for g in status.get("gpus") or []:
        if g.get("pinned_hz") is not None:
            raise FtgovError(f"ftgovd reports GPU {g.get('id')} pinned at {g['pinned_hz']} Hz: refusing")


PROTOCOL_PHASES = ("train", "eval", "checkpoint", "data")


# ---- direct NVML sampling ----
class Sampler:
    """Reads the GPU every interval in a thread, so a phase's mean clock and load do not rest on one read."""

    FIELDS = ["t_s", "graphics_mhz", "sm_mhz", "memory_mhz", "util_pct", "power_w", "energy_j", "event_reasons"]

    def __init__(self, gpu: NvmlGpu, interval_s: float, t0: float):
        self.gpu, self.interval_s, self.t0 = gpu, interval_s, t0
        self.rows: list[dict] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def read(self) -> dict:
        clocks = self.gpu.clocks_mhz()
        reasons = self.gpu.clock_event_reasons()
        return {"t_s": round(time.monotonic() - self.t0, 4), "graphics_mhz": clocks["graphics"],
                "sm_mhz": clocks["sm"], "memory_mhz": clocks["memory"], "util_pct": self.gpu.utilization_pct(),
                "power_w": self.gpu.power_mw() / 1000.0, "energy_j": self.gpu.energy_j(),
                "event_reasons": None if reasons is None else hex(reasons)}

    def _run(self) -> None:
        # Periodic by nature: this thread is the measurement, not a wait for something to happen.
        while not self.stop_event.is_set():
            try:
                self.rows.append(self.read())
            except FtgovError as e:
                self.errors.append(str(e))
            self.stop_event.wait(self.interval_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout=10)

    def window(self, t_start: float, t_end: float) -> list[dict]:
        return [r for r in list(self.rows) if t_start <= r["t_s"] <= t_end]


@dataclass
class Recorder:
    """One row per segment (a training step or a phase block): energy from the counter at its edges, and means."""

    gpu: NvmlGpu
    sampler: Sampler
    t0: float
    rows: list[dict] = field(default_factory=list)
    daemon: Connection | None = None
    job_id: int | None = None
    gpu_id: str = ""

    FIELDS = ["segment", "phase", "step", "t_start_s", "duration_s", "energy_j", "power_w", "util_pct_end",
              "graphics_mhz_end", "sm_mhz_end", "memory_mhz_end", "util_pct_mean", "graphics_mhz_mean",
              "samples", "loss", "daemon_cur_mhz", "daemon_load_pct", "daemon_phase", "daemon_steps",
              "daemon_energy_j"]

    def begin(self) -> tuple[float, float]:
        return self._stamped_energy_j()

    def _stamped_energy_j(self) -> tuple[float, float]:
        """(when, the counter): the read runs on the GPU's NVML worker thread (governor.backends.nvmlcalls), after
        the hop there and any read of the sampler's thread queued before it, so the instant it read is somewhere in
        the call: its middle, not its start (a segment of tenths of a second read 8% dear on a loaded CI host)."""
        before_s = time.monotonic()
        energy_j = self.gpu.energy_j()
        return (before_s + time.monotonic()) / 2, energy_j

    def end(self, started: tuple[float, float], phase: str, step: int, loss: float | None = None,
            status: bool = False) -> dict:
        t_start, e_start = started
        t_end, e_end = self._stamped_energy_j()
        clocks, util = self.gpu.clocks_mhz(), self.gpu.utilization_pct()
        window = self.sampler.window(t_start - self.t0, t_end - self.t0)
        duration_s = t_end - t_start
        row = {"segment": len(self.rows), "phase": phase, "step": step, "t_start_s": round(t_start - self.t0, 4),
               "duration_s": round(duration_s, 5), "energy_j": round(e_end - e_start, 3),
               "power_w": round((e_end - e_start) / duration_s, 2) if duration_s > 0 else None,
               "util_pct_end": util, "graphics_mhz_end": clocks["graphics"], "sm_mhz_end": clocks["sm"],
               "memory_mhz_end": clocks["memory"],
               "util_pct_mean": _mean([r["util_pct"] for r in window]),
               "graphics_mhz_mean": _mean([r["graphics_mhz"] for r in window]), "samples": len(window),
               "loss": None if loss is None else round(loss, 4)}
        if self.daemon is not None and self.job_id is not None:
            if phase in PROTOCOL_PHASES:  # the idle baseline is no phase of the job's
                self.daemon.notify("progress", job_id=self.job_id, steps=step, phase=phase)
            if status:
                row.update(self._daemon_view())
        self.rows.append(row)
        return row

    def _daemon_view(self) -> dict:
        status = self.daemon.call("status")
        check_observe_only(status, self.gpu_id)
        gpu = next((g for g in status.get("gpus") or [] if str(g.get("id")) == self.gpu_id), {})
        job = next((j for j in status.get("jobs") or [] if j.get("job_id") == self.job_id), {})
        cur_hz = gpu.get("cur_hz")
        return {"daemon_cur_mhz": None if cur_hz is None else cur_hz / MHZ, "daemon_load_pct": gpu.get("load_pct"),
                "daemon_phase": job.get("phase"), "daemon_steps": job.get("steps"),
                "daemon_energy_j": job.get("energy_j")}




def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.fmean(values), 2) if values else None


# ---- the workload ----
def build_model(args: argparse.Namespace, device: str):
    import torch
    import transformers

    torch.manual_seed(args.seed)
    if args.arch == "gpt2":
        config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                                         n_positions=args.seq_len, vocab_size=args.vocab,
                                         bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                                         num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                                         max_position_embeddings=args.seq_len, vocab_size=args.vocab)
        model = transformers.BertForMaskedLM(config)
    return model.to(device), config


def synthetic_batch(args: argparse.Namespace, device: str, generator):
    import torch

    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), device=device, generator=generator)
    labels = input_ids.clone()
    if args.arch == "bert":
        # Masked LM: predict 15% of the tokens, which the input replaces by a mask id (the vocabulary's last).
        masked = torch.rand(input_ids.shape, device=device, generator=generator) < 0.15
        labels[~masked] = -100
        input_ids = input_ids.masked_fill(masked, args.vocab - 1)
    return input_ids, labels


def prepare_data_on_cpu(tokens: int, seed: int) -> int:
    """A data phase's CPU work, with the GPU idle: build, sort and pad token lists as a collator would."""
    rng = random.Random(seed)
    samples, left = [], tokens
    while left > 0:
        n = min(left, rng.randint(64, 1024))
        samples.append([rng.randrange(32000) for _ in range(n)])
        left -= n
    samples.sort(key=len)
    longest = len(samples[-1])
    return sum(len(s + [0] * (longest - len(s))) for s in samples)


def run_training(args, model, device: str, recorder: Recorder) -> None:
    import torch

    generator = torch.Generator(device=device).manual_seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    use_cuda = device.startswith("cuda")

    def amp():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_cuda else contextlib.nullcontext()

    def sync():
        if use_cuda:
            torch.cuda.synchronize()  # the step's kernels are done before its energy is read

    model.train()
    for step in range(1, args.steps + 1):
        started = recorder.begin()
        input_ids, labels = synthetic_batch(args, device, generator)
        with amp():
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        recorder.end(started, "train", step, loss=float(loss.detach()), status=step % args.status_every == 0)
        if args.eval_every and step % args.eval_every == 0:
            started = recorder.begin()
            model.eval()
            with torch.no_grad():
                for _ in range(args.eval_steps):
                    input_ids, labels = synthetic_batch(args, device, generator)
                    with amp():
                        model(input_ids=input_ids, labels=labels)
            sync()
            model.train()
            recorder.end(started, "eval", step, status=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            started = recorder.begin()
            with tempfile.TemporaryDirectory(prefix="ftgov-ckpt-") as tmp:  # never into --out: it is not output
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(tmp) / "ckpt.pt")
            recorder.end(started, "checkpoint", step, status=True)
        if args.data_every and step % args.data_every == 0:
            started = recorder.begin()
            prepare_data_on_cpu(args.data_tokens, args.seed + step)
            recorder.end(started, "data", step, status=True)


# ---- output ----
def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def phase_table(rows: list[dict], warmup_steps: int) -> list[dict]:
    table = []
    for phase in ("idle", "train", "eval", "checkpoint", "data"):
        seg = [r for r in rows if r["phase"] == phase and not (phase == "train" and r["step"] <= warmup_steps)]
        if not seg:
            continue
        time_s = sum(r["duration_s"] for r in seg)
        energy_j = sum(r["energy_j"] for r in seg)
        table.append({"phase": phase + (f" (after step {warmup_steps})" if phase == "train" else ""),
                      "segments": len(seg), "time_s": round(time_s, 2), "energy_j": round(energy_j, 1),
                      "mean_power_w": round(energy_j / time_s, 1) if time_s > 0 else None,
                      "energy_per_segment_j": round(energy_j / len(seg), 2),
                      "util_pct_mean": _mean([r["util_pct_mean"] for r in seg]),
                      "graphics_mhz_mean": _mean([r["graphics_mhz_mean"] for r in seg])})
    return table


def markdown_table(rows: list[dict]) -> str:
    if not rows or not rows[0]:
        return "(none)\n"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def daemon_agreement(rows: list[dict]) -> dict:
    """How the daemon's reading (status) compares with the direct one taken at the same segment end."""
    pairs = [(r["daemon_cur_mhz"], r["graphics_mhz_end"]) for r in rows if r.get("daemon_cur_mhz") is not None]
    loads = [(r["daemon_load_pct"], r["util_pct_end"]) for r in rows if r.get("daemon_load_pct") is not None]
    return {"status_reads": len(pairs),
            "clock_mean_abs_diff_mhz": _mean([abs(a - b) for a, b in pairs]),
            "load_mean_abs_diff_pct": _mean([abs(a - b) for a, b in loads]),
            "phases_seen_by_daemon": sorted({r["daemon_phase"] for r in rows if r.get("daemon_phase")})}


def write_summary(out: Path, meta: dict, rows: list[dict], args) -> None:
    gpu = meta["gpu"]
    low_mhz, high_mhz, count = gpu["supported_mhz"]
    machine = {"gpu": f"{gpu['index']}: {gpu['name']}", "uuid": gpu["uuid"], "driver": meta.get("driver"),
               "memory_clock_mhz": gpu["memory_clock_mhz"], "graphics_clocks_mhz": f"{low_mhz}..{high_mhz} ({count})",
               "power_limit_w": _w(meta["power_limit_mw_before"]), "torch_uuid_matches_nvml": meta["uuid_match"]}
    sections = [
        f"# NVML observation: {meta['model']['arch']} on {gpu['name']}",
        "Recorded by scripts/nvml_observe.py, read only: NVML through a handle that refuses every "
        "Set/Reset call, and ftgovd (when it ran) in the observe policy. One run, not a benchmark.",
        "## Machine", markdown_table([machine]),
        f"Levels the NVML backend would tune over (MHz): {', '.join(map(str, gpu['levels_mhz']))}",
        "## Workload", markdown_table([meta["model"]]),
        "## Per phase (direct NVML reads)",
        "Energy from nvmlDeviceGetTotalEnergyConsumption at each segment's edges (after a CUDA synchronize); "
        "utilization and graphics clock are means of the sampler's reads within the segment (empty when the "
        "segment was shorter than the sampling interval).",
        markdown_table(phase_table(rows, args.warmup_steps)),
        "## Steady-state training", markdown_table([steady_state(rows, args)]),
        "## Through the daemon"]
    daemon = meta.get("daemon")
    if daemon and "register" in daemon:
        sections += [f"ftgovd policy `{daemon['policy']}`, job {daemon['job_id']}: register answered freq_hz "
                     f"{daemon['register'].get('freq_hz')} ({daemon['register'].get('reason')}).",
                     markdown_table([daemon_agreement(rows)]),
                     f"unregister answered `{json.dumps(daemon.get('unregister'))}`; ftgovd exit code "
                     f"{daemon.get('exit_code')}."]
    else:
        sections.append(f"Not run: {meta.get('daemon_skipped', 'see run.json')}.")
    check = {"power_limit_w_before": _w(meta["power_limit_mw_before"]),
             "power_limit_w_after": _w(meta["power_limit_mw_after"]),
             "unchanged": meta["power_limit_mw_before"] == meta["power_limit_mw_after"],
             "clock_event_reasons_before": meta["event_reasons_before"],
             "clock_event_reasons_after": meta["event_reasons_after"]}
    sections += ["## Read-only check", markdown_table([check]),
                 "NVML cannot read a clock lock back; bit 0x2 of the clock event reasons (applications clocks "
                 "setting) is set while a lock is in force, so the same bit before and after is the check possible."]
    if meta.get("sampler_errors"):
        sections.append(f"Sampler errors (first 5): {meta['sampler_errors'][:5]}")
    (out / "summary.md").write_text("\n\n".join(s.rstrip("\n") for s in sections) + "\n")


def steady_state(rows: list[dict], args) -> dict:
    train = [r for r in rows if r["phase"] == "train" and r["step"] > args.warmup_steps]
    if not train:
        return {}
    tokens_per_step = args.batch * args.seq_len
    step_s = [r["duration_s"] for r in train]
    energy = [r["energy_j"] for r in train]
    return {"steps": len(train), "step_s_mean": round(statistics.fmean(step_s), 4),
            "step_s_median": round(statistics.median(step_s), 4),
            "energy_per_step_j_mean": round(statistics.fmean(energy), 2),
            "energy_per_step_j_median": round(statistics.median(energy), 2),
            "tokens_per_s": round(tokens_per_step * len(train) / sum(step_s), 1),
            "energy_per_1k_tokens_j": round(1000 * sum(energy) / (tokens_per_step * len(train)), 3)}


def _w(mw: int | None) -> float | None:
    return None if mw is None else mw / 1000.0


# ---- main ----
def choose_gpu(gpus: list[NvmlGpu], key: str | None, meta: dict) -> NvmlGpu:
    """--gpu, else the GPU torch computes on (its UUID), else the only GPU there is."""
    if key is not None:
        return find_gpu(gpus, key)
    seen = visible_gpu()
    meta["torch_gpu"] = seen
    try:
        gpu = find_gpu(gpus, seen)
    except GpuNotFound as e:
        if len(gpus) != 1:
            raise
        meta["torch_gpu_note"] = f"{e}; observing the only GPU"
        return gpus[0]
    if seen is not None and seen.upper().startswith("GPU-"):
        meta["uuid_match"] = seen == gpu.uuid
    return gpu


def open_daemon_job(args, out: Path, gpu: NvmlGpu, config, recorder: Recorder, meta: dict) -> Daemon | None:
    """Start ftgovd (observe policy) and register this run as a job on it; None when the daemon is not used.

    Under --daemon auto a daemon that cannot start or register is reported and the run goes on with direct reads
    (a device session is too short to lose to it); under --daemon on it is an error.
    """
    if args.daemon == "off":
        meta["daemon_skipped"] = "--daemon off"
        return None
    if args.daemon == "auto" and importlib.util.find_spec("governor.daemon") is None:
        meta["daemon_skipped"] = "governor.daemon is not importable"
        return None
    daemon = Daemon(out)
    try:
        recorder.daemon = daemon.start()
        check_observe_only(recorder.daemon.call("status"), gpu.id)
        from governor.features import from_hf_config

        register = recorder.daemon.call("register", **{**from_hf_config(config), "seq_len": float(args.seq_len),
                                                       "name": "nvml_observe", "pid": os.getpid(), "gpu": gpu.uuid})
        meta["daemon"] = {"policy": register["policy"], "job_id": register["job_id"], "register": register}
        if register.get("freq_hz") is not None:
            raise FtgovError(f"ftgovd answered a pin ({register}): refusing to train on a shared GPU")
        recorder.job_id = register["job_id"]
        return daemon
    except (FtgovError, OSError, ValueError) as e:
        if recorder.daemon is not None:
            recorder.daemon.close()
            recorder.daemon = None
        meta.setdefault("daemon", {})["exit_code"] = daemon.stop()
        if args.daemon == "on":
            raise
        meta["daemon_skipped"] = f"ftgovd failed, direct NVML reads only: {e}"
        print(f"nvml_observe: {meta['daemon_skipped']}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = probe(read_only=True)  # refuses every Set*/Reset*: this script never changes the machine
    model, config = build_model(args, args.device)  # torch is imported now, so visible_gpu can ask it
    meta: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                            "argv": sys.argv[1:] if argv is None else argv, "uuid_match": None,
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    gpu = choose_gpu(gpus, args.gpu, meta)
    meta.update({
        "gpu": gpu.describe(), "supported_graphics_mhz": [hz // MHZ for hz in gpu.supported_hz],
        "driver": gpu.driver_version(),
        "power_limit_mw_before": gpu.power_limit_mw(), "event_reasons_before": _hex(gpu.clock_event_reasons()),
        "model": {"arch": args.arch, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "seq_len": args.seq_len, "batch": args.batch, "steps": args.steps, "device": args.device,
                  "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)},
    })
    t0 = time.monotonic()
    sampler = Sampler(gpu, args.sample_interval_s, t0)
    recorder = Recorder(gpu, sampler, t0, gpu_id=gpu.id)
    daemon = None
    try:
        daemon = open_daemon_job(args, out, gpu, config, recorder, meta)
        sampler.start()
        started = recorder.begin()
        sampler.stop_event.wait(args.idle_s)  # the idle baseline: nothing runs on the GPU from this process
        recorder.end(started, "idle", 0, status=daemon is not None)
        run_training(args, model, args.device, recorder)
        if daemon is not None:
            meta["daemon"]["unregister"] = recorder.daemon.call("unregister", job_id=recorder.job_id)
    finally:
        sampler.stop()
        if recorder.daemon is not None:
            recorder.daemon.close()
        if daemon is not None:
            meta.setdefault("daemon", {})["exit_code"] = daemon.stop()
        meta["power_limit_mw_after"] = gpu.power_limit_mw()
        meta["event_reasons_after"] = _hex(gpu.clock_event_reasons())
        meta["sampler_errors"] = sampler.errors
        write_csv(out / "segments.csv", Recorder.FIELDS, recorder.rows)
        write_csv(out / "samples.csv", Sampler.FIELDS, sampler.rows)
        (out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    write_summary(out, meta, recorder.rows, args)
    print((out / "summary.md").read_text())
    return 0


def _hex(value: int | None) -> str | None:
    return None if value is None else hex(value)


if __name__ == "__main__":
    # A SIGTERM (the device tool's time limit) must still run the finally blocks that stop ftgovd.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        sys.exit(main())
    except FtgovError as e:
        print(f"nvml_observe: {e}", file=sys.stderr)
        sys.exit(1)
