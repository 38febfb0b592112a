"""A board whose GPU devfreq node never appears: ready with no GPU, clear errors, and a later probe that finds it."""

from governor.sim import tree
from tests.support.daemon import FEATURES


def test_no_gpu_node_means_ready_without_a_gpu_then_governing_once_it_appears(tmp_path, start_daemon):
    root = tmp_path / "headless"
    root.mkdir()
    d = start_daemon(root=root, config={"node_wait_s": 0.3, "probe_retry_s": 0.2})  # waits for READY=1
    d.wait_status(lambda m: "no devfreq class" in m and "waited 0.3 s" in m)  # the wait is over
    assert "no GPU to govern" in d.log() and "probing again every 0.2 s" in d.log()
    assert "`ftgovd --simulate` runs on a simulated Orin" in d.log()  # a first try on a machine without either
    c = d.client()
    status = c.call("status")
    assert status["gpus"] == [] and "no devfreq class" in status["gpu_missing"]
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "no GPU to govern yet" in err["message"] and "default clocks" in err["message"]
    assert "probes again every 0.2 s" in err["message"]
    assert d.proc.poll() is None  # not exited, so no restart loop

    tree.build(root, "jp6")  # the GPU powers up (rail-gating off): the next probe finds it
    d.wait_status(lambda m: "GPU 0 at baseline" in m)
    assert c.call("status")["gpu_missing"] is None
    assert c.call("register", **FEATURES)["freq_hz"] == 714_000_000


def test_the_socket_answers_at_once_while_the_gpu_node_is_awaited(tmp_path, start_daemon):
    # A daemon that waited before listening looked "not running" to every client for up to node_wait_s (120 s).
    root = tmp_path / "booting"
    root.mkdir()
    d = start_daemon(root=root, config={"node_wait_s": 600, "probe_retry_s": 0.2})
    ready = next(m for m in d.notify.messages if "READY=1" in m)
    assert "waiting for the GPU node" in ready  # STATUS= with READY=1
    c = d.client()
    status = c.call("status")
    assert status["gpus"] == [] and status["gpu_missing"].startswith("waiting for the GPU node: no devfreq class")
    err = c.request("register", **FEATURES)["error"]
    assert err["code"] == -32000 and "waiting for the GPU node" in err["message"]
    assert "waits for it up to 600 s after its start" in err["message"] and "default clocks" in err["message"]

    tree.build(root, "jp6")  # the node appears during the wait: governed from the next probe
    d.wait_status(lambda m: "GPU 0 at baseline" in m)
    assert c.call("register", **FEATURES)["freq_hz"] == 714_000_000
