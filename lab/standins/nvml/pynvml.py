# SPDX-License-Identifier: GPL-3.0-or-later
"""A stand-in for NVIDIA's `pynvml` (PyPI nvidia-ml-py) for tests and the lab ONLY.

Put `lab/standins/nvml` first on sys.path / PYTHONPATH and `import pynvml` answers from the lab machine
under $GPUFLEET_LAB_ROOT (the same model, and the same CURRENT sysfs registers, as the
nvidia-smi stand-in), so the NVML and nvidia-smi backends of gpu_topology_facts can be compared
on one machine.  Production hosts use the real nvidia-ml-py.

Names, constant values, error classes and return shapes follow nvidia-ml-py 13.615.71:

* `NVMLError(value)` returns the subclass for the code (`NVMLError_DriverNotLoaded`, ...),
  built from the NVML_ERROR_* names exactly as `_extractNVMLErrorsAsClasses` does.
* `NVML_P2P_CAPS_INDEX_READ` is the tuple `(0,)` as in that release (a trailing comma in its
  source); `nvmlDeviceGetP2PStatus` takes the integer index, and a tuple fails the way ctypes
  fails (ctypes.ArgumentError), so callers that pass the constant are caught in tests.
* `nvmlDeviceGetPciInfo(h).busId` is a str `00000000:43:00.0`; strings are str.
* A GPU bound to vfio-pci does not exist for NVML; the rest are indexed in PCI bus order.

GPU health (the machine's health state, lab/hwmodel/health.py, read on every call so an
injected fault shows at once): nvmlDeviceGetPersistenceMode, nvmlDeviceGetEccMode,
nvmlDeviceGetTotalEccErrors, nvmlDeviceGetMemoryErrorCounter, nvmlDeviceGetRemappedRows,
nvmlDeviceGetRetiredPages* (NotSupported: these GPUs remap rows), nvmlDeviceGetCurrentClocksEventReasons
(and the older ...ThrottleReasons), nvmlDeviceGetGpuFabricInfo (filling a c_nvmlGpuFabricInfo_t),
nvmlDeviceGetNvLinkState (FEATURE_DISABLED for a link that is down), nvmlDeviceGetNvLinkErrorCounter,
nvmlDeviceGetPcieReplayCounter.

Driver faults (the machine's health state, as for nvidia-smi): `driver-not-loaded` -> nvmlInit
raises NVMLError_DriverNotLoaded; `library-mismatch` -> NVMLError_LibRmVersionMismatch;
`no-devices` -> a count of 0; `gpu-lost` -> the handle of that GPU raises NVMLError_Unknown.  Without $GPUFLEET_LAB_ROOT nvmlInit raises
NVMLError_LibraryNotFound, as on a host without the driver.
"""

from __future__ import annotations

import ctypes
import os
import string
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _REPO not in sys.path:
    sys.path.append(_REPO)

from lab.hwmodel import Node  # noqa: E402
from lab.standins import nvidia_smi as _smi  # noqa: E402

# -- constants (values as in nvidia-ml-py) ------------------------------------------------------
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_P2P_CAPS_INDEX_READ = (0,)  # sic: a tuple in nvidia-ml-py 13.615.71
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_CAPS_INDEX_ATOMICS = 3
NVML_P2P_CAPS_INDEX_PROP = 4
NVML_P2P_CAPS_INDEX_PCI = 4
NVML_P2P_CAPS_INDEX_UNKNOWN = 5
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED = 1
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_P2P_STATUS_UNKNOWN = 6
NVML_AFFINITY_SCOPE_NODE = 0
NVML_AFFINITY_SCOPE_SOCKET = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_LOCATION_L1_CACHE = 0
NVML_MEMORY_LOCATION_L2_CACHE = 1
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_DEVICE_MEMORY = 2
NVML_MEMORY_LOCATION_REGISTER_FILE = 3
NVML_MEMORY_LOCATION_TEXTURE_MEMORY = 4
NVML_MEMORY_LOCATION_TEXTURE_SHM = 5
NVML_MEMORY_LOCATION_CBU = 6
NVML_MEMORY_LOCATION_SRAM = 7
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonApplicationsClocksSetting = nvmlClocksEventReasonApplicationsClocksSetting
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSyncBoost = nvmlClocksEventReasonSyncBoost
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown
nvmlClocksThrottleReasonDisplayClockSetting = nvmlClocksEventReasonDisplayClockSetting
nvmlClocksThrottleReasonNone = nvmlClocksEventReasonNone

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

_P2P_MODE = {0: "read", 1: "write", 2: "nvlink", 3: "atomics", 4: "pcie"}
_P2P_CODE = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DR": 4, "NS": 5, "U": 6}
_LEVEL = {
    "PIX": NVML_TOPOLOGY_SINGLE,
    "PXB": NVML_TOPOLOGY_MULTIPLE,
    "PHB": NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": NVML_TOPOLOGY_NODE,
    "SYS": NVML_TOPOLOGY_SYSTEM,
}


# -- errors, built as nvidia-ml-py builds them ---------------------------------------------------
class NVMLError(Exception):
    _valClassMapping = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def nvmlExceptionClass(nvmlErrorCode):
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError("nvmlErrorCode %s is not valid" % nvmlErrorCode)
    return NVMLError._valClassMapping[nvmlErrorCode]


def _extractNVMLErrorsAsClasses():
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


# -- state --------------------------------------------------------------------------------------
_state = {"refcount": 0, "node": None}


class c_nvmlDevice_t:
    """A device handle: the GPU record and its NVML index."""

    def __init__(self, index, gpu):
        self.index = index
        self.gpu = gpu

    def __repr__(self):
        return "<nvmlDevice %d %s>" % (self.index, self.gpu.bdf)


class nvmlPciInfo_t:
    def __init__(self, bdf, device_id):
        domain, bus, rest = bdf.split(":")
        dev, fn = rest.split(".")
        self.busId = _smi.nvml_bus_id(bdf)
        self.busIdLegacy = self.busId[4:]
        self.domain = int(domain, 16)
        self.bus = int(bus, 16)
        self.device = int(dev, 16)
        self.function = int(fn, 16)
        self.pciDeviceId = (device_id << 16) | 0x10DE
        self.pciSubSystemId = 0


class c_nvmlMemory_t:
    def __init__(self, total, used):
        self.total = total
        self.used = used
        self.free = total - used


def _check(code):
    if code != NVML_SUCCESS:
        raise NVMLError(code)


def _node():
    if not _state["refcount"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _state["node"]


def _visible():
    node = _node()
    kind, _arg = _smi.gpu_fault(node)
    return [] if kind == "no-devices" else _smi.visible_gpus(node)


# -- library ------------------------------------------------------------------------------------
def nvmlInitWithFlags(flags):
    if not os.environ.get("GPUFLEET_LAB_ROOT"):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    try:
        node = Node.load()
    except RuntimeError:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    kind, _arg = _smi.gpu_fault(node)
    if kind == "driver-not-loaded":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    if kind == "library-mismatch":
        raise NVMLError(NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    _state["node"] = node
    _state["refcount"] += 1


def nvmlInit():
    nvmlInitWithFlags(0)


def nvmlShutdown():
    _node()
    _state["refcount"] -= 1
    if not _state["refcount"]:
        _state["node"] = None


def nvmlErrorString(result):
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


def nvmlSystemGetDriverVersion():
    return _smi.driver_version(_node())


def nvmlSystemGetNVMLVersion():
    return "12." + _smi.driver_version(_node())


def nvmlSystemGetCudaDriverVersion():
    _node()
    major, minor = _smi.DEFAULT_CUDA.split(".")
    return int(major) * 1000 + int(minor) * 10


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


# -- devices ------------------------------------------------------------------------------------
def nvmlDeviceGetCount():
    return len(_visible())


def nvmlDeviceGetHandleByIndex(index):
    gpus = _visible()
    if not isinstance(index, int) or not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[index]
    if _node().gpu_lost(gpu.index):
        raise NVMLError(NVML_ERROR_UNKNOWN)
    return c_nvmlDevice_t(index, gpu)


def nvmlDeviceGetHandleByPciBusId(pciBusId):
    if isinstance(pciBusId, bytes):
        pciBusId = pciBusId.decode()
    for index, gpu in enumerate(_visible()):
        if _smi.nvml_bus_id(gpu.bdf).lower().endswith(pciBusId.lower()[-12:]):
            return nvmlDeviceGetHandleByIndex(index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def _gpu(handle):
    _node()
    if not isinstance(handle, c_nvmlDevice_t):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.gpu


def nvmlDeviceGetIndex(handle):
    _gpu(handle)
    return handle.index


def _gpu_attribute(name):
    """An NVML getter ``f(handle)`` that returns the GPU model's attribute ``name``."""

    def getter(handle):
        return getattr(_gpu(handle), name)

    return getter


nvmlDeviceGetName = _gpu_attribute("name")
nvmlDeviceGetUUID = _gpu_attribute("uuid")
nvmlDeviceGetSerial = _gpu_attribute("serial")


def nvmlDeviceGetPciInfo(handle):
    gpu = _gpu(handle)
    return nvmlPciInfo_t(gpu.bdf, gpu.rec["device_id"])


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetMemoryInfo(handle, version=None):
    return c_nvmlMemory_t(_gpu(handle).memory_total_mib * 1024 * 1024, 0)


nvmlDeviceGetCurrPcieLinkGeneration = _gpu_attribute("gen_current")
nvmlDeviceGetMaxPcieLinkGeneration = _gpu_attribute("gen_max")
nvmlDeviceGetCurrPcieLinkWidth = _gpu_attribute("width_current")
nvmlDeviceGetMaxPcieLinkWidth = _gpu_attribute("width_max")


def nvmlDeviceGetCudaComputeCapability(handle):
    major, minor = _gpu(handle).compute_capability.split(".")
    return int(major), int(minor)


def _mask(numbers, words):
    out = [0] * words
    for n in numbers:
        if n // 64 < words:
            out[n // 64] |= 1 << (n % 64)
    return out


def nvmlDeviceGetCpuAffinity(handle, cpuSetSize):
    cpus = []
    for part in _gpu(handle).cpu_affinity.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return _mask(cpus, cpuSetSize)


def nvmlDeviceGetCpuAffinityWithinScope(handle, cpuSetSize, scope):
    return nvmlDeviceGetCpuAffinity(handle, cpuSetSize)


def nvmlDeviceGetMemoryAffinity(handle, nodeSetSize, scope):
    return _mask([_gpu(handle).numa_node], nodeSetSize)


def nvmlDeviceGetNumaNodeId(handle):
    _gpu(handle)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # only coherent (C2C) GPUs have their own node


def nvmlDeviceGetTopologyCommonAncestor(device1, device2):
    a, b = _gpu(device1), _gpu(device2)
    if a is b:
        return NVML_TOPOLOGY_INTERNAL
    return _LEVEL[_node().pcie_link_type(a.index, b.index)]


def nvmlDeviceGetP2PStatus(device1, device2, p2pIndex):
    if not isinstance(p2pIndex, int):
        # What ctypes does with a tuple where the C function takes an enum.
        raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
    a, b = _gpu(device1), _gpu(device2)
    if p2pIndex not in _P2P_MODE:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if a is b:
        return NVML_P2P_STATUS_NOT_SUPPORTED
    return _P2P_CODE[_node().p2p_status(a.index, b.index, _P2P_MODE[p2pIndex])]


def _nvlink(handle, link):
    gpu = _gpu(handle)
    if not gpu.nvlinks:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not isinstance(link, int) or not 0 <= link < gpu.nvlinks:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu


def nvmlDeviceGetNvLinkState(device, link):
    gpu = _nvlink(device, link)
    return NVML_FEATURE_ENABLED if _node().nvlink_active(gpu.index, link) else NVML_FEATURE_DISABLED


def nvmlDeviceGetNvLinkErrorCounter(device, link, counter):
    _nvlink(device, link)
    if counter not in (
        NVML_NVLINK_ERROR_DL_REPLAY,
        NVML_NVLINK_ERROR_DL_RECOVERY,
        NVML_NVLINK_ERROR_DL_CRC_FLIT,
        NVML_NVLINK_ERROR_DL_CRC_DATA,
        NVML_NVLINK_ERROR_DL_ECC_DATA,
    ):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 0


# -- health -------------------------------------------------------------------------------------
def _health(handle):
    gpu = _gpu(handle)
    return _node().gpu_health(gpu.index)


def nvmlDeviceGetPersistenceMode(handle):
    _gpu(handle)
    return NVML_FEATURE_ENABLED


def nvmlDeviceGetEccMode(handle):
    _gpu(handle)
    return [NVML_FEATURE_ENABLED, NVML_FEATURE_ENABLED]


def _ecc_counts(handle, errorType, counterType):
    """``(counts, kind)``: the GPU's ECC counts of ``counterType`` and the key suffix of
    ``errorType`` (correctable or uncorrectable)."""
    if counterType == NVML_VOLATILE_ECC:
        counts = _health(handle)["ecc"]["volatile"]
    elif counterType == NVML_AGGREGATE_ECC:
        counts = _health(handle)["ecc"]["aggregate"]
    else:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    kind = {NVML_MEMORY_ERROR_TYPE_CORRECTED: "correctable", NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrectable"}.get(
        errorType
    )
    if kind is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return counts, kind


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    counts, kind = _ecc_counts(handle, errorType, counterType)
    return counts["sram_" + kind] + counts["dram_" + kind]


def nvmlDeviceGetMemoryErrorCounter(handle, errorType, counterType, locationType):
    counts, kind = _ecc_counts(handle, errorType, counterType)
    if locationType == NVML_MEMORY_LOCATION_DRAM:
        return counts["dram_" + kind]
    if locationType == NVML_MEMORY_LOCATION_SRAM:
        return counts["sram_" + kind]
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # Hopper/Ada count by DRAM and SRAM only


def nvmlDeviceGetRemappedRows(device):
    rows = _health(device)["remapped_rows"]
    return (rows["correctable"], rows["uncorrectable"], int(rows["pending"]), int(rows["failure"]))


def nvmlDeviceGetRetiredPages(device, sourceFilter):
    _gpu(device)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # GPUs that remap rows do not retire pages


def nvmlDeviceGetRetiredPagesPendingStatus(device):
    _gpu(device)
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return _smi.clocks_event_mask(_node(), _gpu(handle))


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetPcieReplayCounter(handle):
    _gpu(handle)
    return 0


class c_nvmlGpuFabricInfo_t:
    """The fields of nvidia-ml-py's ctypes structure (clusterUuid, status, cliqueId, state)."""

    def __init__(self):
        self.clusterUuid = [0] * NVML_GPU_FABRIC_UUID_LEN
        self.status = NVML_SUCCESS
        self.cliqueId = 0
        self.state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


def nvmlDeviceGetGpuFabricInfo(device, gpuFabricInfo):
    """Fills gpuFabricInfo: NOT_SUPPORTED without NVSwitches, COMPLETED while the fabric manager
    runs, IN_PROGRESS while it does not (as `nvidia-smi -q` shows under "Fabric")."""
    _gpu(device)
    active = _node().fabric_manager_active()
    gpuFabricInfo.status = NVML_SUCCESS
    if active is None:
        gpuFabricInfo.state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    elif active:
        gpuFabricInfo.state = NVML_GPU_FABRIC_STATE_COMPLETED
        gpuFabricInfo.clusterUuid = list(range(1, NVML_GPU_FABRIC_UUID_LEN + 1))
    else:
        gpuFabricInfo.state = NVML_GPU_FABRIC_STATE_IN_PROGRESS
    return NVML_SUCCESS


def nvmlDeviceGetNvLinkVersion(device, link):
    _nvlink(device, link)
    return 4


def nvmlDeviceGetNvLinkRemoteDeviceType(handle, link):
    _nvlink(handle, link)
    # The lab's NVLink GPUs are SXM parts: every link goes to an NVSwitch.
    return NVML_NVLINK_DEVICE_TYPE_SWITCH


def nvmlDeviceGetNvLinkRemotePciInfo(device, link):
    _nvlink(device, link)
    # NVSwitches of an HGX baseboard sit outside the host's PCI tree as seen by the GPUs.
    return nvmlPciInfo_t("0000:00:00.0", 0x22A3)
