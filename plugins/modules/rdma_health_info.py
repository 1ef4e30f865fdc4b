#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_health_info
short_description: InfiniBand and RoCE port health of a GPU node
version_added: 0.3.0
description:
  - Reads every RDMA device of the node (InfiniBand and RoCE alike) from sysfs
    (C(<sysfs_path>/class/infiniband)) - firmware, PCI function and the bridges above it, and
    per port the state, physical state, rate, width, link layer and counters - and judges it,
    check by check. Each check returns C(pass), C(warn) or C(fail), the ports it names
    (C(mlx5_0/1)), the reason and the action it calls for (C(fix the node configuration) or
    C(drain and inspect the hardware)).
  - C(port_count) - the judged ports against O(expect.ports); a node without any RDMA device
    passes (C(no RDMA device)) only when no port is expected.
  - C(readable) - every file the checks need reads as its format; a missing or unreadable file,
    or a counter that is not an integer (the C(N/A) of a driver without a performance-management
    agent), fails naming the file.
  - C(port_state) - every port C(ACTIVE) and C(LinkUp); C(Polling) (no link partner), C(Disabled)
    and a link up that no subnet manager activated fail, naming the port and the state.
  - C(link_layer) - every port on O(expect.link_layer) (only when it is given).
  - C(rate) - every active port at O(expect.rate_gbps); a port below it (a link trained down)
    fails, above it warns. Without it, ports of the node that disagree with each other warn.
  - C(link_flap) - C(link_downed) must not rise between this run's two reads (O(sample_interval))
    nor since the previous run's record (O(record_path)); NVSentinel and Azure's HPC health checks
    fail a node on a flap. A C(link_downed) at its maximum (255) warns, since it can no longer
    rise.
  - C(error_counters) - per counter, the growth per minute between the same reads, taken over at
    least a minute, against a limit (see O(counter_limits)). Past it C(symbol_error) (above 2 per
    minute), C(excessive_buffer_overrun_errors), C(local_link_integrity_errors) and
    C(rnr_nak_retry_err) (any increase) fail; C(link_error_recovery) (5), C(port_rcv_errors)
    (600), C(port_xmit_discards) (6000), C(local_ack_timeout_err) (60) and C(roce_slow_restart)
    (600) warn. These are NVIDIA NVSentinel's NIC health monitor defaults, per minute. A counter at
    its maximum warns.
  - C(verbs_device) - each device has its verbs node, C(<dev_path>/infiniband/uverbs<N>) (named by
    C(<sysfs_path>/class/infiniband_verbs/uverbs<N>/ibdev)); without it RDMA verbs are unusable.
  - C(record) - only when the counter record cannot be read or written, or is dated in the future.
  - Where sysfs lacks a port's C(state), C(phys_state), C(rate) or C(link_layer), or a device's
    C(fw_ver), C(ibv_devinfo -v) and then C(ibstat) are run and the field is taken from the first
    that prints it; absent tools matter only then.
  - The task fails (with the full result) when a check fails; warnings are reported as warnings.
    It fails without judging when O(sysfs_path) is not a sysfs tree.
  - "The counter record at O(record_path) is this module's own state file (like the GPU XID
    history of M(gpufleet.node.gpu_health_info)): the counters of the latest read, written
    atomically at the end of each run, outside check mode. Writing it does not report
    C(changed)."
author:
  - gpufleet.node developers (@gpufleet)
options:
  sysfs_path:
    description:
      - Where sysfs is mounted; C(class/infiniband) and C(class/infiniband_verbs) are read under
        it. Point it at a captured or simulated tree to read that instead of this host.
      - This is the sysfs root, not the PCI tree of the collection's C(gpufleet_sysfs_path)
        (C(/sys/bus/pci)); for a tree at C(X/bus/pci) give C(X).
    type: path
    default: /sys
  dev_path:
    description: Where the device nodes are (C(<dev_path>/infiniband/uverbs<N>) are checked).
    type: path
    default: /dev
  devices:
    description:
      - The RDMA devices that make up the fabric, by name or shell pattern (C(mlx5_[0-7])); the
        others are reported and not judged. Empty judges every device.
      - A name or pattern that matches no device fails C(port_count).
    type: list
    elements: str
    default: []
  expect:
    description:
      - What the node's hardware design has, as the caller knows it for the design (peers of one
        design agree, so a node whose ports run at 200 among peers at 400 fails).
    type: dict
    default: {}
    suboptions:
      ports:
        description: The number of judged ports. V(0) accepts a node without RDMA devices.
        type: int
      rate_gbps:
        description: The data rate of each port in Gb/s, as sysfs's C(rate) gives it (C(400) for 4X NDR).
        type: float
      link_layer:
        description: The link layer of every judged port.
        type: str
        choices: [InfiniBand, Ethernet]
  sample_interval:
    description:
      - Seconds between the two reads of the counters in one run; C(link_downed) and the error
        counters are compared across them. V(0) reads once (then only O(record_path) can show a
        flap, and without it C(link_flap) and C(error_counters) warn as not measured).
    type: float
    default: 2
  record_path:
    description:
      - The counter record (JSON, on persistent storage such as
        C(/var/lib/gpufleet/rdma-counters.json)). Each run compares the counters with it and then
        replaces it; no file yet means nothing to compare with. A file that cannot be read fails
        C(record), and this run writes a new one.
    type: path
  counter_limits:
    description:
      - Per-minute limits that replace the defaults, by counter name (C(symbol_error),
        C(link_error_recovery), C(port_rcv_errors), C(port_xmit_discards),
        C(excessive_buffer_overrun_errors), C(local_link_integrity_errors), C(rnr_nak_retry_err),
        C(local_ack_timeout_err), C(roce_slow_restart)); V(0) means any increase. Another name is
        refused.
      - The growth is taken over at least a minute, so over a short O(sample_interval) it is the
        count itself that must exceed the limit.
    type: dict
    default: {}
  ibv_devinfo:
    description:
      - Path of rdma-core's C(ibv_devinfo), or a name to look up in C(PATH), C(/usr/sbin), C(/sbin).
        Run (as C(ibv_devinfo -v)) only when sysfs lacks a needed field.
    type: path
    default: ibv_devinfo
  ibstat:
    description:
      - Path of infiniband-diags' C(ibstat), or a name to look up the same way. Run only when sysfs
        and C(ibv_devinfo) both lack a needed field.
    type: path
    default: ibstat
  timeout:
    description: Seconds each tool may run; one still running then is killed with its process group.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    description: Reads and judges the same in check mode.
    details:
      - Reading sysfs is harmless, so the module reads, waits O(sample_interval) and judges as
        usual; it does not write the counter record.
extends_documentation_fragment:
  - gpufleet.node.attributes
notes:
  - The thresholds, their sources and the counters' meaning are in the collection's docs/fabric.md.
  - InfiniBand PortCounters stop at their maximum instead of wrapping (C(link_downed) 255,
    C(symbol_error) 65535); a counter that went down between two reads was cleared (driver
    reload, reboot, C(perfquery -R)), and its value is what grew since.
  - C(ibv_devinfo) asks the device through verbs; C(ibstat) reads the same sysfs files through
    libibumad, so it adds little where sysfs itself fails.
seealso:
  - module: gpufleet.node.gpu_health_info
  - name: Linux sysfs ABI of /sys/class/infiniband
    description: The files read and their meaning.
    link: https://www.kernel.org/doc/Documentation/ABI/stable/sysfs-class-infiniband
"""

EXAMPLES = r"""
- name: Judge the eight NDR ports of an HGX H100 node; the management bond is not judged
  gpufleet.node.rdma_health_info:
    devices: ["mlx5_[0-9]"]
    expect:
      ports: 8
      rate_gbps: 400
      link_layer: InfiniBand
    record_path: /var/lib/gpufleet/rdma-counters.json
  register: fabric

- name: A RoCE node, one quick read against the counters of the previous run
  gpufleet.node.rdma_health_info:
    expect:
      ports: 8
      rate_gbps: 200
      link_layer: Ethernet
    sample_interval: 0
    record_path: /var/lib/gpufleet/rdma-counters.json

- name: A node without RDMA (inference on one GPU) - passes only with no device
  gpufleet.node.rdma_health_info:
    expect:
      ports: 0
"""

RETURN = r"""
status:
  description: The worst check, C(pass), C(warn) or C(fail).
  returned: always
  type: str
  sample: fail
action:
  description: The strongest action the checks call for (C(none) when all passed).
  returned: always
  type: str
  sample: drain and inspect the hardware
passed:
  description: No check failed.
  returned: always
  type: bool
  sample: false
checks:
  description: One entry per check.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: C(port_count), C(readable), C(port_state), C(link_layer), C(rate), C(link_flap),
        C(error_counters), C(verbs_device), C(record).
      type: str
    status:
      description: C(pass), C(warn) or C(fail).
      type: str
    ports:
      description: The ports concerned, C(<device>/<port>).
      type: list
      elements: str
    gpus:
      description: Always empty (the shape of the GPU health checks).
      type: list
      elements: str
    reason:
      description: What was found, naming each port and the value read.
      type: str
    action:
      description: C(none), C(fix the node configuration) or C(drain and inspect the hardware).
      type: str
  sample:
    - name: rate
      status: fail
      ports: [mlx5_3/1]
      gpus: []
      reason: "mlx5_3/1 at 200 Gb/s (4X HDR), 400 Gb/s expected: a link trained down - reseat or replace the cable or transceiver, check the switch port"
      action: drain and inspect the hardware
devices:
  description: Every RDMA device, in name order.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The device (C(mlx5_0)).
      type: str
    judged:
      description: Whether O(devices) selects it.
      type: bool
    fw_ver:
      description: Firmware version.
      type: str
      sample: "28.41.1000"
    node_guid:
      description: Node GUID as sysfs prints it.
      type: str
    hca_type:
      description: Adapter type where the driver gives it (C(MT4129) is ConnectX-7).
      type: str
    board_id:
      description: Board id where the driver gives it (C(MT_0000000838)).
      type: str
    pci_address:
      description: The PCI function (C(0000:0e:00.0)); null for a device without one (soft RoCE).
      type: str
    pcie_path:
      description: The bridges above the function, root port first.
      type: list
      elements: str
    link_layer:
      description: C(InfiniBand), C(Ethernet), or C(mixed) when its ports differ.
      type: str
    uverbs:
      description: Its verbs device (C(uverbs0)), null when none names it.
      type: str
    verbs_device:
      description: The device node path, null without C(uverbs).
      type: str
    verbs_device_present:
      description: Whether the device node exists.
      type: bool
    unreadable:
      description: Device files that could not be read, each C(field), C(file), C(error).
      type: list
      elements: dict
    filled:
      description: Fields taken from a tool instead of sysfs, with the tool and the sysfs error.
      type: dict
    ports:
      description: Its ports.
      type: list
      elements: dict
      contains:
        port:
          description: Port number.
          type: int
        state:
          description: C(ACTIVE), C(DOWN), C(INIT), C(ARMED) (the kernel's names).
          type: str
        state_id:
          description: The state's number (4 is ACTIVE).
          type: int
        phys_state:
          description: C(LinkUp), C(Polling), C(Disabled), ... (the kernel's names).
          type: str
        phys_state_id:
          description: The physical state's number (5 is LinkUp).
          type: int
        rate_gbps:
          description: Data rate in Gb/s (active width x lane speed).
          type: float
          sample: 400.0
        width:
          description: Active width (C(4X)); null where only ibstat gave the rate.
          type: str
        speed:
          description: Lane speed name (C(NDR), C(HDR), C(EDR)).
          type: str
        link_layer:
          description: C(InfiniBand) or C(Ethernet).
          type: str
        counters:
          description: Every readable file of C(counters/), by name.
          type: dict
          sample: {link_downed: 0, symbol_error: 0, port_rcv_errors: 0}
        hw_counters:
          description: Every readable file of C(hw_counters/) (driver counters) but C(lifespan).
          type: dict
        unreadable:
          description: Port files that could not be read, each C(field), C(file), C(error).
          type: list
          elements: dict
        filled:
          description: Fields taken from a tool instead of sysfs.
          type: dict
windows:
  description: What the counters were compared across, each C(name) and C(seconds).
  returned: always
  type: list
  elements: dict
  sample: [{name: in 2.0 s, seconds: 2.0}, {name: "since the record of 3600 s ago", seconds: 3600.4}]
record:
  description: The counter record.
  returned: always
  type: dict
  contains:
    path:
      description: O(record_path).
      type: str
    previous_timestamp:
      description: When the record compared with was written (seconds since the epoch), null without one.
      type: float
    written:
      description: Whether this run wrote it (never in check mode).
      type: bool
    error:
      description: Why it could not be written, else null.
      type: str
tools:
  description: The tools run to fill what sysfs lacked, each C(name), C(argv), C(rc), C(filled), C(problems), C(error).
  returned: always
  type: list
  elements: dict
msg:
  description: "Each failed check as C(name: reason), after the strongest action."
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _run

SEARCH_DIRS = ("/usr/sbin", "/sbin", "/usr/bin")


def runner(timeout):
    def run(argv):
        result = _proc.run(argv, timeout, environment={"LC_ALL": "C"})
        return (None if result.timed_out else result.rc), result.stdout, result.stderr

    return run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_path=dict(type="path", default="/sys"),
            dev_path=dict(type="path", default="/dev"),
            devices=dict(type="list", elements="str", default=[]),
            expect=dict(
                type="dict",
                default={},
                options=dict(
                    ports=dict(type="int"),
                    rate_gbps=dict(type="float"),
                    link_layer=dict(type="str", choices=["InfiniBand", "Ethernet"]),
                ),
            ),
            sample_interval=dict(type="float", default=2.0),
            record_path=dict(type="path"),
            counter_limits=dict(type="dict", default={}),
            ibv_devinfo=dict(type="path", default="ibv_devinfo"),
            ibstat=dict(type="path", default="ibstat"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds, not %d" % p["timeout"])
    binaries = {name: _proc.find_executable(p[name], SEARCH_DIRS) for name in ("ibv_devinfo", "ibstat")}
    try:
        result = _run.run(p, binaries, runner(p["timeout"]), write_record=not module.check_mode)
    except _run.FabricError as exc:
        module.fail_json(msg=str(exc))
    for check in result["checks"]:
        if check["status"] == "warn":
            module.warn("%s: %s" % (check["name"], check["reason"]))
    if not result["passed"]:
        module.fail_json(msg=_run.failure_message(result), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
