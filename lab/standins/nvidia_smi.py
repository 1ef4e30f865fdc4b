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
--format=csv[,noheader][,nounits]` with `-i`, `-L`, `nvlink -s` (`--status`), and a summary
table with no arguments.  Faults, from the profile's `fault` dict (key `gpu`) or the environment
variable GPUFLEET_LAB_GPU_FAULT (which wins): `driver-not-loaded`, `no-devices`, `lost:<n>` (GPU
n of the model fell off the bus), `library-mismatch`.
"""
from __future__ import annotations

import os
import sys

from lab.hwmodel import Node

FAULT_ENV = "GPUFLEET_LAB_GPU_FAULT"
ANSI_ENV = "GPUFLEET_LAB_NVSMI_ANSI"
DEFAULT_DRIVER = "570.133.20"
DEFAULT_CUDA = "12.8"
NVLINK_GBPS = "26.562"

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

DRIVER_NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                     "Make sure that the latest NVIDIA driver is installed and running.\n\n")
LIBRARY_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.133\n"
NO_DEVICES = "No devices were found\n"
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

COMPUTE_CAP = {"NVIDIA L40S": "8.9", "NVIDIA H100 80GB HBM3": "9.0", "NVIDIA A100 80GB PCIe": "8.0"}


class Exit(Exception):
    def __init__(self, code, out="", err=""):
        super().__init__(code)
        self.code, self.out, self.err = code, out, err


# -- the machine as the driver sees it --------------------------------------------------------
def gpu_fault(node):
    """The GPU fault in force: (kind, model GPU index or None), or (None, None)."""
    text = os.environ.get(FAULT_ENV) or (node.fault or {}).get("gpu") or ""
    if not text:
        return None, None
    kind, _, arg = str(text).partition(":")
    return kind, (int(arg) if arg else None)


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
    values = {
        "index": (str(index), None),
        "name": (gpu.name, None), "gpu_name": (gpu.name, None),
        "uuid": (gpu.uuid, None), "gpu_uuid": (gpu.uuid, None),
        "serial": (gpu.serial, None), "gpu_serial": (gpu.serial, None),
        "pci.bus_id": (nvml_bus_id(gpu.bdf), None), "gpu_bus_id": (nvml_bus_id(gpu.bdf), None),
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
        "compute_cap": (COMPUTE_CAP.get(gpu.name, "8.0"), None),
        "utilization.gpu": ("0", "%"), "utilization.memory": ("0", "%"),
        "temperature.gpu": ("31", None),
        "power.draw": ("61.42", "W"),
        "pstate": ("P8", None),
        "persistence_mode": ("Enabled", None),
        "count": (str(len(visible_gpus(node))), None),
        "display_mode": ("Disabled", None),
        "compute_mode": ("Default", None),
        "mig.mode.current": ("[N/A]", None),
    }
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
                raise Exit(2, 'Field "%s" is not a valid field to query.\n\n' % field)
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
    out = []
    for i, gpu in enumerate(visible_gpus(node)):
        if ids is not None and str(i) not in ids:
            continue
        out.append("GPU %d: %s (UUID: %s)" % (i, gpu.name, gpu.uuid))
        out.extend("\t Link %d: %s GB/s" % (link, NVLINK_GBPS) for link in range(gpu.nvlinks))
    return "\n".join(out) + "\n"


def summary(node):
    gpus = visible_gpus(node)
    bar = "+-----------------------------------------------------------------------------------------+"
    lines = [bar,
             "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|"
             % (driver_version(node), driver_version(node), DEFAULT_CUDA),
             "|-----------------------------------------+------------------------+----------------------+",
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|=========================================+========================+======================|"]
    for i, gpu in enumerate(gpus):
        name = gpu.name if len(gpu.name) <= 27 else gpu.name[:24] + "..."
        lines.append("| %3d  %-27s %6s |   %s Off |                    0 |"
                     % (i, name, "On", nvml_bus_id(gpu.bdf)))
        lines.append("| N/A   31C    P8             61W /  350W |       0MiB / %6dMiB |      0%%      Default |"
                     % gpu.memory_total_mib)
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
        fields = fmt = ids = None
        i = 0
        while i < len(args):
            arg = args[i]
            if arg.startswith("--query-gpu"):
                value, i = _option_value(args, i, "--query-gpu")
                fields = [f.strip() for f in value.split(",") if f.strip()]
            elif arg.startswith("--format"):
                value, i = _option_value(args, i, "--format")
                fmt = set(v.strip() for v in value.split(","))
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
    except RuntimeError as exc:   # no lab machine: like a host without the driver
        return 9, DRIVER_NOT_LOADED, "lab: %s\n" % exc


def main(argv=None):
    code, out, err = run(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    sys.exit(main())
