"""INA3221 power rails of the Jetson AGX Orin (jetson-orin.md).

Energy figures include ENERGY_RAILS only: CPU, GPU+SoC and the 5 V system rail; VDDQ_VDD2_1V8AO is fed from
VIN_SYS_5V0, so adding it would count that power twice.
"""

from __future__ import annotations

RAIL_GPU_SOC = "VDD_GPU_SOC"
RAIL_CPU_CV = "VDD_CPU_CV"
RAIL_SYS_5V0 = "VIN_SYS_5V0"
RAIL_VDDQ = "VDDQ_VDD2_1V8AO"

ENERGY_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
AGX_ORIN_RAILS = (RAIL_GPU_SOC, RAIL_CPU_CV, RAIL_SYS_5V0, RAIL_VDDQ)
