"""`ftgov slurm prolog|epilog|check` (governor/cli/slurm.py): against the real daemon over its socket, with slurmd's
environment; an absent or silent daemon and a bad config warn and exit 0 in bounded time (a failing prolog drains the
node). Slurm itself (scontrol, squeue, sacct) is exercised in the container suite, tests/slurm."""

import re
import socket
import subprocess
import sys
import time

import pytest

from governor.cli.ops import format_status
from governor.cli.slurm import (
    NoSlurmIndex,
    SlurmConfig,
    admin_comment_entry,
    choose_policy,
    job_gpus,
    merged_admin_comment,
    node_gpu_count,
    own_record,
    write_admin_comment,
)
from tests.daemon.test_slurm_hold import nvml_daemon  # noqa: F401 (a fixture)
from tests.support.daemon import REPO, limits

BASELINE = (306000000, 1300500000)


def slurm(action: str, env: dict, config_text: str | bytes | None, tmp_path, timeout_s: float = 30):
    args = [sys.executable, "-m", "governor.cli", "slurm", action]
    if config_text is not None:
        cfg = tmp_path / "slurm.yaml"
        cfg.write_bytes(config_text if isinstance(config_text, bytes) else config_text.encode())
        args += ["--config", str(cfg)]
    # No scontrol or squeue on PATH here: what the prolog does without them is part of what is tested.
    full_env = {"PATH": "/nonexistent", "PYTHONPATH": str(REPO), **env}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=full_env)


CONFIG = """
policy: off
partitions: {gpu: ffg}
admin_comment: false
comment_from_scontrol: false
"""


def test_prolog_holds_the_job_and_epilog_restores(orin, start_daemon, tmp_path):
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "42", "SLURM_JOB_UID": "0", "SLURM_JOB_PARTITION": "gpu"}
    out = slurm("prolog", env, CONFIG, tmp_path)
    assert out.returncode == 0 and "job 42: ffg (from partition gpu) on GPU(s) 0 at 612 MHz" in out.stdout, out
    assert limits(orin) == (612000000, 612000000)
    status = d.client().call("status")
    hold = status["holds"][0]
    assert (hold["slurm_job_id"], hold["partition"], hold["policy"]) == (42, "gpu", "ffg")
    assert "Slurm job 42 (uid 0): ffg on GPU 0 612 MHz, held 0:00:0" in format_status(status)
    out = slurm("epilog", env, CONFIG, tmp_path)
    assert out.returncode == 0 and "job 42: released; ftgov@" in out.stdout and "policy=ffg,gpus=0" in out.stdout
    assert limits(orin) == BASELINE
    out = slurm("epilog", env, CONFIG, tmp_path)  # a second epilog finds nothing and is no error
    assert out.returncode == 0 and "nothing held" in out.stdout


def test_a_daemon_that_observes_measures_a_held_job_and_pins_nothing(orin, start_daemon, tmp_path):
    """The observe policy pins nothing and measures every job: a hold the prolog asks under ffg (its config's) was
    refused, so Slurm's jobs, the jobs that never heard of ftgov, went unmeasured on a daemon set up to measure them."""
    d = start_daemon(config={"policy": "observe"})
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "44", "SLURM_JOB_UID": "0", "SLURM_JOB_PARTITION": "gpu"}
    out = slurm("prolog", env, CONFIG, tmp_path)
    assert out.returncode == 0, out
    assert "job 44: ffg (from partition gpu, held as off by ftgovd (its own policy: see its log)) on GPU(s) 0 at no " \
           "pin" in out.stdout, out
    assert limits(orin) == BASELINE
    (hold,) = d.client().call("status")["holds"]
    assert (hold["slurm_job_id"], hold["policy"]) == (44, "off") and "held as off (measured, no pin)" in d.log()
    out = slurm("epilog", env, CONFIG, tmp_path)
    assert out.returncode == 0 and re.search(r"job 44: released; ftgov@\S+:energy_j=[0-9.]+,policy=off,gpus=0",
                                             out.stdout), out
    assert limits(orin) == BASELINE


def test_the_comment_chooses_the_policy(orin, start_daemon, tmp_path):
    d = start_daemon()
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "43", "SLURM_JOB_UID": "0", "SLURM_JOB_PARTITION": "gpu",
           "SLURM_JOB_COMMENT": "my run ftgov=off"}
    out = slurm("prolog", env, CONFIG, tmp_path)
    assert out.returncode == 0 and "off (from the job's --comment)" in out.stdout, out
    assert limits(orin) == BASELINE


@pytest.mark.parametrize("action", ["prolog", "epilog"])
def test_an_absent_daemon_is_a_warning_and_exit_0(action, tmp_path):
    env = {"FTGOV_SOCKET": str(tmp_path / "none.sock"), "SLURM_JOB_ID": "44", "SLURM_JOB_GPUS": "0,1"}
    out = slurm(action, env, CONFIG, tmp_path)
    assert out.returncode == 0 and "warning: ftgovd is not reachable" in out.stderr, out


def test_a_daemon_that_never_answers_does_not_hang_the_prolog(tmp_path):
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX) as silent:  # listens, never accepts: connect succeeds, no reply comes
        silent.bind(path)
        silent.listen(4)
        start = time.monotonic()
        out = slurm("prolog", {"FTGOV_SOCKET": path, "SLURM_JOB_ID": "45"}, CONFIG + "timeout_s: 0.5\n", tmp_path)
        took_s = time.monotonic() - start
    assert out.returncode == 0 and "warning:" in out.stderr and "default clocks" in out.stderr, out
    assert took_s < 10


def test_a_bad_config_is_a_warning_naming_the_key_and_check_fails_on_it(tmp_path):
    out = slurm("prolog", {"SLURM_JOB_ID": "46"}, "partitions: {gpu: fastest}\n", tmp_path)
    assert out.returncode == 0 and "partitions.gpu" in out.stderr and "default clocks" in out.stderr, out
    out = slurm("check", {}, "partitions: {gpu: fastest}\n", tmp_path)
    assert out.returncode == 1 and "partitions.gpu" in out.stderr
    out = slurm("check", {"SLURM_JOB_PARTITION": "gpu"}, CONFIG, tmp_path)
    assert out.returncode == 0 and "a job here gets ffg (from partition gpu)" in out.stdout
    assert "GPUs: none named by Slurm (a Jetson's GPU is held; elsewhere none)" in out.stdout  # not Python's None
    out = slurm("check", {"SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,2"}, CONFIG, tmp_path)
    assert out.returncode == 0 and "GPUs: 0, 2" in out.stdout


def test_a_config_that_is_not_text_or_gives_a_key_twice_is_a_warning_not_a_drained_node(tmp_path):
    """A UnicodeDecodeError escaped as a traceback and exit 1: slurmd drains a node whose prolog fails. PyYAML keeps
    the second of two equal partitions silently."""
    for text, says in ((b"policy: ffg # r\xe9glage\n", "not valid YAML"),
                       ("partitions:\n  gpu: ffg\n  gpu: tune\n", "duplicate key 'gpu': given on line 2")):
        out = slurm("prolog", {"SLURM_JOB_ID": "47"}, text, tmp_path)
        assert out.returncode == 0 and says in out.stderr and "default clocks" in out.stderr, out
        assert "Traceback" not in out.stderr
        out = slurm("check", {}, text, tmp_path)
        assert out.returncode == 1 and says in out.stderr and "Traceback" not in out.stderr, out


def test_without_slurm_job_id_nothing_is_held(tmp_path):
    out = slurm("prolog", {"FTGOV_SOCKET": str(tmp_path / "x.sock")}, CONFIG, tmp_path)
    assert out.returncode == 0 and "SLURM_JOB_ID is not set" in out.stderr


def test_choose_policy_order_comment_then_partition_then_default(capsys):
    config = SlurmConfig(policy="ffg", partitions={"big": "tune"})
    assert choose_policy(config, "big", "ftgov=mlg") == ("mlg", "the job's --comment")
    assert choose_policy(config, "big", "nothing here") == ("tune", "partition big")
    assert choose_policy(config, "small", None) == ("ffg", "the default")
    assert choose_policy(config, "small", "ftgov=turbo") == ("ffg", "the default")
    assert "ftgov='turbo' is none of" in capsys.readouterr().err
    closed = SlurmConfig(policy="ffg", job_choice=False)
    assert choose_policy(closed, None, "ftgov=off") == ("ffg", "the default")


def test_job_gpus_from_slurms_environment():
    assert job_gpus({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0"}) == [0, 1]
    assert job_gpus({"SLURM_JOB_GPUS": ""}) == []
    assert job_gpus({}) is None
    assert job_gpus({"SLURM_JOB_GPUS": "NoDevFiles"}) == []  # what Slurm writes where gres.conf names no files
    assert job_gpus({"SLURM_JOB_GPUS": "1,x,2"}) == [1]  # read as CUDA reads it: up to the first non-GPU
    # UUIDs (as Slurm 25.11 is reported to give them) name the GPUs whatever Slurm's numbering: they come first.
    assert job_gpus({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "GPU-abc,GPU-def"}) == ["GPU-abc", "GPU-def"]


def test_the_prolog_reads_slurms_numbers_as_its_config_says(nvml_daemon, tmp_path):  # noqa: F811
    """NVML's GPU 0 is /dev/nvidia1 and its GPU 1 /dev/nvidia0: Slurm's 0 means either. The prolog holds nothing and
    says which setting decides, then holds the GPU that setting names."""
    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 0}))
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "43", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0"}
    out = slurm("prolog", env, "policy: ffg\ncomment_from_scontrol: false\n", tmp_path)
    assert out.returncode == 0 and "ambiguous" in out.stderr and "gpu_numbering" in out.stderr, out
    assert d.client().call("status")["holds"] == []
    config = "policy: ffg\ncomment_from_scontrol: false\ngpu_numbering: device_file\n"
    out = slurm("check", env, config, tmp_path)
    assert out.returncode == 0 and "GPUs: 0 (read by gpu_numbering device_file)" in out.stdout, out
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "job 43: ffg (from the default) on GPU(s) 1 at" in out.stdout, out
    # No scontrol on PATH: the count is not read, and the log says the numbers went without that check.
    assert "GPU count for node" in out.stderr and "without that check" in out.stderr, out
    assert slurm("epilog", env, config, tmp_path).returncode == 0
    out = slurm("check", env, "gpu_numbering: pci\n", tmp_path)
    assert out.returncode != 0 and "gpu_numbering" in out.stderr, out


@pytest.mark.parametrize("gres,count", [
    (b"Gres=gpu:4", 4), (b"Gres=gpu:a100:2(S:0-1),gpu:v100:2(S:0,1)", 4), (b"Gres=gpu:2,shard:8,mps:200", 2),
    (b"Gres=gpu:1g.10gb:7(S:0)", 7), (b"Gres=(null)", None), (b"", None), (b"Gres=gpu:a100:x", None)])
def test_slurmds_gpu_count_is_read_off_scontrol_show_node(tmp_path, monkeypatch, gres, count):
    bin_dir = _scontrol_printing(tmp_path / "slurm", b"NodeName=vm Arch=x86_64 CoresPerSocket=1 " + gres +
                                 b" NodeAddr=vm State=IDLE")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert node_gpu_count("vm", 5) == count


def test_a_prolog_on_a_node_whose_slurmd_offers_fewer_gpus_holds_none_by_number(nvml_daemon, tmp_path):  # noqa: F811
    d, _calls = nvml_daemon()
    bin_dir = _scontrol_printing(tmp_path / "slurm", b"NodeName=vm Arch=x86_64 Gres=gpu:1 State=ALLOCATED")
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "44", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0",
           "SLURMD_NODENAME": "vm", "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\ncomment_from_scontrol: false\nsweep_stale: false\nadmin_comment: false\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "slurmd offers 1 GPU(s) on this node and ftgovd governs 2" in out.stderr, out
    assert d.client().call("status")["holds"] == []
    out = slurm("prolog", env, config + "node_gpus_from_scontrol: false\n", tmp_path)  # the operator's call
    assert out.returncode == 0 and "job 44: ffg (from the default) on GPU(s) 0 at" in out.stdout, out
    assert slurm("epilog", env, config, tmp_path).returncode == 0


def test_admin_comment_keeps_other_nodes_entries():
    entry = admin_comment_entry({"energy_j": 1234.56, "saved_pct": 11.5, "saved_pct_err": 2.0, "policy": "tune",
                                 "gpus": {"0": {}, "1": {}}}, "node1")
    assert entry == "ftgov@node1:energy_j=1234.6,saved_pct=11.5+-2,policy=tune,gpus=0+1"
    merged = merged_admin_comment("ftgov@node2:energy_j=5.0,policy=tune,gpus=0;ftgov@node1:energy_j=1.0", entry)
    assert merged == f"ftgov@node2:energy_j=5.0,policy=tune,gpus=0;{entry}"
    assert merged_admin_comment("(null)", entry) == entry
    # The hold's GPUs come in Slurm's order, which need not be NVML's; the comment gives NVML's numbers in order.
    entry = admin_comment_entry({"energy_j": 1.0, "policy": "ffg", "gpus": {"10": {}, "2": {}, "1": {}}}, "n")
    assert entry.endswith("gpus=1+2+10")



def _show_job(where, show: str | bytes | dict[str, str]) -> str:
    """The shell that answers `scontrol show job -o JOB` (written into ``where``): ``show`` whatever JOB is, or, as a
    dict, show[JOB] (none: Slurm's "Invalid job id", exit 1). As Slurm 22.05 answers a heterogeneous job: its leader's
    bare id prints every component's record, ID+0 the leader's alone (scontrol_print_job), a component's id its own."""
    where.mkdir(parents=True, exist_ok=True)
    for job, text in (show if isinstance(show, dict) else {"any": show}).items():
        data = text if isinstance(text, bytes) else text.encode()
        (where / f"show.{job}.out").write_bytes(data + b"\n")
    if not isinstance(show, dict):
        return f"exec cat {where / 'show.any.out'}"
    return (f'[ -f "{where}/show.$4.out" ] && exec cat "{where}/show.$4.out"; '
            'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1')


def _squeue_work_dir(bin_dir, work_dir: str | bytes) -> None:
    """A squeue in ``bin_dir`` that answers `squeue -h -t all -j ID -o %A|%F|%K|%Z` as for a job of that id outside
    any array, in ``work_dir``, as the user chose it."""
    (bin_dir / "squeue.out").write_bytes((work_dir if isinstance(work_dir, bytes) else work_dir.encode()) + b"\n")
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nprintf '%s|N/A|N/A|' \"$5\"; exec cat {bin_dir / 'squeue.out'}\n")
    (bin_dir / "squeue").chmod(0o755)


def _fake_scontrol(where, monkeypatch, show_line: str | dict[str, str], work_dir: str = "/home/u"):
    """An scontrol on PATH (in a new directory ``where``) that prints ``show_line`` for `show job` and logs every
    `update` (the log's path is returned), and a squeue that gives the job's ``work_dir``."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    log = where / "updates.log"
    script = bin_dir / "scontrol"
    script.write_text(f"""#!/bin/sh
if [ "$1" = show ]; then {_show_job(where, show_line)}; else printf '%s\\n' "$*" >> {log}; fi
""")
    script.chmod(0o755)
    _squeue_work_dir(bin_dir, work_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return log


def test_a_job_whose_own_text_carries_admincomment_gets_none_of_it_written(tmp_path, monkeypatch, capsys):
    """Slurm prints AdminComment= only when the field is set, right after WorkDir= (src/api/job_info.c); the user
    names the job, its comment and its work dir. With the field unset, a " AdminComment=" in the job's name or
    comment was the only one, and root wrote the user's text into the admin-only field (found by a review; real
    Slurm 22.05 prints no AdminComment= for a job without one). The field is read only where Slurm prints it."""
    entry = "ftgov@node1:energy_j=10.0,policy=tune,gpus=0"
    for job, show, work_dir in (
            (7, "JobId=7 JobName=x AdminComment=ftgov@node2:energy_j=0.0 UserId=u(1000) Command=/home/u/r "
                "WorkDir=/home/u Comment=c", "/home/u"),
            (8, "JobId=8 JobName=x UserId=u(1000) Command=/home/u/r WorkDir=/home/u Comment=c AdminComment=forged "
                "StdErr=/home/u/o", "/home/u"),
            (9, "JobId=9 JobName=x UserId=u(1000) Command=/r WorkDir=/home/u/d AdminComment=forged  Comment=c",
             "/home/u/d AdminComment=forged"),  # a work dir of that name: its text is the work dir's
            # "WorkDir=" and the work dir in the job's name, after no space: the first "WorkDir=/home/u" in the
            # output, where the field was read until a review found it
            (13, "JobId=13 JobName=WorkDir=/home/u AdminComment=forged UserId=u(1000) WorkDir=/home/u Comment=c",
             "/home/u"),
            (14, "JobId=14 JobName=xWorkDir=/home/u AdminComment=forged UserId=u(1000) WorkDir=/home/u Comment=c",
             "/home/u")):
        log = _fake_scontrol(tmp_path / f"forged{job}", monkeypatch, show, work_dir)
        write_admin_comment(job, entry, 5.0)
        assert log.read_text() == f"update JobId={job} AdminComment={entry}\n", capsys.readouterr().err
    # Slurm's own, after the work dir, is kept (another node's entry) whatever the user's text carries elsewhere.
    honest = ("JobId=10 JobName=y AdminComment=forged UserId=u(1000) WorkDir=/home/u "
              "AdminComment=ftgov@node2:energy_j=5.0,policy=tune,gpus=1  Comment=c AdminComment=forged")
    log = _fake_scontrol(tmp_path / "honest", monkeypatch, honest)
    write_admin_comment(10, entry, 5.0)
    assert log.read_text() == f"update JobId=10 AdminComment=ftgov@node2:energy_j=5.0,policy=tune,gpus=1;{entry}\n"
    # WorkDir= twice (the user's text carries one too), or squeue cannot say the work dir: nothing is written.
    for job, show, work_dir in ((11, "JobId=11 JobName=x WorkDir=/home/u AdminComment=forged UserId=u(1000) "
                                     "WorkDir=/home/u Comment=c", "/home/u"),
                                (12, "JobId=12 JobName=x WorkDir=/home/u Comment=c", "/home/u\n/home/v")):
        log = _fake_scontrol(tmp_path / f"unsure{job}", monkeypatch, show, work_dir)
        write_admin_comment(job, entry, 5.0)
        assert not log.exists() and "AdminComment not written" in capsys.readouterr().err


def _scontrol_printing(where, show_line: bytes | dict[str, str], work_dir: str | bytes = "/home/u"):
    """A directory with an scontrol that prints ``show_line`` (bytes, as Slurm passes a job's own text through) for
    `show job` and logs every `update` to updates.log beside it, and a squeue that gives ``work_dir``; the directory,
    for PATH."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "scontrol"
    script.write_text(f"""#!/bin/sh
if [ "$1" = show ]; then {_show_job(where, show_line)}; else printf '%s\\n' "$*" >> {where / "updates.log"}; fi
""")
    script.chmod(0o755)
    _squeue_work_dir(bin_dir, work_dir)
    return bin_dir


def test_a_job_name_that_is_not_utf8_neither_fails_the_epilog_nor_the_prolog(orin, start_daemon, tmp_path):
    """Slurm passes a job's name and comment through as the user's bytes: a Latin-1 name made `scontrol show job`'s
    output undecodable, the UnicodeDecodeError escaped as a traceback and exit 1, and slurmd drains a node whose prolog
    or epilog fails: any user could drain nodes with `sbatch --job-name=$'caf\\xe9'`."""
    d = start_daemon()
    bin_dir = _scontrol_printing(tmp_path / "slurm",
                                 b"JobId=48 JobName=caf\xe9 UserId=u(1000) WorkDir=/home/caf\xe9 Comment=ftgov=off  ",
                                 b"/home/caf\xe9")
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "48", "SLURM_JOB_UID": "0",
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\nadmin_comment: true\ncomment_from_scontrol: true\nsweep_stale: false\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out
    assert "job 48: off (from the job's --comment)" in out.stdout, out  # the comment is still read
    out = slurm("epilog", env, config, tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out
    assert "job 48: released" in out.stdout and d.client().call("status")["holds"] == []
    update = (tmp_path / "slurm" / "updates.log").read_text()
    assert update.startswith("update JobId=48 AdminComment=ftgov@") and "policy=off" in update, update


def test_a_comment_with_more_than_the_choice_is_read_whole_from_scontrol(orin, start_daemon, tmp_path):
    """Where slurmd passes no SLURM_JOB_COMMENT the prolog reads the comment off `scontrol show job -o`, whose fields
    run to the next Key=: "ftgov=off" after other words was taken for a field of its own, and the choice was lost."""
    d = start_daemon()
    bin_dir = _scontrol_printing(tmp_path / "slurm", b"JobId=49 JobName=bert UserId=u(1000) AdminComment=(null) "
                                                     b"Comment=sweep 3 ftgov=off StdErr=/home/u/slurm-49.out")
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "49", "SLURM_JOB_UID": "0", "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\nadmin_comment: false\ncomment_from_scontrol: true\nsweep_stale: false\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "job 49: off (from the job's --comment)" in out.stdout, out
    assert slurm("epilog", env, config, tmp_path).returncode == 0


def _het_shows(leader: int, *records: str) -> dict[str, str]:
    """`scontrol show job -o JOB` of a heterogeneous job of these records (a line per component, the leader's first)
    by JOB, as Slurm answers (_show_job): the leader's id all of them, ID+0 the leader's, a component's id its own."""
    return {str(leader): "\n".join(records), f"{leader}+0": records[0],
            **{str(leader + offset): r for offset, r in enumerate(records) if offset}}


def test_a_heterogeneous_leaders_comment_is_read_off_its_own_record(orin, start_daemon, tmp_path):
    """`scontrol show job -o ID` of a heterogeneous job's leader prints one line per component (Slurm 22.05, seen in
    tests/slurm): each carries Comment=, which read as one text appeared twice, and the leader's prolog (where slurmd
    passes no SLURM_JOB_COMMENT) dropped the job's choice as ambiguous. ID+0 prints the leader's alone."""
    d = start_daemon()
    bin_dir = _scontrol_printing(tmp_path / "slurm", _het_shows(
        50, "JobId=50 HetJobId=50 HetJobOffset=0 JobName=het UserId=u(1000) AdminComment=(null) Comment=ftgov=off "
            "StdErr=/home/u/o",
        "JobId=51 HetJobId=50 HetJobOffset=1 JobName=het UserId=u(1000) AdminComment=(null) Comment=ftgov=off "
        "StdErr=/home/u/o"))
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "50", "SLURM_HET_JOB_ID": "50", "SLURM_JOB_UID": "0",
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\nadmin_comment: false\ncomment_from_scontrol: true\nsweep_stale: false\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "job 50: off (from the job's --comment)" in out.stdout, out
    assert slurm("epilog", env, config, tmp_path).returncode == 0


def test_a_heterogeneous_leaders_admincomment_is_its_own(tmp_path, monkeypatch, capsys):
    """The leader's `scontrol show job -o ID` lines include its other components', whose AdminComment (another node's
    entry, written while the job was still running) was read as the leader's: not written (ambiguous) where both
    had one, and merged into the leader's field where only the component's had. ID+0 is the leader's record."""
    entry = "ftgov@node1:energy_j=10.0,policy=ffg,gpus=1"
    both = _het_shows(60, "JobId=60 HetJobId=60 HetJobOffset=0 JobName=het WorkDir=/home/u "
                          "AdminComment=ftgov@node1:energy_j=1.0  Comment=c",
                      "JobId=61 HetJobId=60 HetJobOffset=1 JobName=het WorkDir=/home/u "
                      "AdminComment=ftgov@node2:energy_j=5.0  Comment=c")
    log = _fake_scontrol(tmp_path / "both", monkeypatch, both)
    write_admin_comment(60, entry, 5.0, record="60+0")
    # The leader's record keeps its own former entry (node1's, replaced) and has none of node2's.
    assert log.read_text() == f"update JobId=60+0 AdminComment={entry}\n", capsys.readouterr().err
    other = _het_shows(62, "JobId=62 HetJobId=62 HetJobOffset=0 JobName=het WorkDir=/home/u Comment=c",
                       "JobId=63 HetJobId=62 HetJobOffset=1 JobName=het WorkDir=/home/u "
                       "AdminComment=ftgov@node2:energy_j=5.0  Comment=c")
    log = _fake_scontrol(tmp_path / "other", monkeypatch, other)
    write_admin_comment(62, entry, 5.0, record="62+0")
    assert log.read_text() == f"update JobId=62+0 AdminComment={entry}\n"
    # A line of the job's own that the user's text forged (a newline in a name) has no say: the field is Slurm's.
    forged = ("JobId=64 JobName=x\nJobId=64 WorkDir=/home/u AdminComment=ftgov@node2:energy_j=0.0\n"
              "JobId=64 JobName=x WorkDir=/home/u Comment=c")
    log = _fake_scontrol(tmp_path / "forged", monkeypatch, forged)
    write_admin_comment(64, entry, 5.0)
    assert not log.exists() and "AdminComment not written" in capsys.readouterr().err


def _finished_slurm(where, show: str | dict[str, str], unmatched: int = 0):
    """scontrol and sacctmgr on a PATH directory (returned): `scontrol show` prints ``show``, `scontrol update` fails
    as for a job slurmctld considers finished (as the node epilog usually finds it), each logs its arguments; the
    first ``unmatched`` sacctmgr calls find no record (as before slurmdbd knows a heterogeneous job's components)."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "scontrol").write_text(f"""#!/bin/sh
if [ "$1" = show ]; then {_show_job(where, show)}; fi
printf '%s\\n' "$*" >> {where / "calls.log"}; echo "Job has already finished for job $2" >&2; exit 1
""")
    (bin_dir / "sacctmgr").write_text(f"""#!/bin/sh
printf 'sacctmgr %s\\n' "$*" >> {where / "calls.log"}
if [ "$(grep -c ^sacctmgr {where / "calls.log"})" -le {unmatched} ]; then
    echo "sacctmgr: accounting_storage/slurmdbd: acct_storage_p_modify_job: Request didn't affect anything or your \
user doesn't have privilege to perform this action" >&2; exit 1
fi
""")
    for tool in ("scontrol", "sacctmgr"):
        (bin_dir / tool).chmod(0o755)
    _squeue_work_dir(bin_dir, "/home/u")
    return bin_dir


def test_a_heterogeneous_leaders_epilog_writes_the_leaders_record_only(orin, start_daemon, tmp_path):
    """For a heterogeneous job's leader, `scontrol update JobId=ID` and `sacctmgr modify job where jobid=ID` change
    every component's record (Slurm 22.05, seen in tests/slurm): the leader's epilog wrote its node's entry over the
    other components' (whichever epilog came last won). ID+0 names the leader alone (sacctmgr finds it once slurmdbd
    knows the job's components, a moment after the job ends: the epilog tries again); a component's own id names
    itself only."""
    d = start_daemon()
    # As Slurm 22.05 prints them: AdminComment= and Comment= are each followed by two spaces.
    show = _het_shows(80, "JobId=80 HetJobId=80 HetJobOffset=0 JobName=het WorkDir=/home/u AdminComment=  "
                          "Comment=ftgov=off  StdErr=/home/u/o",
                      "JobId=81 HetJobId=80 HetJobOffset=1 JobName=het WorkDir=/home/u "
                      "AdminComment=ftgov@node2:energy_j=5.0  Comment=ftgov=off  StdErr=/home/u/o")
    config = "policy: ffg\nadmin_comment: true\ncomment_from_scontrol: false\nsweep_stale: false\n"
    for job, where in ((80, "leader"), (81, "component")):
        bin_dir = _finished_slurm(tmp_path / where, show, unmatched=2 if job == 80 else 0)
        env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": str(job), "SLURM_HET_JOB_ID": "80", "SLURM_JOB_UID": "0",
               "SLURMD_NODENAME": where, "PATH": f"{bin_dir}:/usr/bin:/bin"}
        assert slurm("prolog", env, config, tmp_path).returncode == 0
        out = slurm("epilog", env, config, tmp_path)
        assert out.returncode == 0 and f"job {job}: released" in out.stdout, out
        calls = (tmp_path / where / "calls.log").read_text().splitlines()
        target = "80+0" if job == 80 else "81"
        # The leader's ID+0 finds its record once slurmdbd knows the job's components: the epilog tries again.
        assert [c.split(" AdminComment=")[0] for c in calls] == [f"update JobId={target}"] + [
            f"sacctmgr -i modify job where jobid={target} set"] * (3 if job == 80 else 1), calls
        assert "AdminComment" not in out.stderr, out
        value = calls[-1].split("AdminComment=", 1)[1]
        # The leader's own record has no AdminComment yet (not node2's, the component's); Slurm's padding is not kept.
        kept = "" if job == 80 else "ftgov@node2:energy_j=5.0;"
        assert value.startswith(f"{kept}ftgov@{where}:energy_j="), calls
        assert value.count("ftgov@") == (1 if job == 80 else 2) and " " not in value, calls


def test_a_finished_array_tasks_accounting_record_is_named_alone(tmp_path, monkeypatch, capsys):
    """The node epilog of the task that has the array's id, once slurmctld considers it finished, writes the
    accounting record with sacctmgr: `jobid=ID` changed every task of the array under Slurm 24.11 (tests/slurm on
    trixie: the other task's entry was replaced by this one's), ARRAY_TASK this task's alone. Slurm 22.05's sacctmgr
    finds no record by ARRAY_TASK (tests/slurm on bookworm), and there the raw id is the task's alone."""
    entry = "ftgov@vm:energy_j=45.0,policy=ffg,gpus=0"
    shows = {"15_1": "JobId=15 ArrayJobId=15 ArrayTaskId=1 JobName=a WorkDir=/home/u StdErr=/o"}
    for slurm_version, unmatched in (("24.11", 0), ("22.05", 1)):
        bin_dir = _finished_slurm(tmp_path / slurm_version, shows, unmatched=unmatched)
        (bin_dir / "squeue").write_text("#!/bin/sh\nprintf '16|15|0|/home/u\\n15|15|1|/home/u\\n'\n")
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        write_admin_comment(15, entry, 5.0)
        calls = (tmp_path / slurm_version / "calls.log").read_text().splitlines()
        assert calls == [f"update JobId=15_1 AdminComment={entry}",
                         f"sacctmgr -i modify job where jobid=15_1 set AdminComment={entry}",
                         *[f"sacctmgr -i modify job where jobid=15 set AdminComment={entry}"] * unmatched], calls
        assert "AdminComment" not in capsys.readouterr().err


def test_a_slurm_whose_sacctmgr_cannot_set_admincomment_is_named_in_the_warning(tmp_path, monkeypatch, capsys):
    """Slurm 21.08's `sacctmgr modify job` sets Comment, DerivedExitCode and WCKey alone (tests/slurm on Ubuntu
    jammy): every epilog's write of a finished job's AdminComment fails, and the warning passed on sacctmgr's "You
    didn't give me anything to set", which says neither why nor what to do."""
    bin_dir = _finished_slurm(tmp_path, "JobId=20 JobName=a WorkDir=/home/u StdErr=/o")
    (bin_dir / "sacctmgr").write_text(f"""#!/bin/sh
printf 'sacctmgr %s\\n' "$*" >> {tmp_path / "calls.log"}
echo " Unknown option: $7"; echo " Use keyword 'where' to modify condition"
echo " You didn't give me anything to set" >&2; exit 1
""")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    write_admin_comment(20, "ftgov@vm:energy_j=45.0,policy=ffg,gpus=0", 5.0)
    assert (tmp_path / "calls.log").read_text().count("sacctmgr") == 1
    err = capsys.readouterr().err
    assert "job 20: AdminComment not written" in err and "Slurm before 22.05" in err, err
    assert "admin_comment: false" in err, err


def test_slurms_padding_after_a_field_is_not_read_into_it(tmp_path, monkeypatch):
    """Slurm 22.05's `scontrol show job -o` follows AdminComment= and Comment= with two spaces; the field ran to the
    next Key= and kept one, so another node's entry was written back as "ftgov@node2:... ;ftgov@node1:...", a space
    more with every node."""
    entry = "ftgov@node1:energy_j=10.0,policy=ffg,gpus=0"
    line = ("JobId=90 JobName=x WorkDir=/home/u AdminComment=ftgov@node2:energy_j=5.0,policy=ffg,gpus=1  "
            "Comment=ftgov=off  StdErr=/o")
    log = _fake_scontrol(tmp_path / "padded", monkeypatch, line)
    write_admin_comment(90, entry, 5.0)
    assert log.read_text() == f"update JobId=90 AdminComment=ftgov@node2:energy_j=5.0,policy=ffg,gpus=1;{entry}\n"


def test_a_slow_squeue_in_the_sweep_does_not_cost_the_job_its_hold(nvml_daemon, tmp_path):  # noqa: F811
    """The sweep asks squeue about every other hold on the node, one call each, while the alarm bounds the whole run at
    CALLS_AT_MOST calls. It ran before the job's own hold: on a node of several jobs, with slurmctld slow to answer
    (the squeue calls each near timeout_s), the alarm ended the prolog first and the job ran unheld."""
    d, _calls = nvml_daemon()
    c = d.client()
    for job in range(70, 76):
        c.call("slurm_hold", slurm_job_id=job, uid=1000, policy="ffg", gpus=[0])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\nsleep 30\n")
    (bin_dir / "squeue").chmod(0o755)
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "77", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "1",
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\ncomment_from_scontrol: false\nnode_gpus_from_scontrol: false\ntimeout_s: 0.5\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0, out
    assert 77 in [h["slurm_job_id"] for h in c.call("status")["holds"]], out
    assert "job 77: ffg (from the default) on GPU(s) 1 at" in out.stdout, out


def test_the_epilogs_entry_names_slurms_node_not_the_hostname(orin, start_daemon, tmp_path):
    """slurmd gives the epilog SLURMD_NODENAME, the NodeName sacct and scontrol show (docs/slurm.md's ftgov@gpu01),
    which need not be the host's name (NodeHostname=, a FQDN); the prolog already used it, the epilog did not."""
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "45", "SLURM_JOB_UID": "0", "SLURMD_NODENAME": "gpu-node-7x"}
    assert slurm("prolog", env, CONFIG, tmp_path).returncode == 0
    out = slurm("epilog", env, CONFIG, tmp_path)
    assert out.returncode == 0 and "job 45: released; ftgov@gpu-node-7x:" in out.stdout, out


def test_numbers_without_slurm_job_gpus_are_not_read_as_slurms_index(nvml_daemon, tmp_path):  # noqa: F811
    """Slurm 19.05 gave the prolog no SLURM_JOB_GPUS and wrote each device file's number in CUDA_VISIBLE_DEVICES and
    GPU_DEVICE_ORDINAL; today's writes them from SLURM_JOB_GPUS's list. Read as the index, /dev/nvidia1's 1 was NVML's
    second GPU, another job's: such numbers hold nothing and the log says why."""
    assert job_gpus({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"}) == [1]
    for name in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        with pytest.raises(NoSlurmIndex, match="without SLURM_JOB_GPUS"):
            job_gpus({name: "1"})
        assert job_gpus({name: ""}) == []
    d, _calls = nvml_daemon(gpus=({"minor_number": 1}, {"minor_number": 2}))
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "44", "SLURM_JOB_UID": "0", "CUDA_VISIBLE_DEVICES": "1"}
    out = slurm("prolog", env, "policy: ffg\ncomment_from_scontrol: false\ngpu_numbering: device_file\n", tmp_path)
    assert out.returncode == 0 and "without SLURM_JOB_GPUS" in out.stderr and "by UUID" in out.stderr, out
    assert "nothing held (" not in out.stderr
    assert d.client().call("status")["holds"] == []
    check = slurm("check", env, "policy: ffg\n", tmp_path)
    assert check.returncode == 0 and "none held" in check.stdout + check.stderr, check


def test_a_heterogeneous_components_prolog_names_its_leader(nvml_daemon, tmp_path):  # noqa: F811
    """A component's prolog has its own SLURM_JOB_ID and the leader's SLURM_HET_JOB_ID; its tasks say the leader's
    id, and join the component's hold by it."""
    d, _calls = nvml_daemon()
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "701", "SLURM_HET_JOB_ID": "700", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GPUS": "1"}
    out = slurm("prolog", env, "policy: ffg\ncomment_from_scontrol: false\n", tmp_path)
    assert out.returncode == 0 and "job 701: ffg" in out.stdout, out
    c = d.client()
    res = c.call("register", slurm_job_id=700, gpu=c.call("status")["gpus"][1]["uuid"], model_type="encoder",
                 num_layers=12, hidden_size=768, seq_len=128)
    assert res["slurm"]["joined"], res
    c.call("unregister", job_id=res["job_id"])
    assert slurm("epilog", env, "policy: ffg\n", tmp_path).returncode == 0
    assert c.call("status")["holds"] == []


def test_a_newline_in_the_jobs_own_text_does_not_get_its_admincomment_written(tmp_path, monkeypatch, capsys):
    """Slurm prints a job's name, command and directories as the user gave them, newlines included, before
    AdminComment=. Where only the line that begins JobId=ID was read, a working directory "/x AdminComment=forged"
    + newline put the user's AdminComment= alone on that line and Slurm's on the next: root wrote the forged text
    into the admin-only field. squeue gives that work dir as two lines, and which is Slurm's field cannot be told:
    nothing is written."""
    entry = "ftgov@node1:energy_j=10.0,policy=ffg,gpus=0"
    work_dir = "/home/u/x AdminComment=ftgov@node2:energy_j=0.0\ny"
    show = f"JobId=66 JobName=x UserId=u(1000) WorkDir={work_dir} Comment=c StdErr=/home/u/o"
    log = _fake_scontrol(tmp_path / "newline", monkeypatch, show, work_dir)
    write_admin_comment(66, entry, 5.0)
    assert not log.exists(), log.read_text()
    assert "AdminComment not written" in capsys.readouterr().err


@pytest.mark.parametrize("env,record", [
    ({}, "7"),
    ({"SLURM_HET_JOB_ID": "7"}, "7+0"),  # a heterogeneous job's leader: its bare id names every component
    ({"SLURM_HET_JOB_ID": "6"}, "7"),  # another component: its own id is its own record
    ({"SLURM_HET_JOB_ID": "x"}, "7"),
])
def test_scontrol_and_sacctmgr_are_asked_for_the_jobs_own_record(env, record):
    assert own_record(7, env) == record


def test_a_components_prolog_is_held_by_an_ftgovd_that_predates_heterogeneous_jobs(tmp_path, capsys):
    """After `make install` and before ftgovd's restart, the new prolog talks to the old daemon, which refuses the
    unknown het_job_id: the component is held all the same, without it, and the log says to restart ftgovd."""
    import json as jsonlib
    import threading

    from governor.cli.slurm import prolog

    path = str(tmp_path / "old.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    seen = []

    def old_daemon():
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as reader:
            for line in reader:
                req = jsonlib.loads(line)
                seen.append(req["params"])
                if "het_job_id" in req["params"]:  # as an ftgovd of before answers an unknown parameter
                    reply = {"error": {"code": -32602, "message": "het_job_id: Extra inputs are not permitted",
                                       "data": {"field": "het_job_id"}}}
                else:
                    reply = {"result": {"slurm_job_id": req["params"]["slurm_job_id"], "policy": "ffg",
                                        "gpus": {"0": {"freq_hz": 816000000}}}}
                conn.sendall(jsonlib.dumps({"jsonrpc": "2.0", "id": req["id"], **reply}).encode() + b"\n")

    thread = threading.Thread(target=old_daemon, daemon=True)
    thread.start()
    config = SlurmConfig(socket=path, policy="ffg", comment_from_scontrol=False, sweep_stale=False)
    env = {"SLURM_JOB_ID": "71", "SLURM_HET_JOB_ID": "70", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0"}
    assert prolog(config, env) == 0
    server.close()
    out = capsys.readouterr()
    assert [p.get("het_job_id") for p in seen] == [70, None], seen
    assert "restart it after an upgrade" in out.err and "job 71: ffg (from the default) on GPU(s) 0 at" in out.out


def test_a_job_array_tasks_admincomment_is_read_off_its_own_record(tmp_path, monkeypatch, capsys):
    """The task that has the array's id: `scontrol show job -o ID` prints every task of the array (Slurm 22.05, seen
    in tests/slurm), with a WorkDir= each, so where Slurm's AdminComment stands could not be told and none was
    written. squeue gives the task's index (%K) beside its raw id (%A): ARRAY_TASK shows its record alone, and
    names it alone to scontrol update and sacctmgr (under Slurm 24.11 `sacctmgr modify job where jobid=ID` changed
    every task of the array: tests/slurm on trixie)."""
    entry = "ftgov@vm:energy_j=26.8,policy=ffg,gpus=0"
    shows = {"13": "JobId=14 ArrayJobId=13 ArrayTaskId=0 JobName=a WorkDir=/home/u "
                   "AdminComment=ftgov@vm:energy_j=54.0  StdErr=/o\n"
                   "JobId=13 ArrayJobId=13 ArrayTaskId=1 JobName=a WorkDir=/home/u StdErr=/o",
             "13_1": "JobId=13 ArrayJobId=13 ArrayTaskId=1 JobName=a WorkDir=/home/u StdErr=/o",
             "13_0": "JobId=14 ArrayJobId=13 ArrayTaskId=0 JobName=a WorkDir=/home/u "
                     "AdminComment=ftgov@vm:energy_j=54.0  StdErr=/o"}
    log = _fake_scontrol(tmp_path / "array", monkeypatch, shows)
    (tmp_path / "array" / "bin" / "squeue").write_text("#!/bin/sh\nprintf '14|13|0|/home/u\\n13|13|1|/home/u\\n'\n")
    write_admin_comment(13, entry, 5.0)
    assert log.read_text() == f"update JobId=13_1 AdminComment={entry}\n", capsys.readouterr().err


def _docs_wrapper(tmp_path, action: str, ftgov: str) -> str:
    """docs/slurm.md's wrapper for slurm.conf's Prolog= (or, for the epilog, as the page says to change it), written
    to a file with its ftgov at ``ftgov``."""
    page = (REPO / "docs" / "slurm.md").read_text()
    text = next(block for block in page.split("```sh\n")[1:] if block.startswith("#!/bin/sh"))
    text = text.split("```", 1)[0].replace("/usr/local/bin/ftgov", ftgov).replace("slurm prolog", f"slurm {action}")
    path = tmp_path / f"slurm-{action}"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_the_docs_wrapper_exits_0_where_systemd_cat_or_ftgov_cannot_run(orin, start_daemon, tmp_path):
    """slurmd drains a node whose prolog or epilog exits non-zero. The page's wrapper exec'd systemd-cat, which cannot
    start without journald (a slurmd in a container: systemd 252's says "Failed to create stream fd" and exits 1,
    never running its command) and exits 1 where its command is missing (ftgov uninstalled, or mid-upgrade): every
    job's prolog drained its node. The wrapper exits 0 whatever happens, and runs ftgov without systemd-cat."""
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemd-cat").write_text(  # as systemd 252's where /run/systemd/journal/stdout is absent
        "#!/bin/sh\necho 'Failed to create stream fd: No such file or directory' >&2\nexit 1\n")
    (bin_dir / "systemd-cat").chmod(0o755)
    config = tmp_path / "slurm.yaml"
    config.write_text(CONFIG)
    ftgov = tmp_path / "ftgov"  # the installed ftgov, with this test's slurm.yaml
    ftgov.write_text(f'#!/bin/sh\nexec {sys.executable} -m governor.cli "$@" --config {config}\n')
    ftgov.chmod(0o755)
    env = {"PATH": str(bin_dir), "PYTHONPATH": str(REPO), "FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "46",
           "SLURM_JOB_UID": "0", "SLURM_JOB_PARTITION": "gpu"}
    out = subprocess.run([_docs_wrapper(tmp_path, "prolog", str(ftgov))], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 0, out
    assert [h["slurm_job_id"] for h in d.client().call("status")["holds"]] == [46], out
    assert limits(orin) == (612000000, 612000000)
    out = subprocess.run([_docs_wrapper(tmp_path, "epilog", str(ftgov))], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 0 and d.client().call("status")["holds"] == [], out
    assert limits(orin) == BASELINE
    for action in ("prolog", "epilog"):  # ftgov not installed (or half-installed by an upgrade)
        out = subprocess.run([_docs_wrapper(tmp_path, action, str(tmp_path / "none" / "ftgov"))], capture_output=True,
                             text=True, timeout=30, env=env)
        assert out.returncode == 0, out


def test_a_job_array_tasks_comment_is_read_where_scontrol_prints_every_task(orin, start_daemon, tmp_path):
    """The prolog of the task that has the array's id, where slurmd passes no SLURM_JOB_COMMENT (Slurm 22.05): its
    `scontrol show job -o ID` prints every task of the array (tests/slurm), a Comment= each, and the prolog took the
    job's choice for ambiguous: that task of an array submitted with --comment ftgov=off was pinned at FFG's level
    while the others were not. The prolog gets no SLURM_ARRAY_TASK_ID to name the task by; the tasks' comments, the
    one user's text all of it, say the same."""
    d = start_daemon(config={"ffg_freq_hz": 612000000})
    shows = {"13": "JobId=14 ArrayJobId=13 ArrayTaskId=0 JobName=a UserId=u(1000) WorkDir=/home/u "
                   "Comment=sweep ftgov=off  StdErr=/o\n"
                   "JobId=13 ArrayJobId=13 ArrayTaskId=1 JobName=a UserId=u(1000) WorkDir=/home/u "
                   "Comment=sweep ftgov=off  StdErr=/o"}
    bin_dir = _scontrol_printing(tmp_path / "slurm", shows)
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "13", "SLURM_JOB_UID": "0", "PATH": f"{bin_dir}:/usr/bin:/bin"}
    config = "policy: ffg\nadmin_comment: false\ncomment_from_scontrol: true\nsweep_stale: false\n"
    out = slurm("prolog", env, config, tmp_path)
    assert out.returncode == 0 and "job 13: off (from the job's --comment)" in out.stdout, out
    assert limits(orin) == BASELINE
    assert slurm("epilog", env, config, tmp_path).returncode == 0
    # Where the records' comments differ (a task's comment changed with scontrol update), none is taken.
    shows["13"] = shows["13"].replace("ftgov=off  StdErr=/o\nJobId=13", "ftgov=tune  StdErr=/o\nJobId=13")
    bin_dir = _scontrol_printing(tmp_path / "differ", shows)
    out = slurm("prolog", {**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}, config, tmp_path)
    assert out.returncode == 0 and "job 13: ffg (from the default)" in out.stdout, out
    assert "the comment is not read" in out.stderr, out
    assert slurm("epilog", env, config, tmp_path).returncode == 0


def test_an_epilog_that_ends_during_the_sweep_neither_stops_it_nor_unsays_the_hold(nvml_daemon, tmp_path):  # noqa: F811
    """The sweep reads the node's holds, then asks squeue about each. A job whose epilog released its hold meanwhile
    (jobs ending together on a busy node), and which squeue no longer lists, was released a second time: ftgovd's
    'no hold' ended the prolog with "the job runs at the default clocks", untrue of the job just held, and the holds
    after it went unswept."""
    d, _calls = nvml_daemon()
    c = d.client()
    for job in (70, 71):
        c.call("slurm_hold", slurm_job_id=job, uid=1000, policy="ffg", gpus=[0])
    config = tmp_path / "slurm.yaml"
    config.write_text("policy: ffg\ncomment_from_scontrol: false\nnode_gpus_from_scontrol: false\n"
                      "admin_comment: false\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # squeue -h -j ID -o %T: job 70's epilog ends as squeue is asked about it; neither job is listed any more.
    (bin_dir / "squeue").write_text(f"""#!/bin/sh
[ "$3" = 70 ] && SLURM_JOB_ID=70 {sys.executable} -m governor.cli slurm epilog --config {config} > /dev/null 2>&1
exit 0
""")
    (bin_dir / "squeue").chmod(0o755)
    env = {"FTGOV_SOCKET": d.socket, "SLURM_JOB_ID": "77", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "1",
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = slurm("prolog", env, config.read_text(), tmp_path)
    assert out.returncode == 0 and "job 77: ffg (from the default) on GPU(s) 1 at" in out.stdout, out
    assert "default clocks" not in out.stderr, out
    assert [h["slurm_job_id"] for h in c.call("status")["holds"]] == [77], out
