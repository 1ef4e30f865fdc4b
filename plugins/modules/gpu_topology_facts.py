#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_topology_facts
short_description: GPU topology facts from NVML or nvidia-smi, checked against the PCI tree
description:
  - Reads the NVIDIA GPUs of the host, the link class between every pair of them (C(X),
    C(PIX), C(PXB), C(PHB), C(NODE), C(SYS), C(NV#)), the peer-to-peer (P2P) read, write and
    NVLink status matrices, PCIe link generation and width, NUMA node, CPU affinity and active
    NVLink count of each GPU, and sets them as C(ansible_facts.gpu_topology).
  - Uses NVML through NVIDIA's C(nvidia-ml-py) package (C(import pynvml)) when it is importable
    and initialisable on the target, otherwise C(nvidia-smi) (C(topo -m), C(topo -p2p r|w|n),
    C(nvlink -s) and C(--query-gpu)). Both give the same facts for the same machine.
  - Maps each GPU bus id to its device in the sysfs PCI tree and reports the bridges that peer
    traffic between each pair crosses, and which of them redirect it (ACS), when the tree's
    config space is readable (as root).
  - With O(expect), compares the topology with what the node must have (GPU count, PCIe
    generation and width, P2P between all pairs, NVLink) and fails the task on any violation
    unless O(report_only=true). Each violation names the GPUs and the bridges concerned.
  - A host whose driver reports no GPU gets empty facts with C(no_gpus=true); that fails only
    when O(expect.gpu_count) asks for GPUs. nvidia-smi's failure texts (driver not loaded,
    driver/library mismatch, a GPU fallen off the bus) fail the task and name the cause.
  - A driver that reports no GPU (nvidia-smi prints nothing or C(No devices were found)) while
    the PCI tree holds NVIDIA GPUs bound to the C(nvidia) driver is a driver problem, and the task
    fails (cause C(driver_no_devices)).
  - Every C(nvidia-smi) call has a deadline (O(timeout)); a call that runs past it is killed with
    its process group and the task fails naming the command (cause C(nvidia_smi_timeout)).
version_added: 0.1.0
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - On the target, either C(nvidia-ml-py) (Python module C(pynvml)) with the NVIDIA driver, or
    the driver's C(nvidia-smi).
options:
  backend:
    description:
      - Where the topology is read from.
      - V(auto) uses NVML when C(pynvml) imports and C(nvmlInit()) succeeds, and C(nvidia-smi)
        otherwise (the reason is returned in RV(backend_notes)).
    type: str
    choices: [auto, nvml, nvidia_smi]
    default: auto
  nvidia_smi_path:
    description:
      - Path of the C(nvidia-smi) binary. By default it is looked up on E(PATH) (and in
        C(/usr/bin), C(/usr/local/bin)).
    type: path
  timeout:
    description:
      - Seconds each C(nvidia-smi) call may take. A call still running then is killed (its whole
        process group) and the task fails naming the command; a hung C(nvidia-smi) usually
        means a wedged driver or GPU.
    type: int
    default: 60
  expect:
    description:
      - What the node must have. Every unmet expectation is a violation.
    type: dict
    suboptions:
      gpu_count:
        description:
          - Number of GPUs the NVIDIA driver must see (GPUs bound to another driver do not count).
          - Unset, a host without GPUs is not a violation (C(no_gpus=true)).
        type: int
      min_pcie_gen:
        description:
          - Lowest acceptable PCIe generation, compared with the maximum each GPU's link can
            negotiate (C(pcie.gen_max)); the current generation drops while a GPU idles.
        type: int
      min_pcie_width:
        description:
          - Lowest acceptable current PCIe link width (for example V(16)); a GPU trained down to
            x8 is a violation that names the GPU and the port above it.
        type: int
      p2p_all_pairs:
        description:
          - Require P2P read and write status C(OK) between every pair of GPUs. A pair that is not
            C(OK) is a violation naming both GPUs, the bridges on their path, and those
            redirecting peer traffic.
        type: bool
        default: false
      nvlink_required:
        description:
          - Require an active NVLink on every GPU and an NVLink class (C(NV#)) between every pair.
        type: bool
        default: false
  report_only:
    description:
      - Return the violations without failing the task.
    type: bool
    default: false
extends_documentation_fragment:
  - gpufleet.node.sysfs
  - gpufleet.node.attributes.read_only
  - gpufleet.node.attributes.facts
notes:
  - The C(nvidia-smi) calls run with C(LC_ALL=C). The C(topo -p2p) mode letter is passed as its own
    argument.
  - NVML's P2P index constants are not used (C(NVML_P2P_CAPS_INDEX_READ) is a tuple in some
    nvidia-ml-py releases); the integer indexes are.
  - GPUs bound to another driver (for example vfio-pci for a VM) are invisible to NVML and
    nvidia-smi; they are listed in C(pci_tree.other_gpus).
seealso:
  - module: gpufleet.node.pcie_acs_info
  - module: gpufleet.node.pcie_acs
"""

EXAMPLES = r"""
- name: Gather GPU topology facts
  gpufleet.node.gpu_topology_facts:

- name: Require four GPUs at x16 that can all talk to each other
  gpufleet.node.gpu_topology_facts:
    expect:
      gpu_count: 4
      min_pcie_width: 16
      min_pcie_gen: 4
      p2p_all_pairs: true

- name: Report NVLink problems of an HGX node without failing
  gpufleet.node.gpu_topology_facts:
    backend: nvml
    expect:
      gpu_count: 8
      nvlink_required: true
    report_only: true
  register: topo

- name: Use the facts
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu_topology.summary.worst_link }} / {{ topo.violations | length }} violation(s)"

- name: Read a lab machine through its nvidia-smi stand-in
  gpufleet.node.gpu_topology_facts:
    backend: nvidia_smi
    nvidia_smi_path: "{{ playbook_dir }}/../lab/bin/nvidia-smi"
    sysfs_path: "{{ lab_root }}/sys/bus/pci"
"""

RETURN = r"""
backend:
  description: The backend that produced the facts (V(none) when no tool could be used and the PCI
    tree holds no NVIDIA GPU).
  returned: always
  type: str
  sample: nvml
backend_notes:
  description: Why V(auto) did not use NVML, when it did not.
  returned: always
  type: list
  elements: str
  sample: ["NVML: nvmlInit() failed: NVML Shared Library Not Found"]
violations:
  description: Unmet expectations (also in the facts).
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: Which expectation (C(gpu_count), C(pcie_width), C(pcie_gen), C(p2p), C(nvlink)).
      type: str
    gpus:
      description: GPU labels concerned (C(GPU0)...).
      type: list
      elements: str
    bridges:
      description: Bridges concerned (redirecting ones for C(p2p) when known, else the path).
      type: list
      elements: str
    message:
      description: What is wrong, where, and what to do.
      type: str
  sample:
    - check: pcie_width
      gpus: [GPU2]
      bridges: ["0000:47:00.0"]
      message: "GPU2 (0000:48:00.0, NVIDIA L40S) PCIe link trained to x8 below port 0000:47:00.0, expected at least x16 ..."
ansible_facts:
  description: Facts set by the module.
  returned: always
  type: dict
  contains:
    gpu_topology:
      description: The GPU topology of the host.
      type: dict
      contains:
        backend:
          description: V(nvml) or V(nvidia_smi) (V(none) without any tool and without GPUs).
          type: str
        driver_version:
          description: NVIDIA driver version, or null without GPUs.
          type: str
          sample: "570.133.20"
        gpu_count:
          description: Number of GPUs visible to the driver.
          type: int
        no_gpus:
          description: True when the driver sees no GPU.
          type: bool
        gpus:
          description: One entry per GPU, by index.
          type: list
          elements: dict
          contains:
            index:
              description: NVML / nvidia-smi index.
              type: int
            uuid:
              description: GPU UUID.
              type: str
            name:
              description: Product name.
              type: str
            pci_bus_id:
              description: PCI address in sysfs form.
              type: str
              sample: "0000:07:00.0"
            memory_total_mib:
              description: Total memory in MiB.
              type: int
            pcie:
              description: PCIe link C(gen_current), C(gen_max), C(width_current), C(width_max).
              type: dict
            numa_node:
              description: NUMA node the GPU is attached to, null when unknown or several.
              type: int
            cpu_affinity:
              description: CPUs close to the GPU, as a cpulist (C(0-31,64-95)), null when unknown.
              type: str
            gpu_numa_id:
              description: NUMA node of the GPU's own memory (coherent GPUs), else null.
              type: int
            nvlinks:
              description: Number of active NVLinks.
              type: int
            upstream_port:
              description: The bridge directly above the GPU in the PCI tree, when found.
              type: str
        links:
          description: 'Link class between each pair, C({"GPU0": {"GPU0": "X", "GPU1": "PIX"}}).'
          type: dict
        p2p:
          description: P2P status matrices C(read), C(write), C(nvlink), each like C(links), with
            the values C(X OK CNS GNS TNS NS DR U).
          type: dict
        bridges:
          description: 'Bridges peer traffic crosses between each pair of GPUs (from the PCI tree), in
            the order it crosses them, C({"GPU0": {"GPU1": ["0000:42:00.0", "0000:42:01.0"]}});
            null for a GPU not in the tree.'
          type: dict
        pci_tree:
          description: The cross-check with the sysfs tree - C(sysfs_path), C(checked),
            C(config_readable), C(missing) (GPU bus ids not in the tree), C(other_gpus) (NVIDIA GPUs
            in the tree the driver does not manage, with their driver), C(redirecting) (per pair,
            the bridges whose ACS Control redirects peer traffic; null when config space was not
            readable) and C(error).
          type: dict
        summary:
          description: C(gpu_count), C(pairs), C(p2p_all_pairs), C(p2p_pairs_not_ok), C(worst_link),
            C(best_link), C(nvlink), C(nvlink_all_pairs), C(numa_nodes), C(pcie_downtrained).
          type: dict
        violations:
          description: As RV(violations).
          type: list
          elements: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _topology_facts

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None


def run_nvidia_smi(module):
    timeout = module.params["timeout"]

    def run(argv):
        result = _proc.run(argv, timeout, environment={"LC_ALL": "C"})
        if result.timed_out:
            raise _topology_facts.GpuTopologyError(
                "nvidia_smi_timeout",
                "%s: a hung nvidia-smi usually means a wedged driver or GPU (look for Xid errors in "
                "dmesg); raise timeout only if this node is known to be slow" % _proc.describe_timeout(argv, timeout),
            )
        return result.rc, result.stdout, result.stderr

    return run


def find_nvidia_smi(module):
    path = module.params["nvidia_smi_path"]
    if path:
        return path
    return module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"])


def no_tool_result(module, notes, causes):
    """Neither NVML nor nvidia-smi could be used: fine without NVIDIA GPUs, else a failure."""
    sysfs_path = module.params["sysfs_path"]
    in_tree = _topology_facts.sysfs_nvidia_gpus(sysfs_path)
    if in_tree:
        module.fail_json(
            msg="%s; yet the PCI tree at %s holds NVIDIA GPU(s) %s: install and load the NVIDIA driver "
            "(nvidia-smi) or nvidia-ml-py, or set nvidia_smi_path"
            % ("; ".join(causes), sysfs_path, ", ".join(in_tree)),
            backend_notes=notes,
        )
    record = _topology_facts.empty_record()
    facts = _topology_facts.build_facts(record, "none", sysfs_path, module.params["expect"])
    return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia_smi"]),
            nvidia_smi_path=dict(type="path"),
            timeout=dict(type="int", default=60),
            sysfs_path=dict(type="path", default="/sys/bus/pci"),
            expect=dict(
                type="dict",
                options=dict(
                    gpu_count=dict(type="int"),
                    min_pcie_gen=dict(type="int"),
                    min_pcie_width=dict(type="int"),
                    p2p_all_pairs=dict(type="bool", default=False),
                    nvlink_required=dict(type="bool", default=False),
                ),
            ),
            report_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    backend = module.params["backend"]
    sysfs_path = module.params["sysfs_path"]
    if module.params["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds, not %d" % module.params["timeout"])
    expect = module.params["expect"] or {}
    notes = []
    record = None
    used = None
    facts = None

    try:
        if backend in ("auto", "nvml"):
            if pynvml is None:
                if backend == "nvml":
                    module.fail_json(
                        msg="backend=nvml needs the nvidia-ml-py package (module pynvml) "
                        "on the target: pip install nvidia-ml-py",
                        exception=PYNVML_IMPORT_ERROR,
                    )
                notes.append("NVML: the pynvml module (nvidia-ml-py) is not installed")
            else:
                try:
                    record = _topology_facts.collect_nvml(pynvml)
                    used = "nvml"
                except _topology_facts.NvmlUnavailable as exc:
                    if backend == "nvml":
                        facts = no_tool_result(module, notes, ["NVML: %s" % exc])
                    notes.append("NVML: %s" % exc)
        if record is None and facts is None:
            binary = find_nvidia_smi(module)
            if binary is None:
                facts = no_tool_result(module, notes, notes + ["nvidia-smi is not on PATH"])
            else:
                record = _topology_facts.collect_nvidia_smi(run_nvidia_smi(module), binary)
                used = "nvidia_smi"
        if record is not None:
            _topology_facts.check_driver_sees_gpus(record, used, sysfs_path)
    except _topology_facts.GpuTopologyError as exc:
        # A driver that is not loaded on a host whose PCI tree has no NVIDIA GPU: nothing to see.
        if exc.cause == "driver_not_loaded" and _topology_facts.sysfs_nvidia_gpus(sysfs_path) == []:
            notes.append("%s (no NVIDIA GPU in the PCI tree at %s)" % (exc, sysfs_path))
            facts = _topology_facts.build_facts(_topology_facts.empty_record(), "none", sysfs_path, expect)
        else:
            module.fail_json(msg=str(exc), cause=exc.cause, backend=used or backend, backend_notes=notes)

    if facts is None:
        facts = _topology_facts.build_facts(record, used, sysfs_path, expect)
    violations = facts["violations"]
    result = dict(
        changed=False,
        backend=facts["backend"],
        backend_notes=notes,
        violations=violations,
        ansible_facts={"gpu_topology": facts},
    )
    if violations and not module.params["report_only"]:
        module.fail_json(
            msg="%d GPU topology violation(s): %s" % (len(violations), " | ".join(v["message"] for v in violations)),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
