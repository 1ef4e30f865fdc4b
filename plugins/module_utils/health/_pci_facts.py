# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What GPU health needs from the PCI tree (sysfs): the AER counters and link maxima of the GPUs and
of the bridges above them, the NVSwitches, the RDMA NICs on GPU paths; and whether
``nvidia_peermem`` is loaded.

Plain Python (no Ansible imports), runs on target Python 3.8+. The tree is read as a
``pcie/_topology.PciTopology``, vendor and class files only (any user can read them).
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi_q
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _sysfs, _topology

_GT_S_TO_GEN = {
    "2.5": 1,
    "5.0": 2,
    "5": 2,
    "8.0": 3,
    "8": 3,
    "16.0": 4,
    "16": 4,
    "32.0": 5,
    "32": 5,
    "64.0": 6,
    "64": 6,
}
AER_FILES = (
    ("fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"),
    ("nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    ("correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
)
CLASS_NVSWITCH = 0x0680  # NVIDIA NVSwitch: class "Bridge: other" (0x068000)


def parse_aer(text, total_label):
    """``aer_dev_*`` (``RxErr 0`` lines, ``TOTAL_ERR_COR 3``) -> the total, or None."""
    if text is None:
        return None
    counts = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.match(r"^\d+$", parts[1]):
            counts[parts[0]] = int(parts[1])
    if total_label in counts:
        return counts[total_label]
    return sum(counts.values()) if counts else None


def link_gen(text):
    """sysfs ``max_link_speed`` (``16.0 GT/s PCIe``) -> generation, or None."""
    if not text:
        return None
    match = re.match(r"^\s*([0-9.]+)\s*GT/s", text)
    return _GT_S_TO_GEN.get(match.group(1)) if match else None


def read_aer(dev_path):
    """``{'fatal', 'nonfatal', 'correctable'}`` of one function (None where the file is absent)."""
    return {key: parse_aer(_sysfs.read_text(os.path.join(dev_path, name)), total) for key, name, total in AER_FILES}


def pci_facts(sysfs_path):
    """What the checks need from the PCI tree, or ``{'error': ...}`` when it cannot be read.

    ``{'gpus': {bdf: {'driver', 'chain', 'aer', 'link': {'gen_max', 'width_max'}}},
    'bridges': {bdf: {'aer', 'link'}}, 'nvswitches': [bdf], 'rdma_nics': [bdf],
    'nics_on_gpu_paths': [bdf]}`` (bridges: those on the GPUs' upstream chains)."""
    try:
        topo = _topology.PciTopology.scan(sysfs_path, with_config=False)
    except (_config_space.PciError, OSError) as exc:
        return {
            "error": str(exc),
            "gpus": {},
            "bridges": {},
            "nvswitches": [],
            "rdma_nics": [],
            "nics_on_gpu_paths": [],
        }

    def link(dev):
        return {
            "gen_max": link_gen(_sysfs.read_text(os.path.join(dev.path, "max_link_speed"))),
            "width_max": _nvsmi_q.to_int(_sysfs.read_text(os.path.join(dev.path, "max_link_width"))),
        }

    gpus = {}
    bridges = {}
    for bdf in topo.gpus:
        dev = topo.devices[bdf]
        gpus[bdf] = {"driver": dev.driver, "chain": list(dev.chain), "aer": read_aer(dev.path), "link": link(dev)}
        for bridge in dev.chain:
            if bridge in topo.devices and bridge not in bridges:
                bdev = topo.devices[bridge]
                bridges[bridge] = {"aer": read_aer(bdev.path), "link": link(bdev)}
    nvswitches = sorted(
        bdf for bdf, dev in topo.devices.items() if dev.vendor_id == 0x10DE and dev.class_code == CLASS_NVSWITCH
    )
    gpu_chains = [set(topo.chain(bdf)) for bdf in topo.gpus]
    on_paths = sorted(nic for nic in topo.nics if any(set(topo.chain(nic)) & chain for chain in gpu_chains))
    return {
        "error": None,
        "gpus": gpus,
        "bridges": bridges,
        "nvswitches": nvswitches,
        "rdma_nics": list(topo.nics),
        "nics_on_gpu_paths": on_paths,
    }


def peermem_loaded(proc_path="/proc", sys_module_path="/sys/module"):
    """Whether ``nvidia_peermem`` is loaded: ``/proc/modules`` or ``/sys/module/nvidia_peermem``."""
    if os.path.isdir(os.path.join(sys_module_path, "nvidia_peermem")):
        return True
    modules = _sysfs.read_text(os.path.join(proc_path, "modules"))
    if modules is None:
        return False
    return any(line.split(" ", 1)[0] == "nvidia_peermem" for line in modules.splitlines())
