# SPDX-License-Identifier: GPL-3.0-or-later
"""Services the hardware brings with it: what the driver packages of a node of this profile
install, written into a lab node's disk when it is imaged.

An NVSwitch machine (8x H100 SXM) runs NVIDIA's fabric manager: `nvidia-fabricmanager.service`,
enabled, from the `nvidia-fabricmanager` package.  In the lab its ExecStart is the stand-in
`nv-fabricmanager` (lab/standins/fabricmanager.py, on the node's PATH as /usr/local/bin), so
`systemctl is-active nvidia-fabricmanager` answers from a real unit, `lab fault NODE
fabric-manager-stop` is a real `systemctl stop`, and the unit comes back at the next boot
because it is enabled.

Every GPU machine runs `nvidia-persistenced.service` (the driver packages' persistence daemon),
installed but not enabled, as the packages leave it: role gpu_health enables and starts it.  Its
ExecStart is the stand-in `nvidia-persistenced` (lab/standins/persistenced.py), which stays
running; the lab's GPUs report persistence mode Enabled.
"""

from __future__ import annotations

import os
from pathlib import Path

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"

FABRIC_MANAGER = """\
# Written by the gpufleet lab (lab/hwmodel/units.py): NVIDIA's unit, with the lab's stand-in.
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target

[Service]
User=root
PrivateTmp=false
Type=simple
ExecStart=/usr/local/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""


PERSISTENCED_UNIT = "nvidia-persistenced.service"

PERSISTENCED = """\
# Written by the gpufleet lab (lab/hwmodel/units.py): NVIDIA's unit, with the lab's stand-in.
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/local/bin/nvidia-persistenced --user root --verbose

[Install]
WantedBy=multi-user.target
"""

# Units the driver packages enable when installed (the others are installed, not enabled).
ENABLED = {FABRIC_MANAGER_UNIT}


def unit_files(data):
    """{relative path under the node's root: text} for this machine's data (lab-node.json)."""
    units = {"etc/systemd/system/" + PERSISTENCED_UNIT: PERSISTENCED}
    if data.get("nvswitch"):
        units["etc/systemd/system/" + FABRIC_MANAGER_UNIT] = FABRIC_MANAGER
    return units


def install(node, upper):
    """Write the units of `node` (a hw.Node) into a node's disk at `upper`, the packages'
    enabled ones enabled."""
    upper = Path(upper)
    for rel, text in unit_files(node.data).items():
        target = upper / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if target.name not in ENABLED:
            continue
        wants = upper / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / target.name
        if not link.is_symlink():
            os.symlink("/" + rel, link)
