"""The path of one `register`, and of a tuned job's `progress` that closes a measurement window, through the daemon's
code: how many calls, through how many files, and how often it calls back into a file it had already left.

`python -m benchmarks.trace_register` starts ftgovd --simulate under a profiler (sys.setprofile) that records, from
the moment the connection dispatches a request line until it returns, every call of a Python function in the governor
package. It sends one register, then registers a tuned job and runs its simulated steps (governor.sim.job) until
--windows of its progress reports have closed a tuner window (JobTuner._window_closed). Only governor's own files
count: the standard library and pydantic are left out. The figures go to docs/benchmarks.md (section
trace-register) unless --no-doc.
"""

from __future__ import annotations

import argparse
import json
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.figures import markdown_table, pct, publish

PACKAGE = str(Path(__file__).resolve().parent.parent / "governor") + "/"
WINDOW_CLOSED = "JobTuner._window_closed"
TIME_SCALE = 0.15  # simulated steps take this fraction of the energy model's time (as tests/daemon/test_daemon_tune)

Call = tuple[str, str, int]  # (file under governor/, function, depth of the call below the dispatch)

# The floors a register runs down, top to bottom (issue 22: connection -> protocol -> rpc -> holds -> controller ->
# policy -> GPU pin -> backend). The GPU pin is the pin with its cap (the power mode's), its baseline and the state
# save before its write; the controller's floor is every other daemon module it composes (the job table, the joins,
# the meters, ...). Files on no floor are what every floor uses: the features, units and errors, a job's record, and
# the log handler that each log line passes through.
FLOORS = ("connection", "protocol", "rpc", "holds", "controller", "policy", "GPU pin", "backend")
_FLOOR_OF = {"daemon/connection.py": 0, "daemon/server.py": 0, "daemon/protocol.py": 1, "daemon/rpc.py": 2,
             "daemon/holds.py": 3, "daemon/peers.py": 3, "daemon/gpupin.py": 6, "daemon/powermode.py": 6,
             "daemon/saving.py": 6, "safefile.py": 6, "sysfs.py": 7}
_NO_FLOOR = ("features.py", "units.py", "errors.py", "text.py", "daemon/jobs.py", "daemon/logs.py",
             "daemon/ratelimit.py")


def floor_of(path: str) -> int | None:
    if path in _FLOOR_OF:
        return _FLOOR_OF[path]
    if path in _NO_FLOOR:
        return None
    for prefix, floor in (("policy/", 5), ("backends/", 7), ("daemon/", 4), ("store/", 6)):
        if path.startswith(prefix):
            return floor
    return None


def floor_figures(calls: list[Call]) -> dict:
    """The floors one request passes, in the order first entered, and the calls up to a floor above the caller's (a
    call's caller: the nearest traced call above it on the stack; the first's, the connection's dispatch). A return
    to a floor above is no such call: a request that runs down the floors once makes none."""
    path: list[int] = []
    up: list[str] = []
    stack: list[tuple[int, int]] = []  # (depth, floor) of the traced calls still open
    for file, name, depth in calls:
        while stack and stack[-1][0] >= depth:
            stack.pop()
        caller = next((f for _d, f in reversed(stack) if f is not None), 0)
        floor = floor_of(file)
        stack.append((depth, floor if floor is not None else caller))
        if floor is None:
            continue
        if floor < caller:
            up.append(f"{FLOORS[caller]} -> {FLOORS[floor]} ({name})")
        if floor not in path:
            path.append(floor)
    return {"path": ", ".join(FLOORS[f] for f in path), "up": up}


def trace_in_daemon(out_path: str, argv: list[str]) -> None:
    """Run the module in argv ("-m", name, args...) with the profiler installed. Writes {"register": the first
    register's calls, "windows": the calls of each progress that closed a tuner window} after each of them."""
    traces: dict[str, list] = {"register": [], "windows": []}
    state: dict = {"depth": 0, "method": None, "calls": []}

    def finish() -> None:
        calls, method = state["calls"], state["method"]
        if method == "register" and not traces["register"]:
            traces["register"] = calls
        elif method == "progress" and any(name == WINDOW_CLOSED for _path, name, _depth in calls):
            traces["windows"].append(calls)
        else:
            return
        tmp = Path(out_path + ".tmp")  # renamed into place: the launcher reads it while the job runs
        tmp.write_text(json.dumps(traces))
        tmp.rename(out_path)

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if state["depth"] == 0:
            if event == "call" and code.co_name == "_dispatch" and code.co_filename.endswith("daemon/connection.py"):
                try:
                    method = json.loads(frame.f_locals["line"]).get("method")
                except ValueError:
                    return
                if method in ("register", "progress"):
                    state.update(depth=1, method=method, calls=[])
            return
        if event == "call":
            state["depth"] += 1
            if code.co_filename.startswith(PACKAGE):
                state["calls"].append((code.co_filename[len(PACKAGE):], code.co_qualname, state["depth"]))
            return
        state["depth"] -= 1
        if state["depth"] == 0:
            finish()

    module = argv[1]
    sys.argv = [module, *argv[2:]]
    sys.setprofile(profile)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def figures(calls: list[Call]) -> dict:
    """calls: the files entered, in order. A re-entry is a call into a file that was entered before and left since."""
    seen: set[str] = set()
    reentries = 0
    previous = None
    for path, _name, _depth in calls:
        if path != previous and path in seen:
            reentries += 1
        seen.add(path)
        previous = path
    return {"calls": len(calls), "files": len(seen), "calls_back_into_a_file_left": reentries}


class _Enough(Exception):
    """The windows wanted are traced: the tuned job stops."""


class _Steps:
    """A job's progress reports, one per simulated step (what a client library's job sends)."""

    def __init__(self, rpc, job_id: int):
        self.rpc, self.job_id, self.steps = rpc, job_id, 0

    def step(self) -> None:
        self.steps += 1
        self.rpc.notify("progress", job_id=self.job_id, steps=self.steps)


def run(windows: int, max_steps: int) -> dict:
    """Trace one register and a tuned job's steps; the traces the daemon wrote."""
    from governor.sim import job as simjob
    from governor.sim.energy import Workload
    from governor.sim.launch import FEATURES, Daemon, scaled
    from governor.sysfs import Root

    base = Path(tempfile.mkdtemp(prefix="ftgt"))
    out = base / "trace.json"
    d = Daemon(None, workdir=base, simulate=True, config=scaled(TIME_SCALE), log_level="info",
               python_args=("-m", "benchmarks.trace_register", "--in-daemon", str(out)))
    d.start(timeout_s=60)
    try:
        rpc = d.client()
        rpc.call("register", **FEATURES)
        shape = {k: v for k, v in FEATURES.items() if k != "gpu_util"}
        tuned = d.client()
        res = tuned.call("register", tune=True, gpu_util=80.0, total_steps=2000, **shape)
        rpc.close()  # the first job ends: a shared GPU pauses the tuner
        steps = _Steps(tuned, res["job_id"])
        root, workload = Root(d.state_dir / "sim-orin"), Workload(name="bert-base", **shape)

        def enough(_step: int) -> None:
            if out.exists() and len(json.loads(out.read_text())["windows"]) >= windows:
                raise _Enough

        try:
            simjob.run(root, steps, workload, max_steps, time_scale=TIME_SCALE, on_step=enough)
        except _Enough:
            pass
        tuned.close()
        traces = json.loads(out.read_text())
    finally:
        d.stop()
        d.close()
        shutil.rmtree(base, ignore_errors=True)
    return traces


def report(registers: list[list], windows: list[list], runs: int) -> str:
    """The table: the register (the same calls in every run), and every traced window's figures as median
    (min-max); what is the daemon's own, outside governor/policy (the tuner's search), shown apart."""
    def row(title: str, traces: list[list]) -> tuple:
        figs = [figures([tuple(c) for c in t]) for t in traces]
        # The daemon's own floors: governor/policy's files as one (its search calls back and forth inside itself).
        floors = [figures([("policy/" if path.startswith("policy/") else path, name, depth)
                           for path, name, depth in t]) for t in traces]
        outside = [sum(1 for path, _name, _depth in t if not path.startswith("policy/")) for t in traces]

        def spread(values: list[int]) -> str:
            if min(values) == max(values):
                return str(values[0])
            return f"{pct(values, 50)} ({min(values)}-{max(values)})"
        return (title, spread([f["calls"] for f in figs]), spread(outside), spread([f["files"] for f in figs]),
                spread([f["calls_back_into_a_file_left"] for f in figs]),
                spread([f["calls_back_into_a_file_left"] for f in floors]))

    rows = [row("register (the paper's tree decides; the GPU's first pin)", registers)]
    # A window whose close moves the pin at once writes the state file and the GPU; the others only plan the move
    # (the GPU's re-pin interval) or keep the level: two kinds of path, reported apart.
    writes = [w for w in windows if any(name.endswith("Gpu.pin") for _path, name, _depth in w)]
    keeps = [w for w in windows if w not in writes]
    for kind, traces in (("writes the pin", writes), ("no pin written", keeps)):
        if traces:
            rows.append(row(f"tuned progress that closes a window, {kind} ({len(traces)} windows)", traces))
    lines = ["## The path of a request through the daemon", "",
             f"`python -m benchmarks.trace_register`, {runs} runs: ftgovd --simulate under a profiler; every call of a "
             "function in the governor package from the moment the connection dispatches the request line until it "
             "returns. A back-return is a call into a file already entered and left since. One register of a "
             "BERT-base job (the paper's tree, the GPU's first pin, a state save); the progress reports of a tuned "
             "job that close a tuner window (the tuner's search in governor/policy, then the pin moved to the next "
             "level to measure, at once or when the GPU's re-pin interval ends, or held). Figures with a spread: "
             "median (min-max) over the windows traced.", "",
             *markdown_table(("request", "calls", "outside governor/policy", "files", "back-returns",
                              "back-returns, governor/policy as one file"), rows), "",
             *floors_report(registers)]
    return "\n".join(lines)


def floors_report(registers: list[list]) -> list[str]:
    """The register's floors (the same in every run: the first run's)."""
    fl = floor_figures([tuple(c) for c in registers[0]])
    up = "; ".join(fl["up"]) if fl["up"] else "none"
    return [f"The register by floors ({' -> '.join(FLOORS)}; the GPU pin with its power-mode cap and the state save "
            "before its write; the features, units, errors, a job's record and the log handler on no floor; every "
            "other daemon module the controller's), in the order first entered: "
            f"{fl['path']}. Calls up to a floor above the caller's: {len(fl['up'])} ({up})."]


def main() -> int:
    if sys.argv[1:2] == ["--in-daemon"]:
        trace_in_daemon(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", action="store_true", help="print every call of the register and the first window")
    ap.add_argument("--windows", type=int, default=8, help="progress reports that close a window, per run (8)")
    ap.add_argument("--runs", type=int, default=3, help="daemons traced, each with its register and tuned job (3)")
    ap.add_argument("--max-steps", type=int, default=300, help="the tuned job's steps at most (300)")
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = ap.parse_args()
    traced = [run(args.windows, args.max_steps) for _ in range(args.runs)]
    registers = [t["register"] for t in traced]
    windows = [w for t in traced for w in t["windows"]]
    if args.calls:
        for title, calls in (("register", registers[0]), ("window", (windows or [[]])[0])):
            print(f"# {title}")
            for path, name, depth in calls:
                print(f"{'  ' * depth}{path}: {name}")
    publish("trace-register", report(registers, windows, args.runs), doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
