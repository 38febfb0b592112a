"""`make demo`: ftgovd governing a simulated Jetson AGX Orin while a (simulated) fine-tuning job runs.

Starts the real daemon with --simulate, registers a BERT-base job through the client library exactly as a training
script would, shows the devfreq files holding the pin and what the daemon reports, ends the job, and shows the
baseline back with the energy the daemon measured from the simulated INA3221 rails. It also compares, from the
energy model, what the same steps would have cost under MAXN (the default, load-following governor).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from governor.sim.launch import Daemon, scaled
from governor.units import mhz

DEVFREQ = "sys/class/devfreq/17000000.gpu"
TIME_SCALE = 0.15  # the tuned job's simulated steps run at this fraction of the energy model's time
TUNED_STEPS = 300
JOB = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0}  # BERT-base on MNLI
STEPS = 40
STEP_S = 0.05  # a simulated step's wall time in the demo (the energy model's real step is longer)


def command_path(name: str) -> str:
    """How to start one of ftgov's commands from here: its name when PATH finds this environment's, else its path
    beside this interpreter (.venv/bin/ftgovd after `make demo`), relative when under the working directory."""
    beside = Path(sys.executable).parent / name
    if not beside.is_file():
        return name
    found = shutil.which(name)
    if found and Path(found).resolve() == beside.resolve():
        return name
    relative = os.path.relpath(beside)
    return relative if not relative.startswith("..") else str(beside)


def say(text: str = "") -> None:
    print(text, flush=True)


def files(root: Path) -> str:
    node = root / DEVFREQ
    read = lambda name: int((node / name).read_text())  # noqa: E731
    return (f"min_freq={mhz(read('min_freq'))}  max_freq={mhz(read('max_freq'))}  "
            f"cur_freq={mhz(read('cur_freq'))}")


def settled(root: Path, cur_hz: int, timeout_s: float = 10.0) -> None:
    """Wait until the board shows the clock (it reacts to the pin a moment after the daemon writes it)."""
    from governor.sim.inotify import IN_MOVED_TO, Inotify

    node = root / DEVFREQ
    watcher = Inotify()
    try:
        watcher.watch(node.resolve(), IN_MOVED_TO)
        deadline = time.monotonic() + timeout_s
        while int((node / "cur_freq").read_text()) != cur_hz:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([watcher.fd], [], [], left)[0]:
                return  # show what the files hold, late or not
            watcher.read()
    finally:
        watcher.close()


def main() -> int:
    from governor import client
    from governor.sim import job as simjob
    from governor.sim.energy import OrinEnergyModel, workload_from_features
    from governor.sysfs import Root

    w = workload_from_features(JOB, "bert-base/mnli")

    work = Path(tempfile.mkdtemp(prefix="ftgov-demo-", dir="/tmp"))
    # Every default but the GPU's re-pin interval, scaled as the tuned job's steps are (they run at 0.15x wall time).
    daemon = Daemon(None, workdir=work, simulate=True, config=scaled(TIME_SCALE), test_config=False, state_dir=work,
                    log_level="info", notify_name="notify.sock")
    sock = daemon.socket
    log_path = daemon.log_path
    say("== 1. Start ftgovd on a simulated Jetson AGX Orin")
    say("   $ " + " ".join([command_path("ftgovd")] + daemon.command()[3:]))
    try:
        daemon.start(timeout_s=30)
        root = work / "sim-orin"
        say(f"   ready; simulated sysfs tree at {root}")
        say(f"   baseline: {files(root)}")

        say("\n== 2. A fine-tuning job registers (BERT-base, 12 layers, hidden 768, ~40 tokens/sample)")
        with client.job(name="bert-base/mnli", socket=sock, report_every_s=0, **JOB) as job:
            reg = job.registration
            say(f"   daemon chose {mhz(reg['freq_hz'])} with policy {reg['policy']}")
            say(f"   why: {reg['reason']}")
            settled(root, reg["freq_hz"])
            say(f"   pinned: {files(root)}")
            with simjob.announce(Root(root), w) as on_board:  # the board shows the load while steps run
                on_board.stepping(True)
                for _ in range(STEPS):
                    time.sleep(STEP_S)  # the "training step" of this demo
                    job.step()
                with client.Connection(sock) as conn:
                    st = conn.call("status")
            j = st["jobs"][0]
            power = st["power_mw"] or {}
            say(f"   status after {j['steps']} steps: job {j['job_id']} '{j['name']}' at {mhz(j['freq_hz'])}, "
                f"GPU load {st['gpus'][0]['load_pct']:.1f}%, energy so far {j['energy_j']:.2f} J")
            say("   rails: " + ", ".join(f"{k} {v / 1000:.2f} W" for k, v in sorted(power.items())))
        res = job.result
        say("\n== 3. The job ends; the daemon restores the baseline")
        say(f"   job ran {res['duration_s']:.2f} s, {res['steps']} steps, measured energy {res['energy_j']:.2f} J "
            f"(VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0)")
        settled(root, int((root / DEVFREQ / "min_freq").read_text()))
        say(f"   restored: {files(root)}")

        say("\n== 4. What the pin saves (energy model, per training step of this workload)")
        model = OrinEnergyModel()
        maxn = model.expected(w, None)
        pinned = model.expected(w, reg["freq_hz"])
        say(f"   MAXN (load-following default governor): {maxn.energy_j:.3f} J/step, {maxn.time_s * 1e3:.0f} ms/step")
        say(f"   pinned at {mhz(reg['freq_hz'])}:                  {pinned.energy_j:.3f} J/step, "
            f"{pinned.time_s * 1e3:.0f} ms/step")
        say(f"   energy saved: {100 * (1 - pinned.energy_j / maxn.energy_j):.1f}%  "
            f"(time {100 * (pinned.time_s / maxn.time_s - 1):+.1f}%)")

        say("\n== 5. The online tuner (policy tune): measure energy per step from the rails, find the minimum")
        # The job says how long it runs: the tuner's exploration budget is a share of the job's energy.
        with client.job(name="bert-base/mnli (tuned)", socket=sock, tune=True, report_every_s=0,
                        total_steps=TUNED_STEPS, **JOB) as tjob:
            say(f"   starts at MLG's pick, {mhz(tjob.registration['freq_hz'])}; each step runs in {TIME_SCALE:g}x "
                f"the energy model's time at the pinned clock, the board drawing 1/{TIME_SCALE:g} of its power: the "
                "step's energy is the model's")
            simjob.run(Root(root), tjob, w, TUNED_STEPS, time_scale=TIME_SCALE)
            with client.Connection(sock) as conn:
                t = conn.call("status")["jobs"][0]
        for e in t["tuner"]["estimates"]:
            say(f"   measured {e['freq_hz'] / 1e6:6g} MHz: {e['joules_per_step']:.3f} J/step over "
                f"{e['windows']} window(s) (the model: {model.expected(w, e['freq_hz']).energy_j:.3f})")
        oracle = min(model.levels_hz, key=lambda hz: model.expected(w, hz).energy_j)
        level = mhz(t["freq_hz"])
        say(f"   {t['reason']}{'' if level in t['reason'] else ': ' + level} (the model's true minimum: {mhz(oracle)})")
        if tjob.result and tjob.result.get("saved_pct") is not None:
            say(f"   measured: saved {tjob.result['saved_pct']:g}% energy per step vs the default governor, over "
                f"{tjob.result['saved_measured_steps']} steps (the model says "
                f"{100 * (1 - model.expected(w, t['freq_hz']).energy_j / maxn.energy_j):.1f}%)")
    finally:
        returncode = daemon.stop(signal.SIGTERM, timeout_s=15)
        daemon.close()
    say("\n== 6. The daemon's log (what `journalctl -u ftgovd` shows on a Jetson)")
    for line in log_path.read_text().splitlines():
        if " INFO " in line or " WARNING " in line or " ERROR " in line:
            say("   " + line.split(" ftgovd ", 1)[-1])
    shutil.rmtree(work, ignore_errors=True)
    ftgovd = command_path("ftgovd")
    say(f"\nDone. Try it yourself: {ftgovd} --simulate &, then eval \"$({ftgovd} --simulate --print-env)\" "
        f"(FTGOV_SOCKET and FTGOV_SIM_TREE) and {command_path('ftgov')} status (README: Try it without a Jetson)")
    return 0 if returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
