#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pcie_acs
short_description: Clear (or set) PCIe ACS redirect on the bridges between GPUs, through setpci
version_added: 0.1.0
description:
  - Computes the target ACS Control value of every ACS-capable port in a scope and writes the
    ports that differ with the real C(setpci), as a masked write of C(ECAP_ACS+0x6.w), so only
    the chosen bits change.
  - The plan (per port - current value, target, mask, the C(setpci) argument and why) is made
    before anything is written and is what check mode and diff show (RV(plan)). Then each write
    is read back, and the run stops at the first port that does not hold the value, reporting
    exactly which ports were changed, which were already right, which failed and which were not
    attempted.
  - A port in scope whose extended config space (where ACS lives) could not be read is unknown,
    not "without ACS"; the module fails naming it and the likely cause, and writes nothing.
  - By default it clears ReqRedir, CmpltRedir and EgressCtrl (the bits that send GPU peer
    traffic up to the root complex, as NCCL's troubleshooting guide and the kernel's
    C(pci=disable_acs_redir=) do) on the bridges crossed by GPU-GPU and GPU-RDMA-NIC peer
    traffic, and nowhere else.
  - Refuses to weaken isolation of a device bound to C(vfio-pci) (a device in scope, in the
    IOMMU group of a port in scope, or one whose peer traffic a port in scope routes) unless
    O(force=true).
  - The change lasts until reboot (the kernel enables ACS again at boot). The module returns
    what a boot unit needs (RV(persist)) and the equivalent kernel parameter (RV(kernel_param)).
author:
  - gpufleet.node developers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.node.sysfs
options:
  sysfs_path:
    description:
      - When it is not the default, C(setpci) is run with C(-O sysfs.path=<sysfs_path>) as well.
  timeout:
    description:
      - Seconds each C(setpci) call may take; one still running then is killed (its process
        group) and the run stops there, reporting what was and was not changed.
    type: int
    default: 30
  state:
    description:
      - V(cleared) turns the bits in O(bits) off; V(set) turns them on (only on ports whose ACS
        Capability has them).
    type: str
    choices: [cleared, set]
    default: cleared
  bits:
    description:
      - The ACS Control bits to change, by their lspci names.
    type: list
    elements: str
    choices: [SrcValid, TransBlk, ReqRedir, CmpltRedir, UpstreamFwd, EgressCtrl, DirectTrans]
    default: [ReqRedir, CmpltRedir, EgressCtrl]
  scope:
    description:
      - V(gpu_paths) is the ACS-capable bridges crossed by peer traffic between two GPUs or
        between a GPU and an RDMA NIC (GPUDirect RDMA).
      - V(devices) is the ports listed in O(devices).
      - V(all_bridges) is every ACS-capable bridge in the tree.
    type: str
    choices: [gpu_paths, devices, all_bridges]
    default: gpu_paths
  devices:
    description:
      - PCI addresses (C([domain:]bus:device.function)) of the ports to change.
        Required with O(scope=devices), not allowed otherwise.
    type: list
    elements: str
  force:
    description:
      - Change ports even where a device bound to C(vfio-pci) would lose its isolation.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports what would change; runs no C(setpci).
  diff_mode:
    support: full
    description: Per-port ACS Control before and after, decoded as lspci prints it.
requirements:
  - C(setpci) from pciutils (Debian/Ubuntu package C(pciutils)), run as root.
notes:
  - Under kernel lockdown (Secure Boot) the kernel refuses config-space writes from user space;
    the module then fails and says so. Use the kernel parameter RV(kernel_param) instead.
  - IOMMU groups are formed at boot; after a change at run time the groups the kernel reports
    are stale until the next boot.
seealso:
  - module: gpufleet.node.pcie_acs_info
  - module: gpufleet.node.iommu_info
  - name: NCCL troubleshooting, PCI Access Control Services
    description: NVIDIA's guidance on disabling ACS redirect for GPU peer-to-peer traffic.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
"""

EXAMPLES = r"""
- name: Clear ACS redirect on the bridges between the GPUs (and GPUDirect NICs)
  become: true
  gpufleet.node.pcie_acs:
  register: acs_fix

- name: Show the kernel parameter that makes it permanent
  ansible.builtin.debug:
    var: acs_fix.kernel_param

- name: Clear redirect on two named switch ports only
  become: true
  gpufleet.node.pcie_acs:
    scope: devices
    devices:
      - "0000:42:00.0"
      - "0000:42:01.0"

- name: Put ACS redirect back on every bridge (for example before handing GPUs to VMs)
  become: true
  gpufleet.node.pcie_acs:
    scope: all_bridges
    state: set
    bits: [SrcValid, ReqRedir, CmpltRedir, UpstreamFwd]
"""

RETURN = r"""
plan:
  description: The plan, one record per port in scope, in the order they are handled; what
    check mode and diff show.
  returned: success or failure after the plan was made
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
      sample: "0000:42:00.0"
    offset:
      description: Config-space offset of the ACS capability.
      type: int
      sample: 336
    current:
      description: ACS Control now.
      type: int
      sample: 29
    target:
      description: ACS Control wanted.
      type: int
      sample: 17
    mask:
      description: The bits this port may change.
      type: int
      sample: 44
    setpci_arg:
      description: The masked setpci write that puts the port in the target state.
      type: str
      sample: "ECAP_ACS+0x6.w=0000:002c"
    write:
      description: Whether the port differs from the target (and so is written).
      type: bool
    why:
      description: Why the port is in scope, and what the write changes.
      type: str
      sample: "crossed by GPU-GPU or GPU-RDMA-NIC peer traffic; clear ReqRedir CmpltRedir"
ports:
  description: Every port in scope, in the order they were handled.
  returned: success or failure after scanning the tree
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
      sample: "0000:42:00.0"
    acs_ctl_before:
      description: ACS Control before.
      type: int
      sample: 29
    acs_ctl_after:
      description: ACS Control after (the target in check mode; the value read back otherwise).
      type: int
      sample: 17
    changed:
      description: Whether the port was (or in check mode would be) written.
      type: bool
changed_ports:
  description: Ports written and verified by read-back (in check mode, the ports that would be).
  returned: always
  type: list
  elements: str
  sample: ["0000:42:00.0", "0000:42:01.0"]
unchanged_ports:
  description: Ports in scope that already held the target value.
  returned: always
  type: list
  elements: str
not_attempted_ports:
  description: Ports that needed a write but were not reached because an earlier one failed.
  returned: always
  type: list
  elements: str
failed_port:
  description: The port whose write failed or did not read back, or null.
  returned: always
  type: str
  sample: null
mask:
  description: The ACS Control mask written (the bits of O(bits)).
  returned: success
  type: str
  sample: "002c"
persist:
  description: For every port in scope, the masked setpci write that puts it in the target state,
    for a boot unit (C(setpci -s <bdf> <setpci_arg>)).
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
    value:
      description: Value written, 4 hex digits.
      type: str
      sample: "0000"
    mask:
      description: Mask written, 4 hex digits.
      type: str
      sample: "002c"
    setpci_arg:
      description: The register argument for setpci.
      type: str
      sample: "ECAP_ACS+0x6.w=0000:002c"
kernel_param:
  description: The kernel parameter that clears the same redirect bits at every boot
    (C(pci=disable_acs_redir=<bdf>;<bdf>...)); empty unless O(state=cleared) with the default
    O(bits) and at least one port in scope.
  returned: success
  type: str
  sample: "pci=disable_acs_redir=0000:42:00.0;0000:42:01.0"
nics:
  description: The RDMA NICs (GPUDirect peers), with the fields of M(gpufleet.node.pcie_acs_info)'s
    C(nics), read from the same scan of the tree as the plan (before any write), so that a role
    needs no separate audit for them.
  returned: success
  type: list
  elements: dict
  contains:
    bdf:
      description: PCI address.
      type: str
      sample: "0000:45:00.0"
    vendor_id:
      description: PCI vendor ID.
      type: str
      sample: "0x15b3"
    class:
      description: PCI class code (C(0x0207) InfiniBand, C(0x0200) Ethernet).
      type: str
      sample: "0x0207"
vfio_conflicts:
  description: Devices bound to vfio-pci whose isolation the change would weaken.
  returned: always
  type: list
  elements: dict
  contains:
    bdf:
      description: The vfio-pci bound device.
      type: str
    driver:
      description: Its driver.
      type: str
    port:
      description: The port in scope that exposes it.
      type: str
    reason:
      description: Why it is exposed.
      type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._acs import (
    SCOPES,
    AcsPlanError,
    plan_acs,
    read_acs_ctl,
    setpci_args,
)
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._config_space import (
    ACS_FLAG_NAMES,
    PciError,
    format_acs,
    normalize_bdf,
)
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._path import ACS_REDIRECT_NAMES
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._sysfs import DEFAULT_SYSFS_PATH
from ansible_collections.gpufleet.node.plugins.module_utils.pcie._topology import PciTopology

LOCKDOWN_TEXT = "Operation not permitted"


def _diff_line(bdf, value):
    return "%s ACSCtl 0x%04x: %s\n" % (bdf, value, format_acs(value))


def make_plan(module, result):
    """Arguments -> the plan (module_utils computes it); fails here, before anything is written."""
    params = module.params
    if params["devices"] and params["scope"] != "devices":
        module.fail_json(msg="devices is only used with scope=devices (scope is %s)" % params["scope"], **result)
    devices = []
    for text in params["devices"] or []:
        try:
            devices.append(normalize_bdf(text))
        except ValueError as exc:
            module.fail_json(msg=str(exc), **result)
    if not params["bits"]:
        module.fail_json(msg="bits is empty: name at least one ACS Control bit", **result)
    if params["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds, not %d" % params["timeout"], **result)
    try:
        topo = PciTopology.scan(params["sysfs_path"])
        return topo, plan_acs(topo, params["scope"], devices, params["bits"], params["state"], params["force"])
    except AcsPlanError as exc:
        module.fail_json(msg=str(exc), **dict(result, failed_port=exc.port, vfio_conflicts=exc.vfio_conflicts))
    except PciError as exc:
        module.fail_json(msg=str(exc), **result)


def execute(module, plan, result):
    """Write each port of the plan that differs, read it back, stop at the first mismatch."""
    params = module.params
    sysfs_path = params["sysfs_path"]
    index = {port["bdf"]: port for port in result["ports"]}
    setpci = module.get_bin_path("setpci")
    if setpci is None:
        module.fail_json(
            msg="setpci was not found (searched PATH and the sbin directories); install the "
            "Debian/Ubuntu package pciutils (apt-get install pciutils)",
            **result,
        )

    pending = [port["bdf"] for port in plan["writes"]]
    for port in plan["writes"]:
        bdf = port["bdf"]
        pending.remove(bdf)
        result["not_attempted_ports"] = list(pending)
        argv = [setpci] + setpci_args(bdf, port["target"], port["mask"], sysfs_path)
        run = _proc.run(argv, params["timeout"])
        rc, out, err = run.rc, run.stdout, run.stderr
        if run.timed_out:
            result["failed_port"] = bdf
            result["changed"] = bool(result["changed_ports"])
            module.fail_json(
                msg="%s writing ACS Control of %s; the port was not verified and no further port was "
                "written. Changed so far: %s"
                % (_proc.describe_timeout(argv, params["timeout"]), bdf, ", ".join(result["changed_ports"]) or "none"),
                stdout=out,
                stderr=err,
                cmd=argv,
                **result,
            )
        if LOCKDOWN_TEXT in err or LOCKDOWN_TEXT in out:
            result["failed_port"] = bdf
            module.fail_json(
                msg="the kernel refused the write to ACS Control of %s (%s): kernel lockdown "
                "(Secure Boot) forbids PCI config-space writes from user space. Nothing after "
                "it was written. Disable lockdown/Secure Boot, or use the kernel parameter %s "
                "and reboot"
                % (bdf, err.strip() or out.strip(), plan["kernel_param"] or "pci=disable_acs_redir=<bdf>;..."),
                rc=rc,
                stdout=out,
                stderr=err,
                cmd=argv,
                **result,
            )
        if rc != 0:
            result["failed_port"] = bdf
            module.fail_json(
                msg="setpci failed on %s with rc %d: %s" % (bdf, rc, err.strip() or out.strip()),
                rc=rc,
                stdout=out,
                stderr=err,
                cmd=argv,
                **result,
            )
        try:
            now = read_acs_ctl(sysfs_path, bdf, port["offset"])
        except (OSError, PciError) as exc:
            result["failed_port"] = bdf
            module.fail_json(
                msg="could not read back ACS Control of %s after the write: %s" % (bdf, exc),
                stdout=out,
                stderr=err,
                cmd=argv,
                **result,
            )
        index[bdf]["acs_ctl_after"] = now
        if now != port["target"]:
            result["failed_port"] = bdf
            result["changed"] = bool(result["changed_ports"])
            module.fail_json(
                msg="ACS Control of %s reads back 0x%04x after writing 0x%04x (mask 0x%04x); the "
                "port did not take the value, so no further port was written. Changed so far: %s"
                % (bdf, now, port["target"], port["mask"], ", ".join(result["changed_ports"]) or "none"),
                stdout=out,
                stderr=err,
                cmd=argv,
                **result,
            )
        index[bdf]["changed"] = True
        result["changed_ports"].append(bdf)
        result["changed"] = True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_path=dict(type="path", default=DEFAULT_SYSFS_PATH),
            timeout=dict(type="int", default=30),
            state=dict(type="str", choices=["cleared", "set"], default="cleared"),
            bits=dict(type="list", elements="str", choices=list(ACS_FLAG_NAMES), default=list(ACS_REDIRECT_NAMES)),
            scope=dict(type="str", choices=list(SCOPES), default="gpu_paths"),
            devices=dict(type="list", elements="str"),
            force=dict(type="bool", default=False),
        ),
        required_if=[("scope", "devices", ["devices"])],
        supports_check_mode=True,
    )
    result = dict(
        changed=False,
        ports=[],
        changed_ports=[],
        unchanged_ports=[],
        not_attempted_ports=[],
        failed_port=None,
        vfio_conflicts=[],
    )
    topo, plan = make_plan(module, result)
    for text in plan["warnings"]:
        module.warn(text)

    ports = plan["ports"]
    result.update(
        plan=ports,
        vfio_conflicts=plan["vfio_conflicts"],
        mask="%04x" % plan["mask"],
        persist=[
            {
                "bdf": p["bdf"],
                "value": "%04x" % (p["target"] & p["mask"]),
                "mask": "%04x" % p["mask"],
                "setpci_arg": p["setpci_arg"],
            }
            for p in ports
        ],
        kernel_param=plan["kernel_param"],
        # the tree is scanned once for the plan: the RDMA NICs come with it (no second audit run)
        nics=[topo.endpoint_record(bdf) for bdf in topo.nics],
        unchanged_ports=[p["bdf"] for p in ports if not p["write"]],
        ports=[
            {"bdf": p["bdf"], "acs_ctl_before": p["current"], "acs_ctl_after": p["current"], "changed": False}
            for p in ports
        ],
    )
    if module._diff:
        header = "ACS Control (%s)" % module.params["sysfs_path"]
        result["diff"] = dict(
            before="".join(_diff_line(p["bdf"], p["current"]) for p in ports),
            after="".join(_diff_line(p["bdf"], p["target"]) for p in ports),
            before_header=header,
            after_header=header,
        )
    if not plan["writes"]:
        module.exit_json(**result)

    if module.check_mode:
        index = {p["bdf"]: p for p in result["ports"]}
        for port in plan["writes"]:
            index[port["bdf"]].update(acs_ctl_after=port["target"], changed=True)
        result.update(changed=True, changed_ports=[p["bdf"] for p in plan["writes"]])
        module.exit_json(**result)

    execute(module, plan, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
