"""gpu_util is measured while the job trains, not when it registers (when the GPU idles while the job sets up)."""

from governor.store import measurements as store
from tests.support.daemon import FEATURES, limits
from tests.support.fswatch import IN_CLOSE_NOWRITE, Watch

LOAD = "sys/devices/platform/bus@0/17000000.gpu/load"  # per mille
STRUCTURE = {k: v for k, v in FEATURES.items() if k != "gpu_util"}  # BERT-base: the tree tests gpu_util for it


def set_load(orin, pct: float) -> None:
    (orin / LOAD).write_text(f"{round(pct * 10)}\n")


def test_the_load_is_sampled_from_the_first_training_step_not_at_registration(orin, start_daemon):
    set_load(orin, 9.3)  # the Trainer is still setting up: the GPU idles
    d = start_daemon()
    c = d.client()
    res = c.call("register", **STRUCTURE)
    assert res["freq_hz"] is None and res["gpu_util"] is None and "waiting for gpu_util" in res["reason"]
    assert limits(orin) == (306_000_000, 1_300_500_000)  # the default governor runs while it waits
    set_load(orin, 60.0)  # the training loop runs
    c.notify("progress", job_id=res["job_id"], steps=1, phase="train")
    d.wait_status(lambda m: "pinned to 714 MHz" in m)  # gpu_util 60 > 22 (9.3% would have meant 1020 MHz)
    job = c.call("status")["jobs"][0]
    assert job["features"]["gpu_util"] == 60.0 and job["freq_hz"] == 714_000_000
    assert "measured while the job trains: 60.0%" in job["reason"] and "from training step 1" in job["reason"]
    assert "gpu_util measured while the job trains: 60.0%" in d.log()


def test_a_job_without_progress_reports_is_sampled_after_the_settling_delay(orin, start_daemon):
    set_load(orin, 0.0)  # `ftgov run`: the child has not started
    d = start_daemon(config={"util_settle_s": 0.5})
    c = d.client()
    job_id = c.call("register", **STRUCTURE)["job_id"]
    set_load(orin, 80.0)
    d.wait_status(lambda m: "pinned to 714 MHz" in m)
    job = c.call("status")["jobs"][0]
    assert job["job_id"] == job_id and job["features"]["gpu_util"] == 80.0
    assert "with no progress reports, after the settling delay" in job["reason"]


def test_a_job_without_progress_still_setting_up_after_the_delay_is_measured_once_its_loop_runs(orin, start_daemon):
    # A real script under `ftgov run` can still be importing torch and initializing CUDA when the settling delay
    # ends (on an H200 the load read 0% there, and 78% once the loop ran): a window under util_active_pct is not
    # the loop's load, so sampling goes on.
    set_load(orin, 0.0)
    d = start_daemon(config={"util_settle_s": 0.05, "util_sample_s": 0.1})
    watch = Watch((orin / LOAD).parent, mask=IN_CLOSE_NOWRITE)
    c = d.client()
    job_id = c.call("register", **STRUCTURE)["job_id"]
    watch.wait(lambda: sum(1 for name, _ in watch.events if name == "load") >= 8)  # several idle windows read
    job = c.call("status")["jobs"][0]
    assert job["job_id"] == job_id and job["freq_hz"] is None and job["features"]["gpu_util"] is None
    set_load(orin, 80.0)
    d.wait_status(lambda m: "pinned to 714 MHz" in m)  # 0% would have meant 1020 MHz
    job = c.call("status")["jobs"][0]
    assert job["features"]["gpu_util"] == 80.0 and "with no progress reports" in job["reason"]
    watch.close()


def test_a_job_whose_load_never_rises_is_decided_on_it_after_util_settle_max_s(orin, start_daemon):
    set_load(orin, 3.0)
    d = start_daemon(config={"util_settle_s": 0.05, "util_sample_s": 0.1, "util_settle_max_s": 0.3})
    c = d.client()
    c.call("register", **STRUCTURE)
    d.wait_status(lambda m: "pinned to 1020 MHz" in m)  # gpu_util 3 <= 22
    job = c.call("status")["jobs"][0]
    assert job["features"]["gpu_util"] == 3.0 and "stayed under 10%" in job["reason"]


def test_a_decision_that_does_not_test_gpu_util_is_made_at_once(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    res = c.call("register", **{**STRUCTURE, "num_layers": 4})  # the tree's num_layers <= 7 side tests seq_len only
    assert res["freq_hz"] == 612_000_000 and res["gpu_util"] is None
    assert c.call("status")["jobs"][0]["features"]["gpu_util"] is None


def test_a_job_that_ends_while_waiting_is_not_measured_later(orin, start_daemon):
    set_load(orin, 60.0)
    d = start_daemon(config={"util_settle_s": 0.3})
    c = d.client()
    first = c.call("register", **STRUCTURE)["job_id"]
    assert c.call("unregister", job_id=first)["freq_hz"] is None
    held = d.client()  # the second job's connection, kept open: closing it would end the job
    second = held.call("register", **STRUCTURE)["job_id"]
    d.wait_status(lambda m: "pinned to 714 MHz" in m)  # the second job's delay ran out, so the first's did too
    measured = [line for line in d.log().splitlines() if "gpu_util measured" in line]
    assert measured and all(f"job {second} " in line for line in measured), measured
    assert [j["job_id"] for j in held.call("status")["jobs"]] == [second]


def test_windows_shorter_than_a_read_still_yield_to_the_loop(orin, start_daemon):
    # util_sample_s: 0 makes each window one read; the windows that follow one another while the load stays low
    # must be scheduled, not nested (nesting hit the recursion limit and left the job undecided).
    set_load(orin, 3.0)
    d = start_daemon(config={"util_settle_s": 0.05, "util_sample_s": 0, "util_settle_max_s": 1.0})
    c = d.client()
    c.call("register", **STRUCTURE)
    d.wait_status(lambda m: "pinned to 1020 MHz" in m)
    assert c.call("status")["jobs"][0]["features"]["gpu_util"] == 3.0


def test_predict_samples_the_load_only_when_the_decision_depends_on_it(orin, start_daemon):
    set_load(orin, 9.3)
    d = start_daemon(config={"policy": "ffg"})
    res = d.client().call("predict", **STRUCTURE)  # a fixed frequency: no tree path, no gpu_util
    assert res["policy"] == "ffg" and "gpu_util" not in res["reason"]
    d.stop()
    d = start_daemon()
    res = d.client().call("predict", **STRUCTURE)  # the tree tests gpu_util for BERT-base: the load now is used
    assert "gpu_util measured from the GPU's load: 9.3%" in res["reason"]


def test_a_job_decided_without_gpu_util_still_has_its_load_measured_and_shown(orin, start_daemon, tmp_path):
    # FFG decides without gpu_util; status and the store used to show gpu_util null for such a job all its life.
    set_load(orin, 55.0)
    db = tmp_path / "measurements.sqlite"
    d = start_daemon(config={"policy": "ffg", "ffg_freq_hz": 816_000_000, "store": {"path": str(db)}})
    c = d.client()
    res = c.call("register", **STRUCTURE)
    assert res["freq_hz"] == 816_000_000 and res["gpu_util"] is None  # decided at once, as before
    watch = Watch((orin / LOAD).parent, mask=IN_CLOSE_NOWRITE)
    try:
        c.notify("progress", job_id=res["job_id"], steps=1, phase="train")  # its loop runs: measure from here
        # Checked after each read of the load file: the measurement ends in the loop turn of its last read.
        watch.wait(lambda: c.call("status")["jobs"][0]["features"]["gpu_util"] is not None)
    finally:
        watch.close()
    job = c.call("status")["jobs"][0]
    assert job["features"]["gpu_util"] == 55.0
    assert job["freq_hz"] == 816_000_000 and job["reason"] == res["reason"]  # the decision stands
    assert "gpu_util measured while the job trains: 55.0%" in d.log()
    assert "at the pin of 816 MHz; recorded only: the job's decision did not test gpu_util" in d.log()
    c.call("unregister", job_id=res["job_id"])
    d.stop()  # the store's writer commits what is queued before the daemon exits
    (stored,) = store.read_jobs(store.open_read_only(db))
    assert stored.gpu_util == 55.0 and stored.freq_hz == 816_000_000
