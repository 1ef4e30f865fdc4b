# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-GPU health facts, from NVML (``collect_nvml``, nvidia-ml-py function names) or from
``nvidia-smi -q`` + ``nvidia-smi nvlink -s`` (``collect_nvidia_smi``, parsed by ``gpu/_nvsmi_q``):
one backend-neutral record that ``_checks`` judges.

Plain Python (no Ansible imports), runs on target Python 3.8+.
"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvml, _nvsmi, _nvsmi_q

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


def _nvml_clock_reasons(reader, handle):
    nvml = reader.nvml
    name = "nvmlDeviceGetCurrentClocksEventReasons"
    if getattr(nvml, name, None) is None:
        name = "nvmlDeviceGetCurrentClocksThrottleReasons"
    mask = reader.get("clocks_event_reasons", name, handle)
    if mask is None:
        return None
    return [label for bit, label in NVML_CLOCK_REASON_BITS if int(mask) & bit]


_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _nvml_fabric(reader, handle):
    nvml = reader.nvml
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is None or getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None) is None:
        return None
    info = struct()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, info)
    except nvml.NVMLError as exc:
        if not _nvml.is_unsupported(nvml, exc):
            reader.note("fabric", "nvmlDeviceGetGpuFabricInfo", exc)
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


def _nvml_nvlinks(reader, handle):
    nvml = reader.nvml
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    # NotSupported (no NVLink) and InvalidArgument (past the GPU's last link) end the links; any
    # other error is a link that exists but cannot be read.
    invalid = getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2)
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
        except nvml.NVMLError as exc:
            if not (_nvml.is_unsupported(nvml, exc) or _nvml.error_code(exc) == invalid):
                reader.note("nvlink %d state" % link, "nvmlDeviceGetNvLinkState", exc)
            continue
        record = {"link": link, "active": state == enabled, "speed_gbps": None}
        values = {}
        for key, counter in counters:
            values[key] = reader.get(
                "nvlink %d %s" % (link, key), "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter
            )
        record["replay_errors"] = values["replay_errors"]
        record["recovery_errors"] = values["recovery_errors"]
        crc = [values["crc_flit"], values["crc_data"]]
        record["crc_errors"] = sum(v for v in crc if v is not None) if any(v is not None for v in crc) else None
        links.append(record)
    # Error counters a GPU model lacks are not worth a warning per link.
    reader.unsupported = [u for u in reader.unsupported if not u["field"].startswith("nvlink ")]
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
                raise _gpu_lost("get a handle for GPU %d (%s)" % (index, exc)) from exc
            gpus.append(_nvml_gpu(nvml, index, handle))
        return {"driver_version": driver, "gpus": gpus}
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _gpu_lost(what):
    """The failure of an NVML call that identifies a GPU: without it the GPU cannot be judged."""
    return HealthError(
        "gpu_lost",
        "NVML cannot %s: the GPU has most likely fallen off the bus (Xid 79); reset the GPU or reboot" % what,
    )


def _nvml_gpu(nvml, index, handle):
    volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
    aggregate = getattr(nvml, "NVML_AGGREGATE_ECC", 1)
    corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    try:
        pci = nvml.nvmlDeviceGetPciInfo(handle)
    except nvml.NVMLError as exc:
        raise _gpu_lost("read the PCI address of GPU %d (nvmlDeviceGetPciInfo: %s)" % (index, exc)) from exc
    reader = _nvml.Reader(nvml)
    get = reader.get
    persistence = get("persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    ecc_calls = (
        ("volatile_correctable", corrected, volatile),
        ("volatile_uncorrectable", uncorrected, volatile),
        ("aggregate_correctable", corrected, aggregate),
        ("aggregate_uncorrectable", uncorrected, aggregate),
    )
    ecc = {"enabled": None}
    for key, kind, counter in ecc_calls:
        ecc[key] = get("ecc " + key, "nvmlDeviceGetTotalEccErrors", handle, kind, counter)
    if all(value is None for value in ecc.values()):
        ecc = None
    remap = get("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
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
        pending = get("retired_pages pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        sbe = get(
            "retired_pages single_bit_ecc",
            "nvmlDeviceGetRetiredPages",
            handle,
            getattr(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
        )
        dbe = get(
            "retired_pages double_bit_ecc",
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
            # Pre-Ampere GPUs retire pages instead of remapping rows: not a gap.
            reader.drop_unsupported("remapped_rows")
    else:
        reader.drop_unsupported("retired_pages pending", "retired_pages single_bit_ecc", "retired_pages double_bit_ecc")
    record = {
        "bus_id": _nvsmi.normalize_bus_id(_nvml.text(pci.busId)),
        "uuid": _nvml.text(_nvml.optional(nvml, "nvmlDeviceGetUUID", handle)),
        "name": _nvml.text(_nvml.optional(nvml, "nvmlDeviceGetName", handle)),
        "persistence_mode": None if persistence is None else persistence == getattr(nvml, "NVML_FEATURE_ENABLED", 1),
        "ecc": ecc,
        "retired_pages": retired,
        "remapped_rows": remapped,
        "clocks_event_reasons": _nvml_clock_reasons(reader, handle),
        "pcie": {
            "gen_current": get("pcie gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "gen_max": get("pcie gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "width_current": get("pcie width_current", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            "width_max": get("pcie width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            "replays": get("pcie replays", "nvmlDeviceGetPcieReplayCounter", handle),
        },
        "fabric": _nvml_fabric(reader, handle),
        "nvlinks": _nvml_nvlinks(reader, handle),
    }
    # Only the facts a check needs from a GPU that lacks them are worth a warning.
    warned = ("persistence_mode", "remapped_rows", "retired_pages", "ecc ")
    record["unsupported"] = [u for u in reader.unsupported if u["field"].startswith(warned)]
    record["unreadable"] = reader.unreadable
    return record
