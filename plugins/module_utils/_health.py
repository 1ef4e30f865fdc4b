# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health: the failures that pass an all-reduce gate, collected and judged.

Plain Python (no Ansible imports), runs on target Python 3.8+.

* Collection: per GPU facts from NVML (``collect_nvml``, nvidia-ml-py function names) or from
  ``nvidia-smi -q`` + ``nvidia-smi nvlink -s`` (``collect_nvidia_smi``, parsed by ``_nvsmi_q``);
  the kernel log's NVRM ``Xid`` and nvswitch ``SXid`` lines (``parse_kernel_log``); the PCI tree's
  AER counters and link maxima, NVSwitches and RDMA NICs (``pci_facts``, through
  ``_topology.PciTopology``); whether ``nvidia_peermem`` is loaded.
* Judgement: ``run_checks`` turns those facts into checks, each ``{name, status (pass|warn|fail),
  gpus, reason, action}``, with the thresholds of ``DEFAULT_THRESHOLDS``.

Sources of the thresholds and the XID table (each cited where it is used):

* NVIDIA, "XID Errors" (docs.nvidia.com/deploy/xid-errors/) - what each code means and the
  recovery it calls for; "Fabric Manager User Guide" (DU-09883-001) for SXids and the fabric state.
* GPUd (github.com/leptonai/gpud) - its XID component maps codes to repair actions (restart the
  application, reset the GPU, reboot, inspect the hardware) and reads NVLink XIDs 144-150 as fatal
  or not from the driver's own "Fatal"/"Nonfatal" word (gpud PR 1174).
* Azure HPC node health checks (github.com/Azure/azurehpc-health-checks) - fail on XIDs 48, 56,
  57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120; on remapped rows pending or
  failed; on inactive NVLinks.
* DCGM (github.com/NVIDIA/DCGM, ``DcgmGpuHardwareLimits.h``) - NVLink CRC errors matter from 100
  (per second), replay and recovery errors from 1; retired pages limit 60; PCIe replays 8 per
  minute; DCGM diag's PCIe AER budget 480 per 15 minutes.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.node.plugins.module_utils import _nvml, _nvsmi, _nvsmi_q
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _sysfs, _topology

PASS, WARN, FAIL = "pass", "warn", "fail"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}

# The actions a check can call for, mildest first (NVIDIA's XID catalog and GPUd's repair actions).
NONE = "none"
RESTART_APP = "restart the application"
RESET_GPU = "reset the GPU"
REBOOT = "reboot"
INSPECT = "drain and inspect the hardware"
CONFIGURE = "fix the node configuration"
ACTIONS = (NONE, RESTART_APP, CONFIGURE, RESET_GPU, REBOOT, INSPECT)

#: Threshold defaults (the module's options carry the same values and cite the same sources).
DEFAULT_THRESHOLDS = {
    # Any volatile uncorrectable ECC error fails (Azure HPC health checks; DCGM health).
    "ecc_volatile_uncorrectable_max": 0,
    # DCGM_LIMIT_MAX_RETIRED_PAGES (DCGM DcgmGpuHardwareLimits.h): 60 retired pages (SBE + DBE).
    "retired_pages_max": 60,
    # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR 100; DCGM_LIMIT_MAX_NVLINK_ERROR 1 for replay/recovery.
    "nvlink_crc_errors_max": 100,
    "nvlink_replay_errors_max": 0,
    "nvlink_recovery_errors_max": 0,
    # DCGM diag's PCIe AER budget (480 per 15 min); here applied to the count since boot.
    "aer_correctable_max": 480,
    # DCGM_LIMIT_MAX_PCIREPLAY_RATE is 8 per minute, a rate; "Replays Since Reset" is a count that
    # grows with uptime (healthy HGX H100s show 100+), so it is judged only when a limit is given.
    "pcie_replays_max": None,
}

#: Clock event reasons (snake_case, as ``_nvsmi_q.CLOCK_REASON_NAMES``/NVML's bits) that fail or
#: warn. HW slowdown, HW thermal slowdown and power brake mean the board protects itself (NVML
#: docs of nvmlClocksEventReasonHwSlowdown; GPUd's clock-events component); a software power cap
#: is the driver keeping the board within its power limit, not a fault.
CLOCK_REASONS_FAIL = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
CLOCK_REASONS_WARN = ("sw_thermal_slowdown",)

# NVML clocks event reason bits (nvidia-ml-py: nvmlClocksEventReason*, same values as the older
# nvmlClocksThrottleReason*).
NVML_CLOCK_REASON_BITS = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
)

# -- the XID table -------------------------------------------------------------------------------
#: code -> (status, action, meaning). Meaning and recovery: NVIDIA "XID Errors" catalog; FAIL codes
#: are those Azure's HPC health checks fail on plus 94/95 (contained/uncontained ECC: reset the
#: GPU), 140 (unrecovered ECC); WARN codes are application faults that do not indict the node.
XID_CATALOG = {
    13: (WARN, RESTART_APP, "graphics engine exception (usually the application)"),
    31: (WARN, RESTART_APP, "GPU memory page fault (usually the application)"),
    43: (WARN, RESTART_APP, "GPU stopped processing (the application)"),
    45: (WARN, RESTART_APP, "preemptive cleanup, due to previous errors"),
    48: (FAIL, RESET_GPU, "double bit ECC error"),
    56: (FAIL, INSPECT, "display engine error"),
    57: (FAIL, INSPECT, "error programming video memory interface"),
    58: (FAIL, INSPECT, "unstable video memory interface detected"),
    62: (FAIL, RESET_GPU, "internal micro-controller halt"),
    63: (FAIL, RESET_GPU, "ECC page retirement or row remapping recording event"),
    64: (FAIL, INSPECT, "ECC page retirement or row remapper recording failure"),
    65: (FAIL, RESET_GPU, "video processor exception"),
    68: (FAIL, RESET_GPU, "NVDEC0 exception"),
    69: (FAIL, RESET_GPU, "graphics engine class error"),
    73: (FAIL, RESET_GPU, "NVENC2 error"),
    74: (FAIL, RESET_GPU, "NVLink error"),
    79: (FAIL, REBOOT, "GPU has fallen off the bus"),
    80: (FAIL, INSPECT, "corrupted data sent to GPU"),
    81: (FAIL, INSPECT, "VGA subsystem error"),
    92: (FAIL, INSPECT, "high single-bit ECC error rate"),
    94: (FAIL, RESET_GPU, "contained ECC error"),
    95: (FAIL, RESET_GPU, "uncontained ECC error"),
    109: (WARN, RESTART_APP, "context switch timeout"),
    119: (FAIL, REBOOT, "GSP RPC timeout"),
    120: (FAIL, REBOOT, "GSP error"),
    140: (FAIL, RESET_GPU, "unrecovered ECC error"),
}
#: NVLink XIDs (Blackwell and later) whose severity the driver prints in the line itself
#: ("Fatal" / "Nonfatal"); read as GPUd does (gpud PR 1174).
XID_NVLINK_SEVERITY_IN_LINE = range(144, 151)
_FATAL_WORD_RE = re.compile(r"\bfatal\b", re.I)
_NONFATAL_WORD_RE = re.compile(r"\bnon-?fatal\b", re.I)

# -- kernel log ----------------------------------------------------------------------------------
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
# Old drivers: "NVRM: Xid (0000:01:00): 16, Head 00000000 Count 00000000" (no "PCI:").
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bdf>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\)"
    r":\s*(?P<code>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
# "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"
_SXID_RE = re.compile(
    r"SXid \((?:PCI:)?(?P<bdf>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\)"
    r":\s*(?P<code>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
_PID_RE = re.compile(r"^pid='?(?P<pid><unknown>|-?\d+)'?\s*,?\s*")
# Drivers that print the loss of a GPU on several lines without an Xid (gpud PR 1209):
# "NVRM: The NVIDIA GPU 0000:b3:00.0" ... "NVRM: fallen off the bus and is not responding".
_LOST_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]\s*$")
_FALLEN_RE = re.compile(r"fallen off the bus")
# Where a new boot starts in a captured log: journalctl's separator, or the kernel's banner.
_BOOT_RE = re.compile(r"^-- (?:Boot [0-9a-f]+|Reboot) --|\bLinux version \d")
_JOURNAL_META_RE = re.compile(r"^-- (?:Logs begin|Journal begins|No entries)")


def this_boot(lines):
    """The lines of the last boot of a captured log (after the last journalctl ``-- Boot ... --``
    separator or the kernel's ``Linux version`` banner); all of them when there is none."""
    start = 0
    for number, line in enumerate(lines):
        if _BOOT_RE.search(line):
            start = number
    return lines[start:]


def parse_kernel_log(text):
    """NVRM Xid and nvswitch SXid events of this boot in a kernel log (plain ``dmesg``, ``dmesg
    -T``, ``journalctl -k``, syslog lines: the prefix does not matter).

    Returns ``(xid_events, sxid_events)``, each event ``{'bdf', 'code', 'pid', 'message'}`` with
    ``bdf`` as the driver printed it (no ``PCI:``, lower case), ``pid`` an int or None.
    """
    xids, sxids = [], []
    lines = this_boot((text or "").splitlines())
    lost = None
    for number, line in enumerate(lines):
        if _JOURNAL_META_RE.match(line):
            continue
        match = _XID_RE.search(line)
        if match:
            rest = match.group("rest") or ""
            pid = None
            pid_match = _PID_RE.match(rest)
            if pid_match:
                pid = None if pid_match.group("pid") == "<unknown>" else int(pid_match.group("pid"))
                rest = rest[pid_match.end() :]
            xids.append(
                {
                    "bdf": match.group("bdf").lower(),
                    "code": int(match.group("code")),
                    "pid": pid,
                    "message": rest.strip(),
                }
            )
            continue
        match = _SXID_RE.search(line)
        if match:
            sxids.append(
                {
                    "bdf": match.group("bdf").lower(),
                    "code": int(match.group("code")),
                    "pid": None,
                    "message": (match.group("rest") or "").strip(),
                }
            )
            continue
        match = _LOST_GPU_RE.search(line)
        if match:
            lost = (match.group("bdf").lower(), number)
            continue
        if lost and number - lost[1] <= 3 and _FALLEN_RE.search(line):
            if not any(x["code"] == 79 and x["bdf"] == lost[0] for x in xids):
                xids.append(
                    {
                        "bdf": lost[0],
                        "code": 79,
                        "pid": None,
                        "message": "GPU has fallen off the bus (reported without an Xid line)",
                    }
                )
            lost = None
    return xids, sxids


def xid_verdict(event):
    """``(status, action, meaning)`` of one Xid event."""
    code = event["code"]
    if code in XID_NVLINK_SEVERITY_IN_LINE:
        message = event.get("message") or ""
        if _FATAL_WORD_RE.search(message) and not _NONFATAL_WORD_RE.search(message):
            return FAIL, RESET_GPU, "fatal NVLink error"
        return WARN, NONE, "non-fatal NVLink error"
    if code in XID_CATALOG:
        return XID_CATALOG[code]
    return WARN, NONE, "XID %d is not in this collection's table: look it up in NVIDIA's XID catalog" % code


def sxid_verdict(event, fatal_codes=()):
    """SXid lines carry their own severity ("Fatal"/"Non-fatal", Fabric Manager User Guide
    DU-09883-001); ``fatal_codes`` fail whatever the line says."""
    message = event.get("message") or ""
    if event["code"] in fatal_codes or (_FATAL_WORD_RE.search(message) and not _NONFATAL_WORD_RE.search(message)):
        return FAIL, REBOOT, "fatal NVSwitch error"
    return WARN, NONE, "NVSwitch error"


# -- sysfs: AER, link maxima, NVSwitches, RDMA NICs, modules ---------------------------------
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


# -- collection: nvidia-smi ------------------------------------------------------------------
class HealthError(Exception):
    """No health facts can be given; ``cause`` is a short key, the message says what to do."""

    def __init__(self, cause, message):
        super().__init__(message)
        self.cause = cause


def collect_nvidia_smi(run, binary):
    """Per GPU facts from ``nvidia-smi -q`` and ``nvidia-smi nvlink -s``; ``run(argv)`` returns
    ``(rc, stdout, stderr)``."""
    argv = [binary, "-q"]
    rc, out, err = run(argv)
    text = (out or "") + "\n" + (err or "")
    try:
        _nvsmi.check_failure(text)
    except _nvsmi.NvidiaSmiError as exc:
        raise HealthError(exc.cause, str(exc)) from exc
    if _nvsmi.no_devices(text):
        return {"driver_version": None, "gpus": []}
    if rc != 0:
        raise HealthError(
            "nvidia_smi_failed", "`%s` exited %s: %s" % (" ".join(argv), rc, (err or out or "").strip()[-500:])
        )
    try:
        report = _nvsmi_q.parse_query(out)
    except _nvsmi.NvidiaSmiParseError as exc:
        raise HealthError("nvidia_smi_output", "cannot read the output of `%s`: %s" % (" ".join(argv), exc)) from exc
    gpus = report["gpus"]
    # NVLink state per link; GPUs without NVLink make some drivers exit non-zero: no links then.
    rc, out, _err = run([binary, "nvlink", "-s"])
    links = _nvsmi_q.parse_nvlink_links(out or "") if rc == 0 else []
    _nvsmi_q.attach_nvlinks(gpus, links)
    return {"driver_version": report["driver_version"], "gpus": gpus}


# -- collection: NVML ------------------------------------------------------------------------
class NvmlUnavailable(Exception):
    """nvmlInit() failed: the caller may fall back to nvidia-smi."""


def _nvml_clock_reasons(nvml, handle):
    mask = _nvml.optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = _nvml.optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is None:
        return None
    return [name for bit, name in NVML_CLOCK_REASON_BITS if int(mask) & bit]


_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _nvml_fabric(nvml, handle):
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None or getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None) is None:
        return None
    info = struct()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, info)
    except nvml.NVMLError:
        return None
    state = _FABRIC_STATES.get(int(info.state), "unknown")
    if state == "not_supported":
        return None
    status = int(info.status)
    if status == 0:
        status_text = "success"
    else:
        try:
            status_text = _nvsmi_q.snake(_nvml.text(nvml.nvmlErrorString(status)))
        except Exception:  # pylint: disable=broad-except
            status_text = "error_%d" % status
    return {"state": state, "status": status_text}


def _nvml_nvlinks(nvml, handle):
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    counters = (
        ("replay_errors", getattr(nvml, "NVML_NVLINK_ERROR_DL_REPLAY", 0)),
        ("recovery_errors", getattr(nvml, "NVML_NVLINK_ERROR_DL_RECOVERY", 1)),
        ("crc_flit", getattr(nvml, "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2)),
        ("crc_data", getattr(nvml, "NVML_NVLINK_ERROR_DL_CRC_DATA", 3)),
    )
    links = []
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            continue
        record = {"link": link, "active": state == enabled, "speed_gbps": None}
        values = {
            key: _nvml.optional(nvml, "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
            for key, counter in counters
        }
        record["replay_errors"] = values["replay_errors"]
        record["recovery_errors"] = values["recovery_errors"]
        crc = [values["crc_flit"], values["crc_data"]]
        record["crc_errors"] = sum(v for v in crc if v is not None) if any(v is not None for v in crc) else None
        links.append(record)
    return links


def collect_nvml(nvml):
    """Per GPU facts through NVML (``nvml`` is nvidia-ml-py's ``pynvml`` module)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable("nvmlInit() failed: %s" % exc) from exc
    try:
        driver = _nvml.text(_nvml.optional(nvml, "nvmlSystemGetDriverVersion"))
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                raise HealthError(
                    "gpu_lost",
                    "NVML cannot get a handle for GPU %d (%s): the GPU has most "
                    "likely fallen off the bus (Xid 79); reset the GPU or reboot" % (index, exc),
                ) from exc
            gpus.append(_nvml_gpu(nvml, handle))
        return {"driver_version": driver, "gpus": gpus}
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _nvml_gpu(nvml, handle):
    volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(nvml, "NVML_AGGREGATE_ECC", 1)
    corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    persistence = _nvml.optional(nvml, "nvmlDeviceGetPersistenceMode", handle)
    ecc = {
        "enabled": None,
        "volatile_correctable": _nvml.optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, corrected, volatile),
        "volatile_uncorrectable": _nvml.optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, volatile),
        "aggregate_correctable": _nvml.optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, corrected, aggregate),
        "aggregate_uncorrectable": _nvml.optional(nvml, "nvmlDeviceGetTotalEccErrors", handle, uncorrected, aggregate),
    }
    if all(value is None for value in ecc.values()):
        ecc = None
    remap = _nvml.optional(nvml, "nvmlDeviceGetRemappedRows", handle)
    remapped = None
    if remap is not None:
        correctable, uncorrectable, pending, failure = remap
        remapped = {
            "correctable": correctable,
            "uncorrectable": uncorrectable,
            "pending": bool(pending),
            "failure": bool(failure),
        }
    retired = None
    if remapped is None:
        pending = _nvml.optional(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        sbe = _nvml.optional(
            nvml,
            "nvmlDeviceGetRetiredPages",
            handle,
            getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
        )
        dbe = _nvml.optional(
            nvml,
            "nvmlDeviceGetRetiredPages",
            handle,
            getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
        )
        if pending is not None or sbe is not None or dbe is not None:
            retired = {
                "single_bit_ecc": len(sbe) if sbe is not None else None,
                "double_bit_ecc": len(dbe) if dbe is not None else None,
                "pending": bool(pending) if pending is not None else None,
            }
    return {
        "bus_id": _nvsmi.normalize_bus_id(_nvml.text(pci.busId)),
        "uuid": _nvml.text(_nvml.optional(nvml, "nvmlDeviceGetUUID", handle)),
        "name": _nvml.text(_nvml.optional(nvml, "nvmlDeviceGetName", handle)),
        "persistence_mode": None if persistence is None else persistence == getattr(nvml, "NVML_FEATURE_ENABLED", 1),
        "ecc": ecc,
        "retired_pages": retired,
        "remapped_rows": remapped,
        "clocks_event_reasons": _nvml_clock_reasons(nvml, handle),
        "pcie": {
            "gen_current": _nvml.optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "gen_max": _nvml.optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "width_current": _nvml.optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
            "width_max": _nvml.optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
            "replays": _nvml.optional(nvml, "nvmlDeviceGetPcieReplayCounter", handle),
        },
        "fabric": _nvml_fabric(nvml, handle),
        "nvlinks": _nvml_nvlinks(nvml, handle),
    }


# -- the checks ------------------------------------------------------------------------------
def check(name, status, gpus, reason, action=NONE):
    return {
        "name": name,
        "status": status,
        "gpus": sorted(set(gpus)),
        "reason": reason,
        "action": action if status != PASS else NONE,
    }


def _judged(name, fails, failed, warns, warned, fail_action, pass_reason, fail_prefix=""):
    """FAIL (naming the warnings too) when there are ``fails``, else WARN (INSPECT) when there are
    ``warns``, else PASS with ``pass_reason``."""
    if fails:
        return check(name, FAIL, failed + warned, fail_prefix + "; ".join(fails + warns), fail_action)
    if warns:
        return check(name, WARN, warned, "; ".join(warns), INSPECT)
    return check(name, PASS, [], pass_reason)


def _worst(verdicts):
    """The worst (status, action) of ``[(status, action)]``; pass/none when empty."""
    status, action = PASS, NONE
    for s, a in verdicts:
        if _RANK[s] > _RANK[status] or (s == status and ACTIONS.index(a) > ACTIONS.index(action)):
            status, action = s, a
    return status, action


def _gpu_of_bdf(bdf, bus_ids):
    """The GPU bus id (``0000:3b:00.0``) an Xid's ``0000:3b:00`` names, else the bdf as printed."""
    for bus_id in bus_ids:
        if bus_id and bus_id.startswith(bdf if "." in bdf else bdf + "."):
            return bus_id
    try:
        return _nvsmi.normalize_bus_id(bdf if "." in bdf else bdf + ".0") or bdf
    except ValueError:
        return bdf


def check_xid(xids, bus_ids, log_error=None):
    if log_error:
        return check("xid", WARN, [], "the kernel log could not be read, so XIDs are unknown: %s" % log_error, INSPECT)
    verdicts, parts, gpus = [], [], []
    seen = {}
    for event in xids:
        status, action, meaning = xid_verdict(event)
        gpu = _gpu_of_bdf(event["bdf"], bus_ids)
        key = (gpu, event["code"])
        if key in seen:
            seen[key][1] += 1
            continue
        seen[key] = [status, 1, meaning, action]
        verdicts.append((status, action))
        if status != PASS:
            gpus.append(gpu)
    for (gpu, code), (status, count, meaning, _action) in seen.items():
        times = ", %d times" % count if count > 1 else ""
        parts.append("XID %d on %s (%s, %s%s)" % (code, gpu, meaning, status, times))
    status, action = _worst(verdicts)
    if not xids:
        return check("xid", PASS, [], "no NVRM Xid in this boot's kernel log")
    return check("xid", status, gpus, "; ".join(parts), action)


def check_sxid(sxids, fatal_codes=()):
    if not sxids:
        return check("sxid", PASS, [], "no NVSwitch SXid in this boot's kernel log")
    groups = {}
    for event in sxids:
        key = (event["bdf"], event["code"])
        groups.setdefault(key, []).append(event)
    verdicts, parts = [], []
    for (bdf, code), events in sorted(groups.items()):
        verdict = _worst([sxid_verdict(e, fatal_codes)[:2] for e in events])
        verdicts.append(verdict)
        parts.append("SXid %d on NVSwitch %s (%s, %d line(s))" % (code, bdf, verdict[0], len(events)))
    status, action = _worst(verdicts)
    return check("sxid", status, [], "; ".join(parts), action)


def check_row_remap(gpus):
    pending = [g["bus_id"] for g in gpus if (g.get("remapped_rows") or {}).get("pending")]
    failed = [g["bus_id"] for g in gpus if (g.get("remapped_rows") or {}).get("failure")]
    if failed:
        return check(
            "row_remap",
            FAIL,
            failed + pending,
            "row remapping failed on %s: the GPU memory has run out of spare rows" % ", ".join(failed),
            INSPECT,
        )
    if pending:
        return check(
            "row_remap",
            FAIL,
            pending,
            "row remapping pending on %s: takes effect only after a GPU reset or reboot" % ", ".join(pending),
            RESET_GPU,
        )
    supported = [g for g in gpus if g.get("remapped_rows") is not None]
    return check(
        "row_remap",
        PASS,
        [],
        "no pending or failed row remapping (%d of %d GPU(s) report it)" % (len(supported), len(gpus)),
    )


def check_ecc(gpus, limit):
    bad = [
        (g["bus_id"], g["ecc"]["volatile_uncorrectable"])
        for g in gpus
        if g.get("ecc")
        and g["ecc"].get("volatile_uncorrectable") is not None
        and g["ecc"]["volatile_uncorrectable"] > limit
    ]
    if bad:
        return check(
            "ecc",
            FAIL,
            [b for b, _n in bad],
            "volatile uncorrectable ECC errors above %d: %s" % (limit, ", ".join("%s: %d" % b for b in bad)),
            RESET_GPU,
        )
    return check("ecc", PASS, [], "no volatile uncorrectable ECC error above %d" % limit)


def check_retired_pages(gpus, limit):
    pending, over = [], []
    for gpu in gpus:
        pages = gpu.get("retired_pages") or {}
        if pages.get("pending"):
            pending.append(gpu["bus_id"])
        total = (pages.get("single_bit_ecc") or 0) + (pages.get("double_bit_ecc") or 0)
        if total >= limit > 0:
            over.append((gpu["bus_id"], total))
    if over:
        return check(
            "retired_pages",
            FAIL,
            [b for b, _n in over] + pending,
            "%s retired page(s), DCGM's limit is %d: replace the GPU" % (", ".join("%s: %d" % o for o in over), limit),
            INSPECT,
        )
    if pending:
        return check(
            "retired_pages",
            FAIL,
            pending,
            "page retirement pending on %s: takes effect after a GPU reset or reboot" % ", ".join(pending),
            RESET_GPU,
        )
    return check("retired_pages", PASS, [], "no pending page retirement, retired pages below %d" % limit)


def nvswitch_system(gpus, pci):
    """Whether the node has NVSwitches (needs the fabric manager): a GPU reports a fabric state
    (NVML fabric info / ``-q`` "Fabric" with a state), or the PCI tree holds NVSwitches."""
    return any(g.get("fabric") for g in gpus) or bool(pci.get("nvswitches"))


def check_fabric(gpus, pci, mode, fm_state):
    if mode == "not_required":
        return check("fabric_manager", PASS, [], "not judged (fabric_manager=not_required)")
    needed = mode == "required" or nvswitch_system(gpus, pci)
    if not needed:
        return check("fabric_manager", PASS, [], "no NVSwitch: the fabric manager is not needed")
    problems, bad = [], []
    if fm_state != "active":
        problems.append(
            "nvidia-fabricmanager is %s (systemctl is-active), not active: start and enable it; "
            'CUDA reports "system not yet initialized" (error 802) without it' % (fm_state or "unknown")
        )
    for gpu in gpus:
        fabric = gpu.get("fabric")
        if fabric is None or fabric.get("state") != "completed" or fabric.get("status") != "success":
            bad.append(gpu["bus_id"])
    if bad:
        problems.append(
            "GPU fabric state not completed/success on %s (%s)"
            % (
                ", ".join(bad),
                ", ".join(
                    sorted(
                        {
                            "%s/%s" % ((g.get("fabric") or {}).get("state"), (g.get("fabric") or {}).get("status"))
                            for g in gpus
                            if g["bus_id"] in bad
                        }
                    )
                ),
            )
        )
    if problems:
        action = CONFIGURE if fm_state != "active" else RESET_GPU
        return check("fabric_manager", FAIL, bad, "; ".join(problems), action)
    return check("fabric_manager", PASS, [], "nvidia-fabricmanager active, fabric completed/success on every GPU")


def check_nvlink(gpus, thresholds, expected_speed=None):
    nvlink_gpus = [g for g in gpus if g.get("nvlinks")]
    if not nvlink_gpus:
        return check("nvlink", PASS, [], "no NVLink GPU")
    speeds = [link["speed_gbps"] for g in nvlink_gpus for link in g["nvlinks"] if link.get("speed_gbps")]
    expected = expected_speed or (max(speeds) if speeds else None)
    fails, warns, failed_gpus, warned_gpus = [], [], [], []
    counts = {len(g["nvlinks"]) for g in nvlink_gpus}
    for gpu in nvlink_gpus:
        down = [link["link"] for link in gpu["nvlinks"] if not link["active"]]
        slow = [
            link["link"]
            for link in gpu["nvlinks"]
            if link["active"] and expected and link.get("speed_gbps") and link["speed_gbps"] < expected * 0.99
        ]
        if down:
            fails.append("%s link(s) %s inactive" % (gpu["bus_id"], ",".join(map(str, down))))
            failed_gpus.append(gpu["bus_id"])
        if slow:
            fails.append("%s link(s) %s below %s GB/s" % (gpu["bus_id"], ",".join(map(str, slow)), expected))
            failed_gpus.append(gpu["bus_id"])
        for key, limit_key in (
            ("crc_errors", "nvlink_crc_errors_max"),
            ("replay_errors", "nvlink_replay_errors_max"),
            ("recovery_errors", "nvlink_recovery_errors_max"),
        ):
            over = [
                (link["link"], link[key])
                for link in gpu["nvlinks"]
                if link.get(key) is not None and link[key] > thresholds[limit_key]
            ]
            if over:
                warns.append(
                    "%s %s above %d on link(s) %s"
                    % (
                        gpu["bus_id"],
                        key.replace("_", " "),
                        thresholds[limit_key],
                        ", ".join("%d (%d)" % o for o in over),
                    )
                )
                warned_gpus.append(gpu["bus_id"])
    if len(counts) > 1:
        fails.append("GPUs report different NVLink counts (%s)" % ", ".join(str(c) for c in sorted(counts)))
    return _judged(
        "nvlink",
        fails,
        failed_gpus,
        warns,
        warned_gpus,
        RESET_GPU,
        "every NVLink of %d GPU(s) active%s" % (len(nvlink_gpus), " at %s GB/s" % expected if expected else ""),
    )


def check_clocks(gpus, fail_reasons=CLOCK_REASONS_FAIL, warn_reasons=CLOCK_REASONS_WARN):
    fails, warns = [], []
    for gpu in gpus:
        active = gpu.get("clocks_event_reasons") or []
        bad = [r for r in active if r in fail_reasons]
        meh = [r for r in active if r in warn_reasons]
        if bad:
            fails.append((gpu["bus_id"], bad))
        if meh:
            warns.append((gpu["bus_id"], meh))
    if fails:
        return check(
            "clocks",
            FAIL,
            [b for b, _r in fails],
            "hardware clock slowdown active: %s; check cooling, power supply and the power brake signal"
            % "; ".join("%s %s" % (b, ",".join(r)) for b, r in fails),
            INSPECT,
        )
    if warns:
        return check(
            "clocks",
            WARN,
            [b for b, _r in warns],
            "software thermal slowdown: %s" % "; ".join("%s %s" % (b, ",".join(r)) for b, r in warns),
            NONE,
        )
    return check("clocks", PASS, [], "no hardware slowdown (a software power cap is not a fault)")


def _link_max(gpu, pci):
    """The GPU's link maxima, capped by its upstream port's (a Gen5 GPU in a Gen4 slot)."""
    pcie = gpu.get("pcie") or {}
    gen_max, width_max = pcie.get("gen_max"), pcie.get("width_max")
    info = pci.get("gpus", {}).get(gpu["bus_id"])
    port = info["chain"][-1] if info and info["chain"] else None
    port_link = pci.get("bridges", {}).get(port, {}).get("link") if port else None
    if port_link:
        if gen_max is not None and port_link.get("gen_max"):
            gen_max = min(gen_max, port_link["gen_max"])
        if width_max is not None and port_link.get("width_max"):
            width_max = min(width_max, port_link["width_max"])
    return gen_max, width_max, port


def check_pcie(gpus, pci, busy, thresholds):
    fails, warns, failed, warned = [], [], [], []
    for gpu in gpus:
        pcie = gpu.get("pcie") or {}
        gen_max, width_max, port = _link_max(gpu, pci)
        where = " below port %s" % port if port else ""
        gen_low = pcie.get("gen_current") is not None and gen_max is not None and pcie["gen_current"] < gen_max
        width_low = (
            pcie.get("width_current") is not None and width_max is not None and pcie["width_current"] < width_max
        )
        text = "%s at Gen%s x%s%s, can do Gen%s x%s" % (
            gpu["bus_id"],
            pcie.get("gen_current"),
            pcie.get("width_current"),
            where,
            gen_max,
            width_max,
        )
        if busy and (gen_low or width_low):
            fails.append(text)
            failed.append(gpu["bus_id"])
        elif width_low:
            # The generation drops while a GPU idles; the width does not, so it is suspect even idle.
            warns.append(text + " (idle; judged under load with busy=true)")
            warned.append(gpu["bus_id"])
        replays = pcie.get("replays")
        limit = thresholds.get("pcie_replays_max")
        if replays is not None and limit is not None and replays > limit:
            warns.append("%s %d PCIe replays since reset (above %d)" % (gpu["bus_id"], replays, limit))
            warned.append(gpu["bus_id"])
    return _judged(
        "pcie_link",
        fails,
        failed,
        warns,
        warned,
        INSPECT,
        "every GPU link at its maximum generation and width under load"
        if busy
        else "link widths at their maximum; generations not judged while idle (busy=false)",
        fail_prefix="PCIe link below its maximum under load: ",
    )


def check_aer(gpus, pci, limit):
    if pci.get("error"):
        return check("pcie_aer", PASS, [], "not judged: the PCI tree cannot be read (%s)" % pci["error"])
    fails, warns, failed, warned = [], [], [], []
    devices = []
    for gpu in gpus:
        info = pci.get("gpus", {}).get(gpu["bus_id"])
        if info is None:
            continue
        devices.append((gpu["bus_id"], gpu["bus_id"], info["aer"]))
        for bridge in info["chain"]:
            if bridge in pci.get("bridges", {}):
                devices.append((bridge, gpu["bus_id"], pci["bridges"][bridge]["aer"]))
    seen = set()
    reported = 0
    for bdf, gpu, aer in devices:
        if bdf in seen:
            continue
        seen.add(bdf)
        if any(v is not None for v in aer.values()):
            reported += 1
        if (aer.get("fatal") or 0) > 0 or (aer.get("nonfatal") or 0) > 0:
            fails.append(
                "%s: %s fatal, %s non-fatal AER error(s)%s"
                % (
                    bdf,
                    aer.get("fatal") or 0,
                    aer.get("nonfatal") or 0,
                    "" if bdf == gpu else " (on the path of %s)" % gpu,
                )
            )
            failed.append(gpu)
        if (aer.get("correctable") or 0) > limit:
            warns.append(
                "%s: %d correctable AER errors (above %d)%s"
                % (bdf, aer["correctable"], limit, "" if bdf == gpu else " (on the path of %s)" % gpu)
            )
            warned.append(gpu)
    return _judged(
        "pcie_aer",
        fails,
        failed,
        warns,
        warned,
        INSPECT,
        "no fatal or non-fatal AER error on %d GPU(s) and the bridges above them "
        "(%d report AER counters)" % (len(gpus), reported),
    )


def check_peermem(pci, loaded, required):
    nics = pci.get("nics_on_gpu_paths") or []
    if loaded:
        return check("peermem", PASS, [], "nvidia_peermem is loaded")
    if required:
        return check(
            "peermem",
            FAIL,
            [],
            "nvidia_peermem is not loaded (require_peermem=true): "
            "`modprobe nvidia_peermem` and add it to /etc/modules-load.d",
            CONFIGURE,
        )
    if nics:
        return check(
            "peermem",
            WARN,
            [],
            "RDMA NIC(s) %s share PCIe switches with GPUs but nvidia_peermem is not "
            "loaded: GPUDirect RDMA is off (modprobe nvidia_peermem)" % ", ".join(nics),
            CONFIGURE,
        )
    return check("peermem", PASS, [], "no RDMA NIC on a GPU path; nvidia_peermem not needed")


def check_gpu_count(gpus, pci, expected=None):
    seen = [g["bus_id"] for g in gpus]
    problems, missing = [], []
    if not pci.get("error"):
        in_tree = [bdf for bdf, info in sorted(pci.get("gpus", {}).items()) if info["driver"] in (None, "nvidia")]
        missing = [bdf for bdf in in_tree if bdf not in seen]
        if missing:
            problems.append(
                "GPU(s) %s are in the PCI tree but the driver does not report them (fallen off the "
                "bus, or failed to initialise: see the kernel log)" % ", ".join(missing)
            )
    if expected is not None and expected != len(seen):
        problems.append("%d GPU(s) visible to the driver, expected %d" % (len(seen), expected))
    if problems:
        return check("gpu_count", FAIL, missing, "; ".join(problems), REBOOT if missing else INSPECT)
    return check(
        "gpu_count", PASS, [], "%d GPU(s) visible%s" % (len(seen), ", as expected" if expected is not None else "")
    )


def check_persistence(gpus):
    off = [g["bus_id"] for g in gpus if g.get("persistence_mode") is False]
    if off:
        return check(
            "persistence_mode",
            FAIL,
            off,
            "persistence mode off on %s: enable nvidia-persistenced" % ", ".join(off),
            CONFIGURE,
        )
    return check("persistence_mode", PASS, [], "persistence mode on (or not reported) on every GPU")


def run_checks(record, xids, sxids, pci, options):
    """Every check, in a fixed order. ``options``: ``thresholds`` (dict, DEFAULT_THRESHOLDS keys),
    ``busy``, ``fabric_manager`` (auto|required|not_required), ``fabric_manager_state``,
    ``require_peermem``, ``peermem_loaded``, ``expect_gpu_count``, ``nvlink_expected_speed_gbps``,
    ``sxid_fatal_codes``, ``clock_reasons_fail``, ``clock_reasons_warn``, ``kernel_log_error``."""
    thresholds = dict(DEFAULT_THRESHOLDS)
    thresholds.update({k: v for k, v in (options.get("thresholds") or {}).items() if v is not None})
    gpus = record["gpus"]
    bus_ids = [g["bus_id"] for g in gpus]
    return [
        check_xid(xids, bus_ids, options.get("kernel_log_error")),
        check_sxid(sxids, options.get("sxid_fatal_codes") or ()),
        check_row_remap(gpus),
        check_ecc(gpus, thresholds["ecc_volatile_uncorrectable_max"]),
        check_retired_pages(gpus, thresholds["retired_pages_max"]),
        check_fabric(gpus, pci, options.get("fabric_manager", "auto"), options.get("fabric_manager_state")),
        check_nvlink(gpus, thresholds, options.get("nvlink_expected_speed_gbps")),
        check_clocks(
            gpus,
            options.get("clock_reasons_fail") or CLOCK_REASONS_FAIL,
            options.get("clock_reasons_warn") if options.get("clock_reasons_warn") is not None else CLOCK_REASONS_WARN,
        ),
        check_pcie(gpus, pci, bool(options.get("busy")), thresholds),
        check_aer(gpus, pci, thresholds["aer_correctable_max"]),
        check_peermem(pci, options.get("peermem_loaded"), bool(options.get("require_peermem"))),
        check_gpu_count(gpus, pci, options.get("expect_gpu_count")),
        check_persistence(gpus),
    ]


def verdict(checks):
    """``(passed, failed_names, warned_names)``."""
    failed = [c["name"] for c in checks if c["status"] == FAIL]
    warned = [c["name"] for c in checks if c["status"] == WARN]
    return not failed, failed, warned
