# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An RDMA port's vocabulary: its logical state, physical state, width and speed, as the kernel
numbers them and as each source (sysfs, ``ibv_devinfo``, ``ibstat``) spells them.

Plain Python (no Ansible imports), runs on target Python 3.8+. Every reader normalises to the
kernel's names (``drivers/infiniband/core/sysfs.c``): ``state`` is ``ACTIVE`` with ``state_id``
4, ``phys_state`` is ``LinkUp`` with ``phys_state_id`` 5, ``rate_gbps`` is the port's data rate
(active width x lane speed) in Gb/s, ``width`` is ``4X``, ``speed`` is ``NDR``.
"""

from __future__ import annotations

import re

#: Logical port states (IBTA PortInfo PortState; the kernel's ``state`` file).
STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
INIT, ARMED, ACTIVE = 2, 3, 4
#: Physical port states (IBTA PortInfo PortPhysicalState; the kernel's ``phys_state`` file).
PHYS_STATE_NAMES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
POLLING, DISABLED, LINK_UP = 2, 3, 5

#: ``ibstat`` (infiniband-diags ibstat.c ``port_state_str``/``port_phy_state_str``).
IBSTAT_STATES = {"Down": 1, "Initializing": 2, "Armed": 3, "Active": 4}
IBSTAT_PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "PhyTest": 7,
}

#: IBTA LinkWidthActive codes as ``ibv_devinfo -v`` prints them in parentheses (rdma-core
#: devinfo.c ``width_str``): 16 is 2X (HDR100, NDR200 split ports).
WIDTH_CODES = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
#: IBTA LinkSpeedActive codes (rdma-core devinfo.c ``speed_str``; 128 NDR and 256 XDR from the
#: extended speeds) -> (Gb/s per lane as the kernel's ``rate`` file counts it, the speed's name).
SPEED_CODES = {
    1: (2.5, "SDR"),
    2: (5.0, "DDR"),
    4: (10.0, "QDR"),
    8: (10.0, "FDR10"),
    16: (14.0, "FDR"),
    32: (25.0, "EDR"),
    64: (50.0, "HDR"),
    128: (100.0, "NDR"),
    256: (200.0, "XDR"),
}
LINK_LAYERS = ("InfiniBand", "Ethernet")

_NUMBERED = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
# sysfs.c rate_show: "%d%s Gb/sec (%dX%s)" - "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", and
# before kernel 5.x no speed name for SDR: "2.5 Gb/sec (1X)".
_SYSFS_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec \((\d+)X(?: ([A-Z0-9]+))?\)$")
_CODED = re.compile(r"^(.*?)\s*\((\d+)\)$")
_GBPS = re.compile(r"^(\d+(?:\.\d+)?) Gbps$")
_DIGITS = re.compile(r"(\d+)")


def parse_numbered(text):
    """``'4: ACTIVE'`` -> ``(4, 'ACTIVE')`` (the kernel's ``state`` and ``phys_state`` files);
    ValueError for anything else."""
    match = _NUMBERED.match(text or "")
    if not match:
        raise ValueError("reads %r, not '<number>: <name>'" % (text,))
    return int(match.group(1)), match.group(2)


def parse_sysfs_rate(text):
    """``'400 Gb/sec (4X NDR)'`` -> ``(400.0, '4X', 'NDR')``; the speed is None where the kernel
    printed none. ValueError for anything else."""
    match = _SYSFS_RATE.match((text or "").strip())
    if not match:
        raise ValueError("reads %r, not '<rate> Gb/sec (<width>X <speed>)'" % (text,))
    return float(match.group(1)), match.group(2) + "X", match.group(3)


def parse_coded(text):
    """``'PORT_ACTIVE (4)'`` -> ``('PORT_ACTIVE', 4)`` (``ibv_devinfo``'s ``name (code)``);
    ValueError for anything else."""
    match = _CODED.match((text or "").strip())
    if not match:
        raise ValueError("reads %r, not '<name> (<code>)'" % (text,))
    return match.group(1), int(match.group(2))


def width_name(code):
    """IBTA width code -> ``'4X'``; None for a code IBTA does not define."""
    lanes = WIDTH_CODES.get(code)
    return "%dX" % lanes if lanes else None


def lane_speed(text, code):
    """``ibv_devinfo``'s ``active_speed``: the printed ``'50.0 Gbps'`` with its code 64 ->
    ``(50.0, 'HDR')``. Older rdma-core prints ``invalid speed`` for speeds it predates (NDR); the
    code then decides. ``(None, None)`` for a code IBTA does not define (0 on a port that is down)."""
    known = SPEED_CODES.get(code)
    match = _GBPS.match((text or "").strip())
    if match:
        return float(match.group(1)), known[1] if known else None
    return known if known else (None, None)


def phys_state_name(phys_state_id):
    return PHYS_STATE_NAMES.get(phys_state_id, "<unknown>")


def state_name(state_id):
    return STATE_NAMES.get(state_id, "UNKNOWN")


def port_key(device, port):
    """The name of a port in checks and records: ``mlx5_0/1``."""
    return "%s/%s" % (device, port)


def natural_key(name):
    """Sort key: ``mlx5_2`` before ``mlx5_10``, ``mlx5_9/1`` before ``mlx5_bond_0/1``."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(name)]


def device_link_layer(ports):
    """A device's link layer: its ports' when they agree, ``mixed`` when they do not."""
    layers = sorted({p["link_layer"] for p in ports if p["link_layer"]})
    return layers[0] if len(layers) == 1 else ("mixed" if layers else None)
