# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Changing ACS Control: the plan of a ``pcie_acs`` run (the ports in scope, their target values,
the refusals), the masked ``setpci`` write, its read-back and the kernel-parameter route.

Plain Python (no Ansible imports), runs on target Python 3.8+. Planning only: the module runs
``setpci``.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _path, _sysfs


def plan_acs_write(ctl, mask, state):
    """Target ACS Control value for ``state`` ('cleared' or 'set') of the bits in ``mask``."""
    if state == "cleared":
        return ctl & ~mask & 0xFFFF
    if state == "set":
        return (ctl | mask) & 0xFFFF
    raise ValueError("state must be cleared or set, not %r" % (state,))


def setpci_args(bdf, value, mask, sysfs_path=_sysfs.DEFAULT_SYSFS_PATH):
    """argv (without the setpci binary) for a masked write of ACS Control."""
    args = []
    if sysfs_path and os.path.normpath(sysfs_path) != _sysfs.DEFAULT_SYSFS_PATH:
        args.extend(["-O", "sysfs.path=%s" % sysfs_path])
    args.extend(["-s", bdf, "ECAP_ACS+0x6.w=%04x:%04x" % (value & mask, mask)])
    return args


def read_acs_ctl(sysfs_path, bdf, offset):
    """Re-read one device's ACS Control from its config file (for read-back after a write)."""
    path = os.path.join(sysfs_path, "devices", bdf, "config")
    with open(path, "rb") as handle:
        handle.seek(offset + 6)
        data = handle.read(2)
    if len(data) != 2:
        raise _config_space.PciConfigTruncated(
            "%s: could not read ACS Control at 0x%03x from %s" % (bdf, offset + 6, path)
        )
    return data[0] | (data[1] << 8)


def kernel_param(bdfs):
    """The ``pci=disable_acs_redir=`` kernel parameter for a list of BDFs ('' when empty)."""
    if not bdfs:
        return ""
    return "pci=disable_acs_redir=%s" % ";".join(bdfs)


# -- the plan of a pcie_acs run --------------------------------------------------------------
SCOPES = ("gpu_paths", "devices", "all_bridges")
_SCOPE_WHY = {
    "gpu_paths": "crossed by GPU-GPU or GPU-RDMA-NIC peer traffic",
    "devices": "named in devices",
    "all_bridges": "an ACS-capable bridge",
}


class AcsPlanError(_config_space.PciError):
    """The plan cannot be made; nothing may be written. ``port`` is the port concerned, if one."""

    def __init__(self, message, port=None, vfio_conflicts=None):
        super().__init__(message)
        self.port = port
        self.vfio_conflicts = vfio_conflicts or []


def _unknown_error(topo, ports):
    reasons = [topo.devices[bdf].config.ext_space_reason(bdf) for bdf in ports]
    return AcsPlanError(
        "refusing to write ACS Control: the ACS state of %s is unknown. %s. Nothing was "
        "written." % (", ".join(ports), "; ".join(reasons)),
        port=ports[0],
    )


def scope_ports(topo, scope, devices=()):
    """The ports a run handles: BDFs with an ACS capability, sorted (``devices``: as given).

    Raises AcsPlanError when a port in scope cannot be judged (extended config space unread),
    or a named device is missing or has no ACS capability.
    """
    if scope == "devices":
        ports = []
        for bdf in devices:
            dev = topo.devices.get(bdf)
            if dev is None:
                raise AcsPlanError(
                    "PCI device %s is not present under %s/devices; check the address with "
                    "`lspci -D` (or the sysfs_path)" % (bdf, topo.sysfs_path),
                    port=bdf,
                )
            if dev.config.ext_space_unknown:
                raise _unknown_error(topo, [bdf])
            if dev.config.acs is None:
                raise AcsPlanError(
                    "PCI device %s has no ACS extended capability; there is nothing to change "
                    "on it (list the ports above it instead, see pcie_acs_info)" % bdf,
                    port=bdf,
                )
            if bdf not in ports:
                ports.append(bdf)
        return ports
    if scope == "all_bridges":
        unknown = sorted(
            bdf for bdf, dev in topo.devices.items() if dev.config.is_bridge and dev.config.ext_space_unknown
        )
        if unknown:
            raise _unknown_error(topo, unknown)
        return topo.acs_bridges()
    if scope != "gpu_paths":
        raise ValueError("scope must be one of %s, not %r" % (", ".join(SCOPES), scope))
    unknown = [port["bdf"] for port in topo.unknown_path_ports()]
    if unknown:
        raise _unknown_error(topo, unknown)
    return sorted(bdf for bdf in topo.peer_path_bridges() if topo.devices[bdf].config.acs is not None)


def plan_acs(topo, scope="gpu_paths", devices=(), bits=_path.ACS_REDIRECT_NAMES, state="cleared", force=False):
    """What a pcie_acs run does, before anything is written (check mode and diff show this).

    Returns ``{'mask', 'ports', 'writes', 'skipped', 'vfio_conflicts', 'kernel_param', 'warnings'}``:
    ``ports`` holds one record per port in scope, in the order they are handled: ``bdf``,
    ``offset`` (of the ACS capability), ``current``, ``target``, ``mask`` (the bits this port may
    change), ``setpci_arg`` (the masked write that puts it in the target state), ``write`` (whether
    it differs now) and ``why``. ``writes`` are the records with ``write``. Raises AcsPlanError when
    a port cannot be judged, or when clearing would expose a vfio-pci device and not ``force``.
    """
    mask = _config_space.acs_bits_mask(bits)
    plan = {
        "mask": mask,
        "ports": [],
        "writes": [],
        "skipped": [],
        "vfio_conflicts": [],
        "warnings": [],
        "kernel_param": "",
    }
    for bdf in scope_ports(topo, scope, devices):
        acs = topo.devices[bdf].config.acs
        if acs["quirk"]:
            plan["skipped"].append(bdf)
            plan["warnings"].append(
                "%s: skipped, its ACS Control register is not at the standard offset (%s quirk)" % (bdf, acs["quirk"])
            )
            continue
        port_mask = mask if state == "cleared" else mask & acs["cap"]
        target = plan_acs_write(acs["ctl"], port_mask, state)
        write = target != acs["ctl"]
        changing = (acs["ctl"] ^ target) & port_mask
        plan["ports"].append(
            {
                "bdf": bdf,
                "offset": acs["offset"],
                "current": acs["ctl"],
                "target": target,
                "mask": port_mask,
                "setpci_arg": "ECAP_ACS+0x6.w=%04x:%04x" % (target & port_mask, port_mask),
                "write": write,
                "why": "%s; %s"
                % (
                    _SCOPE_WHY[scope],
                    (
                        "%s %s"
                        % (
                            "clear" if state == "cleared" else "set",
                            " ".join(n for n, m in _config_space.ACS_FLAGS if changing & m),
                        )
                        if write
                        else "already holds the target"
                    ),
                ),
            }
        )
    plan["writes"] = [port for port in plan["ports"] if port["write"]]
    if state == "cleared" and plan["writes"]:
        conflicts = topo.vfio_conflicts([port["bdf"] for port in plan["writes"]])
        plan["vfio_conflicts"] = conflicts
        if conflicts and not force:
            raise AcsPlanError(
                "refusing to clear ACS on %s: %s bound to vfio-pci would lose the isolation VMs "
                "rely on (%s); narrow the scope (scope: devices) to ports that route no "
                "passed-through device, or set force: true"
                % (
                    ", ".join(sorted({c["port"] for c in conflicts})),
                    ", ".join(sorted({c["bdf"] for c in conflicts})),
                    "; ".join("%s: %s" % (c["bdf"], c["reason"]) for c in conflicts),
                ),
                vfio_conflicts=conflicts,
            )
        if conflicts:
            plan["warnings"].append(
                "force: clearing ACS although %s is bound to vfio-pci"
                % ", ".join(sorted({c["bdf"] for c in conflicts}))
            )
    if state == "cleared" and set(bits) == set(_path.ACS_REDIRECT_NAMES):
        plan["kernel_param"] = kernel_param([port["bdf"] for port in plan["ports"]])
    return plan
