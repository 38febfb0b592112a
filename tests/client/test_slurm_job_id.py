"""The client names the Slurm job it runs in (SLURM_JOB_ID), so that its registration joins the prolog's hold."""

from governor.client.features import slurm_job_id


def test_slurm_job_id_from_the_environment():
    assert slurm_job_id({"SLURM_JOB_ID": "1234"}) == 1234
    assert slurm_job_id({}) is None
    assert slurm_job_id({"SLURM_JOB_ID": "12a"}) is None
    assert slurm_job_id({"SLURM_JOB_ID": "0"}) is None
    assert slurm_job_id({"SLURM_JOB_ID": "٣"}) is None  # a digit to str.isdigit, not a job id
