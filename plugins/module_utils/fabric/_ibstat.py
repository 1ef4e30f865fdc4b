# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``ibstat`` (infiniband-diags) output, read by its structure.

Plain Python (no Ansible imports), runs on target Python 3.8+. ``ibstat`` (rdma-core
infiniband-diags/ibstat.c) prints one block per channel adapter::

    CA 'mlx5_0'
            CA type: MT4129
            Number of ports: 1
            Firmware version: 28.41.1000
            ...
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 400
                    ...
                    Link layer: InfiniBand

The header names the node type (``CA``, ``Switch``, ``Router``, ``iWARP RNIC``) and the device;
``Port N:`` opens a port, and a ``Key: value`` line belongs to the port while it is indented
deeper than that ``Port N:`` line. Tabs or spaces, as the tool or a copy of its output has them.
Anything else at the top level (``ibpanic: ... failed``) is a problem; so is a CA whose ``Number
of ports`` differs from the port blocks printed (output cut short). ``ibstat`` reads the same
sysfs files as the module (through libibumad): it names ``State``/``Physical state`` in words of
its own (``Initializing``, ``PhyTest``), normalised here to the kernel's.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _port

_HEADER = re.compile(r"^(CA|Switch|Router|iWARP RNIC|\?\?\?) '([^']+)'$")
_PORT = re.compile(r"^Port (\d+):$")
_KEY = re.compile(r"^([A-Za-z][A-Za-z ]*?):\s*(.*)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(?: \((FDR10)\))?$")

_CA_KEYS = {
    "Number of ports": "ports_count",
    "Firmware version": "fw_ver",
    "Hardware version": "hw_ver",
    "Node GUID": "node_guid",
    "System image GUID": "system_guid",
}
_PORT_KEYS = {
    "Base lid": "base_lid",
    "LMC": "lmc",
    "SM lid": "sm_lid",
    "Capability mask": "capability_mask",
    "Port GUID": "port_guid",
    "Link layer": "link_layer",
}


def _depth(line):
    return len(line.expandtabs(8)) - len(line.expandtabs(8).lstrip())


def _int_or_none(text):
    try:
        return int(text)
    except ValueError:
        return None


def _port_value(port, key, value, problems, where):
    if key == "State":
        port["state_id"] = _port.IBSTAT_STATES.get(value)
        port["state"] = _port.state_name(port["state_id"]) if port["state_id"] is not None else None
        if port["state_id"] is None:
            problems.append("%s: State %r is not one ibstat prints" % (where, value))
    elif key == "Physical state":
        port["phys_state_id"] = _port.IBSTAT_PHYS_STATES.get(value)
        port["phys_state"] = _port.phys_state_name(port["phys_state_id"]) if port["phys_state_id"] else None
        if port["phys_state_id"] is None:
            problems.append("%s: Physical state %r is not one ibstat prints" % (where, value))
    elif key == "Rate":
        match = _RATE.match(value)
        port["rate_gbps"] = float(match.group(1)) if match else None
        port["speed"] = match.group(2) if match else None
        if not match:
            problems.append("%s: Rate %r is not a number of Gb/s" % (where, value))
    elif key in _PORT_KEYS:
        name = _PORT_KEYS[key]
        port[name] = _int_or_none(value) if name in ("base_lid", "lmc", "sm_lid") else value


def _new_ca(node_type):
    ca = {"node_type": node_type, "ca_type": None, "ports": {}}
    ca.update(dict.fromkeys(_CA_KEYS.values()))
    return ca


def _new_port():
    port = {"state": None, "state_id": None, "phys_state": None, "phys_state_id": None, "rate_gbps": None}
    port.update(dict.fromkeys(_PORT_KEYS.values()))
    port["speed"] = None
    return port


def parse(text):
    """``{'cas': {name: ca}, 'problems': [...]}``; each CA has ``node_type``, ``ca_type``,
    ``ports_count``, ``fw_ver``, ``hw_ver``, ``node_guid``, ``system_guid`` and ``ports``
    (``{number: port}``, each with ``state``, ``state_id``, ``phys_state``, ``phys_state_id``,
    ``rate_gbps``, ``speed`` (``FDR10`` or None), ``link_layer``, ``base_lid``, ``lmc``,
    ``sm_lid``, ``capability_mask``, ``port_guid``)."""
    cas, problems = {}, []
    ca_name = ca = None
    port_number = port_depth = None
    for number, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        depth = _depth(raw)
        header = _HEADER.match(line) if depth == 0 else None
        if header:
            ca_name, ca = header.group(2), _new_ca(header.group(1))
            cas[ca_name] = ca
            port_number = port_depth = None
            continue
        if ca is None or depth == 0:
            problems.append("line %d is not part of a CA block: %s" % (number, line))
            ca_name = ca = port_number = port_depth = None
            continue
        if port_number is not None and depth <= port_depth:
            port_number = port_depth = None
        opened = _PORT.match(line)
        if opened and port_number is None:
            port_number, port_depth = int(opened.group(1)), depth
            ca["ports"][port_number] = _new_port()
            continue
        key = _KEY.match(line)
        if not key:
            problems.append("line %d is not 'Key: value': %s" % (number, line))
            continue
        name, value = key.group(1), key.group(2).strip()
        if port_number is not None:
            where = "CA '%s' port %d" % (ca_name, port_number)
            _port_value(ca["ports"][port_number], name, value, problems, where)
        elif name == ca["node_type"] + " type":
            ca["ca_type"] = value
        elif name in _CA_KEYS:
            ca[_CA_KEYS[name]] = _int_or_none(value) if name == "Number of ports" else value
    for name, ca in cas.items():
        if ca["ports_count"] is not None and ca["ports_count"] != len(ca["ports"]):
            problems.append(
                "CA '%s' has %d port blocks but says Number of ports: %d (output cut short?)"
                % (name, len(ca["ports"]), ca["ports_count"])
            )
    return {"cas": cas, "problems": problems}
