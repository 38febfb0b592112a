"""One client cannot drive the pin (and a state-file fsync) a thousand times a second, nor flood the log."""

from __future__ import annotations

import json
import logging

from governor.daemon import ratelimit
from tests.support.daemon import DEVFREQ, FEATURES, limits
from tests.support.fswatch import Watch
from tests.support.security import BASELINE, open_to_members, run_as, state_dir_of


def test_alternating_updates_move_the_pin_about_once_a_second(orin, start_daemon):
    d = start_daemon()
    c = d.client()
    job = c.call("register", **FEATURES)["job_id"]
    pins_before = d.log().count("GPU 0 pinned to")
    for i in range(200):
        c.call("update", job_id=job, seq_len=80.0 if i % 2 == 0 else 40.0)
    c.call("update", job_id=job, seq_len=80.0)
    d.wait_status(lambda m: "pinned to 816 MHz" in m)  # the last word takes effect when its window ends
    assert limits(orin) == (816000000, 816000000)
    changes = d.log().count("GPU 0 pinned to") - pins_before
    assert 1 <= changes <= 4, f"{changes} pin changes for 201 updates"


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_coalescer_runs_the_latest_request_at_the_windows_end():
    clock, timers, ran = _Clock(), [], []
    co = ratelimit.Coalescer(lambda fn, delay: timers.append((delay, fn)), 1.0, clock)
    assert co.request("job", lambda: ran.append("a")) == 0.0 and ran == ["a"]
    clock.now += 0.25
    assert co.request("job", lambda: ran.append("b")) == 0.75
    assert co.request("job", lambda: ran.append("c")) == 0.75
    assert ran == ["a"] and len(timers) == 1, "one timer for the window, however many requests"
    clock.now += 0.75
    timers.pop()[1]()
    assert ran == ["a", "c"]
    assert co.request("other", lambda: ran.append("x")) == 0.0  # per key
    co.forget("job")
    assert co.request("job", lambda: ran.append("d")) == 0.0


def test_log_lines_are_bounded_per_uid_with_a_count_of_what_was_dropped():
    clock = _Clock()
    logger = logging.getLogger("ftgov-test-loglimit")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.handlers = [handler]
    ratelimit.install(logger, ratelimit.LogLimit(rate_per_s=10, burst=20, clock=clock))
    token = ratelimit.caused_by(1000)
    try:
        for i in range(500):
            logger.info("line %d", i)
        assert len(records) == 20
        clock.now += 1.0  # ten more tokens
        logger.info("after")
    finally:
        ratelimit.done(token)
    logger.info("not caused by a client")
    messages = [r.getMessage() for r in records]
    assert messages[20] == "480 log line(s) caused by uid 1000 suppressed (more than 10 a second)"
    assert messages[21:] == ["after", "not caused by a client"]


_CYCLES = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile()
features = json.loads(sys.argv[2])
refused = 0
for i in range(int(sys.argv[3])):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": features}).encode() + b"\\n")
    reply = json.loads(f.readline())
    if reply.get("error", {}).get("code") == -32002:  # limits.registrations_per_s
        refused += 1
        continue
    job = reply["result"]["job_id"]
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "unregister", "params": {"job_id": job}}).encode()
              + b"\\n")
    assert "result" in json.loads(f.readline())
print("done", refused, flush=True)
"""

# Registrations are bounded too (limits.registrations_per_s): set high where the log's own bound is what is tested.
MANY_REGISTRATIONS = {"limits": {"registrations_per_s": 1000.0, "registration_burst": 1000}}


def test_a_member_cannot_flood_the_daemons_log(orin, start_daemon, member):
    user, uid = member
    d = start_daemon(config=MANY_REGISTRATIONS)
    open_to_members(d)
    proc = run_as(user, _CYCLES, d.socket, json.dumps(FEATURES), "150")
    out, err = proc.communicate(timeout=60)
    assert out.strip() == "done 0", err
    d.client().call("register", **FEATURES)  # root's lines always pass
    log = d.log()
    lines = sum(log.count(s) for s in ("-> mlg 714 MHz", "GPU 0 pinned to", "restored to its baseline",
                                        "ended (unregistered)"))
    # Four lines a cycle, 600 unbounded; the bucket passes 50 at once and 10 a second after that.
    assert lines < 300, f"{lines} lines about this member's jobs"
    assert f"caused by uid {uid} suppressed" in log


_PIN_CHECKS = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile()
for i in range(int(sys.argv[2])):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": "pin_check", "params": {}}).encode() + b"\\n")
    print(f.readline(), end="", flush=True)
"""


def test_a_member_gets_one_pin_check_a_second(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    out, err = run_as(user, _PIN_CHECKS, d.socket, "20").communicate(timeout=60)
    replies = [json.loads(line) for line in out.splitlines()]
    assert len(replies) == 20, err
    checked = [r for r in replies if "result" in r]
    refused = [r for r in replies if r.get("error", {}).get("code") == -32002]
    assert 1 <= len(checked) <= 2 and len(checked) + len(refused) == 20, replies  # 20 asked within a second or two
    assert "one a second" in refused[0]["error"]["message"]
    assert checked[0]["result"]["gpus"][0]["ok"] and limits(orin) == BASELINE
    root = d.client()
    assert all(root.call("pin_check")["gpus"][0]["ok"] for _ in range(3))  # root is not limited


_CLOSE_CYCLES = """
import json, socket, sys
features = json.loads(sys.argv[2])
for i in range(int(sys.argv[3])):
    s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": features}).encode() + b"\\n")
    assert "result" in json.loads(s.makefile().readline())
    s.close()  # the job ends with its connection
print("done", flush=True)
"""


def test_jobs_ended_by_a_closed_connection_log_on_their_clients_budget(orin, start_daemon, member):
    user, uid = member
    d = start_daemon(config=MANY_REGISTRATIONS)
    open_to_members(d)
    out, err = run_as(user, _CLOSE_CYCLES, d.socket, json.dumps(FEATURES), "150").communicate(timeout=120)
    assert out.strip() == "done", err
    d.client().call("ping")  # the last connection's end has been handled before root's reply
    log = d.log()
    ends = log.count("ended (connection closed)") + log.count("restored to its baseline")
    assert ends < 150, f"{ends} lines about this member's ends (300 unbounded)"
    assert f"caused by uid {uid} suppressed" in log


_PHASES = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile()
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "register", "params": json.loads(sys.argv[2])}).encode()
          + b"\\n")
job = json.loads(f.readline())["result"]["job_id"]
for i in range(int(sys.argv[3])):  # notifications: no reply, so no back-pressure
    phase = "checkpoint" if i % 2 == 0 else "train"
    s.sendall(json.dumps({"jsonrpc": "2.0", "method": "progress",
                          "params": {"job_id": job, "steps": i + 1, "phase": phase}}).encode() + b"\\n")
s.sendall(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode() + b"\\n")
assert "result" in json.loads(f.readline())
print("done", flush=True)
s.close()
"""


def test_alternating_phases_move_the_pin_about_once_a_second(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon()
    open_to_members(d)
    watch = Watch((orin / DEVFREQ).resolve())  # the writes themselves: the log of a member's pins is rate-limited
    try:
        out, err = run_as(user, _PHASES, d.socket, json.dumps(FEATURES), "2000").communicate(timeout=120)
        assert out.strip() == "done", err
        writes = sum(1 for name, what in watch.drain() if name == "max_freq" and what == "close_write")
    finally:
        watch.close()
    # One pin for the registration, then a checkpoint/train flip applied at most about once a second.
    assert writes <= 10, f"{writes} pin writes for 2,000 phase reports"


def test_a_member_registers_a_bounded_number_of_jobs_a_second(orin, start_daemon, member):
    user, _uid = member
    d = start_daemon(config={"limits": {"registrations_per_s": 2.0, "registration_burst": 5}})
    open_to_members(d)
    out, err = run_as(user, _CYCLES, d.socket, json.dumps(FEATURES), "40").communicate(timeout=60)
    done, refused = out.split()
    # 5 at once, then about 2 a second: the 40 registrations take a second or two, however slow the machine.
    assert done == "done" and 5 <= 40 - int(refused) <= 20, (out, err)
    assert limits(orin) == BASELINE
    root = d.client()
    for _ in range(10):  # root is not limited
        root.call("unregister", job_id=root.call("register", **FEATURES)["job_id"])


_TUNED = """
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
f = s.makefile()
def call(method, **params):
    s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode() + b"\\n")
    return json.loads(f.readline())
began = time.monotonic()
deadline, jobs, probes = began + float(sys.argv[3]), 0, 0
while time.monotonic() < deadline:  # tuned jobs one after another, each reporting steps as fast as it can
    reply = call("register", **json.loads(sys.argv[2]), tune=True)
    if "error" in reply:  # limits.registrations_per_s
        break
    job, steps, jobs = reply["result"]["job_id"], 0, jobs + 1
    while time.monotonic() < deadline:
        for _ in range(50):  # notifications: no reply, so no back-pressure
            steps += 1
            s.sendall(json.dumps({"jsonrpc": "2.0", "method": "progress",
                                  "params": {"job_id": job, "steps": steps}}).encode() + b"\\n")
        tuner = call("status")["result"]["jobs"][0]["tuner"]
        if tuner["converged"]:
            break
    probes += tuner["probes"]
    call("unregister", job_id=job)
print(json.dumps({"elapsed_s": time.monotonic() - began, "jobs": jobs, "probes": probes}), flush=True)
"""


def test_a_members_tuner_probes_move_the_pin_about_once_a_second(orin, start_daemon, member):
    """A window of one step closes at every report: each probe was a pin write and a state save at the rate the
    member reports steps. Probes share the GPU's re-pin window with phases: about one a second."""
    user, _uid = member
    d = start_daemon(config={"tuner": {"window_steps": 1, "warmup_steps": 0, "baseline_window": False}})
    open_to_members(d)
    watch = Watch((orin / DEVFREQ).resolve(), state_dir_of(d))
    try:
        out, err = run_as(user, _TUNED, d.socket, json.dumps(FEATURES), "3").communicate(timeout=120)
        writes = sum(1 for name, what in watch.drain() if name == "max_freq" and what == "close_write")
        saves = sum(1 for name, what in watch.events if name == "state.json" and what == "moved_to")
    finally:
        watch.close()
    run = json.loads(out or err)
    # Each job's registration and end move the pin at once (bounded by limits.registrations_per_s); its probes
    # about once a second.
    allowed = 2 * run["jobs"] + 1.5 * run["elapsed_s"] + 1
    assert writes <= allowed, f"{writes} pin writes in {run['elapsed_s']:.2f} s: {run}"
    assert saves <= 2 * allowed, f"{saves} state saves in {run['elapsed_s']:.2f} s: {run}"
    print(f"{writes} pin writes, {saves} state saves in {run['elapsed_s']:.2f} s: {run}")


def test_a_tuner_move_within_the_window_waits_for_it_and_its_windows_wait_for_the_pin(tmp_path):
    from governor.daemon.controller import Controller
    from governor.daemon.settings import PinSettings
    from governor.policy import Policy, PolicyName
    from governor.store.state import StateFile
    from tests.daemon.test_controller import ENCODER, FakeGpu

    timers, clock = [], _Clock()
    gpu = FakeGpu()
    def defer(fn, delay_s):
        timers.append(fn)

    pins = Controller([gpu], PinSettings(Policy(PolicyName.FFG, 714_000_000, None)), StateFile(tmp_path / "state"),
                      "boot-1", defer=defer)
    pins.phase_repins = ratelimit.Coalescer(defer, 1.0, clock)
    job = pins.admit(pid=100, start_ticks=5100, uid=1000, name=None, gpu_id="0", features=ENCODER)
    pins.decide(job)
    pins.set_freq(job, 612_000_000, "tune: probing")  # the first move in the window: at once
    pins.set_freq(job, 918_000_000, "tune: probing")  # within it: waits
    pins.set_freq(job, 306_000_000, "tune: probing")  # replaces the one waiting
    assert gpu.writes == [714_000_000, 612_000_000] and pins.repin_pending("0")
    clock.now += 1.0
    while timers:
        timers.pop(0)()
    assert gpu.writes[-1] == 306_000_000 and not pins.repin_pending("0")
