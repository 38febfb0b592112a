"""Record what a real NVIDIA GPU's meters report during fine-tuning, read only: the energy counter at every step's end,
and the counter, the power reading and the SM clock polled by a thread, at the default clocks.

    python -m scripts.record_meter --out OUT [--steps 2000] [--warmup 20] [--sizes small base large]

For each size a BERT-style masked LM (or, for the ``gpt-`` sizes, a GPT-2-style causal LM) built from a config (random
weights, synthetic tokens, bf16 autocast, AdamW) trains on GPU 0 as the traces of benchmarks/data/h200-meter were
recorded (the same three shapes), for ``--steps`` steps after ``--warmup``. Writes, per size, OUT/NAME-steps.csv
(``step, t_s, energy_counter_mj``: read right after torch.cuda.synchronize() at each step's end) and
OUT/NAME-samples.csv (``t_s, energy_counter_mj, power_mw, sm_clock_mhz, mem_clock_mhz, gpu_util_pct``;
benchmarks/data/h200-meter-2000 was recorded before the last two columns), one perf_counter origin for all files, and
OUT/run.json (the GPU, its power limit and clock event reasons before and after: nothing is set, so they must match; the
host's load average after each run). The clocks and the GPU's utilization show what moves the steps: the default
governor's clock, or the GPU waiting.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import threading
import time
from pathlib import Path

SIZES = {  # architecture, layers, hidden, heads, sequence, batch: benchmarks/data/h200-meter/README.md's table
    "small": ("bert", 6, 512, 8, 64, 16),
    "base": ("bert", 12, 768, 12, 128, 32),
    "large": ("bert", 24, 1024, 16, 128, 32),
    # The large shape on 4x the tokens a step: enough work a step that the GPU, not the host, sets the pace.
    "gpubound": ("bert", 24, 1024, 16, 512, 32),
    # Causal LMs, GPT-2's small (124 M) and medium (355 M) shapes, on long sequences (benchmarks/data/h200-meter-gpt).
    "gpt-small": ("gpt2", 12, 768, 12, 512, 8),
    "gpt-medium": ("gpt2", 24, 1024, 16, 1024, 8),
}
DEFAULT_SIZES = ("small", "base", "large", "gpubound")


def gpu_state(pynvml, handle) -> dict:
    return {"name": pynvml.nvmlDeviceGetName(handle),
            "power_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(handle),
            "clocks_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
            "persistence": pynvml.nvmlDeviceGetPersistenceMode(handle)}


class Poller(threading.Thread):
    """Reads the counter, the power and the SM clock as fast as every ``poll_s``, until stopped."""

    def __init__(self, pynvml, handle, origin: float, poll_s: float):
        super().__init__(daemon=True)
        self.nv, self.handle, self.origin, self.poll_s = pynvml, handle, origin, poll_s
        self.rows: list[tuple[float, int, int, int, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        nv, h = self.nv, self.handle
        while not self.stop.is_set():
            t = time.perf_counter() - self.origin
            self.rows.append((t, nv.nvmlDeviceGetTotalEnergyConsumption(h), nv.nvmlDeviceGetPowerUsage(h),
                              nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                              nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                              nv.nvmlDeviceGetUtilizationRates(h).gpu))
            self.stop.wait(self.poll_s)


def record(size: str, steps: int, warmup: int, out: Path, pynvml, handle, origin: float, poll_s: float) -> dict:
    import torch

    arch, layers, hidden, heads, seq, batch = SIZES[size]
    name = f"{arch}-{size.removeprefix('gpt-')}-L{layers}H{hidden}"
    if arch == "bert":
        from transformers import BertConfig, BertForMaskedLM

        config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                            intermediate_size=4 * hidden)
        model = BertForMaskedLM(config).cuda()
    else:  # the labels are the inputs: the model shifts them for next-token prediction
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=max(1024, seq))
        model = GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
    labels = ids.clone()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    poller = Poller(pynvml, handle, origin, poll_s)
    poller.start()
    reports = []
    for k in range(steps + 1):
        if k:
            step()
        reports.append((k, time.perf_counter() - origin, pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)))
    poller.stop.set()
    poller.join()
    with open(out / f"{name}-steps.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "t_s", "energy_counter_mj"])
        w.writerows((k, f"{t:.6f}", e) for k, t, e in reports)
    with open(out / f"{name}-samples.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "energy_counter_mj", "power_mw", "sm_clock_mhz", "mem_clock_mhz", "gpu_util_pct"])
        w.writerows((f"{t:.6f}", *rest) for t, *rest in poller.rows)
    spans = [b[1] - a[1] for a, b in zip(reports, reports[1:], strict=False)]
    return {"name": name, "steps": steps, "samples": len(poller.rows), "host_loadavg": os.getloadavg(),
            "host_cpus": os.cpu_count(),
            "median_step_s": sorted(spans)[len(spans) // 2], "seconds": reports[-1][1] - reports[0][1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), choices=list(SIZES))
    p.add_argument("--poll-s", type=float, default=0.005)
    args = p.parse_args()
    import pynvml

    args.out.mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        run = {"before": gpu_state(pynvml, handle), "runs": []}
        origin = time.perf_counter()
        for size in args.sizes:
            run["runs"].append(record(size, args.steps, args.warmup, args.out, pynvml, handle, origin, args.poll_s))
            print(json.dumps(run["runs"][-1]), flush=True)
        run["after"] = gpu_state(pynvml, handle)
    finally:
        pynvml.nvmlShutdown()
    (args.out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    print(json.dumps({k: run[k] for k in ("before", "after")}))


if __name__ == "__main__":
    main()
