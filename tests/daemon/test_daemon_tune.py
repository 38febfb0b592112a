"""The `tune` policy in the real daemon: a simulated job whose steps take as long as the energy model says at the
pinned clock, the rails following the pin, and the tuner converging on the least energy per step."""

from governor.sim import job as simjob
from governor.sim.energy import OrinEnergyModel, Workload
from governor.sysfs import Root
from tests.support.daemon import FEATURES

BERT_BASE = {k: v for k, v in FEATURES.items() if k != "gpu_util"}


class ProgressJob:
    """What a client library's job does per step, on the raw protocol: report the total steps."""

    def __init__(self, rpc, job_id):
        self.rpc, self.job_id, self.steps = rpc, job_id, 0

    def step(self):
        self.steps += 1
        self.rpc.notify("progress", job_id=self.job_id, steps=self.steps)


def test_tune_converges_within_thirty_profiled_steps_on_the_least_energy_level(orin, start_daemon):
    d = start_daemon(simulate=True)
    root = Root(d.state_dir / "sim-orin")
    c = d.client()
    res = c.call("register", tune=True, gpu_util=80.0, **BERT_BASE)
    assert res["policy"] == "tune"
    workload = Workload(name="bert-base", **BERT_BASE)
    simjob.run(root, ProgressJob(c, res["job_id"]), workload, 45, time_scale=0.15)
    job = c.call("status")["jobs"][0]
    tuner = job["tuner"]
    assert tuner["converged"], tuner
    assert tuner["profiled_steps"] <= 30
    model = OrinEnergyModel()
    energy = {hz: model.expected(workload, hz).energy_j for hz in model.levels_hz}
    oracle = min(energy, key=energy.get)
    assert energy[job["freq_hz"]] <= energy[oracle] * 1.03, (job["freq_hz"], oracle, tuner)
    assert "tune probe" in d.log() and "converged" in job["reason"]


def test_tune_without_progress_keeps_the_mlg_pick(orin, start_daemon):
    d = start_daemon(config={"policy": "tune"})
    c = d.client()
    res = c.call("register", **FEATURES)
    assert res["policy"] == "tune" and res["freq_hz"] == 714000000  # the paper tree's pick, the tuner's start
    tuner = c.call("status")["jobs"][0]["tuner"]
    assert tuner["probes"] == 0 and "without them the job keeps" in tuner["status"]
