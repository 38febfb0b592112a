"""Observe mode measures what tune would: the tuner's windows, read-only, at the job's unchanged clock
(governor/daemon/observing.py), against the simulated board."""

from __future__ import annotations

from governor.daemon.observing import INFO_EVERY, INFO_FIRST, KEPT, successive_spread
from governor.sim import job as simjob
from governor.sim.energy import Workload
from governor.store import measurements as store
from governor.sysfs import Root
from tests.support.daemon import FEATURES, ProgressJob, limits

BERT_BASE = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
WORKLOAD = Workload(name="bert-base", **BERT_BASE)


def test_an_observed_job_gets_the_tuners_windows_and_no_pin(start_daemon):
    d = start_daemon(simulate=True, config={"policy": "observe", "tuner": {
        "window_rule": "time", "window_min_s": 0.3, "window_max_s": 0.6, "window_min_updates": 1}})
    c = d.client()
    root = Root(d.state_dir / "sim-orin")
    before = limits(d.state_dir / "sim-orin")
    res = c.call("register", gpu_util=80.0, **BERT_BASE)
    assert res["freq_hz"] is None
    simjob.run(root, ProgressJob(c, res["job_id"]), WORKLOAD, 120, time_scale=0.15)
    status = c.call("status")
    observed = status["jobs"][0]["tuner"]
    assert status["gpus"][0]["pinned_hz"] is None and limits(d.state_dir / "sim-orin") == before  # no pin, ever
    c.call("unregister", job_id=res["job_id"])
    assert observed["mode"] == "observe" and observed["rule"] == "time" and observed["windows"] >= 2, observed
    window = observed["last_window"]
    assert 0.3 <= window["seconds"] <= 0.6 + 0.2 and window["steps"] >= 2, window
    assert observed["spread_rel"] is not None and 0 <= observed["spread_rel"] < 0.5, observed
    assert "observe window 2:" in d.log()
    d.stop()
    conn = store.open_read_only(d.state_dir / "measurements.sqlite")  # --simulate keeps its store beside its tree
    try:
        rows = conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0]
    finally:
        conn.close()
    assert rows >= 2  # recorded as windows at no pinned level: a board's curves leave them out


def test_an_observed_job_records_no_saving(start_daemon):
    """Observe pins nothing: its windows are all at the default governor, so there is no saving to measure. The store
    said 0.0% against the default governor (its windows against themselves), and report's mean saving of a workload
    averaged that 0 into the tuned jobs' savings: an operator who observed before tuning, as observe is meant for,
    read a smaller saving than tune measured."""
    d = start_daemon(simulate=True, config={"policy": "observe", "tuner": {
        "window_rule": "steps", "window_steps": 2, "warmup_steps": 0}})
    c = d.client()
    res = c.call("register", gpu_util=80.0, **BERT_BASE)
    simjob.run(Root(d.state_dir / "sim-orin"), ProgressJob(c, res["job_id"]), WORKLOAD, 40, time_scale=0.3)
    assert c.call("status")["jobs"][0]["tuner"]["windows"] >= 2
    c.call("unregister", job_id=res["job_id"])
    d.stop()
    conn = store.open_read_only(d.state_dir / "measurements.sqlite")
    try:
        job, = store.read_jobs(conn)
    finally:
        conn.close()
    assert len(job.windows) >= 2 and all(w.level_hz is None for w in job.windows)
    assert (job.saved_rel, job.saved_basis) == (None, None)


def test_the_spread_of_successive_windows():
    assert successive_spread([1.0]) is None
    assert successive_spread([1.0, 1.0, 1.0]) == 0.0
    # Alternating +-1% about 1: differences of 2%, over sqrt(2): 1.41%.
    assert abs(successive_spread([1.01, 0.99, 1.01, 0.99]) - 0.02 / 2 ** 0.5) < 1e-9


def test_a_long_observed_jobs_windows_are_counted_past_those_kept(start_daemon):
    """A job keeps its last KEPT windows (64) for the store: its 65th window and every one after it were logged as
    "observe window 64", and status said 64 windows, for the rest of the job."""
    d = start_daemon(simulate=True, config={"policy": "observe", "tuner": {
        "window_rule": "steps", "window_steps": 1, "warmup_steps": 0}})
    c = d.client()
    res = c.call("register", gpu_util=80.0, **BERT_BASE)
    simjob.run(Root(d.state_dir / "sim-orin"), ProgressJob(c, res["job_id"]), WORKLOAD, 2 * KEPT + 20,
               time_scale=0.3)
    observed = c.call("status")["jobs"][0]["tuner"]
    assert observed["windows"] > KEPT + 5, observed
    assert f"observe window {KEPT + 5}:" in d.log()


def test_a_long_observed_job_logs_its_first_windows_then_one_in_sixty_at_info(start_daemon):
    """An operator's journal (log_level info) gets the first windows and then one in INFO_EVERY, not a line a window
    for as long as the job is observed; status counts every window."""
    d = start_daemon(simulate=True, log_level="info", config={"policy": "observe", "tuner": {
        "window_rule": "steps", "window_steps": 1, "warmup_steps": 0}})
    c = d.client()
    res = c.call("register", gpu_util=80.0, **BERT_BASE)
    simjob.run(Root(d.state_dir / "sim-orin"), ProgressJob(c, res["job_id"]), WORKLOAD, 4 * INFO_EVERY + 20,
               time_scale=0.3)
    closed = c.call("status")["jobs"][0]["tuner"]["windows"]
    assert closed >= 2 * INFO_EVERY, closed
    logged = [n for n in range(1, closed + 1) if f"observe window {n}:" in d.log()]
    assert logged == [*range(1, INFO_FIRST + 1), *range(INFO_EVERY, closed + 1, INFO_EVERY)], logged
