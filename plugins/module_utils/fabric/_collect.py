# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading the fabric of a node: two reads of sysfs some seconds apart, and the tools that fill
what sysfs could not give.

Plain Python (no Ansible imports), runs on target Python 3.8+. The reader, the sleep and the
clock are passed in, so that a test makes a counter grow between the two reads without waiting.

Where a port's ``state``, ``phys_state``, ``rate`` or ``link_layer``, or a device's
``fw_ver``, could not be read from sysfs, ``ibv_devinfo -v`` (rdma-core; it asks the device
through verbs) and then ``ibstat`` (infiniband-diags; it reads the same sysfs through
libibumad) are run, and the field is taken from the first that prints it. A tool that is absent
matters only then; a tool that exits non-zero fills nothing. Counters come from sysfs only.
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _ibstat, _ibv_devinfo, _port

#: The fields a tool may fill, per level.
PORT_FIELDS = ("state", "phys_state", "rate", "link_layer")
DEVICE_FIELDS = ("fw_ver",)
#: The tools, in the order they are tried, with the argv after the binary.
TOOLS = (("ibv_devinfo", ["-v"]), ("ibstat", []))


def sample(read, interval, sleep=time.sleep, clock=time.monotonic):
    """``(latest, earlier, seconds)``: ``read()`` once, or twice ``interval`` seconds apart
    (``earlier`` None and ``seconds`` 0 for one read)."""
    first = read()
    if not interval or interval <= 0:
        return first, None, 0.0
    started = clock()
    sleep(interval)
    second = read()
    return second, first, max(clock() - started, 0.0)


def gaps(devices):
    """``[(device, port or None, field, unreadable entry)]`` of what a tool could fill."""
    found = []
    for device in devices:
        for entry in device["unreadable"]:
            if entry["field"] in DEVICE_FIELDS:
                found.append((device, None, entry["field"], entry))
        for port in device["ports"]:
            for entry in port["unreadable"]:
                if entry["field"] in PORT_FIELDS:
                    found.append((device, port, entry["field"], entry))
    return found


def _from_ibv_devinfo(parsed, device, port, field):
    """The value of ``field`` ``ibv_devinfo`` printed, as ``{key: value}`` for the facts; None
    where it printed none."""
    dev = parsed["devices"].get(device["name"])
    if dev is None:
        return None
    if port is None:
        return {"fw_ver": dev["fw_ver"]} if dev["fw_ver"] else None
    p = dev["ports"].get(port["port"])
    if p is None:
        return None
    if field in ("state", "phys_state"):
        return {field: p[field], field + "_id": p[field + "_id"]} if p[field + "_id"] is not None else None
    if field == "rate":
        if p["rate_gbps"] is None:
            return None
        return {"rate_gbps": p["rate_gbps"], "width": p["width"], "speed": p["speed"]}
    if field == "link_layer":
        return {"link_layer": p["link_layer"]} if p["link_layer"] in _port.LINK_LAYERS else None
    return None


def _from_ibstat(parsed, device, port, field):
    ca = parsed["cas"].get(device["name"])
    if ca is None:
        return None
    if port is None:
        return {"fw_ver": ca["fw_ver"]} if ca["fw_ver"] else None
    p = ca["ports"].get(port["port"])
    if p is None:
        return None
    if field in ("state", "phys_state"):
        return {field: p[field], field + "_id": p[field + "_id"]} if p[field + "_id"] is not None else None
    if field == "rate":
        return {"rate_gbps": p["rate_gbps"], "width": None, "speed": p["speed"]} if p["rate_gbps"] is not None else None
    if field == "link_layer":
        return {"link_layer": p["link_layer"]} if p["link_layer"] in _port.LINK_LAYERS else None
    return None


_PARSERS = {"ibv_devinfo": (_ibv_devinfo.parse, _from_ibv_devinfo), "ibstat": (_ibstat.parse, _from_ibstat)}


def fill(devices, binaries, run):
    """Fill what sysfs could not give from the tools (``binaries``: ``{name: (path or None, why
    not)}``), in :data:`TOOLS` order, each run at most once and only while something is missing.
    ``run(argv)`` returns ``(rc, stdout, stderr)`` (rc None when it timed out). Returns one
    report per tool consulted: ``name``, ``argv``, ``rc``, ``filled`` (``['mlx5_0/1 rate']``),
    ``problems`` and ``error``."""
    reports = []
    for name, args in TOOLS:
        missing = gaps(devices)
        if not missing:
            break
        binary, why_not = binaries.get(name, (None, "not configured"))
        report = {"name": name, "argv": None, "rc": None, "filled": [], "problems": [], "error": None}
        reports.append(report)
        if binary is None:
            report["error"] = why_not
            continue
        report["argv"] = [binary] + list(args)
        rc, out, err = run(report["argv"])
        report["rc"] = rc
        if rc != 0:
            detail = ((err or "") + (out or "")).strip()[-300:]
            report["error"] = ("timed out" if rc is None else "exited %s" % rc) + (": " + detail if detail else "")
            continue
        parse, value_of = _PARSERS[name]
        parsed = parse(out)
        report["problems"] = parsed["problems"]
        for device, port, field, entry in missing:
            value = value_of(parsed, device, port, field)
            if value is None:
                continue
            target = device if port is None else port
            target.update(value)
            target["unreadable"].remove(entry)
            target.setdefault("filled", {})[field] = "%s (sysfs %s: %s)" % (name, entry["file"], entry["error"])
            where = device["name"] if port is None else _port.port_key(device["name"], port["port"])
            report["filled"].append("%s %s" % (where, field))
    for device in devices:
        device["link_layer"] = _port.device_link_layer(device["ports"])
    return reports
