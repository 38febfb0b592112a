"""Print the energy model's calibration table: for each of the paper's 27 characterization configurations, the
energy-optimal GPU level, the savings there against MAXN, the U's depth at both ends and the utilization under MAXN.

    python -m benchmarks.energy_calibration [--held-out]

Noise-free (OrinEnergyModel.expected): this is the model's shape, not a simulated measurement.
"""

from __future__ import annotations

import argparse
import statistics

from governor.pipeline.workloads import characterization_workloads, held_out_workloads
from governor.sim.energy import OrinEnergyModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held-out", action="store_true", help="the 60 held-out workloads instead of the 27")
    args = parser.parse_args()
    model = OrinEnergyModel()
    workloads = held_out_workloads() if args.held_out else characterization_workloads()
    print(f"energy model {model.VERSION}; energy = VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0")
    print("| workload | params (M) | seq | optimum (MHz) | savings vs MAXN (%) | E(306)/E(opt) | E(1300)/E(opt) "
          "| MAXN clock (MHz) | util at MAXN (%) | step at opt (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    big, small = [], []
    for w in workloads:
        energy = {f: model.expected(w, f) for f in model.levels_hz}
        best = min(energy, key=lambda f: energy[f].energy_j)
        maxn = model.expected(w, None)
        savings = 100.0 * (1.0 - energy[best].energy_j / maxn.energy_j)
        (big if w.total_params_m > 70.5 else small).append(savings)
        print(f"| {w.name} | {w.total_params_m:.0f} | {w.seq_len:g} | {best / 1e6:.0f} | {savings:.1f} "
              f"| {energy[model.levels_hz[0]].energy_j / energy[best].energy_j:.2f} "
              f"| {energy[model.levels_hz[-1]].energy_j / energy[best].energy_j:.2f} "
              f"| {maxn.mean_freq_hz / 1e6:.0f} | {maxn.gpu_util_pct:.0f} | {energy[best].time_s * 1e3:.0f} |")
    print()
    print(f"savings vs MAXN, models > 70M: mean {statistics.mean(big):.1f}%, range {min(big):.1f}..{max(big):.1f}")
    print(f"savings vs MAXN, models <= 70M: mean {statistics.mean(small):.1f}%, "
          f"range {min(small):.1f}..{max(small):.1f}")


if __name__ == "__main__":
    main()
