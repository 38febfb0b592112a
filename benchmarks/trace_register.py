"""The path of one `register` through the daemon's code: how many calls, through how many files, and how often it
calls back into a file it had already left.

`python -m benchmarks.trace_register` starts ftgovd on a fake Orin tree under a profiler (sys.setprofile) that
records, from the moment the connection dispatches the register line until it returns, every call of a Python
function in the governor package, then sends one register and prints the figures (and with --calls, the calls).
Only governor's own files count: the standard library and pydantic are left out.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import tempfile
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parent.parent / "governor") + "/"


def trace_in_daemon(out_path: str, argv: list[str]) -> None:
    """Run the module in argv ("-m", name, args...) with the profiler installed; write the first register's trace."""
    calls: list[tuple[str, str]] = []  # (file under governor/, function)
    state = {"depth": 0, "done": False}

    def profile(frame, event, arg):
        if state["done"] or event not in ("call", "return"):
            return
        code = frame.f_code
        inside = state["depth"] > 0
        if not inside:
            if event == "call" and code.co_name == "_dispatch" and code.co_filename.endswith("daemon/connection.py"):
                try:
                    method = json.loads(frame.f_locals["line"]).get("method")
                except ValueError:
                    return
                if method == "register":
                    state["depth"] = 1
            return
        if event == "call":
            state["depth"] += 1
            if code.co_filename.startswith(PACKAGE):
                calls.append((code.co_filename[len(PACKAGE):], code.co_qualname))
            return
        state["depth"] -= 1
        if state["depth"] == 0:
            state["done"] = True
            sys.setprofile(None)
            Path(out_path).write_text(json.dumps(calls))

    module = argv[1]
    sys.argv = [module, *argv[2:]]
    sys.setprofile(profile)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def figures(calls: list[tuple[str, str]]) -> dict:
    """calls: the files entered, in order. A re-entry is a call into a file that was entered before and left since."""
    seen: set[str] = set()
    reentries = 0
    previous = None
    for path, _name in calls:
        if path != previous and path in seen:
            reentries += 1
        seen.add(path)
        previous = path
    return {"calls": len(calls), "files": len(seen), "calls_back_into_a_file_left": reentries}


def main() -> int:
    if sys.argv[1:2] == ["--in-daemon"]:
        trace_in_daemon(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", action="store_true", help="print every call, in order")
    args = ap.parse_args()
    from governor.sim import tree
    from governor.sim.launch import FEATURES, Daemon

    base = Path(tempfile.mkdtemp(prefix="ftgt"))
    out = base / "trace.json"
    root = tree.build(base / "root", "jp6").root
    d = Daemon(root, workdir=base, log_level="info", python_args=("-m", "benchmarks.trace_register", "--in-daemon",
                                                                     str(out)))
    d.start(timeout_s=30)
    try:
        rpc = d.client()
        rpc.call("register", **FEATURES)
        rpc.close()
    finally:
        d.stop()
        d.close()
    calls = [tuple(c) for c in json.loads(out.read_text())]
    if args.calls:
        for path, name in calls:
            print(f"{path}: {name}")
    print(json.dumps(figures(calls)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
