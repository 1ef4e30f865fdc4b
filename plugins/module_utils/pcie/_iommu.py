# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""IOMMU state of a host: mode, groups, vfio-pci bindings, ACS kernel parameters.

Plain Python (no Ansible imports), runs on target Python 3.8+. Every path is configurable so a
captured or simulated machine can be audited:

* ``<proc_path>/cmdline``: ``intel_iommu=``, ``amd_iommu=``, ``iommu=pt|nopt|off``,
  ``iommu.passthrough=0|1``, ``iommu.strict=0|1``, ``pci=...,disable_acs_redir=...``.
* ``<sysfs_root>/class/iommu/*``: present only while an IOMMU is active.
* ``<sysfs_root>/kernel/iommu_groups/N/{devices/*,type}``: ``type`` (Linux 5.11+) is
  ``identity`` (passthrough), ``DMA`` (translated, strict), ``DMA-FQ`` (translated, lazy),
  ``blocked``, ``unmanaged`` or ``unknown``.
* ``<proc_path>/cpuinfo``: the ``hypervisor`` CPU flag tells a virtual machine from bare metal.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.node.plugins.module_utils.pcie._sysfs import DEFAULT_SYSFS_PATH, read_text, scan_tree


class IommuError(Exception):
    """The trees to read are not there; the message says which and what to do."""


MODES = ("off", "passthrough", "translated-strict", "translated-lazy")
GROUP_TYPE_MODES = {
    "identity": "passthrough",
    "DMA": "translated-strict",
    "DMA-FQ": "translated-lazy",
}


def parse_cmdline(text):
    """The IOMMU- and ACS-related parameters of a kernel command line, as a dict."""
    params = {}
    disable_acs_redir = []
    for token in (text or "").split():
        key, sep, value = token.partition("=")
        if key in ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough", "iommu.strict"):
            params[key] = value if sep else ""
        elif key == "pci" and sep:
            # pci= takes comma-separated options; disable_acs_redir's own list is ';'-separated.
            for option in value.split(","):
                name, osep, ovalue = option.partition("=")
                if name == "disable_acs_redir" and osep:
                    disable_acs_redir.extend(item for item in ovalue.strip('"').split(";") if item)
    params["disable_acs_redir"] = disable_acs_redir
    return params


def _cmdline_mode(params):
    """IOMMU mode from the command line alone: (mode or None, reason)."""
    for key in ("intel_iommu", "amd_iommu"):
        values = params.get(key, "").split(",")
        if "off" in values:
            return "off", "%s=off" % key
    if params.get("iommu") == "off":
        return "off", "iommu=off"
    if params.get("iommu") == "pt" or params.get("iommu.passthrough") == "1":
        return "passthrough", "iommu=pt" if params.get("iommu") == "pt" else "iommu.passthrough=1"
    if params.get("iommu.strict") == "1" or "strict" in params.get("intel_iommu", "").split(","):
        return "translated-strict", "iommu.strict=1"
    if params.get("iommu.strict") == "0":
        return "translated-lazy", "iommu.strict=0"
    return None, ""


def read_groups(sysfs_root):
    """``{group: {'type': str or None, 'devices': [bdf, ...]}}`` from kernel/iommu_groups."""
    groups_dir = os.path.join(sysfs_root, "kernel", "iommu_groups")
    groups = {}
    try:
        entries = os.listdir(groups_dir)
    except OSError:
        return groups
    for name in entries:
        gdir = os.path.join(groups_dir, name)
        try:
            members = sorted(os.listdir(os.path.join(gdir, "devices")))
        except OSError:
            members = []
        groups[name] = {"type": read_text(os.path.join(gdir, "type")), "devices": members}
    return groups


def iommu_units(sysfs_root):
    try:
        return sorted(os.listdir(os.path.join(sysfs_root, "class", "iommu")))
    except OSError:
        return []


def is_virtual_machine(proc_path):
    """True/False from the ``hypervisor`` CPU flag in cpuinfo; None when cpuinfo is unreadable."""
    text = read_text(os.path.join(proc_path, "cpuinfo"))
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return "hypervisor" in line.split(":", 1)[-1].split()
    return False


def audit(sysfs_root="/sys", proc_path="/proc", sysfs_path=None):
    """Everything iommu_info returns, as one dict.

    A missing tree is an error, never "IOMMU off": ``sysfs_root`` and ``proc_path`` must be
    directories, ``<proc_path>/cmdline`` readable, and ``sysfs_path`` (given, or the PCI tree of
    ``sysfs_root``) a PCI tree with devices: a sysfs root that exists but holds no PCI tree is
    as wrong as one that does not exist.
    """
    for name, path in (("sysfs_root", sysfs_root), ("proc_path", proc_path)):
        if not os.path.isdir(path):
            raise IommuError(
                "%s %s is not a directory: point it at where %s is mounted (or at a "
                "captured tree)" % (name, path, "sysfs" if name == "sysfs_root" else "procfs")
            )
    explicit_pci_tree = sysfs_path is not None
    if sysfs_path is None:
        sysfs_path = os.path.join(sysfs_root, "bus", "pci") if sysfs_root != "/sys" else DEFAULT_SYSFS_PATH
    cmdline_text = read_text(os.path.join(proc_path, "cmdline"))
    if cmdline_text is None:
        raise IommuError(
            "cannot read %s: is procfs mounted at proc_path %s?" % (os.path.join(proc_path, "cmdline"), proc_path)
        )
    params = parse_cmdline(cmdline_text)
    units = iommu_units(sysfs_root)
    groups = read_groups(sysfs_root)
    type_counts = {}
    for group in groups.values():
        if group["type"]:
            type_counts[group["type"]] = type_counts.get(group["type"], 0) + 1

    # The default domain type is what most groups report (vfio and other drivers turn their own
    # groups to "unmanaged"/"blocked", which says nothing about the default).
    default_types = {t: n for t, n in type_counts.items() if t in GROUP_TYPE_MODES}
    cmd_mode, cmd_reason = _cmdline_mode(params)
    if not units and not groups:
        mode, source = "off", "no /sys/class/iommu entries and no IOMMU groups"
    elif default_types:
        group_type = max(sorted(default_types), key=lambda t: default_types[t])
        mode, source = GROUP_TYPE_MODES[group_type], "iommu_groups/*/type = %s" % group_type
    elif cmd_mode and cmd_mode != "off":
        mode, source = cmd_mode, "kernel command line %s" % cmd_reason
    else:
        # Active IOMMU, no type files (kernels before 5.11), nothing on the command line: the
        # kernel default (x86 distribution kernels build with lazy invalidation).
        mode, source = "translated-lazy", "kernel default (no group type files, nothing on the command line)"

    if not explicit_pci_tree and not os.path.isdir(os.path.join(sysfs_path, "devices")):
        raise IommuError(
            "sysfs_root %s holds no PCI tree (no %s): point sysfs_root at where sysfs is mounted, or "
            "sysfs_path at a PCI tree like /sys/bus/pci" % (sysfs_root, os.path.join(sysfs_path, "devices"))
        )
    devices = scan_tree(sysfs_path, with_config=False)
    gpus = []
    for bdf in sorted(devices):
        dev = devices[bdf]
        if not dev.is_gpu:
            continue
        group = groups.get(dev.iommu_group) if dev.iommu_group is not None else None
        gpus.append(
            {
                "bdf": bdf,
                "driver": dev.driver,
                "iommu_group": dev.iommu_group,
                "group_type": group["type"] if group else None,
                "group_devices": group["devices"] if group else [],
            }
        )
    vfio = [
        {"bdf": bdf, "iommu_group": devices[bdf].iommu_group}
        for bdf in sorted(devices)
        if devices[bdf].driver == "vfio-pci"
    ]

    virtual = is_virtual_machine(proc_path)
    recommendation = _recommend(mode, len(gpus), vfio, virtual)
    return {
        "mode": mode,
        "mode_source": source,
        "enabled": mode != "off",
        "units": units,
        "cmdline": cmdline_text,
        "cmdline_params": {k: v for k, v in params.items() if k != "disable_acs_redir"},
        "disable_acs_redir": params["disable_acs_redir"],
        "group_count": len(groups),
        "group_types": type_counts,
        "gpus": gpus,
        "vfio_devices": vfio,
        "virtual_machine": virtual,
        "recommendation": recommendation,
        "sysfs_root": sysfs_root,
        "proc_path": proc_path,
        "sysfs_path": sysfs_path,
    }


def _recommend(mode, gpu_count, vfio, virtual):
    if vfio:
        return {
            "action": "keep",
            "kernel_param": "",
            "reason": "devices are bound to vfio-pci: VMs need translated DMA and ACS isolation; "
            "do not switch to passthrough or clear ACS on their paths",
        }
    if virtual:
        return {
            "action": "none",
            "kernel_param": "",
            "reason": "this is a virtual machine (hypervisor CPU flag): the IOMMU mode is the host's business",
        }
    if gpu_count < 2:
        return {
            "action": "none",
            "kernel_param": "",
            "reason": "fewer than two GPUs: no peer-to-peer traffic to protect",
        }
    if mode in ("off", "passthrough"):
        return {
            "action": "none",
            "kernel_param": "",
            "reason": "IOMMU is %s: GPU peer-to-peer DMA is not translated" % mode,
        }
    return {
        "action": "set_kernel_param",
        "kernel_param": "iommu=pt",
        "reason": "bare-metal host with %d GPUs and a translating IOMMU (%s): NVIDIA recommends "
        "iommu=pt so peer-to-peer and RDMA DMA skip translation" % (gpu_count, mode),
    }
