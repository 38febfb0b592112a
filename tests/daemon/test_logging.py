"""The daemon's log: a decision's line is out before the hardware access it leads to, and every daemon-side logger
(the NVML backend's included) goes through the daemon's handler."""

import json
import os
from pathlib import Path

from tests.support.daemon import DEVFREQ, FEATURES, REPO

FAKE_NVML = Path(__file__).resolve().parents[1] / "support" / "fakenvml"


def test_the_decision_line_is_written_before_a_hardware_access_that_hangs(orin, start_daemon):
    """A hardware access that hangs must not take the decision's line with it. The daemon opens sysfs attributes
    non-blocking and refuses what is not a regular file, so a FIFO in place of max_freq is refused rather than waited
    on; what this checks is that the decision was logged before that access. (Waiting for the daemon to open the
    FIFO raced with it: it opens and closes it at once, and a writer that comes later waits for ever.)"""
    d = start_daemon()
    max_freq = orin / DEVFREQ / "max_freq"
    max_freq.unlink()
    os.mkfifo(max_freq)
    held = os.open(max_freq, os.O_RDWR)  # a FIFO with both ends open: whoever opens it next never waits
    try:
        c = d.client()
        reply = c.request("register", **FEATURES)
        assert "not a regular file" in reply["error"]["message"], reply
        log = d.log()
        assert "-> mlg 714 MHz" in log, log
        assert log.index("-> mlg 714 MHz") < log.index("not a regular file"), log
    finally:
        os.close(held)


def test_the_nvml_backends_lines_go_through_the_daemons_handler(start_daemon, tmp_path):
    spec = tmp_path / "fakenvml.json"
    spec.write_text(json.dumps({"gpus": [{}, {"lost": True}]}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), str(REPO)])}
    d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml"}, env=env)
    assert [g["id"] for g in d.client().call("status")["gpus"]] == ["0"]
    # The daemon's format ("... ftgovd WARNING ..."), not Python's bare last-resort line.
    assert "ftgovd WARNING skipping GPU 1: " in d.log()
