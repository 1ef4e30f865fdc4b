#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health_info
short_description: GPU health checks that an all-reduce gate does not catch
description:
  - Reads the health of the NVIDIA GPUs of the host and judges it, check by check. Each check
    returns C(pass), C(warn) or C(fail), the GPUs concerned, the reason and the action it calls for
    (C(restart the application), C(fix the node configuration), C(reset the GPU), C(reboot),
    C(drain and inspect the hardware)).
  - C(xid) - NVRM Xid lines of this boot's kernel log. Hardware and driver faults fail (48, 56, 57,
    58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 94, 95, 119, 120, 140 - NVIDIA's XID catalog,
    the codes Azure's HPC health checks fail on); application faults warn (13, 31, 43, 45, 109);
    NVLink XIDs 144-150 fail when the driver's line says C(Fatal) (as GPUd reads them); unknown
    codes warn.
  - C(sxid) - nvidia-nvswitch SXid lines; fail when the line says C(Fatal) or the code is in
    O(sxid_fatal_codes), else warn.
  - C(row_remap) - a pending row remap fails (reset the GPU or reboot); a remapping failure fails
    (inspect the hardware).
  - C(ecc) - volatile uncorrectable ECC errors above O(ecc_volatile_uncorrectable_max) fail.
  - C(retired_pages) - a pending page retirement (GPUs before A100) fails; so do
    O(retired_pages_max) retired pages or more.
  - C(fabric_manager) - on NVSwitch systems (a GPU reports a fabric state, or NVSwitches are in
    the PCI tree) the C(nvidia-fabricmanager) service must be active and every GPU's fabric state
    C(completed) with status C(success).
  - C(nvlink) - every link of an NVLink GPU active at the expected speed; CRC, replay and recovery
    error counters above their thresholds warn (NVML backend only). On an NVLink design (another
    GPU has links, or the GPU reports an NVSwitch fabric state) a GPU with no link read fails.
  - C(clocks) - HW slowdown, HW thermal slowdown or HW power brake active fails; SW thermal
    slowdown warns; a SW power cap is not a fault.
  - C(pcie_link) - link generation or width below the maximum (capped by the upstream port) fails
    while O(busy=true), naming the GPU and its upstream port; idle GPUs lower their generation, so
    only a narrower width warns when idle. PCIe replays above O(pcie_replays_max) warn when it is set.
  - C(pcie_aer) - fatal or non-fatal AER counts (sysfs C(aer_dev_fatal), C(aer_dev_nonfatal)) on a
    GPU or a bridge above it fail; correctable counts above O(aer_correctable_max) warn.
  - C(peermem) - C(nvidia_peermem) must be loaded where RDMA NICs share PCIe switches with GPUs
    (warn), or always with O(require_peermem=true) (fail).
  - C(gpu_count) - GPUs in the PCI tree (bound to C(nvidia) or to no driver) that the driver does
    not report fail; so does a count other than O(expect_gpu_count).
  - C(persistence_mode) - persistence mode off fails.
  - C(readable) - a health fact the driver cannot read fails, naming the GPU, the field and the
    error (C([Unknown Error]), C([GPU is lost]), C([Insufficient Permissions]) in C(nvidia-smi -q);
    any NVML error but NotSupported/FunctionNotFound, such as GpuIsLost or Unknown); a judged fact
    the GPU model does not support (C([Not Supported]), NVML NotSupported) warns with the reason.
  - An C(nvidia-smi -q) report cut short inside a GPU block, or whose C(Attached GPUs) differs from
    its GPU blocks, fails the task (cause C(nvidia_smi_output)).
  - The module never fails for an unhealthy node; it returns RV(gpu_health.passed), and the caller
    (the C(gpu_health) role) drains the node. It fails when it cannot read the GPUs at all.
  - With O(boot_id_path) it also returns RV(verdict), the GPU health verdict of this boot ready to
    write to C(gpu-health.json) (what M(gpufleet.node.node_readiness_info) and the node's HAProxy
    agent read); O(failure) returns the failing verdict of a caller whose GPUs could not be read.
  - With O(history_path) too, the fatal XIDs of this boot are added to the node's XID history
    across boots (returned as RV(history), for the caller to write) and two more checks are
    judged on it. C(xid_recurrence) - the same fatal XID on the same GPU in O(recurrence_boots)
    distinct boots holds the node out with the action C(hardware inspection), in later boots
    too, until M(gpufleet.node.gpu_health_hold) clears the hold (GPUd - an XID two reboots do not
    clear calls for hardware inspection). C(xid_node_wide) - the same fatal XID on every GPU of
    the node in one boot is a software or driver event (NVSentinel tells one GPU's fault from
    all GPUs'); it does not count towards the recurrence. A history that cannot be read fails
    the task naming the file.
version_added: 0.2.0
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - On the target, either C(nvidia-ml-py) (Python module C(pynvml)) with the NVIDIA driver, or
    the driver's C(nvidia-smi).
options:
  boot_id_path:
    description:
      - The file holding this boot's id (C(/proc/sys/kernel/random/boot_id) on a node). Given, the
        module returns RV(verdict), bound to that boot id; a boot id that cannot be read (missing,
        empty, not text) fails the task naming the file.
    type: path
  history_path:
    description:
      - The node's XID history across boots (JSON, on persistent storage such as
        C(/var/lib/gpufleet/gpu-xid-history.json)); no file yet is an empty history. Needs
        O(boot_id_path). The module only reads it; RV(history.content) is what to write.
    type: path
  recurrence_boots:
    description:
      - Distinct boots with the same fatal XID on the same GPU that hold the node for hardware
        inspection. Source - GPUd (two reboots that do not clear the same XID).
    type: int
    default: 2
  failure:
    description:
      - Read no GPU and return the failing verdict of this boot with one C(gpu_facts) check whose
        reason is this text (the gpu_health role records so why a first call could not read the
        GPUs). Needs O(boot_id_path).
    type: str
  backend:
    description:
      - Where the per-GPU facts come from. V(auto) uses NVML when C(pynvml) imports and
        C(nvmlInit()) succeeds, and C(nvidia-smi) otherwise.
      - V(nvidia_smi) reads C(nvidia-smi -q) and C(nvidia-smi nvlink -s).
    type: str
    choices: [auto, nvml, nvidia_smi]
    default: auto
  nvidia_smi_path:
    description:
      - Path of the C(nvidia-smi) binary; looked up on E(PATH) by default.
    type: path
  kernel_log_path:
    description:
      - A file of kernel messages to read instead of this boot's kernel log (plain C(dmesg),
        C(dmesg -T), C(journalctl -k) or syslog lines), so that a captured log can be audited.
        Only its last boot counts (after the last C(-- Boot ... --) separator or C(Linux version)
        banner).
      - Without it, C(journalctl -k -b -o short-precise) is read, or C(dmesg) where there is no
        journal.
    type: path
  timeout:
    description:
      - Seconds each command (C(nvidia-smi), C(journalctl), C(dmesg), C(systemctl)) may take; one
        still running then is killed with its process group and the task fails naming it.
    type: int
    default: 60
  expect_gpu_count:
    description:
      - The number of GPUs the driver must report (C(gpu_topology_expect.gpu_count)).
    type: int
  busy:
    description:
      - Whether the GPUs are under load now (for example sampled during the NCCL gate). Only then is
        a PCIe generation or width below the maximum a failure.
    type: bool
    default: false
  require_peermem:
    description:
      - Fail when C(nvidia_peermem) is not loaded, whatever the PCI tree holds.
    type: bool
    default: false
  fabric_manager:
    description:
      - V(auto) judges the fabric manager on NVSwitch systems only, V(required) always,
        V(not_required) never.
    type: str
    choices: [auto, required, not_required]
    default: auto
  fabric_manager_state:
    description:
      - The state of the C(nvidia-fabricmanager) service as C(systemctl is-active) prints it
        (V(active), V(inactive), V(failed)...). By default C(systemctl is-active
        nvidia-fabricmanager) is run when the check needs it.
    type: str
  proc_path:
    description:
      - Where procfs is mounted (C(modules) is read for C(nvidia_peermem)).
    type: path
    default: /proc
  sys_module_path:
    description:
      - The kernel's module directory in sysfs (C(nvidia_peermem) is loaded when
        C(<sys_module_path>/nvidia_peermem) exists).
    type: path
    default: /sys/module
  ecc_volatile_uncorrectable_max:
    description:
      - Volatile uncorrectable ECC errors allowed per GPU. Source - Azure HPC node health checks
        and DCGM health fail on any.
    type: int
    default: 0
  retired_pages_max:
    description:
      - Retired pages (single plus double bit) from which a GPU fails. Source - DCGM
        C(DCGM_LIMIT_MAX_RETIRED_PAGES) (60).
    type: int
    default: 60
  nvlink_crc_errors_max:
    description:
      - NVLink CRC (flit plus data) errors per link above which the check warns. Source - DCGM
        C(DCGM_LIMIT_MAX_NVLINK_CRC_ERROR) (100).
    type: int
    default: 100
  nvlink_replay_errors_max:
    description:
      - NVLink replay errors per link above which the check warns. Source - DCGM
        C(DCGM_LIMIT_MAX_NVLINK_ERROR) (any error counts).
    type: int
    default: 0
  nvlink_recovery_errors_max:
    description:
      - NVLink recovery errors per link above which the check warns. Source - DCGM
        C(DCGM_LIMIT_MAX_NVLINK_ERROR) (any error counts).
    type: int
    default: 0
  nvlink_expected_speed_gbps:
    description:
      - Speed each active NVLink must run at, in GB/s as C(nvidia-smi nvlink -s) prints it
        (26.562 on H100). By default the fastest link of the node.
    type: float
  aer_correctable_max:
    description:
      - Correctable AER errors since boot on a GPU or a bridge above it beyond which the check
        warns. Source - DCGM diag's PCIe AER budget (480 per 15 minutes).
    type: int
    default: 480
  pcie_replays_max:
    description:
      - PCIe replays since reset per GPU above which the check warns. Unset, replays are not
        judged - DCGM judges a rate (C(DCGM_LIMIT_MAX_PCIREPLAY_RATE), 8 per minute) and the count
        since reset grows with uptime (healthy HGX H100s show more than 100).
    type: int
  sxid_fatal_codes:
    description:
      - SXid codes that fail whatever the line says (Fabric Manager User Guide, SXid errors).
    type: list
    elements: int
    default: []
extends_documentation_fragment:
  - gpufleet.node.sysfs
  - gpufleet.node.attributes.read_only
notes:
  - Commands run with C(LC_ALL=C), argv only, each with the O(timeout) deadline.
  - NVML functions a driver or GPU does not support (C(NVMLError_NotSupported),
    C(NVMLError_FunctionNotFound)) give null facts, not failures.
  - The thresholds' sources - NVIDIA XID catalog (docs.nvidia.com/deploy/xid-errors/), GPUd's
    components (github.com/leptonai/gpud), DCGM's C(DcgmGpuHardwareLimits.h) and diag,
    Azure HPC node health checks (github.com/Azure/azurehpc-health-checks).
seealso:
  - module: gpufleet.node.gpu_topology_facts
"""

EXAMPLES = r"""
- name: Check GPU health at boot
  gpufleet.node.gpu_health_info:
    expect_gpu_count: 8
  register: health

- name: Stop a node that is not healthy
  ansible.builtin.assert:
    that: health.gpu_health.passed
    fail_msg: "{{ health.gpu_health.checks | selectattr('status', 'eq', 'fail') | map(attribute='reason') | join('; ') }}"

- name: Judge the GPUs and get this boot's verdict, ready to write
  gpufleet.node.gpu_health_info:
    boot_id_path: /proc/sys/kernel/random/boot_id
  register: health

- name: Write the verdict where the node's HAProxy agent reads it
  gpufleet.node.files:
    mode: '0644'
    files:
      - content: "{{ health.verdict | to_nice_json(sort_keys=true) }}\n"
        dest: /run/gpufleet/gpu-health.json

- name: Audit a captured kernel log with nvidia-smi while the GPUs are busy
  gpufleet.node.gpu_health_info:
    backend: nvidia_smi
    kernel_log_path: /var/tmp/kern.log
    busy: true
    require_peermem: true
"""

RETURN = r"""
backend:
  description: The backend that produced the per-GPU facts (V(nvml) or V(nvidia_smi)).
  returned: always
  type: str
  sample: nvidia_smi
backend_notes:
  description: Why V(auto) did not use NVML, when it did not.
  returned: always
  type: list
  elements: str
gpu_health:
  description: The facts and the verdict.
  returned: always
  type: dict
  contains:
    driver_version:
      description: NVIDIA driver version.
      type: str
      sample: "535.183.01"
    gpus:
      description: One entry per GPU, null for what the source does not report.
      type: list
      elements: dict
      contains:
        bus_id:
          description: PCI address, lower case, domain included.
          type: str
          sample: "0000:3b:00.0"
        uuid:
          description: GPU UUID.
          type: str
        name:
          description: Product name.
          type: str
        persistence_mode:
          description: Whether persistence mode is on.
          type: bool
        ecc:
          description: C(enabled), C(volatile_uncorrectable), C(aggregate_uncorrectable),
            C(volatile_correctable), C(aggregate_correctable).
          type: dict
        retired_pages:
          description: C(single_bit_ecc), C(double_bit_ecc), C(pending); null on GPUs that remap rows.
          type: dict
        remapped_rows:
          description: C(correctable), C(uncorrectable), C(pending), C(failure); null on GPUs
            before A100.
          type: dict
        clocks_event_reasons:
          description: Active clock event reasons, snake_case (C(gpu_idle), C(sw_power_cap),
            C(hw_slowdown), C(hw_thermal_slowdown), C(hw_power_brake_slowdown), C(sw_thermal_slowdown)...).
          type: list
          elements: str
        pcie:
          description: C(gen_current), C(gen_max), C(width_current), C(width_max), C(replays).
          type: dict
        fabric:
          description: C(state) (C(completed), C(in_progress), C(not_started)) and C(status)
            (C(success) or the error); null without NVSwitch fabric.
          type: dict
        nvlinks:
          description: Per link C(link), C(active), C(speed_gbps), C(crc_errors), C(replay_errors),
            C(recovery_errors).
          type: list
          elements: dict
        unreadable:
          description: The health facts the driver could not read, each C(field) and C(error).
          type: list
          elements: dict
        unsupported:
          description: The judged facts this GPU model does not support, each C(field) and C(reason).
          type: list
          elements: dict
    xid_events:
      description: NVRM Xid events of this boot.
      type: list
      elements: dict
      contains:
        bdf:
          description: The device as the driver printed it, without C(PCI:), lower case.
          type: str
          sample: "0000:3b:00"
        code:
          description: XID code.
          type: int
        pid:
          description: Process id, null when the driver did not know it.
          type: int
        message:
          description: The rest of the line.
          type: str
    sxid_events:
      description: NVSwitch SXid events of this boot, as RV(gpu_health.xid_events).
      type: list
      elements: dict
    kernel_log:
      description: Where the kernel messages came from (C(source)) and the error when none could
        be read (C(error)).
      type: dict
    pci_tree:
      description: C(nvswitches), C(rdma_nics), C(nics_on_gpu_paths) and C(error) of the PCI tree.
      type: dict
    checks:
      description: One entry per check.
      type: list
      elements: dict
      contains:
        name:
          description: C(xid), C(sxid), C(row_remap), C(ecc), C(retired_pages), C(fabric_manager),
            C(nvlink), C(clocks), C(pcie_link), C(pcie_aer), C(peermem), C(gpu_count),
            C(persistence_mode), C(readable).
          type: str
        status:
          description: C(pass), C(warn) or C(fail).
          type: str
        gpus:
          description: Bus ids of the GPUs concerned.
          type: list
          elements: str
        reason:
          description: What was found.
          type: str
        action:
          description: C(none), C(restart the application), C(fix the node configuration),
            C(reset the GPU), C(reboot) or C(drain and inspect the hardware).
          type: str
      sample:
        - name: row_remap
          status: fail
          gpus: ["0000:53:00.0"]
          reason: "row remapping pending on 0000:53:00.0: takes effect only after a GPU reset or reboot"
          action: reset the GPU
    passed:
      description: No check failed.
      type: bool
history:
  description: The node's XID history with this boot's fatal XIDs recorded.
  returned: when O(history_path) is given
  type: dict
  contains:
    path:
      description: O(history_path).
      type: str
    changed:
      description: Whether this run recorded something new (RV(history.content) differs from the file).
      type: bool
    content:
      description: The history file's new text (JSON), to write to RV(history.path).
      type: str
    holds:
      description: The holds for hardware inspection, each C(gpu), C(code), C(boots) (boot ids)
        and C(since) (seconds since the epoch).
      type: list
      elements: dict
    metrics:
      description: The history's node-exporter textfile (C(gpufleet_gpu_health_xid_count),
        C(_xid_boots), C(_xid_last_seen_timestamp_seconds), C(_hold), C(_hold_xid), C(_xid_node_wide)).
      type: str
verdict:
  description:
    - The GPU health verdict of this boot, as written to C(gpu-health.json) and read by
      M(gpufleet.node.node_readiness_info) and the node's HAProxy agent.
  returned: when O(boot_id_path) is given
  type: dict
  contains:
    boot_id:
      description: The boot id read from O(boot_id_path); the verdict counts for that boot only.
      type: str
    passed:
      description: True only when no check failed.
      type: bool
    source:
      description: Who judged (C(gpu_health) here; the node's watcher writes C(gpu-health-watch)).
      type: str
    checks:
      description: The failed checks, as in RV(gpu_health.checks).
      type: list
      elements: dict
    warnings:
      description: The checks that warned, as in RV(gpu_health.checks).
      type: list
      elements: dict
    action:
      description: The strongest action the failed checks call for (C(none) when none failed).
      type: str
    reason:
      description:
        - Each failed check as its name, a colon and its reason, joined by semicolons; C(every check
          passed) when none failed.
      type: str
  sample:
    boot_id: 5d2c6f0e-8a51-4c11-a3f0-6a2b1f0e9c77
    passed: false
    source: gpu_health
    checks:
      - name: row_remap
        status: fail
        gpus: ["0000:53:00.0"]
        reason: "row remapping pending on 0000:53:00.0: takes effect only after a GPU reset or reboot"
        action: reset the GPU
    warnings: []
    action: reset the GPU
    reason: "row_remap: row remapping pending on 0000:53:00.0: takes effect only after a GPU reset or reboot"
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.health import (
    _checks,
    _collect,
    _history,
    _kernel_log,
    _pci_facts,
    _thresholds,
    _verdict,
)
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

THRESHOLD_OPTIONS = (
    "ecc_volatile_uncorrectable_max",
    "retired_pages_max",
    "nvlink_crc_errors_max",
    "nvlink_replay_errors_max",
    "nvlink_recovery_errors_max",
    "aer_correctable_max",
    "pcie_replays_max",
)


class CommandTimeout(Exception):
    pass


def runner(timeout):
    def run(argv):
        result = _proc.run(argv, timeout, environment={"LC_ALL": "C"})
        if result.timed_out:
            raise CommandTimeout(_proc.describe_timeout(argv, timeout))
        return result.rc, result.stdout, result.stderr

    return run


def read_kernel_log(module, run):
    """``(text, source, error)`` of this boot's kernel messages."""
    path = module.params["kernel_log_path"]
    if path:
        try:
            with open(path, "rb") as handle:
                return handle.read().decode("utf-8", "replace"), path, None
        except OSError as exc:
            module.fail_json(msg="cannot read kernel_log_path %s: %s" % (path, exc))
    errors = []
    for name, argv in (("journalctl", ["-k", "-b", "-o", "short-precise", "--no-pager"]), ("dmesg", [])):
        binary = module.get_bin_path(name)
        if binary is None:
            errors.append("%s is not installed" % name)
            continue
        rc, out, err = run([binary] + argv)
        if rc == 0 and out.strip() and "No journal files were found" not in out:
            return out, " ".join([name] + argv), None
        errors.append("`%s` exited %s: %s" % (" ".join([name] + argv), rc, (err or out).strip()[-200:]))
    return "", None, "; ".join(errors)


def fabric_manager_state(module, run):
    if module.params["fabric_manager_state"]:
        return module.params["fabric_manager_state"]
    binary = module.get_bin_path("systemctl")
    if binary is None:
        return "unknown (no systemctl)"
    _rc, out, _err = run([binary, "is-active", "nvidia-fabricmanager"])
    return (out or "").strip().splitlines()[0] if (out or "").strip() else "unknown"


def collect(module, run, notes):
    backend = module.params["backend"]
    if backend in ("auto", "nvml"):
        if pynvml is None:
            if backend == "nvml":
                module.fail_json(
                    msg="backend=nvml needs the nvidia-ml-py package (module pynvml) on the "
                    "target: pip install nvidia-ml-py",
                    exception=PYNVML_IMPORT_ERROR,
                )
            notes.append("NVML: the pynvml module (nvidia-ml-py) is not installed")
        else:
            try:
                return _collect.collect_nvml(pynvml), "nvml"
            except _collect.NvmlUnavailable as exc:
                if backend == "nvml":
                    module.fail_json(msg="NVML: %s" % exc, cause="nvml_unavailable")
                notes.append("NVML: %s" % exc)
    binary = module.params["nvidia_smi_path"] or module.get_bin_path(
        "nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/bin"]
    )
    if binary is None:
        module.fail_json(
            msg="neither NVML nor nvidia-smi can be used (%s; nvidia-smi is not on PATH): install "
            "the NVIDIA driver or set nvidia_smi_path" % "; ".join(notes),
            backend_notes=notes,
        )
    return _collect.collect_nvidia_smi(run, binary), "nvidia_smi"


def read_boot_id(module):
    """This boot's id from ``boot_id_path`` (None when it is not given); a clear failure when it
    cannot be read: a verdict bound to no boot would be ignored by its readers."""
    path = module.params["boot_id_path"]
    if path is None:
        return None
    try:
        return _readiness.read_boot_id(path)
    except OSError as exc:
        module.fail_json(
            msg="cannot read the boot id at boot_id_path %s: %s; the GPU health verdict is bound to this "
            "boot's id (/proc/sys/kernel/random/boot_id on a node): point boot_id_path at it"
            % (path, exc.strerror or exc),
            cause="boot_id",
        )


def read_history(module):
    """The node's XID history (None without ``history_path``); a clear failure when it cannot be
    read: a node whose record is lost must not pass as one without a hold."""
    path = module.params["history_path"]
    if path is None:
        return None
    try:
        return _history.load(path)
    except _history.HistoryError as exc:
        module.fail_json(msg=str(exc), cause="history")


def judge_history(params, history, boot_id, xids, bus_ids):
    """``(history result, checks)``: this boot's fatal XIDs recorded, the holds and the node-wide
    events judged."""
    updated, changed = _history.observe(history, boot_id, xids, bus_ids, boots=params["recurrence_boots"])
    result = {
        "path": params["history_path"],
        "changed": changed,
        "content": _history.dump(updated),
        "holds": updated["holds"],
        "metrics": _history.textfile(updated, boot_id),
    }
    return result, _history.judge(updated, boot_id)


def failure_result(boot_id, reason):
    """The result of ``failure``: GPUs that could not be read, one ``gpu_facts`` failure."""
    checks = [_verdict.check("gpu_facts", _verdict.FAIL, [], reason, _verdict.INSPECT)]
    health = {"passed": False, "gpus": [], "xid_events": [], "sxid_events": [], "checks": checks}
    return {"gpu_health": health, "verdict": _verdict.record_of_checks(boot_id, checks)}


def main():
    argument_spec = dict(
        boot_id_path=dict(type="path"),
        history_path=dict(type="path"),
        recurrence_boots=dict(type="int", default=_history.DEFAULT_BOOTS),
        failure=dict(type="str"),
        backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia_smi"]),
        nvidia_smi_path=dict(type="path"),
        sysfs_path=dict(type="path", default="/sys/bus/pci"),
        kernel_log_path=dict(type="path"),
        timeout=dict(type="int", default=60),
        expect_gpu_count=dict(type="int"),
        busy=dict(type="bool", default=False),
        require_peermem=dict(type="bool", default=False),
        fabric_manager=dict(type="str", default="auto", choices=["auto", "required", "not_required"]),
        fabric_manager_state=dict(type="str"),
        proc_path=dict(type="path", default="/proc"),
        sys_module_path=dict(type="path", default="/sys/module"),
        nvlink_expected_speed_gbps=dict(type="float"),
        sxid_fatal_codes=dict(type="list", elements="int", default=[]),
    )
    for name in THRESHOLD_OPTIONS:
        argument_spec[name] = dict(type="int")
        if _thresholds.DEFAULT_THRESHOLDS[name] is not None:
            argument_spec[name]["default"] = _thresholds.DEFAULT_THRESHOLDS[name]
    module = AnsibleModule(
        argument_spec=argument_spec,
        supports_check_mode=True,
        required_by={"failure": "boot_id_path", "history_path": "boot_id_path"},
    )
    params = module.params
    boot_id = read_boot_id(module)
    if params["failure"] is not None:
        module.exit_json(changed=False, backend=None, backend_notes=[], **failure_result(boot_id, params["failure"]))
    if params["recurrence_boots"] < 1:
        module.fail_json(msg="recurrence_boots must be at least 1, not %d" % params["recurrence_boots"])
    history = read_history(module)
    if params["timeout"] <= 0:
        module.fail_json(msg="timeout must be a positive number of seconds, not %d" % params["timeout"])
    run = runner(params["timeout"])
    notes = []
    used = None
    try:
        record, used = collect(module, run, notes)
        log_text, log_source, log_error = read_kernel_log(module, run)
        xids, sxids = _kernel_log.parse_kernel_log(log_text)
        pci = _pci_facts.pci_facts(params["sysfs_path"])
        needs_fm = params["fabric_manager"] == "required" or (
            params["fabric_manager"] == "auto" and _checks.nvswitch_system(record["gpus"], pci)
        )
        fm_state = fabric_manager_state(module, run) if needs_fm else params["fabric_manager_state"]
    except _collect.HealthError as exc:
        module.fail_json(msg=str(exc), cause=exc.cause, backend=used or params["backend"], backend_notes=notes)
    except CommandTimeout as exc:
        module.fail_json(
            msg="%s: a hung nvidia-smi usually means a wedged driver or GPU (look for Xid errors "
            "in the kernel log)" % exc,
            cause="timeout",
            backend_notes=notes,
        )
    options = {
        "thresholds": {name: params[name] for name in THRESHOLD_OPTIONS},
        "busy": params["busy"],
        "fabric_manager": params["fabric_manager"],
        "fabric_manager_state": fm_state,
        "require_peermem": params["require_peermem"],
        "peermem_loaded": _pci_facts.peermem_loaded(params["proc_path"], params["sys_module_path"]),
        "expect_gpu_count": params["expect_gpu_count"],
        "nvlink_expected_speed_gbps": params["nvlink_expected_speed_gbps"],
        "sxid_fatal_codes": params["sxid_fatal_codes"],
        "kernel_log_error": log_error,
    }
    checks = _checks.run_checks(record, xids, sxids, pci, options)
    bus_ids = [g["bus_id"] for g in record["gpus"]]
    history_result = None
    if history is not None:
        history_result, history_checks = judge_history(params, history, boot_id, xids, bus_ids)
        checks += history_checks
    passed, _failed, _warned = _verdict.verdict(checks)
    health = {
        "backend": used,
        "driver_version": record["driver_version"],
        "gpus": record["gpus"],
        "xid_events": xids,
        "sxid_events": sxids,
        "kernel_log": {"source": log_source, "error": log_error},
        "pci_tree": {
            "error": pci["error"],
            "nvswitches": pci["nvswitches"],
            "rdma_nics": pci["rdma_nics"],
            "nics_on_gpu_paths": pci["nics_on_gpu_paths"],
        },
        "checks": checks,
        "passed": passed,
    }
    result = dict(changed=False, backend=used, backend_notes=notes, gpu_health=health)
    if params["boot_id_path"] is not None:
        result["verdict"] = _verdict.record_of_checks(boot_id, checks)
    if history_result is not None:
        result["history"] = history_result
    module.exit_json(**result)


if __name__ == "__main__":
    main()
