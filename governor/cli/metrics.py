"""Opt-in Prometheus exposition of ftgovd's status, so a fleet of Jetsons is watched with Prometheus and Grafana.

`ftgov metrics --port 9400` serves /metrics on 127.0.0.1 (prometheus-client); every scrape asks the daemon for its
status, so nothing is sampled between scrapes. `ftgov metrics --textfile /var/lib/node_exporter/ftgov.prom` writes
the same metrics for node_exporter's textfile collector, atomically, every --interval seconds (or once, --once).

``families(status)`` turns one status answer into metric families with no dependency; the prometheus-client import is
confined to the exposition, and a missing package is a clear error naming the extra to install.
Metric names use base units (hertz, watts, joules, seconds, ratio) as Prometheus conventions ask.

Job names (by default a model's local path) are labels only with --job-names: the HTTP exporter answers any local
user, and a textfile is read by node_exporter for anyone who can scrape it. Label values are escaped
(governor.text): a name from a client must not carry terminal escapes into whatever prints the metrics.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from governor.argtypes import above, at_least, port
from governor.client import Connection
from governor.client.connection import DaemonUnavailable
from governor.errors import FtgovError
from governor.safefile import OutDir
from governor.text import printable

PREFIX = "ftgov"
SAVED_BASES = {"default_governor": "saved_default_j", "tuner_start": "saved_start_j", "unsplit": "saved_unsplit_j"}
ENERGY_SOURCES = "a Jetson's energy rails, or the GPU's own energy counter"  # where a job's energy comes from


@dataclass
class Family:
    """One metric family. ``kind`` "counter": a value that only grows (or restarts from zero), exposed as NAME_total
    (prometheus.io/docs/concepts/metric_types/: "Do not use a counter to expose a value that can decrease";
    /docs/practices/naming/: "an accumulating count has total as a suffix"); else a gauge."""
    name: str
    help: str
    samples: list[tuple[dict, float]] = field(default_factory=list)
    kind: str = "gauge"

    def add(self, value, **labels) -> None:
        if value is not None:
            self.samples.append(({k: printable(str(v)) for k, v in labels.items()}, float(value)))


def families(status: dict | None, estimate=None, *, job_names: bool = False) -> list[Family]:
    """Metric families for one daemon status (gauges, but for the store's totals that only grow); ``None`` means the
    daemon did not answer (up 0).
    ``job_names``: label each job's samples with its name too (opt-in: see the module docstring).

    ``estimate(job) -> ratio | None`` gives a job's estimated energy savings against the default governor (MAXN); it
    is asked only for jobs on a Jetson GPU (backend devfreq), the board its model describes.
    """
    up = Family(f"{PREFIX}_up", "1 when ftgovd answered the status request")
    up.add(0 if status is None else 1)
    if status is None:
        return [up]
    jobs = status.get("jobs") or []
    active = Family(f"{PREFIX}_jobs_active", "jobs registered with ftgovd")
    active.add(len(jobs))
    gpu_fams = {
        "cur_hz": Family(f"{PREFIX}_gpu_frequency_hertz", "current GPU frequency"),
        "min_hz": Family(f"{PREFIX}_gpu_min_frequency_hertz", "GPU frequency lower limit now"),
        "max_hz": Family(f"{PREFIX}_gpu_max_frequency_hertz", "GPU frequency upper limit now"),
        "pinned_hz": Family(f"{PREFIX}_gpu_pinned_frequency_hertz", "frequency ftgovd pins the GPU to (absent: none)"),
    }
    load = Family(f"{PREFIX}_gpu_load_ratio", "GPU load, 0..1")
    # 0/1 per GPU; absent where the daemon's status has no such key (a daemon from before it): not known, not 0.
    flags = {
        "cannot_pin": Family(f"{PREFIX}_gpu_cannot_pin", "1 when the GPU refused a clock lock as it refuses every "
                             "lock: its jobs run as observe (measured, never pinned) until ftgovd restarts"),
        "cannot_cap": Family(f"{PREFIX}_gpu_cannot_cap", "1 when the GPU refused power_cap_w (it refuses every "
                             "power limit, or the cap is outside its range): its pins go on uncapped"),
    }
    # The energy model behind the estimate is the Orin's: on an NVML GPU it would read the Orin curve at that GPU's
    # clocks (an H100's 1980 MHz is far past the Orin's top, a -142% 'saving').
    jetson_gpus = {gpu.get("id") for gpu in status.get("gpus") or [] if gpu.get("backend") == "devfreq"}
    for gpu in status.get("gpus") or []:
        for key, fam in gpu_fams.items():
            fam.add(gpu.get(key), gpu=gpu.get("id"))
        if gpu.get("load_pct") is not None:
            load.add(gpu["load_pct"] / 100, gpu=gpu.get("id"))
        for key, fam in flags.items():
            if key in gpu:
                fam.add(int(gpu[key] is not None), gpu=gpu.get("id"))
    power = Family(f"{PREFIX}_rail_power_watts", "power of each INA3221 rail")
    for rail, mw in sorted((status.get("power_mw") or {}).items()):
        power.add(mw / 1000, rail=rail)
    job_freq = Family(f"{PREFIX}_job_frequency_hertz", "each job's pick (the GPU runs at the highest pick)")
    job_energy = Family(f"{PREFIX}_job_energy_joules",
                        f"each job's energy so far ({ENERGY_SOURCES})")
    job_time = Family(f"{PREFIX}_job_duration_seconds", "how long each job has run")
    job_steps = Family(f"{PREFIX}_job_steps", "training steps each job has reported")
    savings = Family(f"{PREFIX}_job_energy_savings_ratio_estimate",
                     "estimated energy saved against the default governor (MAXN), 0..1, from the energy model")
    saved = Family(f"{PREFIX}_job_energy_saved_joules_estimate",
                   "estimated joules saved so far against the default governor (MAXN)")
    measured = Family(f"{PREFIX}_job_energy_saved_ratio",
                      "energy per step saved against the default governor, 0..1, measured: a tuned job's baseline "
                      "window against its chosen level (absent until both are measured)")
    measured_err = Family(f"{PREFIX}_job_energy_saved_ratio_stddev",
                          "the measured saving's uncertainty (one standard deviation), 0..1: its baseline window's "
                          "and its chosen level's own, in quadrature")
    measured_steps = Family(f"{PREFIX}_job_energy_saved_measured_steps",
                            "steps the measured saving is measured over (baseline window and chosen level)")
    for j in jobs:
        labels = dict(job_id=j.get("job_id"), gpu=j.get("gpu"))
        if job_names:
            labels["job_name"] = j.get("name") or ""
        job_freq.add(j.get("freq_hz"), policy=j.get("policy") or "", **labels)
        job_energy.add(j.get("energy_j"), **labels)
        job_time.add(j.get("duration_s"), **labels)
        job_steps.add(j.get("steps"), **labels)
        if j.get("saving"):
            measured.add(j["saving"].get("saved_rel"), **labels)
            err = j["saving"].get("saved_pct_err")
            measured_err.add(None if err is None else err / 100, **labels)
            measured_steps.add(j["saving"].get("measured_steps"), **labels)
        ratio = estimate(j) if estimate is not None and j.get("gpu") in jetson_gpus else None
        if ratio is not None:
            savings.add(ratio, **labels)
            if j.get("energy_j") is not None and ratio < 1:
                # energy_j was spent at the pin; MAXN would have spent energy_j / (1 - ratio).
                saved.add(j["energy_j"] * ratio / (1 - ratio), **labels)
    return [up, active, *gpu_fams.values(), load, *flags.values(), power, job_freq, job_energy, job_time, job_steps,
            savings, saved, measured, measured_err, measured_steps, *store_families(status.get("store"))]


def store_families(store: dict | None) -> list[Family]:
    """Cumulative figures of every job the measurement store has recorded (they survive restarts and pruning).

    The job count and the energy only grow, so they are counters (ftgov_jobs_recorded_total, ftgov_energy_joules_total:
    rate() of the latter is the governed jobs' mean power); they restart from zero only with a new store (one moved
    aside as corrupt), which Prometheus reads as a counter reset. The saving is net: a job that cost more than its
    basis subtracts from it, so it is a gauge."""
    jobs = Family(f"{PREFIX}_jobs_recorded", "jobs recorded in the measurement store since it was created",
                  kind="counter")
    energy = Family(f"{PREFIX}_energy_joules", f"energy of every recorded job ({ENERGY_SOURCES})", kind="counter")
    saved = Family(f"{PREFIX}_energy_saved_joules_cumulative",
                   "net energy saved by the recorded jobs, as measured by their own windows, by basis: "
                   "default_governor, tuner_start (what tuning added to the tree's pick), or unsplit (recorded "
                   "before the store kept the two apart); a job that cost more takes from it")
    if store and store.get("error") is None:
        jobs.add(store.get("jobs"))
        energy.add(store.get("energy_j"))
        for basis, key in SAVED_BASES.items():
            if key in store:  # a daemon from before the split answers saved_j alone: all of it unsplit
                saved.add(store[key], basis=basis)
        if "saved_default_j" not in store and "saved_j" in store:
            saved.add(store["saved_j"], basis="unsplit")
    return [jobs, energy, saved]


def model_savings_estimator():
    """``estimate(job)`` from the simulated Orin energy model (calibrated to the paper), or None without it.

    An estimate, not a measurement: the model's MAXN energy for the job's features against its energy at the pin.
    (unverified on hardware: how well the model tracks a real board is what the benchmarks measure.)
    """
    try:
        from governor.sim.energy import OrinEnergyModel, workload_from_features
    except ImportError:
        return None
    model = OrinEnergyModel()

    def estimate(job: dict):
        f, freq_hz = job.get("features") or {}, job.get("freq_hz")
        if not freq_hz or not f.get("seq_len"):
            return None
        w = workload_from_features(f, str(job.get("name") or job.get("job_id")))
        try:
            ratio = 1 - model.expected(w, freq_hz).energy_j / model.expected(w, None).energy_j
        except (ArithmeticError, ValueError):
            # The protocol's bounds keep every accepted job's figures finite; a status from another version of the
            # daemon may not, and one job must not fail the scrape (the exporter would answer 500 while it lives).
            return None
        return ratio if math.isfinite(ratio) else None

    return estimate


class DaemonStatus:
    """The exporter's one connection to ftgovd, reused by every scrape: anyone who can reach the HTTP port decides how
    often it scrapes, and a connection per scrape would spend the daemon's connections (and descriptors) at that
    rate. Scrapes come on the HTTP server's threads, so a lock keeps them to the connection one at a time. A
    connection the daemon closed (its idle timeout, a restart) is replaced, once per scrape."""

    def __init__(self, socket: str | None, timeout_s: float = 5.0):
        self.socket, self.timeout_s = socket, timeout_s
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def read(self) -> dict | None:
        """The daemon's status; None when it did not answer (said on stderr)."""
        with self._lock:
            try:
                return self._status()
            except FtgovError as e:
                self._drop()
                print(f"ftgov metrics: {e}", file=sys.stderr)
                return None

    def _status(self) -> dict:
        reused = self._conn is not None and not self._conn.closed_by_daemon()
        if not reused:
            self._drop()
            self._conn = Connection(self.socket, timeout_s=self.timeout_s)
        try:
            return self._conn.call("status")
        except DaemonUnavailable:
            self._drop()
            if not reused:
                raise
            self._conn = Connection(self.socket, timeout_s=self.timeout_s)  # closed just now: once more, anew
            return self._conn.call("status")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# ---- exposition (prometheus-client) ----------------------------------------------------------------------------------


def _prometheus():
    try:
        import prometheus_client
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError as e:
        raise FtgovError("prometheus-client is not installed: pip install 'ftgov[metrics]'") from e
    return prometheus_client, {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


class DaemonCollector:
    """A prometheus-client collector that asks ftgovd for its status at each collection."""

    def __init__(self, socket: str | None = None, estimate=None, *, job_names: bool = False):
        self.status = DaemonStatus(socket)
        self.estimate = estimate
        self.job_names = job_names
        _, self._kinds = _prometheus()

    def collect(self):
        yield from self.gauges(self.status.read())

    def gauges(self, status: dict | None):
        """The metric families of one status answer (None: the daemon did not answer)."""
        for fam in families(status, self.estimate, job_names=self.job_names):
            label_names = sorted({k for labels, _ in fam.samples for k in labels})
            metric = self._kinds[fam.kind](fam.name, fam.help, labels=label_names)
            for labels, value in fam.samples:
                metric.add_metric([labels.get(k, "") for k in label_names], value)
            yield metric


def registry_for(socket: str | None = None, *, job_names: bool = False):
    prometheus_client, _ = _prometheus()
    registry = prometheus_client.CollectorRegistry()
    registry.register(DaemonCollector(socket, model_savings_estimator(), job_names=job_names))
    return registry


def http_server(address: str, port_: int, registry, *, max_connections: int, timeout_s: float):
    """The /metrics endpoint: prometheus-client's WSGI app behind a wsgiref server that holds at most
    ``max_connections`` connections, each closed when its request is not in ``timeout_s`` after it was accepted, or
    a write of its reply takes longer.

    Not prometheus_client.start_http_server: it starts a thread for every connection, none of them with a timeout, and
    this exporter runs as root answering any local user, who could open connections until root's process runs out of
    threads and memory. Here the accept loop waits while every slot is taken (later connections queue in the
    listening socket's backlog, then the kernel refuses them), and a connection gives its slot back at its deadline:
    a timeout on each read alone let a client that sends a byte every few seconds keep its slot for as long as it
    liked, and a few such clients stopped the scrapes for good.
    """
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    prometheus_client, _ = _prometheus()

    class Handler(WSGIRequestHandler):
        def setup(self) -> None:
            super().setup()
            raw = _UntilDeadline(self.connection, time.monotonic() + timeout_s, timeout_s)
            self.rfile, self.wfile = io.BufferedReader(raw), raw

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True  # an exporter being stopped does not wait for a slow scrape
        address_family = socket.getaddrinfo(address, port_, type=socket.SOCK_STREAM)[0][0]  # IPv6 addresses too
        slots = threading.BoundedSemaphore(max_connections)

        def verify_request(self, request, client_address) -> bool:
            self.slots.acquire()  # blocks the accept loop, not a thread per waiting connection
            return True

        def process_request(self, request, client_address) -> None:
            try:
                super().process_request(request, client_address)
            except BaseException:  # no thread started (RuntimeError: can't start new thread): the slot is free
                self.slots.release()
                raise

        def handle_error(self, request, client_address) -> None:
            if isinstance(sys.exc_info()[1], OSError):
                return  # a client that timed out or went away: any local user could fill the journal with these
            super().handle_error(request, client_address)

        def process_request_thread(self, request, client_address) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    server = make_server(address, port_, prometheus_client.make_wsgi_app(registry), Server, handler_class=Handler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


class _UntilDeadline(io.RawIOBase):
    """A connection's socket whose reads end by one deadline for the whole request (``deadline_s``, time.monotonic();
    TimeoutError after it), and each of whose writes (a sendall) takes at most ``write_timeout_s``: the reply is
    written after the daemon answered, which may itself take seconds, and it is a few writes."""

    def __init__(self, sock: socket.socket, deadline_s: float, write_timeout_s: float):
        self._sock = sock
        self._deadline_s = deadline_s
        self._write_timeout_s = write_timeout_s

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left_s = self._deadline_s - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("the request took longer than the connection's timeout")
        self._sock.settimeout(left_s)
        return self._sock.recv_into(buffer)

    def write(self, data) -> int:
        self._sock.settimeout(self._write_timeout_s)
        self._sock.sendall(data)
        return len(data)


def add_parser(sub) -> None:
    p = sub.add_parser("metrics", help="export ftgovd's status as Prometheus metrics",
                       description="Serve Prometheus metrics on a loopback port, or write them for node_exporter's "
                                   "textfile collector.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=port, help="serve /metrics on this port (e.g. 9400)")
    where.add_argument("--textfile", metavar="PATH.prom",
                       help="write this .prom file (atomically) in node_exporter's textfile directory")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1: put a reverse proxy or an SSH tunnel in front)")
    p.add_argument("--max-connections", type=at_least(1), default=8,
                   help="with --port: connections served at once (default 8); more wait in the listen queue")
    p.add_argument("--timeout", type=above(0), default=10.0,
                   help="with --port: seconds a connection may take to send its request (and each write of the reply) "
                        "before it is closed (default 10)")
    p.add_argument("--interval", type=above(0), default=15.0, help="seconds between textfile writes (default 15)")
    p.add_argument("--once", action="store_true", help="with --textfile: write it once and exit (for a systemd timer)")
    p.add_argument("--job-names", action="store_true",
                   help="label job metrics with job names too (off by default: names, often model paths, would be "
                        "readable by anyone who can scrape the exporter)")
    p.add_argument("--socket", help="ftgovd's socket (default: $FTGOV_SOCKET, else /run/ftgov/ftgov.sock)")
    p.set_defaults(func=run)


def _remove(out: OutDir, name: str) -> None:
    try:
        os.unlink(name, dir_fd=out.fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        print(f"ftgov metrics: cannot remove {out.path / name}: {e.strerror or e}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.once and args.port is not None:
        # Ignored, it left a timer's one-shot run (or a look at the metrics) serving the port until it was killed.
        print("ftgov metrics: --once goes with --textfile: with --port the metrics are served until ftgov metrics is "
              "stopped", file=sys.stderr)
        return 2
    textfile = Path(args.textfile) if args.textfile else None
    if textfile is not None and textfile.suffix != ".prom":
        # node_exporter's textfile collector reads only *.prom files in its directory (node_exporter's README):
        # any other name would be written every interval and never scraped.
        print(f"ftgov metrics: --textfile {textfile}: node_exporter's textfile collector reads only *.prom files",
              file=sys.stderr)
        return 2
    try:
        # The textfile's directory is opened and checked once, before anything else (governor/safefile.py).
        # Not prometheus_client.write_to_textfile: it writes PATH.<pid>.<thread> by path, a name that repeats every
        # interval, so whoever can write the directory could plant a link there for root to follow.
        out = OutDir(textfile.parent, create=False) if textfile else None
    except FtgovError as e:
        print(f"ftgov metrics: --textfile {textfile}: {e}", file=sys.stderr)
        return 2
    try:
        registry = registry_for(args.socket, job_names=args.job_names)
    except FtgovError as e:
        print(f"ftgov metrics: {e}", file=sys.stderr)
        return 2
    prometheus_client, _ = _prometheus()
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    # Blocked before the HTTP server's thread starts, so that thread inherits the mask and the main thread takes them.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        if out is not None:
            with out:
                while True:
                    try:
                        out.write_bytes(textfile.name, prometheus_client.generate_latest(registry), 0o644)
                    except OSError as e:
                        print(f"ftgov metrics: cannot write {textfile}: {e.strerror or e}", file=sys.stderr)
                        _remove(out, textfile.name)  # the last one written would be served for ever
                        return 1
                    if args.once:
                        return 0  # a timer's run: the file stays, and node_textfile_mtime_seconds tells its age
                    if signal.sigtimedwait(stop_signals, args.interval) is not None:
                        # Stopped: node_exporter would serve the last file for ever (ftgov_up 1, the last pins).
                        # Without it the series go stale and absent(ftgov_up) can alert.
                        _remove(out, textfile.name)
                        return 0
        try:
            server = http_server(args.address, args.port, registry, max_connections=args.max_connections,
                                 timeout_s=args.timeout)
        except OSError as e:
            print(f"ftgov metrics: cannot listen on {args.address}:{args.port}: {e.strerror or e}", file=sys.stderr)
            return 1
        host = f"[{args.address}]" if ":" in args.address else args.address  # an IPv6 address, as a URL writes it
        print(f"ftgov metrics: serving http://{host}:{server.server_port}/metrics", file=sys.stderr, flush=True)
        signal.sigwait(stop_signals)
        # No server.shutdown(): it waits for the accept loop, which waits for a slot while every one is taken. The
        # loop's thread is a daemon thread, and exiting closes the socket.
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
