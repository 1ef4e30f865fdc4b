#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvbandwidth
short_description: Judge NVIDIA nvbandwidth's copy matrix cell by cell against the node's topology
version_added: 0.1.0
description:
  - Runs NVIDIA's C(nvbandwidth) (U(https://github.com/NVIDIA/nvbandwidth)) as
    C(nvbandwidth [-j] -t TESTCASE [-t ...]) and judges every cell of the copy matrices it
    prints (host to device and device to host per GPU, device to device per GPU pair) against a
    bar derived from that cell's path in the topology facts and, where given, from healthy peers
    of the same design.
  - "The output format is decided from the binary: the module first runs C(nvbandwidth --help)
    (it touches no GPU) and adds C(-j) when that lists C(--json) (v0.5 and later); older builds
    are read as text. Either way the output is read by its structure: the C(Running NAME.) line,
    the matrix title, the column header, one row per source, C(N/A) cells, the C(SUM) line."
  - "The bar of a cell is the larger of the physics figure x O(threshold_fraction) and
    O(baseline_fraction) x the peers' median. Physics uses the DESIGN of the path (C(pcie.gen_max), C(width_max), the NVLink
    count of the design), never how the links trained today, so a link trained down fails
    instead of lowering its bar. Host<->device: the GPU's PCIe link, GT/s x lanes x encoding / 8
    (Gen3 x16 15.75, Gen4 x16 31.5, Gen5 x16 63 GB/s) x a copy-engine efficiency (0.87 from Gen5,
    0.82 up to Gen4). Device<->device: NVLink count x per-link rate (25 GB/s, 50 for NVLink 5) x
    0.82 where the pair has NVLinks, else the slower PCIe link x the path class's efficiency
    (PIX/PXB 0.80, PHB 0.78, NODE 0.60, SYS 0.50). The figures, their sources and what a slow cell
    tells you are in the collection's docs/nvbandwidth.md."
  - A slow cell names the cell, its figure against its bar and the likely cause from the facts - a
    GPU link trained down (C(width_current < width_max), C(gen_current < gen_max)), an NVLink
    down, a pair without NVLink crossing NODE or SYS, a bridge on the pair's path that still
    redirects peer traffic (ACS, from the facts' PCI tree or O(acs)).
  - "Fails closed: the task fails, with the full result, on any slow cell, an off-diagonal C(N/A)
    (no peer access), a cell that cannot be given a bar, a non-zero exit, a timeout (the whole
    process group is killed), a truncated block, a row with the wrong number of cells, a figure
    that is not a finite number, a SUM that does not add up, a testcase that printed no matrix
    or was waived, or GPUs that do not match the topology facts."
  - When the binary is not found the module returns RV(available=false) with the reason; such a
    result never passes.
  - Reports C(changed=false); it changes nothing on the host.
author:
  - gpufleet.node developers (@gpufleet)
options:
  binary:
    description:
      - Path of C(nvbandwidth), or a name to look up in C(PATH) and C(/usr/local/bin),
        C(/opt/nvbandwidth).
    type: path
    default: nvbandwidth
  testcases:
    description:
      - The testcases to run (each as C(-t NAME)), among those this module can judge.
    type: list
    elements: str
    choices:
      - host_to_device_memcpy_ce
      - device_to_host_memcpy_ce
      - device_to_device_memcpy_read_ce
      - device_to_device_memcpy_write_ce
    default: [host_to_device_memcpy_ce, device_to_host_memcpy_ce, device_to_device_memcpy_read_ce]
  topology:
    description:
      - The GPU topology facts, C(ansible_facts.gpu_topology) as M(gpufleet.node.gpu_topology_facts)
        returns them - C(gpus[].index), C(pci_bus_id), C(name), C(pcie.gen_max), C(width_max),
        C(gen_current), C(width_current), the C(links) matrix (C(NV#), C(PIX), C(PXB), C(PHB), C(NODE),
        C(SYS)), C(p2p.read) and C(pci_tree.redirecting).
      - The cells are matched to these GPUs by index; nvbandwidth runs with
        C(CUDA_DEVICE_ORDER=PCI_BUS_ID) so that CUDA numbers the GPUs as NVML does.
    type: dict
    required: true
  threshold_fraction:
    description:
      - The physics bar is what a healthy copy engine reaches on the cell's path times this. The
        default sits under the spread of healthy published outputs and far over every fault the
        bar must catch (see docs/nvbandwidth.md).
    type: float
    default: 0.85
  peer_medians:
    description:
      - The median of healthy peers of the same design for some cells, in GB/s, keyed by the
        cell's id as RV(cells[].cell) gives it (C(TESTCASE:SRC->DST), for example
        C(host_to_device_memcpy_ce:CPU->GPU0) or C(device_to_device_memcpy_read_ce:GPU0->GPU1)).
      - Where a cell has one, its bar is at least O(baseline_fraction) x the median.
    type: dict
    default: {}
  baseline_fraction:
    description:
      - With a peer median, the bar is at least this times it. The default is the NCCL gate's (see
        M(gpufleet.node.nccl_allreduce)).
    type: float
    default: 0.96
  acs:
    description:
      - The result of M(gpufleet.node.pcie_acs_info) (its C(gpu_pairs)), to name a bridge that
        redirects peer traffic on the path of a slow GPU pair. The topology facts' own
        C(pci_tree.redirecting) is read as well.
    type: dict
  buffer_size:
    description: Copy buffer size in MiB (C(--bufferSize)); unset, nvbandwidth's default.
    type: int
  iterations:
    description: Samples per cell (C(--testSamples), v0.5 and later); unset, nvbandwidth's default.
    type: int
  timeout:
    description:
      - Seconds the run may take. It starts in a new session; on expiry its whole process group is
        killed and the task fails. The C(--help) probe gets at most 60 s of it.
    type: int
    default: 600
attributes:
  check_mode:
    support: partial
    description: Returns the command it would run without running anything.
    details:
      - nvbandwidth loads every copy engine of every GPU, so a check-mode run (a drift check on a
        serving node) does not run it, not even C(--help); it returns RV(status=not_run),
        RV(passed=null) and the text-mode command.
extends_documentation_fragment:
  - gpufleet.node.attributes
notes:
  - Run it on idle GPUs (before the inference server starts, or with it stopped); copies that
    share the links with other work measure low and fail.
  - The run does not go through C(run_command), which has no timeout; stderr is merged into
    stdout, where nvbandwidth's error lines belong to the testcase they interrupt.
seealso:
  - module: gpufleet.node.gpu_topology_facts
  - module: gpufleet.node.pcie_acs_info
  - module: gpufleet.node.nccl_allreduce
  - name: nvbandwidth
    description: NVIDIA's memory copy bandwidth tool.
    link: https://github.com/NVIDIA/nvbandwidth
"""

EXAMPLES = r"""
- name: Gather the GPU topology
  gpufleet.node.gpu_topology_facts:

- name: Audit ACS on the GPU paths
  gpufleet.node.pcie_acs_info:
  register: acs

- name: Judge the copy matrix against the node's design
  gpufleet.node.nvbandwidth:
    binary: /opt/nvbandwidth/nvbandwidth
    topology: "{{ ansible_facts.gpu_topology }}"
    acs: "{{ acs }}"
  register: copies

- name: Judge host copies only, against peers of the same design as well
  gpufleet.node.nvbandwidth:
    topology: "{{ ansible_facts.gpu_topology }}"
    testcases: [host_to_device_memcpy_ce, device_to_host_memcpy_ce]
    peer_medians:
      "host_to_device_memcpy_ce:CPU->GPU0": 55.36
      "device_to_host_memcpy_ce:GPU0->CPU": 55.20
"""

RETURN = r"""
available:
  description: Whether the binary was found. When false, RV(reason) says why and RV(passed) is false.
  returned: always
  type: bool
  sample: true
passed:
  description: Whether every cell reached its bar and the output was whole. C(null) in check mode.
  returned: always
  type: bool
  sample: false
status:
  description:
    - C(pass) or C(fail) (the worst of RV(checks)), C(not_run) in check mode, C(unavailable)
      without a binary.
  returned: always
  type: str
  sample: fail
reason:
  description: One sentence on the verdict (every failed check with its reason), or why nothing ran.
  returned: always
  type: str
  sample: "host_to_device_memcpy_ce: host_to_device_memcpy_ce CPU->GPU3 27.68 GB/s under its bar 46.60 GB/s ..."
cmd:
  description: The argv that was run (in check mode, the text-mode argv that would be); C(null) without a binary.
  returned: always
  type: list
  elements: str
  sample: [/usr/local/bin/nvbandwidth, -j, -t, host_to_device_memcpy_ce, -t, device_to_host_memcpy_ce]
format:
  description: How the output was read, C(json) or C(text) (decided from C(--help)); C(null) when nothing ran.
  returned: always
  type: str
  sample: json
version:
  description: The version nvbandwidth printed (C(v0.8)), C(null) when it printed none.
  returned: always
  type: str
  sample: v0.10.0
matrices:
  description:
    - Every matrix of the output by its SUM key (the testcase, or C(_read1)/C(_read2)/C(_total)
      after it for the three of a bidirectional testcase).
  returned: always
  type: dict
  contains:
    testcase: {description: "The testcase that printed it.", type: str}
    title: {description: "Its title, as printed (for example V(memcpy CE CPU(row\\) -> GPU(column\\) bandwidth (GB/s\\)))).", type: str}
    rows: {description: "C({row label: {column label: GB/s or null}}); null for C(N/A).", type: dict}
    sum: {description: "The C(SUM) figure.", type: float}
    cv: {description: "The C(COEFFICIENT_OF_VARIATION) figure (v0.10), else null.", type: float}
  sample: {"host_to_device_memcpy_ce": {"testcase": "host_to_device_memcpy_ce",
           "title": "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
           "rows": {"0": {"0": 55.37, "1": 55.36}}, "sum": 110.73, "cv": 0.0}}
cells:
  description: Every judged cell (the diagonal of a device-to-device matrix is not one).
  returned: always
  type: list
  elements: dict
  contains:
    cell: {description: "Its id, C(TESTCASE:SRC->DST), the key of O(peer_medians).", type: str}
    testcase: {description: "The testcase.", type: str}
    src: {description: "Where the copy reads (C(CPU) or C(GPUn)), as the matrix title orients it.", type: str}
    dst: {description: "Where the copy writes.", type: str}
    gpus: {description: "The GPU indices of the cell.", type: list, elements: int}
    gbps: {description: "The figure, GB/s; null for C(N/A).", type: float}
    bar: {description: "The bar, GB/s; null when none could be derived.", type: float}
    rule: {description: "Which rule set the bar, C(physics) or C(peers).", type: str}
    expected_gbps: {description: "What a healthy copy engine reaches on the path (before O(threshold_fraction)).", type: float}
    physics_bar: {description: "RV(cells[].expected_gbps) x O(threshold_fraction).", type: float}
    peers_bar: {description: "O(baseline_fraction) x the peer median; null without one.", type: float}
    peer_median: {description: "The peer median given for the cell, else null.", type: float}
    basis: {description: "How the physics figure was derived (or why it could not be).", type: str}
    status: {description: "C(pass), C(slow), C(no_peer_access) (an off-diagonal N/A) or C(unjudged) (no bar).", type: str}
    causes: {description: "The likely causes of a slow cell from the facts.", type: list, elements: str}
    actions: {description: "The actions those causes call for.", type: list, elements: str}
slow_cells:
  description: The entries of RV(cells) under their bars or without a figure.
  returned: always
  type: list
  elements: dict
checks:
  description:
    - The check records (C(name), C(status), C(gpus), C(reason), C(action)), as the GPU health
      checks write them - C(nvbandwidth_output) (the run and its output), then one per testcase.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "nvbandwidth_output", "status": "pass", "gpus": [], "reason": "every testcase asked for printed its matrix",
            "action": "none"}]
rc:
  description: The exit status of the run.
  returned: when the run exited (not in check mode, not when killed on timeout)
  type: int
  sample: 0
duration_s:
  description: Seconds spent running (the C(--help) probe and the run).
  returned: always
  type: float
  sample: 12.4
timestamp:
  description: Unix time at which the verdict was reached.
  returned: when the binary ran
  type: float
stdout:
  description: The output of the run (stdout and stderr together), on failure only.
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.diag import _copy_judge, _copy_run, _nvbandwidth

SEARCH_DIRS = ("/usr/local/bin", "/opt/nvbandwidth")
INSTALL_HINT = "build it from github.com/NVIDIA/nvbandwidth"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            binary=dict(type="path", default="nvbandwidth"),
            testcases=dict(
                type="list",
                elements="str",
                choices=list(_copy_judge.JUDGED_TESTCASES),
                default=list(_nvbandwidth.DEFAULT_TESTCASES),
            ),
            topology=dict(type="dict", required=True),
            threshold_fraction=dict(type="float", default=_copy_judge.DEFAULT_THRESHOLD_FRACTION),
            peer_medians=dict(type="dict", default={}),
            baseline_fraction=dict(type="float", default=_copy_judge.DEFAULT_BASELINE_FRACTION),
            acs=dict(type="dict"),
            buffer_size=dict(type="int"),
            iterations=dict(type="int"),
            timeout=dict(type="int", default=600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        _copy_judge.check_options(p["threshold_fraction"], p["baseline_fraction"], p["peer_medians"], p["testcases"])
    except _copy_judge.JudgeError as exc:
        module.fail_json(msg=str(exc))
    for name in ("timeout", "buffer_size", "iterations"):
        if p[name] is not None and p[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %d" % (name, p[name]))
    binary, missing = _proc.find_executable(p["binary"], SEARCH_DIRS, INSTALL_HINT)
    if binary is None:
        module.exit_json(**_copy_run.unavailable(missing))
    if module.check_mode:
        module.exit_json(**_copy_run.not_run(binary, p["testcases"], p["buffer_size"], p["iterations"]))
    result = _copy_run.measure(binary, p, _copy_run.run_bounded)
    if not result["passed"]:
        module.fail_json(msg=_copy_run.failure_message(result), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
