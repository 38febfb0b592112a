"""Recheck on a real NVIDIA GPU, read only: the client names its GPU without initializing CUDA, and the daemon cuts
a pause the job does not report out of its windows.

    python -m scripts.gpu_recheck --out OUT [--train-s 20] [--pause-s 4] [--stall-s 1.1]

One ftgovd (NVML backend, policy observe, tuner.window_rule time, a private socket and state dir:
scripts.observe_windows.observing_daemon) and three jobs, each a plain PyTorch loop in a process of its own through
the governor Job API (governor.job, seq_len given, job.step() each step), the first with CUDA_VISIBLE_DEVICES unset,
the second with it 0, the third with it the GPU's UUID:

1. The process imports torch and enters its job before the model is on the GPU. torch.cuda.is_initialized() must
   still be False after the job started (a torch built with CUDA: the job registers at its first step instead), and
   the job must register with the GPU the loop then trains on: the GPU the client named and the one the daemon's
   status shows for the job are nvidia-smi's UUID (NVML's, off a GPU).
2. The first job trains --train-s, sleeps --pause-s, trains, saves a checkpoint (model and optimizer, torch.save to
   a temp dir, repeated to --pause-s), trains again (with --stall-s: stalls that long inside one step, sleeps
   --pause-s, trains again), none of the pauses reported. The daemon's status (read by the
   job before it ends) must count them (the tuner's unreported_pauses), and the window that spans each pause must
   read about what its neighbours read: the summary gives each window's J/step, the pause's own energy from the
   counter, and what the spanning window would have read had the pause been spread over its steps.

Writes summary.md, run.json, windows.csv and ftgovd.log under OUT; exits 1 when a check fails or the power limit
changed. Against the fake NVML on the CPU (docs/observe-windows.md, "A dry run here"): --device cpu.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from scripts.observe_windows import WINDOW_LINE, gpu_readings, observing_daemon

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
PAUSE_LINE = re.compile(r"job (\d+) .*: ([0-9.]+) s between the ends of steps (\d+) and (\d+), whose steps take "
                        r"([0-9.]+) s: a pause it did not report")
PROBLEM_LINE = re.compile(r"Traceback|ERROR|CRITICAL")
NEAR_PCT = 5.0  # how far from its neighbours' median J/step a window spanning a cut pause may read


def child(args: argparse.Namespace) -> int:
    """One job, in a process of its own (the check needs a process whose torch has not initialized CUDA yet)."""
    import torch

    import governor
    from governor.backends.nvml import probe
    from governor.client import Connection

    out: dict = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "cuda_built": bool(torch.backends.cuda.is_built()), "pauses": []}
    dev = args.device
    # BERT-base's shape on a GPU (the CLI tour's loop); a small one for a dry run on the CPU
    hidden, layers, vocab, batch = (768, 12, 30522, 32) if dev == "cuda" else (64, 2, 1000, 8)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, hidden), torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(hidden, hidden // 64, 4 * hidden, batch_first=True), layers,
        enable_nested_tensor=False),
        torch.nn.Linear(hidden, vocab))
    with governor.job(model_type="encoder", num_layers=layers, hidden_size=hidden, seq_len=128, name=args.name,
                      socket=args.socket) as job:
        out["cuda_initialized_after_start"] = bool(torch.cuda.is_initialized())
        out["registered_after_start"] = job.registered
        model = model.to(dev)  # the first CUDA call: torch chooses the GPU here
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gpu = probe(read_only=True)[0]  # the pauses' own energy, from the counter (reads only)

        def train(seconds: float, steps: int | None = None) -> None:
            end_s, first = time.monotonic() + seconds, job.steps
            while time.monotonic() < end_s if steps is None else job.steps < first + steps:
                x = torch.randint(0, vocab, (batch, 128), device=dev)
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss.item()  # the step's end is its kernels' (a loop that logs its loss)
                job.step()
                if "gpu_sent" not in out and job.registered:
                    out["gpu_sent"] = job.gpu
                    out["registered_at_step"] = job.steps

        def pause(kind: str) -> None:
            t0, e0, steps = time.time(), gpu.energy_j(), job.steps
            if kind == "sleep":
                time.sleep(args.pause_s)
            elif kind == "stall":  # a host stall inside one step, then a sleep: two long gaps in a row, unalike
                time.sleep(args.stall_s)
                train(0.0, steps=1)
                time.sleep(args.pause_s)
                kind = f"a {args.stall_s:g} s stall in one step, then a sleep"
            else:  # a checkpoint save the loop does not report, repeated to the pause's length
                with tempfile.TemporaryDirectory(prefix="ftgov-recheck-ckpt-") as d:
                    saves = 0
                    while time.time() - t0 < args.pause_s:
                        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{d}/ckpt{saves}.pt")
                        saves += 1
                    kind = f"checkpoint ({saves} torch.save, {os.path.getsize(f'{d}/ckpt0.pt') / 1e9:.2f} GB each)"
            out["pauses"].append({"kind": kind, "start_s": t0, "end_s": time.time(), "at_step": steps,
                                  "energy_j": gpu.energy_j() - e0})

        train(args.train_s)
        if args.pauses:
            pause("sleep")
            train(args.train_s)
            pause("checkpoint")
            train(args.train_s)
            if args.stall_s:
                pause("stall")
                train(args.train_s)
        out["steps"] = job.steps
        with Connection(args.socket) as conn:
            status = conn.call("status")
        out["status_job"] = next((j for j in status["jobs"] if j["job_id"] == job.job_id), None)
        gid = out["status_job"] and out["status_job"]["gpu"]
        out["status_gpu_uuid"] = next((g.get("uuid") for g in status["gpus"] if g["id"] == gid), None)
        out["job_id"] = job.job_id
    out["result"] = job.result
    Path(args.result).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0


def expected_uuid() -> str | None:
    """nvidia-smi's UUID of the only GPU; NVML's where there is no nvidia-smi (the fake NVML)."""
    if shutil.which("nvidia-smi"):
        got = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.split()
        return got[0] if len(got) == 1 else None
    from governor.backends.nvml import probe

    gpus = probe(read_only=True)
    return gpus[0].uuid if len(gpus) == 1 else None


def log_windows(log_text: str) -> list[dict]:
    rows = []
    for line in log_text.splitlines():
        m, t = WINDOW_LINE.search(line), LOG_TIME.match(line)
        if m and t:
            rows.append({"job_id": int(m[1]), "job": m[2], "window": int(m[3]), "j_per_step": float(m[4]),
                         "s_per_step": float(m[5]), "steps": int(m[6]), "seconds": float(m[7]),
                         "closed_s": datetime.strptime(t[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()})
    return rows


def pause_windows(run: dict, windows: list[dict]) -> list[dict]:
    """For each pause, the window that spans it (the first to close after it) against its neighbours: the nearest
    windows before and after it that span no pause (the job's first, the loop's warm-up, left out). Neighbours, not
    the job's median: a job's speed moves over its run (a shared host's CPU, the GPU's own drift)."""
    ws = [w for w in windows if w["job_id"] == run["job_id"]]
    spanning = {p["kind"]: next((w for w in ws if w["closed_s"] > p["end_s"]), None) for p in run["pauses"]}
    spans = {w["window"] for w in spanning.values() if w is not None}
    plain = [w for w in ws[1:] if w["window"] not in spans]
    out = []
    for p in run["pauses"]:
        w = spanning[p["kind"]]
        # open across the pause: the window before it closed before the pause began (the window's seconds leave
        # the pause out, so its close less those seconds is no start)
        before = max((v["closed_s"] for v in ws if v["closed_s"] < p["start_s"]), default=None)
        row = {"pause": p["kind"], "pause_s": round(p["end_s"] - p["start_s"], 2),
               "window_opened_s_before_pause": None if before is None else round(p["start_s"] - before, 2),
               "pause_energy_j": round(p["energy_j"], 1), "window": None}
        if w is None:
            out.append(row)
            continue
        neighbours = ([v for v in plain if v["window"] < w["window"]][-1:]
                      + [v for v in plain if v["window"] > w["window"]][:1])
        if neighbours:
            near = statistics.fmean(v["j_per_step"] for v in neighbours)
            uncut = w["j_per_step"] + p["energy_j"] / w["steps"]  # had the pause's energy been spread over its steps
            row |= {"window": w["window"], "window_steps": w["steps"], "window_j_per_step": w["j_per_step"],
                    "neighbours": [v["window"] for v in neighbours], "neighbours_j_per_step": near,
                    "off_pct": 100 * (w["j_per_step"] / near - 1),
                    "uncut_j_per_step": uncut, "uncut_off_pct": 100 * (uncut / near - 1)}
        out.append(row)
    return out


def check_gpu(run: dict, uuid: str | None) -> list[str]:
    """What check 1 found wrong with one job (none: it passed)."""
    bad = []
    if run["cuda_initialized_after_start"]:
        bad.append("the job's start initialized CUDA")
    if run["cuda_built"] and run["registered_after_start"]:
        bad.append("the job registered before CUDA chose its GPU")
    if uuid is not None and run["cuda_built"] and run.get("gpu_sent") != uuid:
        bad.append(f"the client named {run.get('gpu_sent')!r}, not {uuid}")
    if run["status_gpu_uuid"] != uuid:
        bad.append(f"the daemon's status shows {run['status_gpu_uuid']!r}, not {uuid}")
    return bad


def summary(runs: dict, uuid, pauses: list[dict], before: dict, after: dict, problems: list[str],
            pause_lines: int) -> tuple[list[str], bool]:
    ok = True
    lines = [f"# Client GPU naming and unreported pauses on {before['name']} (read only)", "",
             "ftgovd on the NVML backend, policy observe, tuner.window_rule time; each job a plain PyTorch loop "
             f"(TransformerEncoder, BERT-base's shape, batch 32 x 128; on the CPU a small one) through governor.job, "
             f"seq_len given. Expected GPU: {uuid}.", "",
             "## 1. The job names its GPU without initializing CUDA", "",
             "| CUDA_VISIBLE_DEVICES | torch built with CUDA | CUDA initialized after the job started | registered "
             "after the job started | registered at step | GPU the client named | GPU in the daemon's status | "
             "verdict |", "|---|---|---|---|---:|---|---|---|"]
    for label, run in runs.items():
        bad = check_gpu(run, uuid)
        ok = ok and not bad
        lines.append(f"| {label} | {run['cuda_built']} | {run['cuda_initialized_after_start']} | "
                     f"{run['registered_after_start']} | {run.get('registered_at_step', '-')} | "
                     f"{run.get('gpu_sent')} | {run['status_gpu_uuid']} | {'; '.join(bad) or 'pass'} |")
    tuner = (runs["unset"]["status_job"] or {}).get("tuner") or {}
    counted = tuner.get("unreported_pauses")
    lines += ["", "## 2. Pauses the job did not report", "",
              f"The daemon's status before the job ended: unreported_pauses = {counted} ({len(pauses)} pauses made; "
              f"the log's pause lines: {pause_lines}, the first at info, the rest at debug). The window that spans "
              "each pause (the first to close after it) against its neighbours (the nearest windows before and after "
              "it that span no pause, the job's first left out), and what it would have read had the pause's energy "
              "been spread over its steps:", "",
              "| pause | s | J drawn | window | open from s before it | its steps | J/step | neighbours | their J/step "
              "| off | uncut J/step | uncut off |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    if not counted or counted < 1:
        ok = False
    for p in pauses:
        if "off_pct" not in p:
            lines.append(f"| {p['pause']} | {p['pause_s']} | {p['pause_energy_j']} | none | | | | | | | | |")
            ok = False
            continue
        ok = ok and abs(p["off_pct"]) <= NEAR_PCT
        lines.append(f"| {p['pause']} | {p['pause_s']} | {p['pause_energy_j']} | {p['window']} | "
                     f"{p['window_opened_s_before_pause']} | {p['window_steps']} | {p['window_j_per_step']:.3f} | "
                     f"{', '.join(map(str, p['neighbours']))} | {p['neighbours_j_per_step']:.3f} | "
                     f"{p['off_pct']:+.1f}% | {p['uncut_j_per_step']:.3f} | {p['uncut_off_pct']:+.1f}% |")
    same = before["power_limit_mw"] == after["power_limit_mw"]
    ok = ok and same and not problems
    lines += ["", f"Pass: each window spanning a pause within {NEAR_PCT:g}% of its neighbours, and "
              "unreported_pauses >= 1.", "",
              f"ftgovd's log: {len(problems)} lines matching {PROBLEM_LINE.pattern!r}"
              + (":" if problems else ".")] + [f"    {p}" for p in problems[:20]]
    lines += ["", f"Read-only check: power limit {before['power_limit_mw']} mW before, {after['power_limit_mw']} mW "
              f"after ({'unchanged' if same else 'CHANGED'}); clock event reasons {before['clocks_event_reasons']:#x} "
              f"before, {after['clocks_event_reasons']:#x} after.", "", f"Overall: {'PASS' if ok else 'FAIL'}."]
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default="cuda", help="cpu for a dry run against the fake NVML")
    p.add_argument("--train-s", type=float, default=20.0, help="seconds of training before, between and after pauses")
    p.add_argument("--pause-s", type=float, default=4.0, help="each unreported pause's length")
    p.add_argument("--stall-s", type=float, default=0.0, help="a third pause: a host stall this long inside one "
                   "step, then a sleep of --pause-s (0: none)")
    # The child's own (one job): the script runs itself with these.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--name", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--pauses", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.out is None:
        p.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    before = gpu_readings()
    uuid = expected_uuid()
    log_path = args.out / "ftgovd.log"
    daemon = observing_daemon(log_path)
    runs = {}
    try:
        # the GPU named by its UUID too, as Slurm 25.11 is reported to set it (docs/slurm.md)
        runs_by = (("unset", None, True), ("0", "0", False)) + ((("uuid", uuid, False),) if uuid else ())
        for label, visible, pauses in runs_by:
            env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            result = args.out / f"job-cvd-{label}.json"
            cmd = [sys.executable, "-m", "scripts.gpu_recheck", "--child", "--socket", daemon.socket, "--name",
                   f"recheck-cvd-{label}", "--result", str(result), "--device", args.device,
                   "--train-s", str(args.train_s if pauses else min(args.train_s, 5.0)),
                   "--pause-s", str(args.pause_s), "--stall-s", str(args.stall_s)] + (["--pauses"] if pauses else [])
            subprocess.run(cmd, env=env, check=True, timeout=60 + 5 * (args.train_s + 4 * args.pause_s))
            runs[label] = json.loads(result.read_text())
    finally:
        daemon.stop()
    after = gpu_readings()
    log_text = log_path.read_text()
    windows = log_windows(log_text)
    with open(args.out / "windows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(windows[0]) if windows else ["job"])
        w.writeheader()
        w.writerows(windows)
    pauses = pause_windows(runs["unset"], windows)
    problems = [line for line in log_text.splitlines() if PROBLEM_LINE.search(line)]
    lines, ok = summary(runs, uuid, pauses, before, after, problems, len(PAUSE_LINE.findall(log_text)))
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    (args.out / "run.json").write_text(json.dumps({"before": before, "after": after, "expected_uuid": uuid,
                                                   "jobs": runs, "pauses": pauses, "ok": ok}, indent=2,
                                                  default=str) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
