# SPDX-License-Identifier: GPL-3.0-or-later
"""`nvidia-smi` for a lab machine: the real output formats, answered from the hardware model.

The machine is the one `lab.hwmodel.build()` laid out under $GPUFLEET_LAB_ROOT.  What it prints
follows the model and the CURRENT registers of the machine's sysfs tree: `topo -p2p r` shows CNS
between two GPUs while a bridge between them redirects peer traffic (ACS), OK once a role cleared
it with setpci; `--query-gpu=pcie.link.width.current` is the width in the GPU's Link Status
register.

Like the real tool, only GPUs bound to the `nvidia` driver exist for it (a GPU handed to vfio-pci
is invisible and the others are numbered without it), indexed in PCI bus order.

Supported: `topo -m` (alias `--matrix`), `topo -p2p r|w|n|a|p`, `--query-gpu=FIELDS
--format=csv[,noheader][,nounits]` with `-i`, `-L`, `nvlink -s` (`--status`), `-q` (`--query`,
with `-i`: the full text report, laid out as driver 535+ lays it out), and a summary table with
no arguments.  The GPU health state of the machine (lab/hwmodel/health.py: ECC counts, remapped
rows, clocks event reasons, NVLink links down, a link trained down, the fabric manager) shows in
`-q`, `nvlink -s`, the summary's ECC column and the matching `--query-gpu` fields, and so do its
driver faults: `driver-not-loaded`, `no-devices`, `library-mismatch`, and `gpu-lost` (a GPU of
the model fell off the bus).
"""

from __future__ import annotations

import os
import sys
import time

from lab.hwmodel import Node
from lab.hwmodel.profiles import DRIVER_VERSION

ANSI_ENV = "GPUFLEET_LAB_NVSMI_ANSI"
DEFAULT_DRIVER = DRIVER_VERSION
DEFAULT_CUDA = "12.8"

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

P2P_LEGEND = """Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  DR   = Disabled by regkey
  U    = Unknown
"""

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
LIBRARY_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.133\n"
NO_DEVICES = "No devices were found\n"
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


class Exit(Exception):
    def __init__(self, code, out="", err=""):
        super().__init__(code)
        self.code, self.out, self.err = code, out, err


# -- the machine as the driver sees it --------------------------------------------------------
def gpu_fault(node):
    """The driver fault in force (the machine's health state): (kind, model GPU index or None), or
    (None, None); kind is one of health.DRIVER_FAULTS, or `lost` for the first GPU off the bus."""
    state = node.health
    if node.driver_fault(state):
        return node.driver_fault(state), None
    lost = [g.index for g in node.gpus if node.gpu_lost(g.index, state)]
    return ("lost", lost[0]) if lost else (None, None)


def visible_gpus(node):
    """GPUs bound to the nvidia driver, in PCI bus order: index i here is nvidia-smi's index i."""
    return sorted((g for g in node.gpus if g.driver == "nvidia"), key=lambda g: g.bdf)


def driver_version(node):
    return node.profile.get("driver_version", DEFAULT_DRIVER)


def nvml_bus_id(bdf):
    """sysfs `0000:43:00.0` -> NVML/nvidia-smi `00000000:43:00.0` (hex digits upper case)."""
    domain, rest = bdf.split(":", 1)
    return ("%08X:%s" % (int(domain, 16), rest)).upper()


def link_between(node, a, b):
    if a.kind == "gpu" and b.kind == "gpu":
        return node.link_type(a.index, b.index)
    return node.pcie_class(a.bdf, b.bdf)


def nic_name(nic):
    return "mlx5_%d" % nic.index


def check_driver(node, for_help=False):
    """Raise Exit the way the real tool fails before answering anything."""
    if for_help:
        return
    kind, arg = gpu_fault(node)
    if kind == "driver-not-loaded":
        raise Exit(9, DRIVER_NOT_LOADED)
    if kind == "library-mismatch":
        raise Exit(18, LIBRARY_MISMATCH)
    if kind == "no-devices" or not visible_gpus(node):
        raise Exit(6, NO_DEVICES)
    if kind == "lost":
        gpu = node.gpus[arg]
        # Newer drivers print the bus id with a 4-digit domain and no space after "GPU".
        raise Exit(15, "Unable to determine the device handle for GPU%s: Unknown Error\n" % gpu.bdf.upper())


# -- topo ---------------------------------------------------------------------------------------
def _ansi(text):
    if os.environ.get(ANSI_ENV, "1") == "0":
        return text
    return "\x1b[4m" + text + "\x1b[0m"


def topo_matrix(node):
    gpus = visible_gpus(node)
    nics = node.nics
    columns = [("GPU%d" % i, g) for i, g in enumerate(gpus)] + [("NIC%d" % i, n) for i, n in enumerate(nics)]
    labels = [name for name, _dev in columns] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    lines = ["\t" + _ansi("\t".join(labels))]
    for name, dev in columns:
        cells = [" X " if other is dev else link_between(node, dev, other) for _n, other in columns]
        if dev.kind == "gpu":
            cells += [dev.cpu_affinity, str(dev.numa_node), "", "N/A"]
        lines.append("\t".join([name] + cells))
    out = "\n".join(lines) + "\n\n" + LEGEND
    if nics:
        out += "\nNIC Legend:\n\n" + "".join("  NIC%d: %s\n" % (i, nic_name(n)) for i, n in enumerate(nics))
    return out + "\n"


P2P_MODES = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "pcie"}


def topo_p2p(node, letter):
    if letter not in P2P_MODES:
        raise Exit(2, INVALID_ARGS)
    gpus = visible_gpus(node)
    lines = [" \t" + "".join("GPU%d\t" % i for i in range(len(gpus)))]
    for i, a in enumerate(gpus):
        cells = ["X" if a is b else node.p2p_status(a.index, b.index, P2P_MODES[letter]) for b in gpus]
        lines.append(" GPU%d\t" % i + "".join(c + "\t" for c in cells))
    return "\n".join(lines) + "\n\n" + P2P_LEGEND + "\n"


def topo(node, args):
    if not args:
        raise Exit(2, INVALID_ARGS)
    if args[0] in ("-m", "--matrix"):
        return topo_matrix(node)
    if args[0] in ("-mp", "--matrix_pci"):
        return topo_matrix(node)
    if args[0] in ("-p2p", "--p2pstatus"):
        if len(args) < 2:
            raise Exit(2, 'Option "-p2p" is missing its value.\n')
        return topo_p2p(node, args[1])
    raise Exit(2, INVALID_ARGS)


# -- --query-gpu --------------------------------------------------------------------------------
def _query_value(node, index, gpu, field):
    """(value, unit) for one --query-gpu field."""
    mem_total = gpu.memory_total_mib
    used = 0
    state = node.health
    health = node.gpu_health(gpu.index, state)
    rows = health["remapped_rows"]
    fabric = fabric_state(node, state)
    values = {
        "index": (str(index), None),
        "name": (gpu.name, None),
        "gpu_name": (gpu.name, None),
        "uuid": (gpu.uuid, None),
        "gpu_uuid": (gpu.uuid, None),
        "serial": (gpu.serial, None),
        "gpu_serial": (gpu.serial, None),
        "pci.bus_id": (nvml_bus_id(gpu.bdf), None),
        "gpu_bus_id": (nvml_bus_id(gpu.bdf), None),
        "pci.domain": ("0x%04X" % int(gpu.bdf[:4], 16), None),
        "pci.bus": ("0x%s" % gpu.bdf[5:7].upper(), None),
        "pci.device": ("0x%s" % gpu.bdf[8:10].upper(), None),
        "pci.device_id": ("0x%04X10DE" % gpu.rec["device_id"], None),
        "driver_version": (driver_version(node), None),
        "memory.total": (str(mem_total), "MiB"),
        "memory.used": (str(used), "MiB"),
        "memory.free": (str(mem_total - used), "MiB"),
        "memory.reserved": ("0", "MiB"),
        "pcie.link.gen.current": (str(gpu.gen_current), None),
        "pcie.link.gen.gpucurrent": (str(gpu.gen_current), None),
        "pcie.link.gen.max": (str(gpu.gen_max), None),
        "pcie.link.gen.gpumax": (str(gpu.gen_max), None),
        "pcie.link.gen.hostmax": (str(gpu.gen_max), None),
        "pcie.link.width.current": (str(gpu.width_current), None),
        "pcie.link.width.max": (str(gpu.width_max), None),
        "compute_cap": (gpu.compute_capability, None),
        "utilization.gpu": ("0", "%"),
        "utilization.memory": ("0", "%"),
        "temperature.gpu": ("31", None),
        "power.draw": ("61.42", "W"),
        "pstate": ("P8", None),
        "persistence_mode": ("Enabled", None),
        "count": (str(len(visible_gpus(node))), None),
        "display_mode": ("Disabled", None),
        "compute_mode": ("Default", None),
        "mig.mode.current": ("[N/A]", None),
        "ecc.mode.current": ("Enabled", None),
        "ecc.errors.uncorrected.volatile.total": (str(volatile_uncorrectable(node, gpu, state)), None),
        "ecc.errors.uncorrected.aggregate.total": (str(_ecc_total(health["ecc"]["aggregate"], "uncorrectable")), None),
        "ecc.errors.corrected.volatile.total": (str(_ecc_total(health["ecc"]["volatile"], "correctable")), None),
        "ecc.errors.corrected.aggregate.total": (str(_ecc_total(health["ecc"]["aggregate"], "correctable")), None),
        "remapped_rows.correctable": (str(rows["correctable"]), None),
        "remapped_rows.uncorrectable": (str(rows["uncorrectable"]), None),
        "remapped_rows.pending": ("Yes" if rows["pending"] else "No", None),
        "remapped_rows.failure": ("Yes" if rows["failure"] else "No", None),
        "clocks_event_reasons.active": ("0x%016X" % clocks_event_mask(node, gpu, state), None),
        "fabric.state": (fabric[0], None),
        "fabric.status": (fabric[1], None),
    }
    for key, bit, _label in CLOCK_REASONS:
        active = "Active" if clocks_event_mask(node, gpu, state) & bit else "Not Active"
        values["clocks_event_reasons.%s" % key] = (active, None)
        values["clocks_throttle_reasons.%s" % key] = (active, None)
    if field not in values:
        raise KeyError(field)
    return values[field]


def query_gpu(node, fields, fmt, ids):
    if "csv" not in fmt:
        raise Exit(2, INVALID_ARGS)
    gpus = list(enumerate(visible_gpus(node)))
    if ids is not None:
        gpus = [(i, g) for i, g in gpus if str(i) in ids or g.uuid in ids or nvml_bus_id(g.bdf) in ids]
        if not gpus:
            raise Exit(6, "No devices were found\n")
    rows = []
    units = {}
    for index, gpu in gpus:
        row = []
        for field in fields:
            try:
                value, unit = _query_value(node, index, gpu, field)
            except KeyError:
                raise Exit(2, 'Field "%s" is not a valid field to query.\n\n' % field) from None
            units[field] = unit
            if unit and "nounits" not in fmt and not value.startswith("["):
                value = "%s %s" % (value, unit)
            row.append(value)
        rows.append(", ".join(row))
    out = []
    if "noheader" not in fmt:
        out.append(", ".join("%s [%s]" % (f, units[f]) if units.get(f) else f for f in fields))
    return "\n".join(out + rows) + "\n"


# -- others -------------------------------------------------------------------------------------
def list_gpus(node):
    return "".join("GPU %d: %s (UUID: %s)\n" % (i, g.name, g.uuid) for i, g in enumerate(visible_gpus(node)))


def nvlink_status(node, ids):
    state = node.health
    out = []
    for i, gpu in enumerate(visible_gpus(node)):
        if ids is not None and str(i) not in ids:
            continue
        out.append("GPU %d: %s (UUID: %s)" % (i, gpu.name, gpu.uuid))
        down = node.gpu_health(gpu.index, state)["nvlinks_down"]
        out.extend(
            "\t Link %d: %s" % (link, "<inactive>" if link in down else "%.3f GB/s" % gpu.nvlink_gbps)
            for link in range(gpu.nvlinks)
        )
    return "\n".join(out) + "\n"


# -- health (from the machine's health state) ---------------------------------------------------
#: NVML clocks event reason bits (nvmlClocksEventReason*), with nvidia-smi's query keys and -q labels.
CLOCK_REASONS = (
    ("gpu_idle", 0x1, "Idle"),
    ("applications_clocks_setting", 0x2, "Applications Clocks Setting"),
    ("sw_power_cap", 0x4, "SW Power Cap"),
    ("hw_slowdown", 0x8, "HW Slowdown"),
    ("sync_boost", 0x10, "Sync Boost"),
    ("sw_thermal_slowdown", 0x20, "SW Thermal Slowdown"),
    ("hw_thermal_slowdown", 0x40, "HW Thermal Slowdown"),
    ("hw_power_brake_slowdown", 0x80, "HW Power Brake Slowdown"),
    ("display_clock_setting", 0x100, "Display Clock Setting"),
)

ARCHITECTURE = {"NVIDIA L40S": "Ada Lovelace", "NVIDIA H100 80GB HBM3": "Hopper", "NVIDIA A100 80GB PCIe": "Ampere"}
VBIOS = {
    "NVIDIA L40S": "95.02.66.00.02",
    "NVIDIA H100 80GB HBM3": "96.00.74.00.01",
    "NVIDIA A100 80GB PCIe": "92.00.45.00.05",
}
POWER_LIMIT = {"NVIDIA L40S": 350, "NVIDIA H100 80GB HBM3": 700, "NVIDIA A100 80GB PCIe": 300}
RESERVED_MIB = {"NVIDIA L40S": 593, "NVIDIA H100 80GB HBM3": 551, "NVIDIA A100 80GB PCIe": 539}


def _ecc_total(counts, kind):
    return counts["sram_" + kind] + counts["dram_" + kind]


def volatile_uncorrectable(node, gpu, state=None):
    return _ecc_total(node.gpu_health(gpu.index, state)["ecc"]["volatile"], "uncorrectable")


def clocks_event_mask(node, gpu, state=None):
    """nvmlDeviceGetCurrentClocksEventReasons: the lab's GPUs idle, plus what the state adds."""
    mask = 0x1
    if node.gpu_health(gpu.index, state)["hw_slowdown"]:
        mask |= 0x8
    return mask


def fabric_state(node, state=None):
    """(State, Status) as `nvidia-smi -q` prints them under "Fabric": N/A without NVSwitches;
    Completed/Success while the fabric manager runs; In Progress/N/A while it does not (the GPUs
    wait to be registered with the fabric)."""
    active = node.fabric_manager_active(state)
    if active is None:
        return "N/A", "N/A"
    return ("Completed", "Success") if active else ("In Progress", "N/A")


def _kv(depth, label, value=None):
    text = "    " * depth + label
    if value is None:
        return text
    return "%-42s: %s" % (text, value)


def _gpu_report(node, index, gpu, state):
    h = node.gpu_health(gpu.index, state)
    vol, agg, rows = h["ecc"]["volatile"], h["ecc"]["aggregate"], h["remapped_rows"]
    mask = clocks_event_mask(node, gpu, state)
    reserved = RESERVED_MIB.get(gpu.name, 512)
    power = POWER_LIMIT.get(gpu.name, 300)
    fab_state, fab_status = fabric_state(node, state)
    bus, dev = gpu.bdf[5:7].upper(), gpu.bdf[8:10].upper()
    L = [
        "GPU %s" % nvml_bus_id(gpu.bdf),
        _kv(1, "Product Name", gpu.name),
        _kv(1, "Product Brand", "NVIDIA"),
        _kv(1, "Product Architecture", ARCHITECTURE.get(gpu.name, "Ampere")),
        _kv(1, "Display Mode", "Disabled"),
        _kv(1, "Display Active", "Disabled"),
        _kv(1, "Persistence Mode", "Enabled"),
        _kv(1, "Addressing Mode", "None"),
        _kv(1, "MIG Mode"),
        _kv(2, "Current", "Disabled"),
        _kv(2, "Pending", "Disabled"),
        _kv(1, "Accounting Mode", "Disabled"),
        _kv(1, "Accounting Mode Buffer Size", "4000"),
        _kv(1, "Driver Model"),
        _kv(2, "Current", "N/A"),
        _kv(2, "Pending", "N/A"),
        _kv(1, "Serial Number", gpu.serial),
        _kv(1, "GPU UUID", gpu.uuid),
        _kv(1, "Minor Number", str(index)),
        _kv(1, "VBIOS Version", VBIOS.get(gpu.name, "92.00.00.00.01")),
        _kv(1, "MultiGPU Board", "No"),
        _kv(1, "Board ID", "0x%s00" % bus.lower()),
        _kv(1, "GPU Operation Mode"),
        _kv(2, "Current", "N/A"),
        _kv(2, "Pending", "N/A"),
        _kv(1, "GSP Firmware Version", driver_version(node)),
        _kv(1, "GPU Virtualization Mode"),
        _kv(2, "Virtualization Mode", "None"),
        _kv(2, "Host VGPU Mode", "N/A"),
        _kv(1, "GPU Reset Status"),
        _kv(2, "Reset Required", "Yes" if rows["pending"] else "No"),
        _kv(2, "Drain and Reset Recommended", "No"),
        _kv(1, "IBMNPU"),
        _kv(2, "Relaxed Ordering Mode", "N/A"),
        _kv(1, "PCI"),
        _kv(2, "Bus", "0x%s" % bus),
        _kv(2, "Device", "0x%s" % dev),
        _kv(2, "Domain", "0x%04X" % int(gpu.bdf[:4], 16)),
        _kv(2, "Device Id", "0x%04X10DE" % gpu.rec["device_id"]),
        _kv(2, "Bus Id", nvml_bus_id(gpu.bdf)),
        _kv(2, "Sub System Id", "0x%04X10DE" % gpu.rec.get("subsystem_id", 0)),
        _kv(2, "GPU Link Info"),
        _kv(3, "PCIe Generation"),
        _kv(4, "Max", str(gpu.gen_max)),
        _kv(4, "Current", str(gpu.gen_current)),
        _kv(4, "Device Current", str(gpu.gen_current)),
        _kv(4, "Device Max", str(gpu.gen_max)),
        _kv(4, "Host Max", str(gpu.gen_max)),
        _kv(3, "Link Width"),
        _kv(4, "Max", "%dx" % gpu.width_max),
        _kv(4, "Current", "%dx" % gpu.width_current),
        _kv(2, "Bridge Chip"),
        _kv(3, "Type", "N/A"),
        _kv(3, "Firmware", "N/A"),
        _kv(2, "Replays Since Reset", "0"),
        _kv(2, "Replay Number Rollovers", "0"),
        _kv(2, "Tx Throughput", "0 KB/s"),
        _kv(2, "Rx Throughput", "0 KB/s"),
        _kv(2, "Atomic Caps Inbound", "N/A"),
        _kv(2, "Atomic Caps Outbound", "N/A"),
        _kv(1, "Fan Speed", "N/A"),
        _kv(1, "Performance State", "P0" if gpu.nvlinks else "P8"),
        _kv(1, "Clocks Event Reasons"),
    ]
    for key, bit, label in CLOCK_REASONS:
        depth = 3 if key in ("hw_thermal_slowdown", "hw_power_brake_slowdown") else 2
        L.append(_kv(depth, label, "Active" if mask & bit else "Not Active"))
    # nvidia-smi prints the HW Slowdown sub-reasons right under it, then the rest.
    order = [
        "Idle",
        "Applications Clocks Setting",
        "SW Power Cap",
        "HW Slowdown",
        "HW Thermal Slowdown",
        "HW Power Brake Slowdown",
        "Sync Boost",
        "SW Thermal Slowdown",
        "Display Clock Setting",
    ]
    reasons = L[-len(CLOCK_REASONS) :]
    reasons.sort(key=lambda line: order.index(line.split(":")[0].strip()))
    L[-len(CLOCK_REASONS) :] = reasons
    L += [
        _kv(1, "Sparse Operation Mode", "Disabled"),
        _kv(1, "FB Memory Usage"),
        _kv(2, "Total", "%d MiB" % gpu.memory_total_mib),
        _kv(2, "Reserved", "%d MiB" % reserved),
        _kv(2, "Used", "0 MiB"),
        _kv(2, "Free", "%d MiB" % (gpu.memory_total_mib - reserved)),
        _kv(1, "BAR1 Memory Usage"),
        _kv(2, "Total", "131072 MiB"),
        _kv(2, "Used", "1 MiB"),
        _kv(2, "Free", "131071 MiB"),
        _kv(1, "Compute Mode", "Default"),
        _kv(1, "Utilization"),
        _kv(2, "Gpu", "0 %"),
        _kv(2, "Memory", "0 %"),
        _kv(2, "Encoder", "0 %"),
        _kv(2, "Decoder", "0 %"),
        _kv(1, "ECC Mode"),
        _kv(2, "Current", "Enabled"),
        _kv(2, "Pending", "Enabled"),
        _kv(1, "ECC Errors"),
    ]
    for scope, counts in (("Volatile", vol), ("Aggregate", agg)):
        L += [
            _kv(2, scope),
            _kv(3, "SRAM Correctable", str(counts["sram_correctable"])),
            _kv(3, "SRAM Uncorrectable Parity", "0"),
            _kv(3, "SRAM Uncorrectable SEC-DED", str(counts["sram_uncorrectable"])),
            _kv(3, "DRAM Correctable", str(counts["dram_correctable"])),
            _kv(3, "DRAM Uncorrectable", str(counts["dram_uncorrectable"])),
        ]
    L += [
        _kv(3, "SRAM Threshold Exceeded", "No"),
        _kv(1, "Retired Pages"),
        _kv(2, "Single Bit ECC", "N/A"),
        _kv(2, "Double Bit ECC", "N/A"),
        _kv(2, "Pending Page Blacklist", "N/A"),
        _kv(1, "Remapped Rows"),
        _kv(2, "Correctable Error", str(rows["correctable"])),
        _kv(2, "Uncorrectable Error", str(rows["uncorrectable"])),
        _kv(2, "Pending", "Yes" if rows["pending"] else "No"),
        _kv(2, "Remapping Failure Occurred", "Yes" if rows["failure"] else "No"),
        _kv(2, "Bank Remap Availability Histogram"),
        _kv(3, "Max", "%d bank(s)" % (2560 - rows["correctable"] - rows["uncorrectable"])),
        _kv(3, "High", "0 bank(s)"),
        _kv(3, "Partial", "0 bank(s)"),
        _kv(3, "Low", "0 bank(s)"),
        _kv(3, "None", "0 bank(s)"),
        _kv(1, "Temperature"),
        _kv(2, "GPU Current Temp", "31 C"),
        _kv(2, "GPU T.Limit Temp", "55 C"),
        _kv(2, "GPU Shutdown T.Limit Temp", "-8 C"),
        _kv(2, "GPU Slowdown T.Limit Temp", "-2 C"),
        _kv(2, "GPU Max Operating T.Limit Temp", "0 C"),
        _kv(2, "GPU Target Temperature", "N/A"),
        _kv(2, "Memory Current Temp", "N/A"),
        _kv(2, "Memory Max Operating T.Limit Temp", "N/A"),
        _kv(1, "GPU Power Readings"),
        _kv(2, "Power Draw", "61.42 W"),
        _kv(2, "Current Power Limit", "%.2f W" % power),
        _kv(2, "Requested Power Limit", "%.2f W" % power),
        _kv(2, "Default Power Limit", "%.2f W" % power),
        _kv(2, "Min Power Limit", "%.2f W" % (power * 0.3)),
        _kv(2, "Max Power Limit", "%.2f W" % power),
        _kv(1, "Clocks"),
        _kv(2, "Graphics", "345 MHz"),
        _kv(2, "SM", "345 MHz"),
        _kv(2, "Memory", "2619 MHz"),
        _kv(2, "Video", "765 MHz"),
        _kv(1, "Clock Policy"),
        _kv(2, "Auto Boost", "N/A"),
        _kv(2, "Auto Boost Default", "N/A"),
        _kv(1, "Fabric"),
        _kv(2, "State", fab_state),
        _kv(2, "Status", fab_status),
        _kv(1, "Processes", "None"),
    ]
    return L


def query_report(node, ids=None):
    """`nvidia-smi -q [-i ID]`: the full text report of every (or the chosen) GPU."""
    gpus = list(enumerate(visible_gpus(node)))
    if ids is not None:
        gpus = [(i, g) for i, g in gpus if str(i) in ids or g.uuid in ids or nvml_bus_id(g.bdf) in ids]
        if not gpus:
            raise Exit(6, NO_DEVICES)
    state = node.health
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        "%-42s: %s" % ("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        "%-42s: %s" % ("Driver Version", driver_version(node)),
        "%-42s: %s" % ("CUDA Version", DEFAULT_CUDA),
        "",
        "%-42s: %d" % ("Attached GPUs", len(visible_gpus(node))),
    ]
    for index, gpu in gpus:
        lines += _gpu_report(node, index, gpu, state)
        lines.append("")
    return "\n".join(lines) + "\n"


def summary(node):
    gpus = visible_gpus(node)
    bar = "+-----------------------------------------------------------------------------------------+"
    lines = [
        bar,
        "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|"
        % (driver_version(node), driver_version(node), DEFAULT_CUDA),
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|=========================================+========================+======================|",
    ]
    state = node.health
    for i, gpu in enumerate(gpus):
        name = gpu.name if len(gpu.name) <= 27 else gpu.name[:24] + "..."
        lines.append(
            "| %3d  %-27s %6s |   %s Off | %20d |"
            % (i, name, "On", nvml_bus_id(gpu.bdf), volatile_uncorrectable(node, gpu, state))
        )
        lines.append(
            "| N/A   31C    P8             61W /  350W |       0MiB / %6dMiB |      0%%      Default |"
            % gpu.memory_total_mib
        )
        lines.append("+-----------------------------------------+------------------------+----------------------+")
    return "\n".join(lines) + "\n"


def _option_value(args, i, name):
    """`--name=value` or `--name value` / `-x value` at args[i]: (value, next index)."""
    arg = args[i]
    if "=" in arg and arg.startswith("--"):
        return arg.split("=", 1)[1], i + 1
    if i + 1 >= len(args):
        raise Exit(2, 'Option "%s" is missing its value.\n' % name)
    return args[i + 1], i + 2


def run(argv, node=None):
    """Answer one command line; returns (exit code, stdout, stderr)."""
    try:
        if node is None:
            node = Node.load()
        args = list(argv)
        if args and args[0] in ("-h", "--help"):
            return 0, "NVIDIA System Management Interface -- lab stand-in (gpufleet.node)\n", ""
        check_driver(node)
        if not args:
            return 0, summary(node), ""
        if args[0] == "topo":
            return 0, topo(node, args[1:]), ""
        if args[0] == "nvlink":
            ids = None
            rest = args[1:]
            if "-i" in rest:
                ids = set(rest[rest.index("-i") + 1].split(","))
            if any(a in ("-s", "--status") for a in rest):
                return 0, nvlink_status(node, ids), ""
            raise Exit(2, INVALID_ARGS)
        if args[0] in ("-L", "--list-gpus"):
            return 0, list_gpus(node), ""
        if args[0] in ("-q", "--query"):
            ids = None
            rest = args[1:]
            for flag in ("-i", "--id"):
                if flag in rest and rest.index(flag) + 1 < len(rest):
                    ids = set(rest[rest.index(flag) + 1].split(","))
            return 0, query_report(node, ids), ""
        fields = fmt = ids = None
        i = 0
        while i < len(args):
            arg = args[i]
            if arg.startswith("--query-gpu"):
                value, i = _option_value(args, i, "--query-gpu")
                fields = [f.strip() for f in value.split(",") if f.strip()]
            elif arg.startswith("--format"):
                value, i = _option_value(args, i, "--format")
                fmt = {v.strip() for v in value.split(",")}
            elif arg in ("-i", "--id") or arg.startswith("--id="):
                value, i = _option_value(args, i, "-i")
                ids = set(value.split(","))
            else:
                raise Exit(2, INVALID_ARGS)
        if fields is None or fmt is None:
            raise Exit(2, INVALID_ARGS)
        return 0, query_gpu(node, fields, fmt, ids), ""
    except Exit as exc:
        return exc.code, exc.out, exc.err
    except RuntimeError as exc:  # no lab machine: like a host without the driver
        return 9, DRIVER_NOT_LOADED, "lab: %s\n" % exc


def main(argv=None):
    code, out, err = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main())
