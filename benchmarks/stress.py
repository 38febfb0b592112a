"""Fault and load figures: `make stress` prints the table and writes it to docs/benchmarks.md ("stress").

1. Protocol fuzz: tests/daemon/test_fuzz.py run with enough hypothesis examples for 10,000+ lines.
2. Hostile clients: a probe client's ping and register->pinned latency, quiet and next to 500 idle connections,
   10 clients that never read their replies, and a client holding the maximum number of jobs; 20 slow writers
   (a byte a second) run through the load phase and must get their replies at the end.
3. SIGKILL of the daemon at random points of register/unregister, restarted each time (tests/support/faults.kill_trial).
   The daemon is forked from a process that has already imported ftgovd (the same code and process as
   `python -m governor.daemon`, without the interpreter's 0.7 s start each time), so that 1,000 trials fit.
4. Load: 200 concurrent clients, 10,000 register/unregister cycles, clients dropping their connections at random
   and real client processes SIGKILLed at random; no job leaked, baseline restored, RSS growth, p99 latencies.

Run: `.venv/bin/python -m benchmarks.stress` (about 6-8 minutes on 2 cores; --quick for a smoke run, --json; a
smoke run or one part alone (--only) writes nothing to docs/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.figures import machine, markdown_table, pct, write_section
from governor.sim import tree
from governor.sim.launch import DEVFREQ, FEATURES, Daemon, NotifyListener, Rpc, limits
from tests.support.faults import BASELINE, kill_trial

REPO = Path(__file__).resolve().parent.parent

LINE_BUDGET_MS = 5.0  # the daemon's target for register -> pinned p99, one client



def line(method, rid=1, **params) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n"


# ---- 1. fuzz -------------------------------------------------------------------------------------------------------


def fuzz(examples: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        env = {**os.environ, "FTGOV_FUZZ_EXAMPLES": str(examples), "FTGOV_FUZZ_REPORT": report.name,
               "PYTHONPATH": str(REPO)}
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/daemon/test_fuzz.py::test_fuzzed_lines_each_get_their_reply_and_the_daemon_keeps_serving",
                               "tests/daemon/test_fuzz.py::test_after_the_fuzz_no_job_is_left_and_the_gpu_is_at_its_baseline"],
                              cwd=REPO, env=env, capture_output=True, text=True)
        wall_s = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stdout[-6000:], proc.stderr[-2000:], file=sys.stderr)
            return {"ok": False, "wall_s": wall_s}
        r = json.loads(Path(report.name).read_text())
    return {"ok": True, "examples": examples, "wall_s": wall_s, **r}


# ---- daemons -------------------------------------------------------------------------------------------------------

_ZYGOTE = r"""
import json, os, signal, sys
import governor.daemon.main, governor.daemon.server, governor.daemon.controller, governor.policy
import governor.backends.devfreq, governor.backends.rails
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; the driver waits on pidfds
for req in sys.stdin:
    req = json.loads(req)
    pid = os.fork()
    if pid == 0:
        os.environ.update(req["env"])
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        code = 1
        try:
            code = governor.daemon.main.main(req["argv"])
        finally:
            os._exit(code)
    print(pid, flush=True)
"""


class ForkedDaemon:
    """ftgovd forked from a process that has imported it already: kill_trial's start()/kill() in ~30 ms."""

    def __init__(self, zygote: subprocess.Popen, workdir: Path, root: Path):
        self.zygote, self.root = zygote, root
        self.socket = str(workdir / "s.sock")
        self.state_dir = workdir / "state"
        self.log_path = workdir / "ftgovd.log"
        self.notify = NotifyListener(str(workdir / "n.sock"))
        cfg = workdir / "c.yaml"
        cfg.write_text(f"model_file: {REPO / 'model' / 'paper-tree.json'}\nutil_sample_s: 0\nsample_interval_s: 0.2\n")
        self.argv = ["--config", str(cfg), "--socket", self.socket, "--state-dir", str(self.state_dir),
                     "--sysfs-root", str(root), "--log-level", "info"]
        self.pid = None
        self.pidfd = None

    def start(self) -> None:
        self.zygote.stdin.write(json.dumps({"argv": self.argv, "env": {"NOTIFY_SOCKET": self.notify.path},
                                            "log": str(self.log_path)}) + "\n")
        self.zygote.stdin.flush()
        self.pid = int(self.zygote.stdout.readline())
        self.pidfd = os.pidfd_open(self.pid)
        self.wait_status(lambda m: "READY=1" in m, 20)

    def wait_status(self, predicate, timeout_s: float = 10.0) -> str:
        return self.notify.wait(predicate, timeout_s, pidfd=self.pidfd)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        select.select([self.pidfd], [], [], 10)  # readable once the process is gone
        os.close(self.pidfd)
        self.pidfd = None

    def close(self) -> None:
        if self.pidfd is not None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.notify.close()


def kill_trials(base: Path, n: int, seed: int) -> dict:
    root = tree.build(base / "killroot", "jp6").root
    zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    work = base / "kill"
    work.mkdir()
    d = ForkedDaemon(zygote, work, root)
    rng = random.Random(seed)
    results, failures = [], []
    t = time.perf_counter()
    try:
        d.start()
        for i in range(n):
            try:
                results.append(kill_trial(d, root, rng))
            except AssertionError as e:
                failures.append(f"trial {i}: {e}")
                if len(failures) > 5:
                    break
                d.kill()  # start the next trial from a fresh daemon
                d.start()
        d.close()
    finally:
        zygote.stdin.close()
        zygote.wait(10)
    count = lambda key, val: sum(1 for r in results if r[key] == val)  # noqa: E731
    return {"trials": len(results) + len(failures), "failures": failures, "wall_s": time.perf_counter() - t,
            "phase": {p: count("phase", p) for p in ("register", "unregister")},
            "after_kill": {s: count("after_kill", s) for s in ("baseline", "pinned", "mid-write")},
            "outcome": {o: count("outcome", o) for o in ("baseline", "restored", "re-adopted")},
            "torn": sum(r["torn"] for r in results), "max_writes": max((r["writes"] for r in results), default=0)}


# ---- 2 and 4: hostile clients and load against one real daemon -----------------------------------------------------


async def probe(sock: str, n: int, node: Path) -> dict:
    """One well-behaved client: ping round trips, and register -> pinned (checked in the files) then unregister."""
    r, w = await asyncio.open_unix_connection(sock)
    ping, reg = [], []
    for i in range(n):
        t = time.perf_counter()
        w.write(line("ping", i))
        await r.readline()
        ping.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        w.write(line("register", i, **FEATURES))
        reply = json.loads(await r.readline())
        reg.append((time.perf_counter() - t) * 1e3)
        if "result" in reply:
            assert (node / "min_freq").read_text().strip() == "714000000"
            w.write(line("unregister", i, job_id=reply["result"]["job_id"]))
            await r.readline()
    w.close()
    return {"ping_p99_ms": pct(ping, 99), "register_p50_ms": statistics.median(reg), "register_p99_ms": pct(reg, 99),
            "register_error": reply.get("error", {}).get("code")}


async def hostile(sock: str, node: Path, n: int) -> dict:
    out = {"quiet": await probe(sock, n, node)}
    idle = [await asyncio.open_unix_connection(sock) for _ in range(500)]
    out["500 idle connections"] = await probe(sock, n, node)
    for _r, w in idle:
        w.close()
    hogs = []
    for _ in range(10):  # clients that never read: each stops being read once its replies fill the socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.setblocking(False)
        burst = line("status") * 2000
        try:
            while True:
                s.send(burst)
        except BlockingIOError:
            pass
        hogs.append(s)
    out["10 clients that never read"] = await probe(sock, n, node)
    for s in hogs:
        s.close()
    jobs = []
    for _ in range(8):  # the default limits: 8 jobs a connection, 64 in all
        r, w = await asyncio.open_unix_connection(sock)
        for i in range(8):
            w.write(line("register", i, **FEATURES))
            assert "result" in json.loads(await r.readline())
        jobs.append(w)
    out["a client holding the 64 jobs"] = await probe(sock, n, node)  # register is refused: -32002, measured too
    for w in jobs:
        w.close()
    return out


async def slow_writer(sock: str, rid: int) -> bool:
    """A byte a second: a whole ping line takes ~40 s; True when its reply comes."""
    r, w = await asyncio.open_unix_connection(sock)
    data = line("ping", rid)
    for i in range(len(data)):
        w.write(data[i:i + 1])
        await w.drain()
        await asyncio.sleep(1.0)  # the pace is the hostile behaviour itself
    reply = json.loads(await asyncio.wait_for(r.readline(), 10))
    w.close()
    return reply == {"jsonrpc": "2.0", "id": rid, "result": {}}


_CHILD = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
p = json.loads(sys.argv[2]); i = 0
while True:
    i += 1
    f.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": "register", "params": p}).encode() + b"\n"); f.flush()
    job = json.loads(f.readline())["result"]["job_id"]
    f.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": "unregister", "params": {"job_id": job}}).encode() + b"\n")
    f.flush()
    f.readline()
"""


async def load(sock: str, clients: int, cycles: int, rss, seed: int) -> dict:
    rng = random.Random(seed)
    reg, unreg = [], []
    done = 0
    drops = 0
    warm = asyncio.Event()
    rss_warm = []

    async def client(k: int):
        nonlocal done, drops
        r, w = await asyncio.open_unix_connection(sock)
        i = 0
        while done < cycles:
            i += 1
            t = time.perf_counter()
            w.write(line("register", i, name=f"load-{k}", **FEATURES))
            reply = json.loads(await r.readline())
            reg.append((time.perf_counter() - t) * 1e3)
            assert "result" in reply, reply
            if rng.random() < 0.02:  # the client dies holding its job: the daemon must end it
                w.transport.abort()
                drops += 1
                r, w = await asyncio.open_unix_connection(sock)
                continue
            t = time.perf_counter()
            w.write(line("unregister", i, job_id=reply["result"]["job_id"]))
            reply = json.loads(await r.readline())
            unreg.append((time.perf_counter() - t) * 1e3)
            assert "result" in reply, reply
            done += 1
            if done == cycles // 10 and not warm.is_set():
                warm.set()
                rss_warm.append(rss())
        w.close()

    children, kills = [], 0

    async def killer():
        nonlocal kills
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for _ in range(4):
            children.append(subprocess.Popen([sys.executable, "-c", _CHILD, sock, json.dumps(FEATURES)], env=env))
        while done < cycles:
            await asyncio.sleep(rng.uniform(0.05, 0.3))  # random moments, not a wait for an event
            victim = rng.randrange(len(children))
            children[victim].kill()
            children[victim].wait()
            kills += 1
            children[victim] = subprocess.Popen([sys.executable, "-c", _CHILD, sock, json.dumps(FEATURES)], env=env)
        for c in children:
            c.kill()
            c.wait()

    t = time.perf_counter()
    slow = [asyncio.ensure_future(slow_writer(sock, 1000 + i)) for i in range(20)]
    await asyncio.gather(killer(), *(client(k) for k in range(clients)))
    wall_s = time.perf_counter() - t
    slow_ok = sum(await asyncio.gather(*slow))
    return {"clients": clients, "cycles": done, "wall_s": wall_s, "dropped_connections": drops, "process_kills": kills,
            "register_p50_ms": statistics.median(reg), "register_p99_ms": pct(reg, 99),
            "unregister_p50_ms": statistics.median(unreg), "unregister_p99_ms": pct(unreg, 99),
            "rss_warm_mb": rss_warm[0] if rss_warm else None, "slow_writers_ok": slow_ok, "slow_writers": len(slow)}


def hostile_and_load(base: Path, clients: int, cycles: int, probes: int, seed: int) -> dict:
    root = tree.build(base / "loadroot", "jp6").root
    node = (root / DEVFREQ).resolve()
    for sub in ("load", "load2"):
        (base / sub).mkdir()
    # As deployed: a line per decision (info), not debug.
    d = Daemon(root, workdir=base / "load", config={"util_sample_s": 0, "sample_interval_s": 1.0,
                                                     "limits": {"max_connections": 1024,
                                                                "max_connections_per_uid": 1024,
                                                                # every client here is root: one uid, all 64 jobs
                                                                "max_jobs_per_uid": 64}},
               extra_args=("--log-level", "info"))
    d.start()
    try:
        ps = psutil.Process(d.proc.pid)
        rss = lambda: ps.memory_info().rss / 2**20  # noqa: E731
        out = {"hostile": asyncio.run(hostile(d.socket, node, probes))}
        # The load gets a config with room for 200 clients' jobs: a second daemon on the same tree, after this one.
        d.close()
        d = Daemon(root, workdir=base / "load2", config={"util_sample_s": 0, "sample_interval_s": 1.0, "limits": {
            "max_connections": 1024, "max_connections_per_uid": 1024, "max_jobs": 512, "max_jobs_per_uid": 512}},
            extra_args=("--log-level", "info"))
        d.start()
        ps = psutil.Process(d.proc.pid)
        rss_start = rss()
        out["load"] = asyncio.run(load(d.socket, clients, cycles, rss, seed))
        d.notify.drain()
        c = Rpc(d.socket)
        status = c.call("status")
        if status["jobs"]:  # the last closes may still be in flight
            d.wait_jobs(0, 30)
            status = c.call("status")
        c.close()
        out["load"].update({"rss_start_mb": rss_start, "rss_end_mb": rss(), "jobs_left": len(status["jobs"]),
                            "files_after": limits(root), "baseline_ok": limits(root) == BASELINE,
                            "traceback_in_log": "Traceback" in d.log()})
        return out
    finally:
        d.close()


# ---- table ---------------------------------------------------------------------------------------------------------


def table(r: dict) -> str:
    rows = []
    f = r.get("fuzz")
    if f:
        rows.append(("protocol fuzz (hypothesis)", "every line: one reply (none for notifications), daemon serving, "
                     "baseline at the end",
                     f"{f.get('lines', 0):,} lines in {f['wall_s']:.0f} s; {f.get('replies', 0):,} replies "
                     f"({f.get('results', 0):,} results, errors by code {f.get('errors')}); "
                     + ("**pass**" if f["ok"] else "**FAIL**")))
    h = r.get("hostile")
    if h:
        for name, p in h.items():
            reg = (f"register p99 {p['register_p99_ms']:.2f} ms" if p["register_error"] is None else
                   f"register refused ({p['register_error']}) p99 {p['register_p99_ms']:.2f} ms")
            rows.append((f"probe client, {name}", f"register p99 <= {LINE_BUDGET_MS:g} ms",
                         f"ping p99 {p['ping_p99_ms']:.2f} ms, {reg}"))
    k = r.get("kill")
    if k:
        rows.append(("SIGKILL of the daemon during register/unregister, restarted", "baseline or live job re-adopted; "
                     "only the pin/restore paths write",
                     f"{k['trials']} trials in {k['wall_s']:.0f} s: files after the kill {k['after_kill']}; after the "
                     f"restart {k['outcome']}; at most {k['max_writes']} writes by a restart; {k['torn']} torn "
                     f"fake-tree writes mended; failures {len(k['failures'])} "
                     + ("**pass**" if not k["failures"] else "**FAIL**")))
    ld = r.get("load")
    if ld:
        rows.append((f"load: {ld['clients']} clients, {ld['cycles']:,} register/unregister cycles",
                     "no job leaked, baseline restored",
                     f"{ld['wall_s']:.0f} s; {ld['dropped_connections']} dropped connections, {ld['process_kills']} "
                     f"client processes SIGKILLed; jobs left {ld['jobs_left']}; files {ld['files_after']} "
                     + ("**pass**" if ld["jobs_left"] == 0 and ld["baseline_ok"] else "**FAIL**")))
        rows.append(("load: latency", "reported", f"{2 * ld['cycles'] / ld['wall_s']:,.0f} requests/s with "
                     f"{ld['clients']} in flight (so each waits behind the others); "
                     f"register p50 {ld['register_p50_ms']:.2f} ms, p99 "
                     f"{ld['register_p99_ms']:.2f} ms; unregister p50 {ld['unregister_p50_ms']:.2f} ms, p99 "
                     f"{ld['unregister_p99_ms']:.2f} ms"))
        growth = ld["rss_end_mb"] - (ld["rss_warm_mb"] or ld["rss_start_mb"])
        rows.append(("load: daemon RSS", "growth < 5 MB", f"{ld['rss_start_mb']:.1f} MB at start, "
                     f"{ld['rss_warm_mb']:.1f} MB after 10% of the cycles, {ld['rss_end_mb']:.1f} MB at the end: "
                     f"growth {growth:.2f} MB " + ("**pass**" if growth < 5 else "**FAIL**")))
        rows.append(("slow writers (a byte a second) during the load", "each gets its reply",
                     f"{ld['slow_writers_ok']}/{ld['slow_writers']}"))
    return "\n".join(markdown_table(("scenario", "requirement", "measured"), rows))


def section(table_md: str) -> str:
    """docs/benchmarks.md's "stress" section: the table, what was run, on what."""
    return ("## Stress and fault figures\n\n`python -m benchmarks.stress` (`make stress`; the scenarios: "
            "[stress.md](stress.md)): each row names its count; latencies are p50/p99 over the requests of a "
            "scenario. The fake Orin tree in tmpfs; the daemons raise the per-uid limits (every client here is "
            f"root, so one uid). Machine: {machine()}.\n\n{table_md}\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer examples, trials and cycles")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", choices=["fuzz", "kill", "load"], help="run one part")
    a = p.parse_args()
    q = a.quick
    t = time.perf_counter()
    r: dict = {}
    base = Path(tempfile.mkdtemp(prefix="ftgs", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        if a.only in (None, "fuzz"):
            r["fuzz"] = fuzz(200 if q else 2200)
        if a.only in (None, "kill"):
            r["kill"] = kill_trials(base, 50 if q else 1000, a.seed)
        if a.only in (None, "load"):
            r.update(hostile_and_load(base, clients=50 if q else 200, cycles=1000 if q else 10000,
                                      probes=100 if q else 500, seed=a.seed))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    r["wall_s"] = time.perf_counter() - t
    print(json.dumps(r, indent=1, default=str) if a.json else table(r))
    print(f"total {r['wall_s']:.0f} s", file=sys.stderr)
    if not (q or a.only):
        print(f"wrote {write_section('stress', section(table(r)))}", file=sys.stderr)
    ok = (r.get("fuzz", {}).get("ok", True) and not r.get("kill", {}).get("failures")
          and r.get("load", {}).get("jobs_left", 0) == 0 and r.get("load", {}).get("baseline_ok", True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
