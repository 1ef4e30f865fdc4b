# SPDX-License-Identifier: GPL-3.0-or-later
"""Where the simulated functions keep their registers: capability offsets, port types and the
link-speed text of sysfs, shared by the tree builder and the health faults."""

from __future__ import annotations

PM_CAP, PCIE_CAP = 0x40, 0x60
AER_ECAP, ACS_ECAP = 0x100, 0x150
PORT_TYPE = {"endpoint": 0x0, "root_port": 0x4, "upstream": 0x5, "downstream": 0x6}
LINK_SPEED_TEXT = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
    6: "64.0 GT/s PCIe",
}
