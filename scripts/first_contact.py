#!/usr/bin/env python3
"""First contact on a real NVIDIA GPU, READ ONLY: is a job's gpu_util the load of its running training loop?

The tree's gpu_util feature is the GPU load of the fine-tuning loop at the default governor. This script starts
ftgovd with the NVML backend in the ``observe`` policy (NVML opened through a handle that refuses every Set/Reset
call; nothing is pinned) and the paper's tree (whose root tests gpu_util, so the daemon must measure it), then runs:

1. a Hugging Face Trainer (BERT-base built from its config, random weights, synthetic tokens) with
   ``GovernorCallback()`` and no gpu_util given;
2. an unmodified PyTorch training script under ``ftgov run`` (it sends no progress reports).

For each, it records what the daemon measured (the job's ``features.gpu_util`` in status, and the reason) beside the
load that NVML reads directly while the loop trains. Writes summary.md, run.json and ftgovd.log under --out.

    python3 -m scripts.first_contact --out OUT [--steps 400] [--run-seconds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from governor.client import Connection
from governor.sim.launch import Daemon

REPO = Path(__file__).resolve().parent.parent
# The checkout first, then the caller's PYTHONPATH: it may carry the dependencies (a machine with no installs) or a
# pynvml stand-in (tests/support/fakenvml).
PYTHONPATH = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

CHILD = """
import sys, time, torch
from transformers import BertConfig, BertForMaskedLM
torch.manual_seed(0)
model = BertForMaskedLM(BertConfig()).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
time.sleep(3.0)  # a script's own set-up (data loading, say) before its first step
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    ids = torch.randint(0, 30000, (32, 128), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
"""


class LoadSampler(threading.Thread):
    """NVML's utilization read directly every 100 ms, with the time of each reading."""

    def __init__(self, index: int = 0):
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.samples.append((time.monotonic(), self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))

    def mean(self, start: float, end: float) -> float | None:
        values = [u for t, u in self.samples if start <= t <= end]
        return round(sum(values) / len(values), 1) if values else None


class StatusWatch(threading.Thread):
    """The daemon's status every 0.5 s: the last entry seen for each job name."""

    def __init__(self, socket: str):
        super().__init__(daemon=True)
        self.socket = socket
        self.last: dict[str, dict] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with Connection(self.socket) as conn:
            while not self.stop.wait(0.5):
                for job in conn.call("status")["jobs"]:
                    self.last[job["name"]] = job


def token_dataset(samples: int, seq_len: int = 128, vocab: int = 30000):
    """Synthetic masked-LM samples (random tokens, seeded by index, no padding): a Trainer's data without a download."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return samples

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (seq_len,), generator=g)
            return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones(seq_len, dtype=torch.long)}

    return Tokens()


def hf_job(socket: str, steps: int, marks: dict) -> None:
    import torch
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainerCallback, TrainingArguments

    from governor.hf import GovernorCallback

    class Marks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            marks["hf_begin"] = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                marks["hf_first_step"] = time.monotonic()

        def on_train_end(self, args, state, control, **kwargs):
            marks["hf_end"] = time.monotonic()

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig())
    args = TrainingArguments(output_dir="/tmp/first-contact-hf", max_steps=steps, per_device_train_batch_size=32,
                             report_to=[], save_strategy="no", logging_steps=100, dataloader_num_workers=2)
    trainer = Trainer(model=model, args=args, train_dataset=token_dataset(32 * steps),
                      callbacks=[GovernorCallback(name="hf-bert", socket=socket), Marks()])
    trainer.train()


def run_job(socket: str, seconds: float, marks: dict) -> subprocess.CompletedProcess:
    marks["run_begin"] = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "governor.cli", "run", "--socket", socket, "--name", "ftgov-run",
                          "--model-type", "encoder", "--num-layers", "12", "--hidden-size", "768", "--seq-len", "128",
                          "-v", "--", sys.executable, "-c", CHILD, str(seconds)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": PYTHONPATH})
    marks["run_end"] = time.monotonic()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=400, help="Trainer steps")
    p.add_argument("--run-seconds", type=float, default=40.0, help="how long the `ftgov run` child trains")
    p.add_argument("--settle-s", type=float, default=10.0, help="util_settle_s for the job without progress")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {"backend": "nvml", "policy": "observe", "util_sample_s": 2.0, "util_settle_s": args.settle_s,
              "sample_interval_s": 1.0}
    daemon = Daemon(None, config=config, log_level="info", log_path=out / "ftgovd.log",
                    env={"PYTHONPATH": PYTHONPATH}).start(timeout_s=60)
    sampler, watch, marks = LoadSampler(), StatusWatch(daemon.socket), {}
    sampler.start()
    watch.start()
    try:
        hf_job(daemon.socket, args.steps, marks)
        ran = run_job(daemon.socket, args.run_seconds, marks)
    finally:
        watch.stop.set()
        sampler.stop.set()
        watch.join(5)
        daemon.close()
    hf, run = watch.last.get("hf-bert", {}), watch.last.get("ftgov-run", {})
    rows = [
        ("HF Trainer + GovernorCallback()", hf, sampler.mean(marks["hf_first_step"], marks["hf_end"]),
         sampler.mean(marks["hf_begin"], marks["hf_first_step"])),
        ("ftgov run (no progress reports)", run, sampler.mean(marks["run_begin"] + 3 + args.settle_s, marks["run_end"]),
         sampler.mean(marks["run_begin"], marks["run_begin"] + 3)),
    ]
    lines = ["# First contact: gpu_util measured while the job trains (NVML, observe policy, read only)", "",
             "| job | daemon's gpu_util | NVML load while it trains | NVML load during its set-up | reason |",
             "|---|---:|---:|---:|---|"]
    for name, job, training, setup in rows:
        util = (job.get("features") or {}).get("gpu_util")
        lines.append(f"| {name} | {util} | {training} | {setup} | {job.get('reason')} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "run.json").write_text(json.dumps({"hf_job": hf, "run_job": run, "run_stdout": ran.stdout,
                                              "run_stderr": ran.stderr[-4000:], "run_rc": ran.returncode,
                                              "marks": marks}, indent=2, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
