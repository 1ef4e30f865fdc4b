# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi's text formats: the topology matrix, the P2P matrices, CSV queries, NVLink status,
and the failure texts.

Plain Python (no Ansible imports), runs on target Python 3.8+.

Everything is parsed by structure (header labels, row labels, legends), never by column
position, because the real outputs differ between drivers and between a terminal and a pipe:

* ``nvidia-smi topo -m``: a matrix whose header names the GPU columns (``GPU0``...), then the
  NIC columns (``NIC0``... on newer drivers, the RDMA device name such as ``mlx5_0`` on older
  ones), then ``CPU Affinity``, ``NUMA Affinity`` and, on newer drivers, ``GPU NUMA ID``.  Cells
  are tab-separated (a wide cell is followed by two tabs, so empty fields appear), or
  space-padded when copied from a terminal; the header may be wrapped in ANSI underline codes.
  A ``Legend:`` block follows, and a ``NIC Legend:`` block (``NIC0: mlx5_0``) when NICs exist.
* ``nvidia-smi topo -p2p r|w|n|a|p``: a GPU-by-GPU matrix of ``X OK CNS GNS TNS NS DR U``
  with its own ``Legend:`` (older drivers have no ``DR`` line).
* ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``: CSV; ``pci.bus_id`` has an
  8-digit PCI domain (``00000000:07:00.0``) where sysfs has 4; a value not reported is ``N/A``,
  empty, or a bracketed placeholder (``[N/A]``, ``[Not Supported]``, ``[Requested functionality
  has been deprecated]``); with a header, each column's unit is in its brackets
  (``memory.total [MiB]``). Real outputs: tests/data/nvidia-smi/query-gpu/.
* ``nvidia-smi nvlink -s``: ``GPU 0: <name> (UUID: ...)`` then ``Link N: 26.562 GB/s`` or
  ``Link N: <inactive>`` lines.
"""

from __future__ import annotations

import csv
import re

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path

#: The fields the topology facts need, in the order the module asks for them.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "driver_version",
)

#: ``topo -p2p`` mode letters (a separate argv element) and the facts' names for them.
P2P_MODES = (("read", "r"), ("write", "w"), ("nvlink", "n"))

#: P2P statuses and what they mean (nvidia-smi's legend).
P2P_STATUSES = {
    "X": "self",
    "OK": "status OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}

# The link classes of topo -m, their meaning and order: pcie/_path.py (the path vocabulary).

AFFINITY_LABELS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_HEADER_TOKEN_RE = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID|\S+")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
_NIC_LABEL_RE = re.compile(r"^NIC(\d+)$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
# SOC: older drivers' name for SYS; N/A: no path.
_LINK_RE = re.compile(r"^(X|NV\d+|%s|SOC|N/A)$" % "|".join(_path.PATH_CLASSES))
_NVLINK_GPU_RE = re.compile(r"^GPU\s+(\d+)\s*:")
_NVLINK_LINK_RE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*(.*?)\s*$")
_CPU_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_BUS_ID_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


class NvidiaSmiError(Exception):
    """nvidia-smi said something that means there are no facts to give (driver, lost GPU...)."""

    def __init__(self, cause, message, text=""):
        super().__init__(message)
        self.cause = cause
        self.text = text


class NvidiaSmiParseError(ValueError):
    """Output that does not have the structure of the format it should be."""


# -- failure texts --------------------------------------------------------------------------
#: (cause, pattern, what it means and what to do). Checked in this order, on stdout+stderr.
FAILURES = (
    (
        "driver_not_loaded",
        re.compile(r"NVIDIA-SMI has failed because it couldn.t communicate with the NVIDIA driver"),
        "the NVIDIA kernel driver is not loaded (nvidia-smi cannot talk to it): check "
        "`lsmod | grep nvidia`, `dmesg | grep NVRM`, and that the driver was built for the running "
        "kernel (DKMS) and is not blocked by Secure Boot",
    ),
    (
        "driver_library_mismatch",
        re.compile(r"Failed to initialize NVML: Driver/library version mismatch"),
        "the loaded NVIDIA kernel module and the user-space NVML library are different versions "
        "(typically after a driver upgrade without a reboot): reboot, or reload the nvidia modules",
    ),
    (
        "nvml_library_missing",
        re.compile(r"couldn't find libnvidia-ml\.so|NVML Shared Library Not Found", re.I),
        "libnvidia-ml.so (NVML, part of the driver) is not installed or not on the library path",
    ),
    (
        "gpu_lost",
        re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)\s*:\s*(.*)"),
        "a GPU the driver knows does not answer: it has most likely fallen off the bus (look for "
        '"Xid 79" / "fallen off the bus" in dmesg); the node needs a GPU reset or a reboot, and '
        "the GPU may need reseating or replacing",
    ),
    (
        "gpu_lost",
        re.compile(r"GPU is lost|has fallen off the bus", re.I),
        "a GPU has fallen off the bus (see dmesg for Xid 79); the node needs a GPU reset or reboot",
    ),
)

NO_DEVICES_RE = re.compile(r"^\s*No devices were found\s*$", re.M)


def check_failure(text):
    """Raise NvidiaSmiError when ``text`` carries one of nvidia-smi's failure messages."""
    text = text or ""
    for cause, pattern, meaning in FAILURES:
        match = pattern.search(text)
        if match:
            line = text[text.rfind("\n", 0, match.start()) + 1 :].split("\n", 1)[0].strip()
            where = ""
            if cause == "gpu_lost" and match.groups():
                bus = normalize_bus_id(match.group(1))
                where = " (GPU %s)" % (bus or match.group(1))
            raise NvidiaSmiError(cause, 'nvidia-smi: "%s"%s: %s' % (line, where, meaning), text)


def no_devices(text):
    """True when nvidia-smi reports that the driver sees no GPU at all."""
    return bool(NO_DEVICES_RE.search(text or ""))


# -- small value parsers --------------------------------------------------------------------
def strip_ansi(text):
    return _ANSI_RE.sub("", text or "")


def normalize_bus_id(text):
    """``00000000:07:00.0`` (nvidia-smi/NVML) or ``07:00.0`` -> sysfs form ``0000:07:00.0``."""
    if text is None:
        return None
    match = _BUS_ID_RE.match(text.strip())
    if not match:
        return None
    domain, bus, dev, fn = match.groups()
    return "%04x:%02x:%02x.%s" % (int(domain or "0", 16), int(bus, 16), int(dev, 16), fn)


def parse_cpu_list(text):
    """``0-31,64-95`` or ``0,2,4`` -> sorted list of CPU numbers; None for N/A or empty."""
    if text is None:
        return None
    text = text.strip()
    if not text or text.upper() in ("N/A", "[N/A]"):
        return None
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        match = _CPU_RANGE_RE.match(part)
        if not match:
            raise NvidiaSmiParseError("not a CPU list: %r" % text)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise NvidiaSmiParseError("CPU range runs backwards in %r" % text)
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def _cpu_range(first, last):
    return str(first) if first == last else "%s-%s" % (first, last)


def format_cpu_list(cpus):
    """Sorted CPU numbers -> canonical ranges ``0-31,64-95`` (the kernel's cpulist form)."""
    if cpus is None:
        return None
    cpus = sorted(set(cpus))
    parts = []
    start = prev = None
    for cpu in cpus:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(_cpu_range(start, prev))
            start = prev = cpu
    if start is not None:
        parts.append(_cpu_range(start, prev))
    return ",".join(parts)


def normalize_cpu_list(text):
    return format_cpu_list(parse_cpu_list(text))


def parse_int_or_none(text):
    """``0`` -> 0; ``N/A``, ``[N/A]``, ``[Not Supported]``, ``-1``-free text -> None."""
    if text is None:
        return None
    text = text.strip()
    if text.endswith("x") and text[:-1].isdigit():  # '16x' in -q output
        text = text[:-1]
    try:
        return int(text)
    except ValueError:
        return None


# -- nvidia-smi topo -m ---------------------------------------------------------------------
def _header_tokens(line):
    return _HEADER_TOKEN_RE.findall(line)


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m``.

    Returns ``{'gpus': [{'label', 'index', 'links': {label: class}, 'cpu_affinity',
    'numa_affinity', 'gpu_numa_id'}], 'nics': [{'label', 'device', 'links': {...}}],
    'columns': [...], 'affinity_columns': [...]}``.  ``cpu_affinity`` is canonical
    (``0-31,64-95``) or None for N/A; NUMA values are strings as printed (``0``, ``0-1``, N/A->None).
    """
    lines = strip_ansi(text).splitlines()
    header_at = None
    for number, line in enumerate(lines):
        tokens = _header_tokens(line)
        if "GPU0" in tokens:
            header_at = number
            break
    if header_at is None:
        raise NvidiaSmiParseError("no topology header (a line naming GPU0) in nvidia-smi topo -m output")
    tokens = _header_tokens(lines[header_at])
    tokens = tokens[tokens.index("GPU0") :]
    devices = []
    affinity = []
    for token in tokens:
        if token in AFFINITY_LABELS:
            affinity.append(token)
        elif affinity:
            raise NvidiaSmiParseError("device column %r after the affinity columns" % token)
        else:
            devices.append(token)
    if len(set(devices)) != len(devices):
        raise NvidiaSmiParseError("duplicate column labels in topo -m header: %s" % " ".join(devices))

    rows = {}
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Legend:") or stripped.startswith("NIC Legend:"):
            break
        cells = stripped.split()
        label = cells[0]
        if label not in devices:
            raise NvidiaSmiParseError("topo -m row %r is not one of the header columns" % label)
        values = cells[1:]
        links = values[: len(devices)]
        if len(links) < len(devices):
            raise NvidiaSmiParseError(
                "topo -m row %s has %d link cells for %d columns" % (label, len(links), len(devices))
            )
        for cell in links:
            if not _LINK_RE.match(cell):
                raise NvidiaSmiParseError("topo -m row %s: %r is not a link class" % (label, cell))
        # Drivers before the NODE class (2017) printed SOC for what is now SYS.
        links = ["SYS" if cell == "SOC" else cell for cell in links]
        rows[label] = (dict(zip(devices, links)), values[len(devices) :])

    nic_names = {}
    in_nic_legend = False
    for line in lines[header_at + 1 :]:
        if line.strip().startswith("NIC Legend:"):
            in_nic_legend = True
            continue
        if in_nic_legend:
            match = _NIC_LEGEND_RE.match(line)
            if match:
                nic_names[match.group(1)] = match.group(2)

    gpus = []
    nics = []
    for label in devices:
        if label not in rows:
            raise NvidiaSmiParseError("topo -m has a %s column but no %s row" % (label, label))
        links, rest = rows[label]
        gpu = _GPU_LABEL_RE.match(label)
        if gpu:
            extra = dict(zip(affinity, rest))
            numa = extra.get("NUMA Affinity")
            gpu_numa = extra.get("GPU NUMA ID")
            gpus.append(
                {
                    "label": label,
                    "index": int(gpu.group(1)),
                    "links": {peer: links[peer] for peer in devices if _GPU_LABEL_RE.match(peer)},
                    "nic_links": {peer: links[peer] for peer in devices if not _GPU_LABEL_RE.match(peer)},
                    "cpu_affinity": normalize_cpu_list(extra.get("CPU Affinity")),
                    "numa_affinity": None if numa in (None, "N/A") else numa,
                    "gpu_numa_id": parse_int_or_none(gpu_numa),
                }
            )
        else:
            nics.append(
                {
                    "label": label,
                    "device": nic_names.get(label, None if _NIC_LABEL_RE.match(label) else label),
                    "links": {peer: links[peer] for peer in devices if _GPU_LABEL_RE.match(peer)},
                }
            )
    _check_symmetric(gpus)
    return {"gpus": gpus, "nics": nics, "columns": devices, "affinity_columns": affinity}


def _check_symmetric(gpus):
    by_label = {gpu["label"]: gpu for gpu in gpus}
    for gpu in gpus:
        if gpu["links"].get(gpu["label"]) != "X":
            raise NvidiaSmiParseError("topo -m: %s is not X on the diagonal" % gpu["label"])
        for peer, link in gpu["links"].items():
            other = by_label.get(peer)
            if other is not None and other["links"].get(gpu["label"]) != link:
                raise NvidiaSmiParseError("topo -m is not symmetric between %s and %s" % (gpu["label"], peer))


def numa_node_of(numa_affinity):
    """A single NUMA node number from the ``NUMA Affinity`` cell, else None (N/A or several)."""
    if numa_affinity is None:
        return None
    try:
        return int(numa_affinity)
    except ValueError:
        return None


# -- nvidia-smi topo -p2p <mode> ------------------------------------------------------------
def parse_p2p_matrix(text):
    """Parse ``nvidia-smi topo -p2p <mode>`` into ``{'GPU0': {'GPU0': 'X', 'GPU1': 'OK'}}``."""
    lines = strip_ansi(text).splitlines()
    header = None
    matrix = {}
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Legend:"):
            break
        tokens = stripped.split()
        if header is None:
            if tokens and all(_GPU_LABEL_RE.match(t) for t in tokens):
                header = tokens
            continue
        label = tokens[0]
        if label not in header:
            raise NvidiaSmiParseError("topo -p2p row %r is not one of the header columns" % label)
        statuses = tokens[1:]
        if len(statuses) != len(header):
            raise NvidiaSmiParseError(
                "topo -p2p row %s has %d cells for %d columns" % (label, len(statuses), len(header))
            )
        matrix[label] = dict(zip(header, statuses))
    if header is None:
        raise NvidiaSmiParseError("no GPU header line in nvidia-smi topo -p2p output")
    missing = [label for label in header if label not in matrix]
    if missing:
        raise NvidiaSmiParseError("topo -p2p has no row for %s" % ", ".join(missing))
    return matrix


# -- nvidia-smi --query-gpu -----------------------------------------------------------------
def query_argv(binary, fields=QUERY_FIELDS):
    return [binary, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


#: Spellings (lower case) of "the driver could not read this value", in ``-q`` reports and
#: ``--query-gpu`` CSV alike: the value exists and is unknown, which is never "not reported".
UNREADABLE = (
    "unknown error",
    "[unknown error]",
    "gpu is lost",
    "[gpu is lost]",
    "insufficient permissions",
    "[insufficient permissions]",
)

#: Units nvidia-smi appends to a value without ``nounits``, for output without a header to name
#: them (with a header, each column's own unit is the one in its brackets: ``memory.total [MiB]``).
_UNITS = ("MiB", "MHz", "W", "%", "us", "ms")
#: A header cell: the field's name, then its unit in brackets when it has one.
_HEADER_CELL_RE = re.compile(r"^(.*?)(?:\s*\[(.*)\])?$")


def _clean_value(value, units=_UNITS):
    """One CSV value: None for what nvidia-smi does not report (``N/A``, nothing, or a bracketed
    placeholder: ``[N/A]``, ``[Not Supported]``, ``[Requested functionality has been
    deprecated]``), else the text without its unit. A value the driver could not read
    (``[Unknown Error]``, ``[GPU is lost]``, ``[Insufficient Permissions]``) is refused by the
    caller, never read as absent."""
    value = value.strip()
    if value in ("N/A", "") or (value.startswith("[") and value.endswith("]")):
        return None
    for unit in units:
        if value.endswith(" " + unit):
            return value[: -len(unit) - 1]
    return value


def parse_query_csv(text, fields=None):
    """Parse ``--query-gpu`` CSV into a list of ``{field: str or None}``.

    With a header line (``--format=csv``) the columns are mapped by their names, and each value
    loses the unit its column's header names (``memory.total [MiB]``); without one (``noheader``)
    ``fields`` gives the order that was asked for, and the units nvidia-smi prints are dropped.
    """
    lines = [line for line in strip_ansi(text).splitlines() if line.strip()]
    if not lines:
        return []
    reader = csv.reader(lines, skipinitialspace=True)
    rows = list(reader)
    cells = [_HEADER_CELL_RE.match(cell.strip()).groups() for cell in rows[0]]
    names = [name for name, _unit in cells]
    # A header names every field asked for (values never look like field names).
    if fields is None or set(fields) <= set(names):
        header, rows = names, rows[1:]
        units = [(unit,) if unit else () for _name, unit in cells]
    else:
        header = list(fields)
        units = [_UNITS] * len(header)
    result = []
    for row in rows:
        if len(row) != len(header):
            raise NvidiaSmiParseError(
                "query CSV row has %d values for %d fields: %r" % (len(row), len(header), ", ".join(row))
            )
        unreadable = [
            f"{name} reads {value.strip()!r}" for name, value in zip(header, row) if value.strip().lower() in UNREADABLE
        ]
        if unreadable:
            raise NvidiaSmiParseError(
                "GPU row %d of --query-gpu: %s: the driver could not read the GPU; check the GPU and the driver "
                "(nvidia-smi -q, the kernel log) before it serves" % (len(result), ", ".join(unreadable))
            )
        result.append({name: _clean_value(value, unit) for name, value, unit in zip(header, row, units)})
    return result


# -- nvidia-smi nvlink -s -------------------------------------------------------------------
def parse_nvlink_status(text):
    """``nvidia-smi nvlink -s`` -> ``{gpu_index: active_link_count}`` (GPUs listed only)."""
    counts = {}
    current = None
    for line in strip_ansi(text).splitlines():
        match = _NVLINK_GPU_RE.match(line.strip())
        if match:
            current = int(match.group(1))
            counts.setdefault(current, 0)
            continue
        match = _NVLINK_LINK_RE.match(line)
        if match and current is not None:
            state = match.group(2)
            if re.match(r"^[0-9.]+\s*GB/s$", state):
                counts[current] += 1
    return counts
