"""What `tune` would measure on a real GPU, read only: ftgovd in the observe policy runs the tuner's windows on Hugging
Face Trainer jobs at the clock they already have, and this script summarizes them.

    python -m scripts.observe_windows --out OUT [--steps 400] [--sizes base large]

For each model size, a BERT masked-LM built from a config (random weights, synthetic tokens) trains under the HF
Trainer with governor.hf.GovernorCallback, one job after another, against one ftgovd (NVML backend, policy observe,
tuner.window_rule time, a private socket and state dir). The daemon closes windows by its own rule (governor.policy.
windows.WindowRule on the GPU's 100 ms energy counter) and logs each; the summary gives, per job, the windows' length
in steps and seconds and the spread of successive windows (governor.daemon.observing.successive_spread). Nothing is
written to the GPU: observe pins nothing, and the power limit and clocks' event reasons are read before and after.
Writes summary.md, windows.csv, run.json and ftgovd.log under OUT.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from governor.daemon.observing import successive_spread
from governor.sim.launch import Daemon
from scripts.first_contact import token_dataset

SIZES = {"small": (6, 512, 8), "base": (12, 768, 12), "large": (24, 1024, 16)}  # layers, hidden, heads
WINDOW_LINE = re.compile(r"job (\d+) '([^']*)' .*observe window (\d+): ([0-9.]+) J/step, ([0-9.]+) s/step over "
                         r"(\d+) steps in ([0-9.]+) s")


GRID_LINE = re.compile(r"the energy counter's update instants are known to ([0-9.]+) ms")


def process_cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gpu_readings() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        # The legacy pynvml package (NGC containers') has only the older name of the reasons' call, and answers
        # strings in bytes (governor.backends.nvml._text).
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        name = pynvml.nvmlDeviceGetName(h)
        return {"power_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(h),
                "clocks_event_reasons": (reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)(h),
                "name": (name.decode() if isinstance(name, bytes) else name)
                + (" (the fake NVML of tests/support)" if "fakenvml" in (pynvml.__file__ or "") else ""),
                "pynvml": pynvml.__file__}
    finally:
        pynvml.nvmlShutdown()


def observing_daemon(log_path: Path) -> Daemon:
    """ftgovd started on the NVML backend in the observe policy, tuner.window_rule time, with a private socket and
    state dir, its log at ``log_path``; SystemExit (the daemon stopped) unless its status shows it observing with no
    GPU pinned."""
    # An empty sysfs root: with the NVML backend the daemon reads the GPU through NVML alone, never /sys. The
    # caller's PYTHONPATH goes on to it (carried dependencies; a pynvml stand-in for a dry run).
    here = str(Path(__file__).resolve().parents[1])
    daemon = Daemon(Path(tempfile.mkdtemp(prefix="ftgov-observe-")),
                    config={"backend": "nvml", "policy": "observe", "restore_on_stop": False,
                            "tuner": {"window_rule": "time"}},
                    test_config=False,  # the daemon's defaults otherwise (the tests' 0.05 s util_sample_s is 1 read)
                    env={"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)},
                    log_path=log_path,
                    # debug: every window's line (info has the first ones and one in 60), for windows.csv
                    log_level=os.environ.get("OBS_LOG_LEVEL", "debug"))
    daemon.start(timeout_s=60)
    status = daemon.client().call("status")
    if status["policy"] != "observe" or any(g.get("pinned_hz") for g in status["gpus"]):
        daemon.stop()
        raise SystemExit(f"refusing to train: the daemon is not observing read-only: {status}")
    return daemon


def bert(size: str):
    """The masked LM of ``size`` (SIZES), built from a config: random weights, seeded."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    layers, hidden, heads = SIZES[size]
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      intermediate_size=4 * hidden))


def train(size: str, steps: int, socket: str, device: str, eval_every: int = 0, eval_batches: int = 20,
          seq_len: int = 128, grad_accum: int = 1) -> float:
    from transformers import Trainer, TrainingArguments

    from governor.hf import GovernorCallback

    model = bert(size)
    evaluation = {}
    if eval_every:  # the Trainer's evaluation every eval_every steps: eval_batches of forward passes, no steps
        evaluation = {"eval_steps": eval_every, "per_device_eval_batch_size": 32,
                      ("eval_strategy" if "eval_strategy" in TrainingArguments.__dataclass_fields__
                       else "evaluation_strategy"): "steps"}
    # A step is an optimizer step: grad_accum batches of 32 (long steps, as a Jetson's, on a large GPU).
    args = TrainingArguments(output_dir=f"/tmp/observe-windows-{size}", max_steps=steps, report_to=[],
                             per_device_train_batch_size=32, gradient_accumulation_steps=grad_accum,
                             save_strategy="no", logging_steps=100,
                             dataloader_num_workers=2, use_cpu=device == "cpu", bf16=device != "cpu", **evaluation)
    start = time.monotonic()
    name = f"bert-{size}" + (f"-eval{eval_every}" if eval_every else "")
    Trainer(model=model, args=args, train_dataset=token_dataset(32 * grad_accum * steps, seq_len),
            eval_dataset=token_dataset(32 * eval_batches, seq_len) if eval_every else None,
            callbacks=[GovernorCallback(name=name, socket=socket, seq_len=seq_len)]).train()
    return time.monotonic() - start


def train_lightning(size: str, steps: int, socket: str, device: str, seq_len: int = 128) -> float:
    """The same model, data and batch as train()'s, fitted by a Lightning Trainer with governor.lightning's callback
    (a step: a batch; no evaluation)."""
    import lightning.pytorch as pl
    import torch

    from governor.lightning import GovernorCallback

    class MaskedLM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = bert(size)

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=5e-5)

    module = MaskedLM()
    data = torch.utils.data.DataLoader(token_dataset(32 * steps, seq_len), batch_size=32, num_workers=2)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu" if device == "cpu" else "gpu", devices=1,
                         precision="32-true" if device == "cpu" else "bf16-mixed", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[GovernorCallback(name=f"lightning-bert-{size}", socket=socket, seq_len=seq_len)])
    start = time.monotonic()
    trainer.fit(module, data)
    return time.monotonic() - start


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["job"] for r in rows):
        ws = [r for r in rows if r["job"] == name]
        first_dropped = ws[1:] if len(ws) > 2 else ws  # the first window still carries the loop's warm-up
        j = [r["j_per_step"] for r in first_dropped]
        spread = successive_spread(j)
        out.append({"job": name, "windows": len(ws),
                    "steps_median": statistics.median(r["steps"] for r in first_dropped),
                    "seconds_median": statistics.median(r["seconds"] for r in first_dropped),
                    "j_per_step_mean": statistics.fmean(j), "s_per_step_mean": statistics.fmean(
                        r["s_per_step"] for r in first_dropped),
                    "spread_pct": None if spread is None else 100 * spread,
                    # the window furthest from the job's median J/step: an evaluation's energy in a window shows here
                    "worst_pct": 100 * max(abs(x / statistics.median(j) - 1) for x in j)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["base", "large"])
    p.add_argument("--device", default="cuda", help="cpu for a dry run against the fake NVML")
    p.add_argument("--eval-every", type=int, nargs="+", default=[0],
                   help="each size is trained once per value: 0 without evaluation, N with the Trainer's evaluation "
                        "(--eval-batches) every N steps")
    p.add_argument("--eval-batches", type=int, default=20, help="batches of 32 in each evaluation")
    p.add_argument("--seq-len", type=int, default=128, help="tokens a sample")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="batches of 32 in each optimizer step (the step the daemon counts): long steps")
    p.add_argument("--lightning", action="store_true",
                   help="after each size's HF Trainer jobs, the same model fitted by a Lightning Trainer "
                        "(governor.lightning.GovernorCallback)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = gpu_readings()
    daemon = observing_daemon(args.out / "ftgovd.log")
    try:
        seconds, cpu_s = {}, {}
        for size in args.sizes:
            for every in args.eval_every:
                run = size + (f"-eval{every}" if every else "")
                cpu0 = process_cpu_s(daemon.proc.pid)
                seconds[run] = train(size, args.steps, daemon.socket, args.device, every, args.eval_batches,
                                     args.seq_len, args.grad_accum)
                cpu_s[run] = process_cpu_s(daemon.proc.pid) - cpu0
            if args.lightning:
                run = f"lightning-{size}"
                cpu0 = process_cpu_s(daemon.proc.pid)
                seconds[run] = train_lightning(size, args.steps, daemon.socket, args.device, args.seq_len)
                cpu_s[run] = process_cpu_s(daemon.proc.pid) - cpu0
    finally:
        daemon.stop()
    after = gpu_readings()
    log_text = (args.out / "ftgovd.log").read_text()
    grids = len(GRID_LINE.findall(log_text))
    rows = [{"job": m[2], "window": int(m[3]), "j_per_step": float(m[4]), "s_per_step": float(m[5]),
             "steps": int(m[6]), "seconds": float(m[7])}
            for m in WINDOW_LINE.finditer(log_text)]
    with open(args.out / "windows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["job", "window", "j_per_step", "s_per_step", "steps", "seconds"])
        w.writeheader()
        w.writerows(rows)
    table = summarize(rows)
    lines = [f"# Observe-mode windows on {before['name']} (read only)", "",
             f"HF Trainer, BERT masked LM built from a config (random weights, synthetic tokens, batch 32 x "
             f"{args.seq_len}" + (f", {args.grad_accum} batches a step" if args.grad_accum > 1 else "") + "), "
             f"{args.steps} steps per job, bf16"
             + (f", evaluation ({args.eval_batches} batches of 32) every "
                f"{' / '.join(str(e) for e in args.eval_every if e)} steps in the jobs so named"
                if any(args.eval_every) else "")
             + ("; the same model and batches fitted by a Lightning Trainer (governor.lightning) in the jobs named "
                "lightning-*" if args.lightning else "")
             + "; ftgovd with the NVML backend, policy observe, tuner.window_rule time (WindowRule's defaults). "
             "The first window of each job (the loop's warm-up) is left out of the medians and the spread. One run "
             "per job.", "",
             "| job | windows | window, median steps | window, median s | J/step | s/step | spread of successive "
             "windows | furthest window from the median |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        spread = "-" if r["spread_pct"] is None else f"{r['spread_pct']:.1f}%"
        lines.append(f"| {r['job']} | {r['windows']} | {r['steps_median']:g} | {r['seconds_median']:.2f} | "
                     f"{r['j_per_step_mean']:.3f} | {r['s_per_step_mean']:.4f} | {spread} | {r['worst_pct']:.1f}% |")
    same = before["power_limit_mw"] == after["power_limit_mw"]
    lines += ["", f"Read-only check: power limit {before['power_limit_mw']} mW before, {after['power_limit_mw']} mW "
              f"after ({'unchanged' if same else 'CHANGED'}); clock event reasons {before['clocks_event_reasons']:#x} "
              f"before, {after['clocks_event_reasons']:#x} after. Training took "
              + ", ".join(f"{s:.0f} s ({run})" for run, s in seconds.items()) + ".",
              "", f"The daemon logged the counter's update instants found {grids} times over {len(seconds)} jobs (its "
              "\"update instants are known\" line). ftgovd's CPU time while each job trained: "
              + ", ".join(f"{100 * cpu_s[run] / seconds[run]:.2f}% of a core ({run})" for run in seconds) + "."]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    (args.out / "run.json").write_text(json.dumps({"before": before, "after": after, "summary": table,
                                                   "train_s": seconds, "daemon_cpu_s": cpu_s,
                                                   "grids_found": grids, "steps": args.steps}, indent=2,
                                                  default=str) + "\n")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
