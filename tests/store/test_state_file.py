"""The state file and its directory cannot be turned against root: forged or malformed files are set aside and
ignored (never obeyed, never a crash), the directory must be private, temp files cannot be redirected by symlinks."""

from __future__ import annotations

import json
import os
import stat

import pytest

from governor.errors import StateError
from governor.store.state import MAX_STATE_BYTES, State, StateFile
from tests.support.daemon import limits
from tests.support.security import BASELINE, boot_id_of, ftgov, job_record, needs_root, state_dir_of, write_state

ONE_HZ = {"0": {"describe": {}, "baseline": {"min_hz": 1, "max_hz": 1, "extra": {}}, "pinned_hz": 1}}


def _restore(d, orin, state_dir=None):
    return ftgov("restore", "--config", str(d.config_path), "--state-dir", str(state_dir or d.state_dir),
                 "--sysfs-root", str(orin))


def test_a_forged_baseline_of_1_hz_is_not_written_to_the_gpu(orin, start_daemon):
    d = start_daemon(launch=False)
    write_state(d, orin, gpus=ONE_HZ)
    out = _restore(d, orin)
    assert out.returncode != 0 and "outside the GPU's range" in out.stderr, out
    assert limits(orin) == BASELINE
    d.start()
    assert limits(orin) == BASELINE
    assert "ignoring GPU 0: baseline 1..1 Hz is outside the GPU's range" in d.log()


def test_a_forged_job_on_pid_1_is_not_readopted(orin, start_daemon):
    d = start_daemon(launch=False)
    write_state(d, orin, jobs=[job_record(1)])
    d.start()
    assert d.client().call("status")["jobs"] == []
    assert limits(orin) == BASELINE
    assert "ignoring job 3: pid 1 is never a job" in d.log()


def _bad_files(orin):
    header = {"format": "ftgov-state/1", "boot_id": boot_id_of(orin)}
    return {
        "wrong types": json.dumps({**header, "gpus": {"0": []}, "jobs": "x"}).encode(),
        "gpus a list": json.dumps({**header, "gpus": [1, 2]}).encode(),
        "100k-deep nesting": b'{"format": "ftgov-state/1", "jobs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "not JSON": b"\xff\xfe garbage",
        # What the daemon wrote before the field was renamed start_ticks (an int): not read as a job with no start.
        "the old start_time key": json.dumps({**header, "jobs": [_old_record(job_record(os.getpid()))]}).encode(),
    }


def _old_record(rec: dict) -> dict:
    rec = dict(rec)
    rec["start_time"] = float(rec.pop("start_ticks"))
    return rec


@pytest.mark.parametrize("kind", ["wrong types", "gpus a list", "100k-deep nesting", "not JSON",
                                  "the old start_time key"])
def test_a_malformed_state_file_is_set_aside_not_a_crash(orin, start_daemon, kind):
    d = start_daemon(launch=False)
    path = write_state(d, orin, raw=_bad_files(orin)[kind])
    out = _restore(d, orin)  # refused with the reason, and left where it is: the GPU may still hold its pin
    assert out.returncode == 1 and "is invalid" in out.stderr and "Traceback" not in out.stderr, out
    assert path.exists() and not (path.parent / "state.json.invalid").exists()
    d.start()
    assert d.client().call("ping") == {}
    assert "ignoring invalid state file" in d.log()
    assert (path.parent / "state.json.invalid").exists()
    assert d.client().call("status")["jobs"] == []


def test_a_400_mb_state_file_is_not_read(orin, start_daemon):
    d = start_daemon(launch=False)
    path = state_dir_of(d) / "state.json"
    with open(path, "wb") as f:
        f.truncate(400 * 1024 * 1024)  # sparse: no 400 MB written
    d.start()
    assert d.client().call("ping") == {}
    assert f"more than {MAX_STATE_BYTES}" in d.log()
    assert (path.parent / "state.json.invalid").exists()


def test_a_symlink_planted_at_a_temp_name_is_never_followed(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    # The names a writer could predict: the old scheme was .state.json.<pid>.tmp.
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        (state_dir / f".state.json.{pid}.tmp").symlink_to(victim)
    StateFile(state_dir).write(State("boot"))
    assert victim.read_text() == "precious\n"
    assert json.loads((state_dir / "state.json").read_text())["boot_id"] == "boot"


def test_the_state_file_is_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        StateFile(tmp_path / "state").write(State("boot"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "state.json").st_mode) == 0o600


def test_a_state_file_that_is_a_symlink_is_set_aside(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(State("boot").to_dict()))
    (state_dir / "state.json").symlink_to(secret)
    assert StateFile(state_dir).read("boot") is None
    assert (state_dir / "state.json.invalid").is_symlink() and secret.exists()


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "another owner"])
def test_a_state_dir_others_can_write_is_refused(tmp_path, orin, start_daemon, how):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    if how == "another owner":
        needs_root()
        os.chown(state_dir, 4242, 4242)
    else:
        os.chmod(state_dir, 0o770 if how == "group-writable" else 0o1777)
    with pytest.raises(StateError, match="another user could replace the state file"):
        StateFile(state_dir).write(State("boot"))
    with pytest.raises(StateError, match="another user could replace the state file"):
        StateFile(state_dir).read("boot")
    d = start_daemon(launch=False, extra_args=("--state-dir", str(state_dir)))
    out = _restore(d, orin, state_dir)
    assert out.returncode == 1 and "another user could replace the state file" in out.stderr, out
    d.start(wait=False)
    assert d.proc.wait(30) == 1
    assert "another user could replace the state file" in d.log()
