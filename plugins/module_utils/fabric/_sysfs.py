# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The RDMA devices of a sysfs tree, read: ``<sysfs>/class/infiniband`` (InfiniBand and RoCE
alike), each device's PCI function and its ports' state, rate, link layer and counters, and
the verbs device node each device needs.

Plain Python (no Ansible imports), runs on target Python 3.8+. The layout is the kernel's
(Documentation/ABI/stable/sysfs-class-infiniband, drivers/infiniband/core/sysfs.c):

* ``class/infiniband/<dev>/``: ``fw_ver``, ``node_guid``, ``hca_type`` and ``board_id`` (the
  mlx4/mlx5 drivers'), ``device`` (a link to the PCI function; its target's path names the
  bridges above it), ``ports/<n>/``.
* ``ports/<n>/``: ``state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate`` (``400
  Gb/sec (4X NDR)``), ``link_layer`` (``InfiniBand``, ``Ethernet``), ``counters/`` (the
  PortCounters of the IB specification, one file each; ``N/A (no PMA)`` where the driver has no
  performance-management agent) and ``hw_counters/`` (driver counters, where present; its
  ``lifespan`` is a setting in milliseconds, not a counter).
* ``class/infiniband_verbs/uverbs<N>/ibdev`` names the device whose verbs node is
  ``/dev/infiniband/uverbs<N>``.

A file that is missing, cannot be read or does not read as its format is an ``unreadable``
entry naming the file and the error, never a value that passes.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _port
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._sysfs import SYSFS_BDF_RE

DEFAULT_SYSFS_PATH = "/sys"
DEFAULT_DEV_PATH = "/dev"
#: ``hw_counters`` entries that are settings, not counters (the ABI document's ``lifespan``).
HW_COUNTER_SETTINGS = ("lifespan",)
_INTEGER = re.compile(r"^\d+$")


class SysfsMissing(Exception):
    """``sysfs_path`` is not a sysfs tree at all (no ``class`` directory)."""


def read_text(path):
    """``(text, None)`` with surrounding whitespace stripped, or ``(None, error)``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(4096)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    try:
        return data.decode("ascii").strip(), None
    except UnicodeDecodeError:
        return None, "not text"


def _unreadable(field, path, error):
    return {"field": field, "file": path, "error": error}


def pci_function(dev_dir):
    """``(address, bridges)`` of the PCI function behind ``<dev>/device``: its BDF and the BDFs
    of the bridges above it, root port first (the components of the link's resolved path after
    ``pci<domain>:<bus>``). ``(None, [])`` for a device without one (soft RoCE)."""
    link = os.path.join(dev_dir, "device")
    if not os.path.exists(link):
        return None, []
    parts = os.path.realpath(link).split(os.sep)
    chain, started = [], False
    for part in parts:
        if part.startswith("pci") and ":" in part:
            started, chain = True, []
        elif started and SYSFS_BDF_RE.match(part):
            chain.append(part)
    if not chain:
        return None, []
    return chain[-1], chain[:-1]


def read_counters(directory, field, skip=()):
    """``(values, unreadable)`` of every file in a counters directory; a value that is not a
    non-negative integer is unreadable (``N/A (no PMA)`` included: nothing can be judged on it)."""
    values, unreadable = {}, []
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return values, [_unreadable(field, directory, exc.strerror or str(exc))]
    for name in names:
        if name in skip:
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            continue
        text, error = read_text(path)
        if error is None and not _INTEGER.match(text):
            error = "reads %r, not an integer" % text
        if error is None:
            values[name] = int(text)
        else:
            unreadable.append(_unreadable("%s/%s" % (field, name), path, error))
    return values, unreadable


def _numbered(port, port_dir, name, problems):
    path = os.path.join(port_dir, name)
    text, error = read_text(path)
    if error is None:
        try:
            number, label = _port.parse_numbered(text)
        except ValueError as exc:
            error = str(exc)
        else:
            port[name + "_id"], port[name] = number, label
            return
    problems.append(_unreadable(name, path, error))


def read_port(port_dir, number):
    port = {
        "port": number,
        "state": None,
        "state_id": None,
        "phys_state": None,
        "phys_state_id": None,
        "rate_gbps": None,
        "width": None,
        "speed": None,
        "link_layer": None,
        "counters": {},
        "hw_counters": {},
        "unreadable": [],
        "filled": {},
    }
    problems = port["unreadable"]
    _numbered(port, port_dir, "state", problems)
    _numbered(port, port_dir, "phys_state", problems)
    path = os.path.join(port_dir, "rate")
    text, error = read_text(path)
    if error is None:
        try:
            port["rate_gbps"], port["width"], port["speed"] = _port.parse_sysfs_rate(text)
        except ValueError as exc:
            error = str(exc)
    if error is not None:
        problems.append(_unreadable("rate", path, error))
    path = os.path.join(port_dir, "link_layer")
    text, error = read_text(path)
    if error is None and text not in _port.LINK_LAYERS:
        error = "reads %r, not InfiniBand or Ethernet" % text
    if error is None:
        port["link_layer"] = text
    else:
        problems.append(_unreadable("link_layer", path, error))
    counters = os.path.join(port_dir, "counters")
    if os.path.isdir(counters):
        port["counters"], unreadable = read_counters(counters, "counters")
        problems.extend(unreadable)
    else:
        problems.append(_unreadable("counters", counters, "missing"))
    hw_counters = os.path.join(port_dir, "hw_counters")
    if os.path.isdir(hw_counters):
        port["hw_counters"], unreadable = read_counters(hw_counters, "hw_counters", HW_COUNTER_SETTINGS)
        problems.extend(unreadable)
    return port


def read_device(class_dir, name):
    dev_dir = os.path.join(class_dir, name)
    device = {"name": name, "unreadable": [], "filled": {}}
    for field in ("fw_ver", "node_guid", "hca_type", "board_id"):
        text, error = read_text(os.path.join(dev_dir, field))
        device[field] = text if error is None and text else None
        if field == "fw_ver" and device[field] is None:
            device["unreadable"].append(_unreadable(field, os.path.join(dev_dir, field), error or "empty"))
    device["pci_address"], device["pcie_path"] = pci_function(dev_dir)
    ports_dir = os.path.join(dev_dir, "ports")
    ports = []
    try:
        names = sorted((n for n in os.listdir(ports_dir) if n.isdigit()), key=int)
    except FileNotFoundError:
        names, error = [], "missing"
    except OSError as exc:
        names, error = [], exc.strerror or str(exc)
    else:
        error = None if names else "no port directories"
    if error:
        device["unreadable"].append(_unreadable("ports", ports_dir, error))
    for entry in names:
        ports.append(read_port(os.path.join(ports_dir, entry), int(entry)))
    device["ports"] = ports
    device["link_layer"] = _port.device_link_layer(ports)
    return device


def verbs_devices(sysfs_path):
    """``({ibdev: 'uverbs<N>'}, problem)`` from ``class/infiniband_verbs``; the problem names a
    missing class directory (``ib_uverbs`` not loaded)."""
    class_dir = os.path.join(sysfs_path, "class", "infiniband_verbs")
    if not os.path.isdir(class_dir):
        return {}, "%s is missing (is the ib_uverbs module loaded?)" % class_dir
    mapping = {}
    for entry in os.listdir(class_dir):
        if not entry.startswith("uverbs"):
            continue
        text, error = read_text(os.path.join(class_dir, entry, "ibdev"))
        if error is None and text:
            mapping[text] = entry
    return mapping, None


def read_fabric(sysfs_path=DEFAULT_SYSFS_PATH, dev_path=DEFAULT_DEV_PATH):
    """Every RDMA device of the sysfs tree at ``sysfs_path``, its ports and its verbs node under
    ``dev_path``: ``{'devices': [...], 'verbs_problem': str or None}``. No ``class/infiniband``
    is a node without RDMA devices; no ``class`` at all raises :class:`SysfsMissing`."""
    if not os.path.isdir(os.path.join(sysfs_path, "class")):
        raise SysfsMissing(
            "%s is not a sysfs tree (it has no class directory): point sysfs_path at the directory "
            "sysfs is mounted on, /sys on a node" % sysfs_path
        )
    class_dir = os.path.join(sysfs_path, "class", "infiniband")
    names = sorted(os.listdir(class_dir), key=_port.natural_key) if os.path.isdir(class_dir) else []
    verbs, verbs_problem = verbs_devices(sysfs_path) if names else ({}, None)
    devices = []
    for name in names:
        device = read_device(class_dir, name)
        device["uverbs"] = verbs.get(name)
        device["verbs_device"] = os.path.join(dev_path, "infiniband", device["uverbs"]) if device["uverbs"] else None
        device["verbs_device_present"] = bool(device["verbs_device"]) and os.path.exists(device["verbs_device"])
        devices.append(device)
    return {"devices": devices, "verbs_problem": verbs_problem}
