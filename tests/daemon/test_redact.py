"""Least disclosure: a member sees others' jobs without name, pid or features; metrics carry job names only when
asked; the state file is 0600 (test_state_file), the measurement store 0600 whatever the umask."""

from __future__ import annotations

import json
import os
import stat

import pytest

from governor.cli.metrics import families
from governor.daemon.redact import status_for
from tests.support.daemon import FEATURES
from tests.support.security import open_to_members, run_as

_REGISTER_THEN_STATUS = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile()
def call(i, method, **params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
    return json.loads(f.readline())
call(1, "register", name="member-model", **json.loads(sys.argv[2]))
print(json.dumps(call(2, "status")), flush=True)
"""


def test_a_member_sees_others_jobs_redacted_and_its_own_in_full(orin, start_daemon, member):
    user, uid = member
    d = start_daemon()
    open_to_members(d)
    root_client = d.client()
    root_client.call("register", name="/root/secret-model-path", **FEATURES)
    proc = run_as(user, _REGISTER_THEN_STATUS, d.socket, json.dumps(FEATURES))
    out, err = proc.communicate(timeout=30)
    status = json.loads(out)["result"]
    by_name = {j.get("name"): j for j in status["jobs"]}
    mine = by_name["member-model"]
    assert mine["uid"] == uid and mine["pid"] and mine["features"]["num_layers"] == 12
    (other,) = [j for j in status["jobs"] if j is not mine]
    assert other["redacted"] and other["freq_hz"] == 714000000 and other["gpu"] == "0"
    for hidden in ("name", "pid", "features", "uid", "reason"):
        assert hidden not in other, other
    assert "secret-model-path" not in out
    full = root_client.call("status")  # root sees everything (the member's job ended with its connection)
    assert [j["name"] for j in full["jobs"]] == ["/root/secret-model-path"] and full["jobs"][0]["features"]


def test_redaction_keeps_the_callers_own_jobs():
    status = {"jobs": [{"job_id": 1, "uid": 1000, "name": "a", "pid": 5, "freq_hz": 1, "gpu": "0"},
                       {"job_id": 2, "uid": 1001, "name": "b", "pid": 6, "freq_hz": 2, "gpu": "0"}]}
    seen = status_for(status, 1000)
    assert seen["jobs"][0] == status["jobs"][0]
    assert seen["jobs"][1]["redacted"] and "name" not in seen["jobs"][1] and seen["jobs"][1]["freq_hz"] == 2
    assert status["jobs"][1]["name"] == "b", "the daemon's own status is untouched"


def test_metrics_carry_job_names_only_when_asked():
    status = {"jobs": [{"job_id": 1, "name": "/home/alice/models/secret", "gpu": "0", "freq_hz": 1, "steps": 3}]}
    default = [labels for fam in families(status) for labels, _ in fam.samples]
    assert default and not any("job_name" in labels for labels in default)
    opted = [labels for fam in families(status, job_names=True) for labels, _ in fam.samples]
    assert {"job_name": "/home/alice/models/secret"}.items() <= next(lbl for lbl in opted if "job_id" in lbl).items()


def _modes(path) -> dict[str, int]:
    return {suffix: stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode) for suffix in ("", "-wal", "-shm")}


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
def test_the_measurement_store_is_private_whatever_the_umask(orin, start_daemon, tmp_path, umask):
    """A daemon started by hand (or --simulate) with a store: the store holds the job names status redacts."""
    path = tmp_path / "store" / "measurements.sqlite"
    old = os.umask(umask)  # the daemon inherits it
    try:
        d = start_daemon(config={"store": {"path": str(path)}})
    finally:
        os.umask(old)
    c = d.client()
    c.call("unregister", job_id=c.call("register", name="secret", **FEATURES)["job_id"])
    assert _modes(path) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}  # WAL mode: -wal and -shm open with the db


def test_a_store_left_readable_by_others_is_narrowed(orin, start_daemon, tmp_path):
    path = tmp_path / "measurements.sqlite"
    d = start_daemon(config={"store": {"path": str(path)}})
    d.stop()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.chmod(f"{path}{suffix}", 0o666)
    start_daemon(config={"store": {"path": str(path)}})
    assert set(_modes(path).values()) == {0o640}  # group-readable at most (0640 root:ftgov), never others'


_STATUS = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "status"}\\n')
print(s.makefile().readline(), end="", flush=True)
"""


def test_a_member_sees_others_slurm_holds_without_their_user_or_jobs(orin, start_daemon, member):
    """A Slurm hold said whose it was (uid) and which daemon jobs joined it: with that, a member read the uid of the
    jobs status redacts. Another user's hold shows only its policy, GPUs and duration."""
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    root = d.client()
    root.call("slurm_hold", slurm_job_id=21, uid=0, policy="ffg", partition="lab")
    job_id = root.call("register", slurm_job_id=21, name="/root/secret-model-path", **FEATURES)["job_id"]
    proc = run_as(user, _STATUS, d.socket)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    status = json.loads(out)["result"]
    assert [(j["job_id"], j["redacted"]) for j in status["jobs"]] == [(job_id, True)]
    (hold,) = status["holds"]
    assert hold["redacted"] and hold["policy"] == "ffg" and hold["gpus"]["0"]["joined"] is True
    for hidden in ("uid", "joined", "slurm_job_id", "partition"):
        assert hidden not in hold, hold
    assert root.call("status")["holds"][0]["joined"] == [job_id]  # root sees it whole
