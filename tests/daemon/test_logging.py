"""The daemon's log: a decision's line is out before the hardware access it leads to, and every daemon-side logger
(the NVML backend's included) goes through the daemon's handler."""

import json
import os
import threading
from pathlib import Path

from tests.support.daemon import DEVFREQ, FEATURES, REPO

FAKE_NVML = Path(__file__).resolve().parents[1] / "support" / "fakenvml"


def test_the_decision_line_is_written_before_a_hardware_access_that_hangs(orin, start_daemon):
    d = start_daemon()
    max_freq = orin / DEVFREQ / "max_freq"
    max_freq.unlink()
    os.mkfifo(max_freq)  # reading it blocks until a writer comes: a sysfs access that hangs
    c = d.client()
    c.send_raw((json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": FEATURES}) + "\n").encode())
    opened = []
    # Opening the FIFO for writing returns once the daemon has opened it for reading, i.e. it is now stuck there.
    opener = threading.Thread(target=lambda: opened.append(os.open(max_freq, os.O_WRONLY)), daemon=True)
    opener.start()
    opener.join(15)
    assert opened, "the daemon never reached the devfreq node"
    try:
        log = d.log_path.read_text()  # not d.log(): that pings the daemon, which is stuck
        assert "-> mlg 714 MHz" in log, log
    finally:
        os.close(opened[0])


def test_the_nvml_backends_lines_go_through_the_daemons_handler(start_daemon, tmp_path):
    spec = tmp_path / "fakenvml.json"
    spec.write_text(json.dumps({"gpus": [{}, {"lost": True}]}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), str(REPO)])}
    d = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml"}, env=env)
    assert [g["id"] for g in d.client().call("status")["gpus"]] == ["0"]
    # The daemon's format ("... ftgovd WARNING ..."), not Python's bare last-resort line.
    assert "ftgovd WARNING skipping GPU 1: " in d.log()
