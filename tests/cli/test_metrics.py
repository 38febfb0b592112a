"""Prometheus exposition of the real daemon's status: the node_exporter textfile and the loopback HTTP endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest

import governor
from governor.cli import main
from governor.cli.metrics import families
from governor.client import Connection
from tests.support import FAKENVML_DIR
from tests.support.daemon import FEATURES, REPO
from tests.support.fswatch import Watch

prometheus_parser = pytest.importorskip("prometheus_client.parser")



def parse(text: str) -> dict:
    """{(name, frozenset(labels)): value} for every sample in an exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in prometheus_parser.text_string_to_metric_families(text) for s in fam.samples}


def test_textfile_carries_jobs_pin_load_power_energy_and_savings(start_daemon, tmp_path):
    daemon = start_daemon(simulate=True)
    prom = tmp_path / "ftgov.prom"
    with governor.job(model_type="encoder", num_layers=12, hidden_size=768, seq_len=40, gpu_util=60, name="bert",
                      socket=daemon.socket) as job:
        job.step(30)
        assert main(["metrics", "--textfile", str(prom), "--once", "--job-names", "--socket", daemon.socket]) == 0
        with Connection(daemon.socket) as conn:
            status = conn.call("status")
    samples = parse(prom.read_text())
    pin = job.registration["freq_hz"]
    labels = {("job_id", str(job.job_id)), ("job_name", "bert"), ("gpu", "0")}
    assert samples[("ftgov_up", frozenset())] == 1
    assert samples[("ftgov_jobs_active", frozenset())] == 1
    assert samples[("ftgov_gpu_pinned_frequency_hertz", frozenset({("gpu", "0")}))] == pin
    assert samples[("ftgov_job_frequency_hertz", frozenset(labels | {("policy", "mlg")}))] == pin
    assert samples[("ftgov_job_steps", frozenset(labels))] == 30
    assert samples[("ftgov_job_energy_joules", frozenset(labels))] >= 0
    assert samples[("ftgov_gpu_load_ratio", frozenset({("gpu", "0")}))] == status["gpus"][0]["load_pct"] / 100
    for rail, mw in status["power_mw"].items():
        assert samples[("ftgov_rail_power_watts", frozenset({("rail", rail)}))] == pytest.approx(mw / 1000)
    ratio = samples[("ftgov_job_energy_savings_ratio_estimate", frozenset(labels))]
    assert 0 < ratio < 0.5, "the energy model puts BERT-base at its MLG pick below MAXN (paper: 13% on average)"
    energy_j = samples[("ftgov_job_energy_joules", frozenset(labels))]
    saved_j = samples[("ftgov_job_energy_saved_joules_estimate", frozenset(labels))]
    assert saved_j == pytest.approx(energy_j * ratio / (1 - ratio))
    assert not list(tmp_path.glob("ftgov.prom.*")), "written through a temporary file renamed into place"


def test_daemon_down_is_up_zero(tmp_path):
    prom = tmp_path / "ftgov.prom"
    assert main(["metrics", "--textfile", str(prom), "--once", "--socket", str(tmp_path / "none.sock")]) == 0
    assert parse(prom.read_text()) == {("ftgov_up", frozenset()): 0}


def test_once_with_a_port_is_a_usage_error_not_a_server_for_ever(tmp_path):
    """--once was ignored with --port: a timer's one-shot run served the port until it was killed (here: until the
    timeout fails the test)."""
    done = subprocess.run([sys.executable, "-m", "governor.cli", "metrics", "--port", "0", "--once", "--socket",
                           str(tmp_path / "none.sock")], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (2, "ftgov metrics: --once goes with --textfile: with --port the metrics "
                                                 "are served until ftgov metrics is stopped\n")


def serve_metrics(daemon, *args: str, host: str = r"127\.0\.0\.1") -> tuple[subprocess.Popen, re.Match]:
    """`ftgov metrics --port 0` for the daemon, with ``args``: the process, and the URL its first line says it serves
    (group 1: the port). The caller stops the process."""
    proc = subprocess.Popen([sys.executable, "-m", "governor.cli", "metrics", "--port", "0", "--socket", daemon.socket,
                             *args], env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    url = re.search(rf"http://{host}:(\d+)/metrics", line)
    if url is None:
        proc.kill()
    assert url, line
    return proc, url


def test_http_endpoint_on_loopback(start_daemon):
    daemon = start_daemon()
    proc, url = serve_metrics(daemon)
    try:
        with urllib.request.urlopen(url.group(0), timeout=30) as reply:
            samples = parse(reply.read().decode())
        assert samples[("ftgov_up", frozenset())] == 1
        assert samples[("ftgov_jobs_active", frozenset())] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_http_endpoint_on_ipv6_loopback_prints_a_url_that_works(start_daemon):
    """An IPv6 address goes in brackets in a URL (RFC 3986): http://::1:PORT/metrics is no URL to paste anywhere."""
    daemon = start_daemon()
    proc, url = serve_metrics(daemon, "--address", "::1", host=r"\[::1\]")
    try:
        with urllib.request.urlopen(url.group(0), timeout=30) as reply:
            assert parse(reply.read().decode())[("ftgov_up", frozenset())] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_http_endpoint_holds_a_bounded_number_of_connections(start_daemon):
    """The exporter runs as root and answers any local user: a connection that sends nothing must neither hold a
    thread for ever nor let connections multiply threads. With one slot, a silent connection holds it until its
    timeout closes it; only then is the next scrape answered."""
    daemon = start_daemon()
    proc, url = serve_metrics(daemon, "--max-connections", "1", "--timeout", "0.5")
    try:
        silent = socket.create_connection(("127.0.0.1", int(url.group(1))), timeout=30)
        with urllib.request.urlopen(url.group(0), timeout=30) as reply:  # queued behind the silent one
            assert parse(reply.read().decode())[("ftgov_up", frozenset())] == 1
        # The scrape was served only once the silent connection had been closed (its FIN came first).
        silent.setblocking(False)
        assert silent.recv(1) == b""
        silent.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_http_endpoint_frees_a_slot_a_trickling_connection_holds(start_daemon):
    """A connection that sends its request a byte at a time, each within the timeout, must not keep its slot for as
    long as it trickles: with every slot so held, any local user would stop the scrapes for good. The timeout bounds
    the whole exchange, so the next scrape is answered while the trickle goes on."""
    daemon = start_daemon()
    proc, url = serve_metrics(daemon, "--max-connections", "1", "--timeout", "1")
    stop = threading.Event()
    try:
        slow = socket.create_connection(("127.0.0.1", int(url.group(1))), timeout=30)

        def trickle() -> None:  # a byte of a request line that never ends, every tenth of the timeout
            try:
                while not stop.wait(0.1):
                    slow.sendall(b"G")
            except OSError:
                pass  # the exporter closed it

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        with urllib.request.urlopen(url.group(0), timeout=15) as reply:  # queued behind the trickling one
            assert parse(reply.read().decode())[("ftgov_up", frozenset())] == 1
        stop.set()
        sender.join(timeout=30)
        slow.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # A connection timed out is the client's doing: no traceback in root's journal for each one.
        assert "Traceback" not in proc.stderr.read()
    finally:
        stop.set()
        proc.kill()


def test_savings_estimate_from_an_estimator():
    status = {"jobs": [{"job_id": 1, "name": "a", "gpu": "0", "freq_hz": 612000000, "energy_j": 300.0,
                        "duration_s": 10.0, "steps": 5, "policy": "mlg"}], "gpus": [{"id": "0", "backend": "devfreq"}]}
    by_name = {f.name: f.samples for f in families(status, estimate=lambda job: 0.25)}
    assert by_name["ftgov_job_energy_savings_ratio_estimate"][0][1] == 0.25
    # 300 J at the pin, 25% below MAXN: MAXN would have taken 400 J.
    assert by_name["ftgov_job_energy_saved_joules_estimate"][0][1] == pytest.approx(100.0)
    assert by_name["ftgov_gpu_pinned_frequency_hertz"] == []


def test_store_totals_that_only_grow_are_counters():
    """The store's job count and energy only grow (they survive restarts and pruning): Prometheus counters, named
    `_total` (prometheus.io/docs/practices/naming/, /docs/concepts/metric_types/), so that rate() and increase() read
    them as such. The net saving can go down (a job that cost more than the default governor): a gauge."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from governor.cli.metrics import DaemonCollector

    collector = DaemonCollector(socket="/nonexistent")
    status = {"jobs": [], "gpus": [], "store": {"jobs": 3, "energy_j": 900.0, "saved_j": -12.5, "error": None}}
    registry = CollectorRegistry()
    registry.register(type("C", (), {"collect": lambda self: collector.gauges(status)})())
    fams = {f.name: f for f in prometheus_parser.text_string_to_metric_families(generate_latest(registry).decode())}
    assert fams["ftgov_jobs_recorded"].type == "counter"
    assert [(s.name, s.value) for s in fams["ftgov_jobs_recorded"].samples] == [("ftgov_jobs_recorded_total", 3)]
    assert fams["ftgov_energy_joules"].type == "counter"
    assert [(s.name, s.value) for s in fams["ftgov_energy_joules"].samples] == [("ftgov_energy_joules_total", 900.0)]
    saved = fams["ftgov_energy_saved_joules_cumulative"]
    assert saved.type == "gauge"
    assert [(s.name, s.value) for s in saved.samples] == [("ftgov_energy_saved_joules_cumulative", -12.5)]


def test_no_orin_model_estimate_for_a_job_on_another_gpu():
    """The estimate comes from the simulated Orin's energy model: on an NVML GPU (an H100 at 1980 MHz) it would read
    the Orin curve far past its top clock and export a -142% 'saving'. Only jobs on a Jetson (devfreq) GPU get it."""
    from governor.cli.metrics import model_savings_estimator

    estimate = model_savings_estimator()
    features = {"model_type": "encoder", "num_layers": 12, "hidden_size": 768, "seq_len": 128.0, "gpu_util": 100.0}
    jobs = [{"job_id": 1, "gpu": "0", "freq_hz": 1980000000, "energy_j": 500.0, "features": features},
            {"job_id": 2, "gpu": "1", "freq_hz": 714000000, "energy_j": 500.0, "features": features}]
    status = {"jobs": jobs, "gpus": [{"id": "0", "backend": "nvml"}, {"id": "1", "backend": "devfreq"}]}
    by_name = {f.name: f.samples for f in families(status, estimate)}
    for name in ("ftgov_job_energy_savings_ratio_estimate", "ftgov_job_energy_saved_joules_estimate"):
        assert [labels["job_id"] for labels, _ in by_name[name]] == ["2"], name


def test_a_stopped_textfile_exporter_takes_its_file_away(start_daemon, tmp_path):
    """node_exporter serves whatever .prom file is there: one left behind by an exporter that was stopped would go on
    saying ftgov_up 1 and the last pins for ever. The looping exporter removes its file when it stops (--once, run
    from a timer, leaves it: node_textfile_mtime_seconds tells its age)."""
    daemon = start_daemon()
    prom = tmp_path / "ftgov.prom"
    watch = Watch(tmp_path)  # the exporter's rename of its first file into place
    proc = subprocess.Popen([sys.executable, "-m", "governor.cli", "metrics", "--textfile", str(prom), "--interval",
                             "0.2", "--socket", daemon.socket], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        watch.wait(lambda: prom.exists() or proc.poll() is not None, timeout_s=30)
        assert parse(prom.read_text())[("ftgov_up", frozenset())] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not prom.exists()
        assert not list(tmp_path.glob("*.prom*")), "no temporary file left either"
    finally:
        proc.kill()
        watch.close()


def test_a_textfile_that_cannot_be_written_again_is_not_left_pretending(tmp_path, monkeypatch, capsys):
    """A write that fails (a full disk) ends the exporter with exit 1: the previous file, which node_exporter would
    serve for ever, goes with it."""
    from governor.safefile import OutDir

    real, calls = OutDir.write_bytes, []

    def write_bytes(self, name, data, mode=0o644):
        calls.append(name)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real(self, name, data, mode)

    monkeypatch.setattr(OutDir, "write_bytes", write_bytes)
    prom = tmp_path / "ftgov.prom"
    argv = ["metrics", "--textfile", str(prom), "--interval", "0.01", "--socket", str(tmp_path / "none.sock")]
    assert main(argv) == 1
    assert len(calls) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not prom.exists()


def test_a_gpu_that_cannot_be_pinned_or_capped_says_so_in_a_gauge(start_daemon, tmp_path):
    """A GPU that refuses every clock lock runs its jobs as observe until ftgovd restarts, and one that refuses every
    power limit runs its pins uncapped; status said so, the exporter did not: a fleet's dashboard read such a node as
    governed. Each is a 0/1 gauge per GPU."""
    spec, faults, prom = tmp_path / "fakenvml.json", tmp_path / "faults.json", tmp_path / "ftgov.prom"
    faults.write_text(json.dumps({"gpus": {"1": {"nvmlDeviceSetPowerManagementLimit": 3}}}))  # NOT_SUPPORTED
    spec.write_text(json.dumps({"gpus": [{"supports_locking": False}, {}, {}], "faults_path": str(faults)}))
    env = {"FAKENVML_CONFIG": str(spec), "PYTHONPATH": os.pathsep.join([str(FAKENVML_DIR), str(REPO)])}
    daemon = start_daemon(root=tmp_path / "no-jetson", config={"backend": "nvml", "power_cap_w": 500}, env=env)
    with Connection(daemon.socket) as conn:
        for gpu in (0, 1):
            conn.call("register", gpu=gpu, **FEATURES)
        assert main(["metrics", "--textfile", str(prom), "--once", "--socket", daemon.socket]) == 0
    samples = parse(prom.read_text())
    for name, flagged in (("ftgov_gpu_cannot_pin", "0"), ("ftgov_gpu_cannot_cap", "1")):
        assert {gpu: samples[(name, frozenset({("gpu", gpu)}))] for gpu in ("0", "1", "2")} == {
            gpu: float(gpu == flagged) for gpu in ("0", "1", "2")}, name
    older = {f.name: f.samples for f in families({"jobs": [], "gpus": [{"id": "0", "backend": "nvml"}]})}
    assert older["ftgov_gpu_cannot_pin"] == [] and older["ftgov_gpu_cannot_cap"] == []  # no key: not known, no 0
    # a cap outside the GPU's range is flagged too, and is tried again with a reloaded cap: not "until ftgovd restarts"
    out_of_range = {"id": "1", "cannot_cap": "GPU 1: power cap 500000 mW is outside what it allows (100000..350000 mW)"}
    (cap,) = [f for f in families({"jobs": [], "gpus": [out_of_range]}) if f.name == "ftgov_gpu_cannot_cap"]
    assert cap.samples == [({"gpu": "1"}, 1.0)]
    assert "outside its range" in cap.help and "restarts" not in cap.help, cap.help
