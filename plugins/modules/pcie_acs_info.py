#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_acs_info
short_description: Audit PCIe Access Control Services (ACS) on the paths between GPUs
version_added: 0.1.0
description:
  - Reads the PCI configuration space of every function in a sysfs PCI tree once, decodes the
    ACS Capability and Control registers of every port the way C(lspci -vvv) does, finds the
    NVIDIA GPUs and RDMA NICs, and works out for every GPU pair which bridges their peer-to-peer
    traffic crosses and whether any of them redirects it to the root complex
    (ReqRedir, CmpltRedir or EgressCtrl set in ACS Control).
  - Read-only; runs no external command.
  - Reading the capabilities needs root (the kernel cuts config space to 64 bytes for other
    users); the module fails with a clear message when that happens.
  - A bridge on a GPU or peer path whose extended config space (256 bytes or less read) cannot
    be decoded has an unknown ACS state, never "no ACS"; it is listed in RV(acs_unknown_ports)
    with the likely cause, and C(peer_to_peer_clear) in RV(summary) is false.
author:
  - gpufleet.node developers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.node.sysfs
  - gpufleet.node.attributes.read_only
notes:
  - The bridges a GPU pair crosses are the union of both GPUs' upstream bridges minus the ones
    they share (two GPUs below one switch cross only its two downstream ports; GPUs on
    different root ports cross every bridge up to and including those root ports).
  - GPUs are functions with vendor 0x10de and class 0x0300 or 0x0302; RDMA NICs have class
    0x0207, or 0x0200 with vendor 0x15b3 (ConnectX, RoCE) or bound to a PCI driver that is an
    RDMA provider (C(mlx5_core), C(mlx4_core), C(efa)).
seealso:
  - module: gpufleet.node.pcie_acs
  - module: gpufleet.node.iommu_info
  - name: NCCL troubleshooting, PCI Access Control Services
    description: Why ACS redirect breaks GPU peer-to-peer traffic.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
"""

EXAMPLES = r"""
- name: Audit ACS on this host
  become: true
  gpufleet.node.pcie_acs_info:
  register: acs

- name: Fail when any GPU pair is redirected through the root complex
  ansible.builtin.assert:
    that: acs.blocked_gpu_pairs | length == 0
    fail_msg: "ACS redirect on {{ acs.blocked_gpu_pairs | map(attribute='redirecting') | flatten | unique | join(', ') }}"

- name: Audit a captured or simulated tree
  gpufleet.node.pcie_acs_info:
    sysfs_path: /srv/lab/node1/sys/bus/pci
"""

RETURN = r"""
ports:
  description: Every bridge and every function with an ACS capability, sorted by BDF.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address, C(domain:bus:device.function).
      type: str
      sample: "0000:42:00.0"
    vendor_id:
      description: Vendor ID, hex.
      type: str
      sample: "0x1000"
    device_id:
      description: Device ID, hex.
      type: str
      sample: "0xc010"
    class:
      description: Class code (base class and subclass), hex.
      type: str
      sample: "0x0604"
    port_type:
      description: PCI Express port type (C(root_port), C(upstream_port), C(downstream_port),
        C(endpoint), ...), or null without a PCI Express capability.
      type: str
      sample: downstream_port
    is_bridge:
      description: Whether the function is a PCI bridge.
      type: bool
    acs_offset:
      description: Config-space offset of the ACS extended capability, or null.
      type: int
      sample: 336
    acs_cap:
      description: Raw ACS Capability register, or null when the function has no ACS capability.
      type: int
      sample: 95
    acs_ctl:
      description: Raw ACS Control register, or null when the function has no ACS capability.
      type: int
      sample: 29
    acs_cap_flags:
      description: ACS Capability decoded by lspci's names, plus C(other_bits) (bits above
        DirectTrans, kept raw); null without ACS.
      type: dict
      sample: {"SrcValid": true, "TransBlk": true, "ReqRedir": true, "CmpltRedir": true,
               "UpstreamFwd": true, "EgressCtrl": false, "DirectTrans": true, "other_bits": 0}
    acs_ctl_flags:
      description: ACS Control decoded like C(acs_cap_flags).
      type: dict
      sample: {"SrcValid": true, "TransBlk": false, "ReqRedir": true, "CmpltRedir": true,
               "UpstreamFwd": true, "EgressCtrl": false, "DirectTrans": false, "other_bits": 0}
    acs_quirk:
      description: C(intel_spt_pch) for Intel PCH root ports whose ACS Control is not where the
        capability says (lspci and setpci show garbage for them), else null.
      type: str
    redirect:
      description: Whether ACS Control has ReqRedir, CmpltRedir or EgressCtrl set.
      type: bool
    acs_unknown:
      description: Whether the port is a PCI Express function whose extended config space could
        not be read (its ACS state is unknown, not absent).
      type: bool
    on_gpu_path:
      description: Whether the port is above any GPU.
      type: bool
    on_peer_path:
      description: Whether GPU-GPU or GPU-RDMA-NIC peer traffic crosses the port (the default
        scope of M(gpufleet.node.pcie_acs)).
      type: bool
    link:
      description: Link capability and status (C(gen_max), C(speed_max), C(width_max),
        C(gen_current), C(speed_current), C(width_current)), or null.
      type: dict
      sample: {"gen_max": 4, "speed_max": "16GT/s", "width_max": 16,
               "gen_current": 4, "speed_current": "16GT/s", "width_current": 16}
    upstream:
      description: Bridges above the port, root first.
      type: list
      elements: str
    driver:
      description: Bound driver (basename of the C(driver) link), or null.
      type: str
    iommu_group:
      description: IOMMU group number, or null.
      type: str
gpus:
  description: The NVIDIA GPUs, sorted by BDF.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    vendor_id:
      description: Vendor ID, hex.
      type: str
    device_id:
      description: Device ID, hex.
      type: str
    class:
      description: Class code, hex.
      type: str
    upstream:
      description: Bridges above the GPU, root first.
      type: list
      elements: str
    redirecting_upstream:
      description: Those of C(upstream) whose ACS Control redirects.
      type: list
      elements: str
    link:
      description: Link capability and status, as for C(ports).
      type: dict
    driver:
      description: Bound driver, or null.
      type: str
    iommu_group:
      description: IOMMU group number, or null.
      type: str
    numa_node:
      description: NUMA node from sysfs, or null.
      type: int
nics:
  description: The RDMA NICs, with the same fields as C(gpus).
  returned: success
  type: list
  elements: dict
gpu_pairs:
  description: Every GPU pair with the bridges their peer traffic crosses.
  returned: success
  type: list
  elements: dict
  contains:
    gpus:
      description: The two GPUs' BDFs.
      type: list
      elements: str
    bridges:
      description: Bridges crossed.
      type: list
      elements: str
    redirecting:
      description: Crossed bridges whose ACS Control redirects peer traffic.
      type: list
      elements: str
    acs_unknown:
      description: Crossed bridges whose ACS state could not be read.
      type: list
      elements: str
    blocked:
      description: Whether C(redirecting) is not empty.
      type: bool
blocked_gpu_pairs:
  description: The entries of C(gpu_pairs) whose traffic is redirected.
  returned: success
  type: list
  elements: dict
  sample: [{"gpus": ["0000:43:00.0", "0000:44:00.0"], "bridges": ["0000:42:00.0", "0000:42:01.0"],
            "redirecting": ["0000:42:00.0", "0000:42:01.0"], "blocked": true}]
gpu_nic_pairs:
  description: Every GPU and RDMA NIC pair (GPUDirect RDMA), with the same fields as
    C(gpu_pairs) but C(gpu) and C(nic) in place of C(gpus).
  returned: success
  type: list
  elements: dict
acs_unknown_ports:
  description: Bridges on a GPU or peer path whose ACS state could not be read, with the reason
    and likely cause; any entry makes C(summary.peer_to_peer_clear) false.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    reason:
      description: What could not be read and the likely cause.
      type: str
summary:
  description: Counts for dashboards and gates.
  returned: success
  type: dict
  sample: {"devices": 14, "ports": 9, "acs_capable_ports": 7, "redirecting_ports": 5,
           "redirecting_peer_path_ports": 5, "gpus": 4, "nics": 1, "gpu_pairs": 6,
           "blocked_gpu_pairs": 6, "blocked_gpu_nic_pairs": 4, "acs_unknown_path_ports": 0,
           "peer_to_peer_clear": false}
warnings_found:
  description: Problems found while decoding (looped capability chains, quirky ports).
  returned: success
  type: list
  elements: str
sysfs_path:
  description: The tree that was read.
  returned: success
  type: str
  sample: /sys/bus/pci
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.pcie._config_space import PciError
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._sysfs import DEFAULT_SYSFS_PATH
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._topology import PciTopology


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_path=dict(type="path", default=DEFAULT_SYSFS_PATH),
        ),
        supports_check_mode=True,
    )
    sysfs_path = module.params["sysfs_path"]
    try:
        audit = PciTopology.scan(sysfs_path).audit()
    except PciError as exc:
        module.fail_json(msg=str(exc), sysfs_path=sysfs_path)
    warnings = audit.pop("warnings")
    for text in warnings:
        module.warn(text)
    module.exit_json(changed=False, sysfs_path=sysfs_path, warnings_found=warnings, **audit)


if __name__ == "__main__":
    main()
