"""The power mode's cap (nvpmodel's max_freq) is respected: no pin above the max found before the first pin."""

from governor.sim.tree import replace_file
from governor.sysfs import Root
from tests.support.daemon import DEVFREQ, FEATURES, limits
from tests.support.faults import limits_now
from tests.support.fswatch import Watch

MODE_30W_MAX_HZ = 612_000_000  # AGX Orin MODE_30W caps the GPU here


def capped_tree(orin):
    (orin / DEVFREQ / "max_freq").write_text(f"{MODE_30W_MAX_HZ}\n")
    return orin


def test_a_pick_above_the_power_modes_cap_is_pinned_at_the_cap(orin, start_daemon):
    d = start_daemon(root=capped_tree(orin))
    c = d.client()
    res = c.call("register", **FEATURES)  # the paper's tree picks 714 MHz for this job
    assert res["freq_hz"] == MODE_30W_MAX_HZ and "capped by the power mode at 612 MHz" in res["reason"]
    assert limits(orin) == (MODE_30W_MAX_HZ, MODE_30W_MAX_HZ)
    assert "capped by the power mode at 612 MHz instead of 714 MHz" in d.log()
    assert c.call("predict", **FEATURES)["freq_hz"] == MODE_30W_MAX_HZ  # what it would pin says the same
    c.call("unregister", job_id=res["job_id"])
    d.wait_status(lambda m: "at baseline" in m)
    assert limits(orin) == (306_000_000, MODE_30W_MAX_HZ)


def test_a_pick_under_the_cap_is_left_alone(orin, start_daemon):
    d = start_daemon(root=capped_tree(orin))
    res = d.client().call("register", **{**FEATURES, "seq_len": 80.0, "num_layers": 4})
    assert res["freq_hz"] <= MODE_30W_MAX_HZ and "capped" not in res["reason"]


def test_the_config_may_allow_pinning_above_the_cap(orin, start_daemon):
    d = start_daemon(root=capped_tree(orin), config={"pin_above_power_mode": True})
    c = d.client()  # held: closing the connection would end the job
    res = c.call("register", **FEATURES)
    assert res["freq_hz"] == 714_000_000 and "capped" not in res["reason"]
    assert limits(orin) == (714_000_000, 714_000_000)


def test_a_power_mode_lowered_under_a_pin_caps_it_and_is_what_the_end_restores(orin, start_daemon):
    d = start_daemon(config={"on_external_change": "reapply", "sample_interval_s": 0.05})
    node = (orin / DEVFREQ).resolve()
    c = d.client()
    assert c.call("register", **FEATURES)["freq_hz"] == 714_000_000  # MAXN: no cap
    watch = Watch(node)
    try:
        # nvpmodel -m <MODE_30W> under the pin: GPU MIN_FREQ 0 / MAX_FREQ 612 MHz (a plain file keeps the raw values).
        # each in one step, as the kernel's attributes change: the daemon's tick reads them meanwhile
        replace_file(Root(orin), node / "max_freq", f"{MODE_30W_MAX_HZ}\n")
        replace_file(Root(orin), node / "min_freq", "0\n")
        watch.wait(lambda: limits_now(orin) == (MODE_30W_MAX_HZ, MODE_30W_MAX_HZ), 10)  # re-pinned, under the new cap
    finally:
        watch.close()
    log = d.log()
    assert "limits changed under our pin" in log and "714 MHz is above the power mode's cap 612 MHz" in log
    assert c.call("register", **FEATURES)["freq_hz"] == MODE_30W_MAX_HZ  # a new job: the new mode's cap
    c.close()
    d.wait_jobs(0)
    assert limits(orin) == (0, MODE_30W_MAX_HZ)  # the new mode's limits are restored, not MAXN's
