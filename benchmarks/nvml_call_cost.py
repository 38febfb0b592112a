"""What the hop to a GPU's NVML worker thread costs a call (governor.backends.nvmlcalls): the energy counter read, the
NVML call the daemon makes most often, through NvmlGpu (on the GPU's worker, with its deadline) against the same
pynvml function called directly, on the fake NVML (a read that costs nothing itself, so the difference is the hop).

    python -m benchmarks.nvml_call_cost [--calls 20000] [--batches 5] [--no-doc]
    python -m benchmarks.nvml_call_cost --real --calls 300 --no-doc   # on a real GPU (read only), printed

With --real the same two ways read GPU 0's counter on the machine's own NVML, opened read only (the daemon's observe
mode): there a read costs milliseconds of the driver's, which the hop rides on.

Wall time and CPU time (the process's, every thread's) per call, the median of the batches. Prints, and writes its
own section of docs/benchmarks.md (replaced on each run).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from typing import Any

from benchmarks.figures import machine, publish
from governor.backends import nvml
from tests.support import FAKENVML_DIR

# The daemon's counter reads a second with one job reporting ten times a second (the sampler-cost section), and the
# most it would make: one per report.
READS_PER_S = (0.8, 10.0)
H200_CHEAPEST_READ_S = 0.004  # its reads cost 4 and 12 ms in turn (benchmarks/sampler_cost.py's H200_READ_S)


def fake_pynvml() -> Any:
    """tests/support/fakenvml's pynvml, imported under that name from its file (sys.path stays as it is)."""
    package = FAKENVML_DIR / "pynvml"
    spec = importlib.util.spec_from_file_location("pynvml", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pynvml"] = module  # its own relative import (._sim) needs it
    spec.loader.exec_module(module)
    return module


def per_call_s(fn, calls: int) -> tuple[float, float]:
    """(wall s, CPU s) per call of fn over ``calls`` calls."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall0) / calls, (time.process_time() - cpu0) / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    p.add_argument("--real", action="store_true", help="the machine's NVML, GPU 0, read only (implies --no-doc)")
    args = p.parse_args()
    if args.real:
        pynvml = nvml.import_pynvml()
        gpu = nvml.probe(pynvml, read_only=True)[0]
        where = f"the real NVML of GPU 0 ({pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}, read only)"
    else:
        pynvml = fake_pynvml()
        pynvml.fake_reset(pynvml.FakeSystem(gpus=[pynvml.FakeGpu(index=0, uuid="GPU-0", meter_update_s=0.0)]))
        gpu, = nvml.probe(pynvml)
        where = "the fake NVML (a read that costs nothing itself)"
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ways = {"pynvml directly, on the caller's thread": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            "NvmlGpu.energy_mj(), on the GPU's worker": gpu.energy_mj}
    for fn in ways.values():  # warm: the worker's thread started, the caches filled
        per_call_s(fn, min(1000, args.calls))
    results = {name: [per_call_s(fn, args.calls) for _ in range(args.batches)] for name, fn in ways.items()}
    medians = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for name, rs in results.items()}
    (direct_wall, direct_cpu), (hop_wall, hop_cpu) = medians.values()
    extra_wall, extra_cpu = hop_wall - direct_wall, hop_cpu - direct_cpu
    lines = ["## The hop to a GPU's NVML worker thread", "",
             f"`python -m benchmarks.nvml_call_cost{' --real' if args.real else ''}`: {args.batches} batches of "
             f"{args.calls} energy counter reads on {where}, the median batch; CPU is the process's, every "
             f"thread's. Machine: {machine()}.", "",
             "| the read | wall per call | CPU per call |", "|---|---|---|"]
    lines += [f"| {name} | {1e6 * wall:.1f} us | {1e6 * cpu:.1f} us |" for name, (wall, cpu) in medians.items()]
    shares = " and ".join(f"{100 * extra_cpu * rate:.4f}% at {rate:g} reads a second" for rate in READS_PER_S)
    lines += ["", f"The hop (with NvmlGpu's own wrapping) adds {1e6 * extra_wall:.1f} us of wall time and "
              f"{1e6 * extra_cpu:.1f} us of CPU to each call: {100 * extra_wall / H200_CHEAPEST_READ_S:.2f}% of an "
              f"H200's cheapest counter read ({1000 * H200_CHEAPEST_READ_S:g} ms; docs/daemon-cpu.md); as a share of "
              f"a core, {shares} (the sampler's pace with one job reporting ten times a second, and one read per "
              "report).", ""]
    publish("nvml-call-cost", "\n".join(lines), doc=not (args.no_doc or args.real))
    return 0


if __name__ == "__main__":
    sys.exit(main())
