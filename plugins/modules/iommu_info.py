#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: iommu_info
short_description: Report the IOMMU mode, the GPUs' IOMMU groups and vfio-pci bindings
version_added: 0.1.0
description:
  - Works out the IOMMU mode (V(off), V(passthrough), V(translated-strict) or
    V(translated-lazy)) from the IOMMU group C(type) files, C(/sys/class/iommu) and the kernel
    command line, in that order of trust.
  - Lists the IOMMU group of every NVIDIA GPU, the devices bound to C(vfio-pci), any
    C(pci=disable_acs_redir=) on the kernel command line, and a recommendation
    (C(iommu=pt) on a bare-metal multi-GPU host that translates DMA; nothing where VMs need the
    IOMMU).
  - Read-only; works as an unprivileged user (it reads no config space).
author:
  - gpufleet.node developers (@gpufleet)
options:
  sysfs_root:
    description:
      - Where sysfs is mounted (C(class/iommu) and C(kernel/iommu_groups) are read below it).
      - A root that does not exist, or holds no PCI tree (no C(bus/pci/devices), or one without
        devices) while O(sysfs_path) is not given, fails the task.
    type: path
    default: /sys
  proc_path:
    description:
      - Where procfs is mounted (C(cmdline) and C(cpuinfo) are read below it).
    type: path
    default: /proc
  sysfs_path:
    description:
      - The sysfs PCI tree, with the meaning of pciutils' C(-O sysfs.path=).
      - Defaults to C(<sysfs_root>/bus/pci).
    type: path
extends_documentation_fragment:
  - gpufleet.node.attributes.read_only
notes:
  - O(sysfs_root) and O(proc_path) must exist (with C(<proc_path>/cmdline) readable); a tree
    that is not there fails the task instead of reading as "IOMMU off".
seealso:
  - module: gpufleet.node.pcie_acs_info
  - module: gpufleet.node.pcie_acs
"""

EXAMPLES = r"""
- name: Read the IOMMU state
  gpufleet.node.iommu_info:
  register: iommu

- name: Say what to change on the kernel command line
  ansible.builtin.debug:
    msg: "{{ iommu.recommendation.reason }}"
  when: iommu.recommendation.action == 'set_kernel_param'

- name: Read a simulated machine
  gpufleet.node.iommu_info:
    sysfs_root: /srv/lab/node1/sys
    proc_path: /srv/lab/node1/proc
"""

RETURN = r"""
mode:
  description: IOMMU mode, one of C(off), C(passthrough), C(translated-strict), C(translated-lazy).
  returned: success
  type: str
  sample: passthrough
mode_source:
  description: What the mode was derived from.
  returned: success
  type: str
  sample: "iommu_groups/*/type = identity"
enabled:
  description: Whether an IOMMU is active (mode is not C(off)).
  returned: success
  type: bool
units:
  description: Entries of C(<sysfs_root>/class/iommu) (e.g. C(dmar0), C(ivhd0)).
  returned: success
  type: list
  elements: str
cmdline:
  description: The kernel command line, or null when unreadable.
  returned: success
  type: str
cmdline_params:
  description: IOMMU parameters found on the command line (C(intel_iommu), C(amd_iommu),
    C(iommu), C(iommu.passthrough), C(iommu.strict)).
  returned: success
  type: dict
  sample: {"amd_iommu": "on", "iommu": "pt"}
disable_acs_redir:
  description: The devices listed in C(pci=disable_acs_redir=), in order.
  returned: success
  type: list
  elements: str
  sample: ["0000:42:00.0", "0000:42:01.0"]
group_count:
  description: Number of IOMMU groups.
  returned: success
  type: int
group_types:
  description: How many groups report each C(type).
  returned: success
  type: dict
  sample: {"identity": 14}
gpus:
  description: The NVIDIA GPUs and their IOMMU groups.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    driver:
      description: Bound driver, or null.
      type: str
    iommu_group:
      description: Group number, or null.
      type: str
    group_type:
      description: The group's C(type), or null.
      type: str
    group_devices:
      description: Every device in the group.
      type: list
      elements: str
vfio_devices:
  description: Devices bound to vfio-pci.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    iommu_group:
      description: Group number, or null.
      type: str
virtual_machine:
  description: Whether the host is a VM (C(hypervisor) CPU flag); null when cpuinfo is unreadable.
  returned: success
  type: bool
recommendation:
  description: What to do about the IOMMU mode.
  returned: success
  type: dict
  contains:
    action:
      description: C(set_kernel_param), C(keep) (VMs need the IOMMU) or C(none).
      type: str
    kernel_param:
      description: The parameter to add, or an empty string.
      type: str
      sample: iommu=pt
    reason:
      description: Why.
      type: str
sysfs_root:
  description: The sysfs root read.
  returned: success
  type: str
proc_path:
  description: The procfs root read.
  returned: success
  type: str
sysfs_path:
  description: The PCI tree read.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.pcie._config_space import PciError
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._iommu import IommuError, audit


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            proc_path=dict(type="path", default="/proc"),
            sysfs_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = audit(params["sysfs_root"], params["proc_path"], params["sysfs_path"])
    except (IommuError, PciError, OSError) as exc:
        module.fail_json(
            msg="reading IOMMU state under %s and %s failed: %s" % (params["sysfs_root"], params["proc_path"], exc)
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
