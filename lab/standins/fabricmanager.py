# SPDX-License-Identifier: GPL-3.0-or-later
"""`nv-fabricmanager` for a lab machine: the NVSwitch fabric manager's service, as a stand-in.

Run by the node's `nvidia-fabricmanager.service` (lab/hwmodel/units.py) on NVSwitch profiles.
Started, it registers the GPUs with the fabric (the machine's health state says the fabric
manager is active: `nvidia-smi -q` and NVML report the GPUs' fabric state Completed/Success) and
stays in the foreground; stopped (SIGTERM, `systemctl stop`), it marks itself inactive (the GPUs'
fabric state drops to In Progress) and exits 0.  Like the real daemon it refuses to run on a
machine without NVSwitches.
"""

from __future__ import annotations

import sys

from lab.standins._daemon import load_node, serve, stop_flag

NO_SWITCH = (
    "NVIDIA Fabric Manager: no NVSwitch devices found; this system does not need the fabric manager (lab stand-in)\n"
)


def main(argv=None):
    node = load_node("nv-fabricmanager")
    if node is None:
        return 1
    if node.fabric_manager_active() is None:
        sys.stderr.write(NO_SWITCH)
        return 1
    stopping = stop_flag()
    node.set_fabric_manager(True)
    try:
        serve(
            stopping,
            "Successfully configured all the available NVSwitches to route GPU NVLink traffic. "
            "NVLink Peer-to-Peer support will be enabled once the GPUs are successfully registered "
            "with the NVLink fabric.\n",
        )
    finally:
        node.set_fabric_manager(False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
