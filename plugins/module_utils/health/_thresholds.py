# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The thresholds GPU health is judged by, with their sources.

Plain Python (no Ansible imports), runs on target Python 3.8+. The module ``gpu_health_info``'s
options and the gpu_health role's defaults carry the same values.

* DCGM (github.com/NVIDIA/DCGM, ``DcgmGpuHardwareLimits.h``) - NVLink CRC errors matter from 100
  (per second), replay and recovery errors from 1; retired pages limit 60; PCIe replays 8 per
  minute; DCGM diag's PCIe AER budget 480 per 15 minutes.
* Azure HPC node health checks (github.com/Azure/azurehpc-health-checks) - fail on any volatile
  uncorrectable ECC error.
* NVML's clocks event reasons and GPUd's clock-events component - which slowdowns are faults.
"""

from __future__ import annotations

#: Threshold defaults (the module's options carry the same values and cite the same sources).
DEFAULT_THRESHOLDS = {
    # Any volatile uncorrectable ECC error fails (Azure HPC health checks; DCGM health).
    "ecc_volatile_uncorrectable_max": 0,
    # DCGM_LIMIT_MAX_RETIRED_PAGES (DCGM DcgmGpuHardwareLimits.h): 60 retired pages (SBE + DBE).
    "retired_pages_max": 60,
    # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100; DCGM_LIMIT_MAX_NVLINK_ERROR 1 for replay/recovery.
    "nvlink_crc_errors_max": 100,
    "nvlink_replay_errors_max": 0,
    "nvlink_recovery_errors_max": 0,
    # DCGM diag's PCIe AER budget (480 per 15 min); here applied to the count since boot.
    "aer_correctable_max": 480,
    # DCGM_LIMIT_MAX_PCIREPLAY_RATE is 8 per minute, a rate; "Replays Since Reset" is a count that
    # grows with uptime (healthy HGX H100s show 100+), so it is judged only when a limit is given.
    "pcie_replays_max": None,
}

#: Clock event reasons (snake_case, as ``_nvsmi_q.CLOCK_REASON_NAMES``/NVML's bits) that fail or
#: warn. HW slowdown, HW thermal slowdown and power brake mean the board protects itself (NVML
#: docs of nvmlClocksEventReasonHwSlowdown; GPUd's clock-events component); a software power cap
#: is the driver keeping the board within its power limit, not a fault.
CLOCK_REASONS_FAIL = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
CLOCK_REASONS_WARN = ("sw_thermal_slowdown",)
