#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_allreduce
short_description: Gate a node on its measured NCCL all-reduce bus bandwidth
version_added: 0.1.0
description:
  - Runs nccl-tests' C(all_reduce_perf) on the node's GPUs (one process, one thread driving
    O(gpus) GPUs), reads its output by the column header it prints, and judges the bus
    bandwidth at the largest message sizes, out-of-place and in-place, against a threshold.
    Never judges on C(# Avg bus bandwidth), the mean over all sizes that small sizes drag down.
  - Fails closed. The task fails, with measured against expected and the likely cause, on a
    non-zero exit, a timeout (the whole process group is killed), C(#wrong) above 0, an
    C(# Out of bounds values ... FAILED) footer, a missing footer (truncated output), no data
    rows, a figure that is not a finite number (C(nan) or C(inf) anywhere in the table or the
    average footer), a C(#wrong) of C(N/A) while O(check) asked for validation, or a bus
    bandwidth under the threshold.
  - "O(min_busbw_gbps=auto) derives the threshold from the GPU topology facts
    (C(ansible_facts.gpu_topology) from M(gpufleet.node.gpu_topology_facts)) and the node's peers:
    C(max(physics floor, baseline_fraction x baseline)). The physics floor is the bus bandwidth
    the model gives a HEALTHY node of this design, times O(threshold_fraction); the baseline is
    the median of the latest healthy figures of the other nodes of the same design key (from
    O(baselines), outliers dropped), used once there are O(baseline_min_samples) of them. The
    verdict says which rule decided."
  - "The design key (RV(design_key)) is computed from what the hardware is built to be: GPU
    model and count, the link class and number of PCIe bridges between every GPU pair (an NVLink
    pair counts as NV whatever its active link count), the PCIe generation and width maximums,
    the NVLink capability of the model, NVSwitch or not, and the RDMA NICs (vendor:device, read
    from the sysfs tree). A GPU trained to x8 or an inactive NVLink keeps the key, so that node
    is judged against its healthy peers."
  - "The physics model: the expected
    bus bandwidth is that of the weakest hop of the best ring NCCL can build through the GPUs,
    each hop valued for the node's design (the maximum PCIe generation and width of the two
    GPUs' links, the NVLink count), never for how the links trained today, so a link trained
    down or a bridge redirecting peer traffic fails the gate instead of lowering its bar."
  - "PCIe hop: raw rate per direction (GT/s x lanes x encoding / 8; Gen3 x16 15.75 GB/s, Gen4
    x16 31.5 GB/s, Gen5 x16 63 GB/s) x a path efficiency by the nvidia-smi topology class:
    PIX and PXB 0.80, PHB 0.78, NODE 0.60, SYS 0.50. NVLink hop: the NV count x 25 GB/s per
    link per direction (50 GB/s for NVLink 5, Blackwell) x 0.80, and x 1.0 through the
    NVSwitches of a Hopper system (NVLink SHARP; 8x H100 = 450 GB/s)."
  - "Sources of the figures: PCIe Gen4 x16 measures about 25 GB/s at best against 31.5 raw
    (0.80); 4x RTX 4090 reach 22-26 GB/s with P2P and about 18 through host memory; ACS
    redirect roughly halves bus bandwidth (NVIDIA/nccl issue 700); 8-GPU NVLink all-reduce
    reaches about 230 GB/s on A100 (12 links, 240 here) and 440-480 GB/s on H100/H200 with
    NVLS (nccl-tests issue 272: 475 on 8x H200; 450 here); Azure's per-SKU floors (228 for 8x
    A100, 460 for 8x H100 at 8-16 GB messages) sit about 4 % under healthy figures, which is
    where O(baseline_fraction) comes from. No peer tool derives its threshold from the topology
    or from the fleet's own healthy nodes; fixed per-SKU floors kept by hand are the usual
    practice."
  - Read-only as far as the host is concerned; it reports C(changed=false).
author:
  - gpufleet.node developers (@gpufleet)
options:
  binary:
    description:
      - Path of C(all_reduce_perf), or a name to look up in C(PATH) and C(/usr/local/bin),
        C(/opt/nccl-tests/build).
    type: path
    default: all_reduce_perf
  min_busbw_gbps:
    description:
      - Threshold for the judged bus bandwidth in GB/s, as a finite number above 0 (for example
        C("22") for 4x PCIe Gen4 behind switches), or C(auto) to derive it from O(topology) (see the
        description for the model). C(nan), C(inf), C(0) and negative numbers are refused.
    type: str
    default: auto
  topology:
    description:
      - The GPU topology facts, C(ansible_facts.gpu_topology) as M(gpufleet.node.gpu_topology_facts)
        sets them (C(gpus[].pcie.gen_max), C(width_max), C(width_current), C(links), C(p2p)).
      - Required when O(min_busbw_gbps=auto); also used for the default of O(gpus) and to name
        the likely cause of a failure (a link trained down, peer-to-peer reads not OK).
    type: dict
  threshold_fraction:
    description:
      - With O(min_busbw_gbps=auto), the physics floor is the expected bus bandwidth times this.
        It decides alone until the peer baseline has O(baseline_min_samples) nodes.
      - Unset, the module's default, chosen to catch every fault the model knows (ACS redirect, a
        GPU at x8, copies through host memory) with room for the model's error across platforms;
        the figure and its reasoning are in the collection's docs/gate.md (the physics floor).
    type: float
  baselines:
    description:
      - "The peer baselines, as M(gpufleet.node.nccl_baseline) with C(state=read) returns them in its
        C(designs): C({design_key: {samples: [{host, gbps, timestamp}]}}), or C({design_key: {error: why}})
        for a design whose file is corrupt (the physics floor then decides, with a warning)."
      - Only this node's design key is used; its own samples are left out (O(host)).
    type: dict
    default: {}
  baseline_fraction:
    description:
      - With a baseline, the threshold is at least this times the median of the peers.
      - Unset, the module's default, from Azure's HPC health checks (8x H100 gated at 460 GB/s,
        about 96 % of what healthy systems reach), between the healthy spread (about 1 % at large
        messages) and one NVLink of 18 down (5.6 %); the figure and its reasoning are in the
        collection's docs/gate.md (why the peers' fraction).
    type: float
  baseline_min_samples:
    description: Peers of the same design the baseline needs before it counts.
    type: int
    default: 5
  baseline_window:
    description: The baseline is the median of at most this many peers, the most recent.
    type: int
    default: 50
  host:
    description:
      - This node's name in the baseline store (its own figures are not its peers), and the
        C(host) of RV(verdict).
    type: str
  record:
    description:
      - What the records of this run (RV(verdict), RV(marker)) carry that only the caller knows.
        Role M(gpufleet.node.nccl_gate) passes them and writes the records as they come back.
    type: dict
    default: {}
    suboptions:
      boot_id:
        description: The boot the verdict holds for (the boot id read before measuring).
        type: str
      result_path:
        description: Where the full result (RV(verdict)) is written; the marker names it.
        type: str
      serving_backend:
        description: The serving backend chosen for the node (C(vllm) or C(llamacpp)).
        type: str
      serving_backend_reason:
        description: Why that backend was chosen.
        type: str
  sysfs_path:
    description:
      - The sysfs PCI tree the RDMA NICs of the design key are read from. Default the tree the
        topology facts were read from (C(pci_tree.sysfs_path)), else C(/sys/bus/pci).
    type: path
  min_bytes:
    description:
      - Smallest message size (C(-b)), in bytes or with a K, M or G suffix (powers of 1024).
      - The defaults measure only sizes that saturate the links; small sizes measure latency.
    type: str
    default: 256M
  max_bytes:
    description:
      - Largest message size (C(-e)), same format. NVLink needs several GB to saturate; each GPU
        needs memory for about three buffers of this size.
    type: str
    default: 4G
  step_factor:
    description: Multiplication factor between sizes (C(-f)).
    type: int
    default: 2
  gpus:
    description:
      - Number of GPUs (C(-g)). Defaults to the number of GPUs in O(topology) (those named by
        C(CUDA_VISIBLE_DEVICES) in O(environment) when it is set, by index or GPU UUID).
    type: int
  iters:
    description: Timed iterations per size (C(-n)).
    type: int
    default: 20
  warmup_iters:
    description: Warm-up iterations per size (C(-w)).
    type: int
    default: 5
  check:
    description:
      - Validate the results (C(-c 1)), so that wrong results fail the gate. With C(false) the
        C(#wrong) column reads C(N/A) and only the bandwidth is judged. With C(true), a C(#wrong) of
        C(N/A) means nothing was validated, and fails the gate.
    type: bool
    default: true
  repeats:
    description:
      - Best of this many runs for the bandwidth (run-to-run noise). A run that fails for any
        other reason (wrong results, exit status, timeout, truncated output) fails at once.
    type: int
    default: 1
  judge_sizes:
    description:
      - How many of the largest message sizes are judged; the judged bus bandwidth is the lowest
        out-of-place or in-place value over them.
    type: int
    default: 2
  timeout:
    description:
      - Seconds one run may take. The run starts in a new session; on expiry its whole process
        group is killed and the task fails.
    type: int
    default: 900
  environment:
    description:
      - Extra environment for the run, typically the node's NCCL variables (C(NCCL_P2P_LEVEL),
        C(NCCL_IB_DISABLE), ...) and C(CUDA_VISIBLE_DEVICES). C(LC_ALL=C) is always set.
    type: dict
    default: {}
attributes:
  check_mode:
    support: partial
    description: Computes the threshold and the command without running the test.
    details:
      - The result cannot be known without running the test, and the test occupies the GPUs;
        in check mode the module computes the threshold and the command but does not run it,
        and returns RV(passed=None).
extends_documentation_fragment:
  - gpufleet.node.attributes
notes:
  - Run it on idle GPUs (before the inference server starts, or with it stopped); a busy GPU
    measures low and fails the gate.
  - Bus bandwidth for all-reduce is algbw x 2(n-1)/n, comparable across GPU counts.
  - The role C(gpufleet.node.nccl_gate) runs this module and writes the verdict it returns
    (RV(marker), RV(verdict)) as a readiness marker for the current boot and a JSON file, with
    Prometheus metrics.
  - The run does not go through C(run_command), which has no timeout; it starts in a new
    session so that a hung test and every process it forked can be killed together.
  - "Output read: the C(#wrong) (nccl-tests 2.13 and later) or C(error) column, with or without
    C(root), C(N/A) with C(-c 0), NCCL C(INFO) lines and launcher prefixes
    (C([1,0]<stdout>:), C(0:)) anywhere."
seealso:
  - module: gpufleet.node.gpu_topology_facts
  - module: gpufleet.node.pcie_acs
  - name: nccl-tests performance notes (bus bandwidth)
    description: What algbw and busbw mean and what to expect.
    link: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
"""

EXAMPLES = r"""
- name: Gather the GPU topology
  gpufleet.node.gpu_topology_facts:

- name: Gate on the all-reduce bandwidth a healthy node of this design reaches
  gpufleet.node.nccl_allreduce:
    binary: /opt/nccl-tests/build/all_reduce_perf
    min_busbw_gbps: auto
    topology: "{{ ansible_facts.gpu_topology }}"
    repeats: 2
  register: nccl

- name: Gate 4x L40S behind PCIe Gen4 switches at a fixed 22 GB/s
  gpufleet.node.nccl_allreduce:
    binary: /usr/local/bin/all_reduce_perf
    min_busbw_gbps: "22"
    gpus: 4
    min_bytes: 64M
    max_bytes: 1G
    environment:
      NCCL_P2P_LEVEL: PXB
      NCCL_IB_DISABLE: "1"
"""

RETURN = r"""
passed:
  description: Whether the node passed. C(null) in check mode (nothing was measured).
  returned: always
  type: bool
  sample: true
judged_busbw_gbps:
  description: The lowest out-of-place or in-place bus bandwidth over the O(judge_sizes) largest sizes, best run.
  returned: always
  type: float
  sample: 23.41
threshold_gbps:
  description: The threshold the judged bus bandwidth was compared with.
  returned: always
  type: float
  sample: 22.12
expected_busbw_gbps:
  description: With O(min_busbw_gbps=auto), what a healthy node of this design reaches; else C(null).
  returned: always
  type: float
  sample: 24.58
design_key:
  description: The node's design key (see the description); C(null) without topology facts.
  returned: always
  type: str
  sample: h100-80gb-hbm3-8x-nvswitch-4f1c0a9e
design:
  description: What the design key was computed from (C(gpu_count), C(gpus), C(pairs), C(nvswitch), C(nics)).
  returned: always
  type: dict
rule:
  description: Which rule set the threshold - C(peer_median), C(physics_floor), or C(fixed) (a number was given).
  returned: always
  type: str
  sample: peer_median
physics_floor_gbps:
  description: With O(min_busbw_gbps=auto), the expected bus bandwidth x O(threshold_fraction); else C(null).
  returned: always
  type: float
  sample: 382.5
baseline:
  description: With O(min_busbw_gbps=auto), the peer baseline of this design; else C(null).
  returned: always
  type: dict
  contains:
    median_gbps: {description: Median of the peers kept (C(null) without any)., type: float, sample: 464.71}
    count: {description: Peers behind the median., type: int, sample: 7}
    hosts: {description: Their names., type: list, elements: str}
    outliers: {description: "Peers dropped as outliers, C([{host, gbps}]).", type: list, elements: dict}
    threshold_gbps: {description: "O(baseline_fraction) x the median, once O(baseline_min_samples) peers exist.", type: float}
    problem: {description: "Why the design's baseline could not be used (a corrupt file), else C(null).", type: str}
    rule_text: {description: "The rule in words, as the reason quotes it.", type: str}
model:
  description: With O(min_busbw_gbps=auto), how the expectation was derived; else C(null).
  returned: always
  type: dict
  contains:
    worst_link:
      description: Topology class of the weakest hop of the best ring.
      type: str
      sample: PHB
    worst_pair:
      description: GPU indices of that hop.
      type: list
      elements: int
      sample: [1, 2]
    ring:
      description: GPU indices in ring order.
      type: list
      elements: int
      sample: [0, 1, 2, 3]
    basis:
      description: How the weakest hop was valued.
      type: str
      sample: "PHB: PCIe Gen4 x16 31.51 GB/s x 0.78"
reason:
  description: One sentence on the verdict, with measured against expected and the likely cause.
  returned: always
  type: str
  sample: "bus bandwidth 11.70 GB/s at sizes [2147483648, 4294967296] B is under the threshold 22.12 GB/s ..."
kind:
  description:
    - "The verdict's category: C(ok), C(low_bandwidth), C(wrong), C(out_of_bounds), C(exit), C(timeout),
      C(truncated), C(no_rows), C(non_finite) (a NaN or infinite figure was printed), C(unvalidated)
      (O(check) asked for validation but C(#wrong) read N/A), or C(check_mode)."
  returned: always
  type: str
  sample: ok
rows:
  description: The data rows of the best run, in output order.
  returned: always
  type: list
  elements: dict
  contains:
    size: {description: Message size in bytes., type: int, sample: 4294967296}
    count: {description: Elements., type: int, sample: 1073741824}
    type: {description: Data type., type: str, sample: float}
    redop: {description: Reduction operation (C(null) in the oldest format)., type: str, sample: sum}
    root: {description: Root rank (C(-1) for all-reduce; C(null) before nccl-tests printed it)., type: int, sample: -1}
    time_oop: {description: Out-of-place time in microseconds., type: float, sample: 12646.0}
    algbw_oop: {description: Out-of-place algorithm bandwidth in GB/s., type: float, sample: 169.81}
    busbw_oop: {description: Out-of-place bus bandwidth in GB/s., type: float, sample: 318.4}
    wrong_oop: {description: Out-of-place wrong elements; C(null) when not validated or in the old C(error) format., type: int, sample: 0}
    time_ip: {description: In-place time in microseconds., type: float, sample: 12641.0}
    algbw_ip: {description: In-place algorithm bandwidth in GB/s., type: float, sample: 169.88}
    busbw_ip: {description: In-place bus bandwidth in GB/s., type: float, sample: 318.52}
    wrong_ip: {description: "In-place wrong elements, as for RV(rows[].wrong_oop).", type: int, sample: 0}
avg_busbw_gbps:
  description: The C(# Avg bus bandwidth) footer of the best run (informational, never judged).
  returned: always
  type: float
  sample: 21.7
out_of_bounds:
  description: The count in the C(# Out of bounds values) footer, C(null) when it is missing.
  returned: always
  type: int
  sample: 0
cmd:
  description: The argv that was (or in check mode would be) run.
  returned: always
  type: list
  elements: str
  sample: [/usr/local/bin/all_reduce_perf, -b, "268435456", -e, "4294967296", -f, "2", -g, "4", -n, "20", -w, "5", -c, "1"]
rc:
  description: Exit status of the last run.
  returned: when the last run exited (not in check mode, not when killed on timeout)
  type: int
  sample: 0
duration_s:
  description: Seconds spent running, all repeats together.
  returned: always
  type: float
  sample: 41.2
runs:
  description: One entry per run.
  returned: always
  type: list
  elements: dict
  contains:
    judged_busbw_gbps: {description: That run's judged bus bandwidth., type: float, sample: 23.4}
    kind: {description: That run's verdict category., type: str, sample: ok}
    rc: {description: That run's exit status., type: int, sample: 0}
    duration_s: {description: That run's duration., type: float, sample: 20.1}
timestamp:
  description: Unix time at which the verdict was reached.
  returned: always
  type: float
  sample: 1764403200.5
stdout:
  description: Output (stdout and stderr together) of the last run, on failure only.
  returned: failure
  type: str
verdict:
  description:
    - The full result as role M(gpufleet.node.nccl_gate) writes it (JSON, keys sorted), on
      success and on failure alike (kind C(error) with the message as the reason when the gate
      could not run). Its fields are listed in one place, the collection's docs/gate.md (the
      verdict and the readiness marker).
  returned: always, except when the arguments are refused (see P(gpufleet.node.nccl_gate_records#filter))
  type: dict
marker:
  description:
    - The readiness marker of this boot, ready to write (JSON, keys sorted), on success and on
      failure alike; what M(gpufleet.node.node_readiness_info) and the node's HAProxy agent
      read. Its fields are listed in one place, the collection's docs/gate.md.
  returned: always, except when the arguments are refused (see P(gpufleet.node.nccl_gate_records#filter))
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.process import get_bin_path

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import (
    _baseline,
    _command,
    _gate,
    _readiness,
    _threshold,
)

SEARCH_DIRS = ["/usr/local/bin", "/opt/nccl-tests/build", "/usr/local/nccl-tests/build"]


def _records(module, result):
    """``result`` with the records to write (``verdict``, ``marker``) built from it."""
    verdict, marker = _readiness.gate_records(result, module.params["host"], **module.params["record"])
    return dict(result, verdict=verdict, marker=marker)


def _fail(module, msg, **result):
    """Fail the task with ``msg``; the records say so too (kind ``error`` without a verdict)."""
    module.fail_json(**_records(module, dict(result, msg=msg)))


def _binary(module, binary):
    """The path of all_reduce_perf: looked up (PATH and SEARCH_DIRS) when a bare name."""
    if os.sep not in binary:
        try:
            return get_bin_path(binary, opt_dirs=SEARCH_DIRS)
        except ValueError as e:
            _fail(module, str(e))
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        _fail(
            module,
            f"{binary} is not an executable file: build nccl-tests "
            "(make -C nccl-tests) or point binary at all_reduce_perf",
        )
    return binary


def main():
    module = AnsibleModule(
        argument_spec=dict(
            topology=dict(type="dict"),
            binary=dict(type="path", default="all_reduce_perf"),
            min_busbw_gbps=dict(type="str", default="auto"),
            threshold_fraction=dict(type="float"),
            baselines=dict(type="dict", default={}),
            baseline_fraction=dict(type="float"),
            baseline_min_samples=dict(type="int", default=_threshold.DEFAULT_MIN_SAMPLES),
            baseline_window=dict(type="int", default=_baseline.DEFAULT_WINDOW),
            host=dict(type="str"),
            record=dict(
                type="dict",
                default={},
                options=dict(
                    boot_id=dict(type="str"),
                    result_path=dict(type="str"),
                    serving_backend=dict(type="str"),
                    serving_backend_reason=dict(type="str"),
                ),
            ),
            sysfs_path=dict(type="path"),
            gpus=dict(type="int"),
            min_bytes=dict(type="str", default="256M"),
            max_bytes=dict(type="str", default="4G"),
            warmup_iters=dict(type="int", default=5),
            check=dict(type="bool", default=True),
            environment=dict(type="dict", default={}),
            **{name: dict(type="int", default=default) for name, default in _gate.COUNTS.items()},
        ),
        required_if=[("min_busbw_gbps", "auto", ("topology",))],
        required_one_of=[("gpus", "topology")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        plan = _gate.prepare(p, module.warn)
    except _gate.GateError as e:
        _fail(module, str(e))
    argv = _command.build_argv(
        _binary(module, p["binary"]),
        plan["min_bytes"],
        plan["max_bytes"],
        p["step_factor"],
        plan["gpus"],
        p["iters"],
        p["warmup_iters"],
        p["check"],
    )
    result = _gate.planned_result(plan, argv)
    if module.check_mode:
        module.exit_json(**_records(module, _gate.check_mode(result)))
    result, stdout, failure = _gate.measure(plan, argv, result, p)
    if failure:
        _fail(module, failure, stdout=stdout, **result)
    module.exit_json(**_records(module, result))


if __name__ == "__main__":
    main()
