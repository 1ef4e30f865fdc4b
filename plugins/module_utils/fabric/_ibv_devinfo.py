# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""``ibv_devinfo`` (rdma-core libibverbs) output, read by its structure.

Plain Python (no Ansible imports), runs on target Python 3.8+. ``ibv_devinfo`` (rdma-core
libibverbs/examples/devinfo.c) opens each device through verbs and prints, one tab per level
and tabs between a key and its value::

    hca_id: mlx5_0
        transport: InfiniBand (0)
        fw_ver: 20.37.1700
        ...
        phys_port_cnt: 1
        ...                (with -v: capabilities, some with nested lines)
            port: 1
                state: PORT_ACTIVE (4)
                ...
                link_layer: InfiniBand
                ...            (with -v:)
                active_width: 4X (2)
                active_speed: 50.0 Gbps (64)
                phys_state: LINK_UP (5)
                GID[  0]: fe80:0000:0000:0000:88e9:a4ff:ff25:a462

``hca_id:`` opens a device; the device's own keys are its least indented ones before the first
``port:``; ``port: N`` opens a port, and every line indented deeper than it belongs to the port.
Capability flag lines (no colon) and nested capability keys are skipped. Only ``-v`` prints
``active_width``, ``active_speed`` and ``phys_state``; the module runs ``ibv_devinfo -v``.
Values are read with their IBTA code in parentheses, which decides where the text is rdma-core's
``invalid speed`` for a speed older releases do not know (NDR). A device whose ``phys_port_cnt``
differs from its port blocks, or lines outside any device block, are problems.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _port

_KEY = re.compile(r"^([^:]+):\s*(.*)$")
_DEVICE_KEYS = (
    "transport",
    "fw_ver",
    "node_guid",
    "sys_image_guid",
    "vendor_id",
    "vendor_part_id",
    "hw_ver",
    "board_id",
)


def _depth(line):
    expanded = line.expandtabs(8)
    return len(expanded) - len(expanded.lstrip())


def _new_port():
    return {
        "state": None,
        "state_id": None,
        "phys_state": None,
        "phys_state_id": None,
        "width": None,
        "speed": None,
        "lane_gbps": None,
        "rate_gbps": None,
        "link_layer": None,
        "active_mtu": None,
    }


def _port_value(port, key, value, problems, where):
    try:
        if key == "state":
            _name, port["state_id"] = _port.parse_coded(value)
            port["state"] = _port.state_name(port["state_id"])
        elif key == "phys_state":
            _name, port["phys_state_id"] = _port.parse_coded(value)
            port["phys_state"] = _port.phys_state_name(port["phys_state_id"])
        elif key == "active_width":
            _name, code = _port.parse_coded(value)
            port["width"] = _port.width_name(code)
        elif key == "active_speed":
            text, code = _port.parse_coded(value)
            port["lane_gbps"], port["speed"] = _port.lane_speed(text, code)
        elif key == "active_mtu":
            port["active_mtu"] = _port.parse_coded(value)[0]
        elif key == "link_layer":
            port["link_layer"] = value
    except ValueError as exc:
        problems.append("%s: %s %s" % (where, key, exc))


def _finish_port(port):
    lanes = int(port["width"][:-1]) if port["width"] else None
    if lanes and port["lane_gbps"] is not None:
        port["rate_gbps"] = lanes * port["lane_gbps"]


def parse(text):
    """``{'devices': {name: device}, 'problems': [...]}``; each device has ``transport``,
    ``fw_ver``, ``node_guid``, ``sys_image_guid``, ``vendor_id``, ``vendor_part_id``,
    ``hw_ver``, ``board_id``, ``phys_port_cnt`` and ``ports`` (``{number: port}``, each with
    ``state``, ``state_id``, ``phys_state``, ``phys_state_id``, ``width``, ``speed``,
    ``lane_gbps``, ``rate_gbps`` (width x lane speed), ``link_layer``, ``active_mtu``; the
    ``-v`` fields are None without ``-v``)."""
    devices, problems = {}, []
    name = device = None
    device_depth = port_number = port_depth = None
    for number, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        depth = _depth(raw)
        key = _KEY.match(line)
        if key and key.group(1) == "hca_id" and depth == 0:
            if port_number is not None:
                _finish_port(device["ports"][port_number])
            name = key.group(2).strip()
            device = dict.fromkeys(_DEVICE_KEYS)
            device.update(phys_port_cnt=None, ports={})
            devices[name] = device
            device_depth = port_number = port_depth = None
            continue
        if device is None:
            problems.append("line %d is not part of an hca_id block: %s" % (number, line))
            continue
        if port_number is not None and depth <= port_depth:
            _finish_port(device["ports"][port_number])
            port_number = port_depth = None
        if not key:
            continue  # a capability flag line (BAD_PKEY_CNTR, ...) or "tag matching not supported"
        label, value = key.group(1).strip(), key.group(2).strip()
        if label == "port" and port_number is None:
            try:
                port_number = int(value)
            except ValueError:
                problems.append("line %d: port %r is not a number" % (number, value))
                continue
            port_depth = depth
            device["ports"][port_number] = _new_port()
        elif port_number is not None:
            _port_value(device["ports"][port_number], label, value, problems, "%s port %d" % (name, port_number))
        elif device["ports"]:
            continue  # after a port block, before the next device: nothing ibv_devinfo prints
        else:
            if device_depth is None:
                device_depth = depth
            if depth != device_depth:
                continue  # a nested capability key (rss_caps: max_rwq_indirection_tables, ...)
            if label in _DEVICE_KEYS:
                device[label] = value
            elif label == "phys_port_cnt":
                device["phys_port_cnt"] = int(value) if value.isdigit() else None
    if port_number is not None:
        _finish_port(device["ports"][port_number])
    for name, device in devices.items():
        if device["phys_port_cnt"] is not None and device["phys_port_cnt"] != len(device["ports"]):
            problems.append(
                "%s has %d port blocks but says phys_port_cnt: %d (output cut short?)"
                % (name, len(device["ports"]), device["phys_port_cnt"])
            )
    return {"devices": devices, "problems": problems}
