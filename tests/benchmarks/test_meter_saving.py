"""benchmarks/meter_saving.py: a tuned job's measured saving and energy on a simulated meter, against the truth."""

from benchmarks.meter_saving import run_job
from benchmarks.tuner_curves import Curve

LEVELS = tuple(300_000_000 + k * 100_000_000 for k in range(9))
# A U with its minimum 25% under the top level; steps of 50-90 ms.
CURVE = Curve("u", LEVELS, tuple(1.0 + 0.02 * (k - 3) ** 2 for k in range(9)),
              tuple(0.05 + 0.04 * (8 - k) / 8 for k in range(9)))


def test_the_measured_saving_and_the_jobs_energy_follow_the_truth_on_both_meters():
    for meter in ("nvml", "ina3221"):
        job = run_job(CURVE, meter, seed=3, job_steps=2000, rule_name="time", settle=True)
        assert job["true"] > 0.2 and job["tuned_steps"] > 500, job
        assert abs(job["measured"] - job["true"]) < 0.06, job  # one baseline window: a few points at most here
        assert abs(job["energy_err"]) < 0.02, job
        # The whole job charges the baseline's steps at the top level, 25% above the minimum: more than their cost
        # against the pick, and a few percent of the job at most.
        assert job["baseline_cost"] < job["whole_job"] < 0.08, job
