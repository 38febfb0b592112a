"""The state file's one schema: the classes the daemon uses are the ones a file is validated as, and the bytes written
for a state do not depend on how the schema is declared."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel

from governor.backends.base import Limits
from governor.errors import StateError
from governor.store import state as state_module
from governor.store.state import GpuState, HeldJob, SchedulerHold, State, StateFile

FEATURES = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 40.0, "gpu_util": 60.0}
# What StateFile.write wrote for STATE below when the schema was declared twice (dataclasses and pydantic mirrors).
WRITTEN = (
    b'{"boot_id":"b00t","format":"ftgov-state/1","gpus":{"0":{"baseline":{"extra":{"power_cap_mw":15000},'
    b'"max_hz":1300500000,"min_hz":306000000},"describe":{"name":"gpu"},"pinned_hz":714000000}},'
    b'"jobs":[{"energy_j":12.5,"features":{"gpu_util":60.0,"hidden_size":768,"model_type":"encoder",'
    b'"num_layers":12,"seq_len":40.0},"freq_hz":714000000,"gpu":"0","job_id":3,"name":"bert","pid":4242,'
    b'"policy":"mlg","start_ticks":99,"started_at":1700000000.0,"uid":1000}],"next_job_id":4}'
)


def _state() -> State:
    gpu = GpuState(describe={"name": "gpu"}, baseline=Limits(306000000, 1300500000, (("power_cap_mw", 15000),)),
                   pinned_hz=714000000)
    job = HeldJob(job_id=3, pid=4242, start_ticks=99, gpu="0", name="bert", uid=1000, features=dict(FEATURES),
                  freq_hz=714000000, policy="mlg", started_at=1700000000.0, energy_j=12.5)
    return State("b00t", {"0": gpu}, [job], 4)


def test_the_state_file_is_byte_identical_and_reads_back_as_the_same_state(tmp_path):
    StateFile(tmp_path).write(_state())
    assert (tmp_path / "state.json").read_bytes() == WRITTEN
    assert StateFile(tmp_path).read("b00t") == _state()


def test_the_daemons_classes_are_the_schema():
    mirrors = [v for v in vars(state_module).values()
               if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == state_module.__name__]
    assert mirrors == []
    read = State.from_json(WRITTEN)
    assert type(read.gpus["0"]) is GpuState and type(read.gpus["0"].baseline) is Limits
    assert type(read.jobs[0]) is HeldJob


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.pop("format"), "format"),
    (lambda d: d.update(format="ftgov-state/2"), "format"),
    (lambda d: d["gpus"]["0"]["baseline"].update(min_hz=0), "gpus.0.baseline.min_hz"),
    (lambda d: d["gpus"]["0"]["baseline"].update(extra=[["power_cap_mw", 1]]), "gpus.0.baseline.extra"),
    (lambda d: d["gpus"]["0"]["baseline"]["extra"].update(power_cap_mw=True), "gpus.0.baseline.extra"),
    (lambda d: d["jobs"][0].update(pid="4242"), "jobs.0.pid"),
    (lambda d: d["jobs"][0].update(surprise=1), "jobs.0.surprise"),
    (lambda d: d["jobs"][0]["features"].update(num_layers=-1), "jobs.0.features"),
])
def test_a_file_off_the_schema_is_an_error_naming_the_field(change, where):
    d = json.loads(WRITTEN)
    change(d)
    with pytest.raises(StateError, match=re.escape(where)):
        State.from_json(json.dumps(d).encode())


# A scheduler hold's keys as the daemon before heterogeneous jobs wrote and read them (extra="forbid": it sets aside a
# whole file with any other key, the GPUs' baselines and the registered jobs with it).
HOLD_KEYS_BEFORE_HET = {"slurm_job_id", "uid", "partition", "policy", "freq_hz", "energy_j", "joined", "started_at"}


def test_a_hold_of_no_heterogeneous_job_is_written_as_an_older_daemon_reads_it(tmp_path):
    """het_job_id (a heterogeneous component's leader) was written as null for every hold, and the previous ftgovd
    (a rolled-back package, restarted on the kept /run/ftgov) set the whole file aside at its unknown key: the jobs'
    holds and registrations were lost. Absent where None, as a job's group fields are; a component's is kept."""
    plain = SchedulerHold(slurm_job_id=5, uid=1000, policy="ffg", freq_hz={"0": 714000000}, started_at=1.0)
    component = SchedulerHold(slurm_job_id=7, het_job_id=6, uid=1000, policy="ffg", freq_hz={"0": None},
                              started_at=1.0)
    state = State("b00t", holds=[plain, component])
    StateFile(tmp_path).write(state)
    written = json.loads((tmp_path / "state.json").read_bytes())["holds"]
    assert set(written[0]) == HOLD_KEYS_BEFORE_HET, written[0]
    assert written[1]["het_job_id"] == 6
    assert StateFile(tmp_path).read("b00t") == state
