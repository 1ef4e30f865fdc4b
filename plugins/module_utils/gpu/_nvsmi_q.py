# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvidia-smi's per-GPU report (``nvidia-smi -q``) and the per-link NVLink state
(``nvidia-smi nvlink -s``), read into the health facts ``health/_checks`` judges.

Plain Python (no Ansible imports), runs on target Python 3.8+.

``nvidia-smi -q`` is an indented text report: ``Label : value`` lines and section headers
(``Label`` alone, or ``Label : N/A`` on one line where the whole section is unsupported), nested by
indentation, one ``GPU 00000000:53:00.0`` block per GPU.  It is read here as a tree, by indentation
and label, never by line position, because the labels move and change between drivers:

* ``Clocks Event Reasons`` (drivers from 535) was ``Clocks Throttle Reasons``; ``HW Thermal
  Slowdown`` and ``HW Power Brake Slowdown`` are nested under ``HW Slowdown``; newer drivers add
  a separate ``Clocks Event Reasons Counters`` section (durations, not states).
* ``Remapped Rows`` (A100 and later) is ``Remapped Rows : N/A`` on one line on older GPUs, which
  report ``Retired Pages`` (``Single Bit ECC``, ``Double Bit ECC``, ``Pending Page Blacklist``)
  instead; GPUs with row remapping print ``Retired Pages`` with ``N/A`` values.
* ``ECC Errors`` (``Ecc Mode`` on old drivers for the mode): old drivers nest ``Volatile >
  Single Bit / Double Bit > Total``; newer ones print ``SRAM Correctable``, ``SRAM
  Uncorrectable``, ``DRAM Correctable``, ``DRAM Uncorrectable``; Hopper splits ``SRAM
  Uncorrectable Parity`` and ``SRAM Uncorrectable SEC-DED``.
* ``PCI > GPU Link Info > PCIe Generation > Max/Current`` (plus ``Device Max``/``Host Max`` on
  newer drivers) and ``Link Width > Max/Current`` (``16x``).
* ``Fabric > State/Status`` (NVSwitch systems: ``Completed``/``Success``; ``In Progress``,
  ``Not Started``; ``N/A`` elsewhere); absent on drivers before 525.
* Values ``N/A``, ``[N/A]`` mean "does not apply" and read as None. ``Not Supported`` /
  ``[Not Supported]`` (the GPU model lacks the field) read as None too, and the GPU's record
  names the field under ``unsupported``. ``Unknown Error`` / ``[Unknown Error]``, ``[GPU is lost]``
  and ``[Insufficient Permissions]`` read as None, and the record names the field and the error
  under ``unreadable``: the value exists but the driver could not read it, which is no pass.
  So does a value of the ECC, retired-page, row-remap or persistence sections that is neither a
  count nor a state (``Pending : Maybe``): it would read as None too.
* Every GPU block ends with ``Processes`` (the last section nvidia-smi prints for a GPU, on every
  driver); a block without it is a report cut short. ``Attached GPUs`` counts the GPU blocks that
  follow; a report that prints another number of blocks is not a whole report.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi

#: Spellings of "the GPU model lacks this field" (a warning with the reason, never a failure).
_UNSUPPORTED = ("not supported", "[not supported]")
#: Spellings of "the driver could not read this value" (a failure).
_UNREADABLE = _nvsmi.UNREADABLE
#: Every spelling of "no value": read as absent (None) by the record's fields.
_NOT_REPORTED = ("n/a", "[n/a]", "") + _UNSUPPORTED + _UNREADABLE

#: The top-level sections of a GPU block that the health record reads; a value in them that
#: cannot be read makes the record name it (``unreadable``/``unsupported``).
JUDGED_SECTIONS = (
    "Product Name",
    "GPU UUID",
    "Persistence Mode",
    "ECC Mode",
    "Ecc Mode",
    "ECC Errors",
    "Retired Pages",
    "Remapped Rows",
    "PCI",
    "Fabric",
    "Clocks Event Reasons",
    "Clocks Throttle Reasons",
)
#: Sections whose every value is a count or a state (yes/no, enabled/disabled): a value that is
#: neither reads as None, so it is named as unreadable rather than passed.
COUNT_OR_STATE_SECTIONS = ("Persistence Mode", "ECC Mode", "Ecc Mode", "ECC Errors", "Retired Pages", "Remapped Rows")
#: The section nvidia-smi prints last in every GPU block.
LAST_SECTION = "Processes"
_GPU_HEADER_RE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_LABEL_VALUE_RE = re.compile(r"^(?P<label>[^:]+?)\s*:\s?(?P<value>.*?)\s*$")
_INT_RE = re.compile(r"^(-?\d+)")
_NVLINK_SPEED_RE = re.compile(r"^([0-9.]+)\s*GB/s$")
_UUID_RE = re.compile(r"\(UUID:\s*([^)]+?)\s*\)")

#: Clock event reason labels of ``-q`` -> the snake_case names of NVML's reasons
#: (``nvmlClocksEventReason*``); ``Idle`` is NVML's GpuIdle.
CLOCK_REASON_NAMES = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clock_setting",
}
CLOCK_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")


class Node:
    """One line of the report: its label, its value (None for a section header) and its children."""

    __slots__ = ("label", "value", "children", "indent")

    def __init__(self, label, value, indent):
        self.label = label
        self.value = value
        self.indent = indent
        self.children = []

    def child(self, *labels):
        """The first child with one of ``labels`` (case-insensitive), else None."""
        wanted = [label.lower() for label in labels]
        for child in self.children:
            if child.label.lower() in wanted:
                return child
        return None

    def find(self, *path):
        """Follow a path of labels (each step a label or a tuple of alternatives)."""
        node = self
        for step in path:
            if node is None:
                return None
            node = node.child(*(step if isinstance(step, tuple) else (step,)))
        return node

    def text(self, *path):
        node = self.find(*path)
        return reported(node.value) if node is not None else None

    def walk(self):
        for child in self.children:
            yield child
            yield from child.walk()


def reported(value):
    """The value, or None for nvidia-smi's not-reported spellings."""
    if value is None:
        return None
    value = value.strip()
    return None if value.lower() in _NOT_REPORTED else value


def to_int(value):
    """``0``, ``16x``, ``2560 bank(s)`` -> int; not reported or not a number -> None."""
    value = reported(value)
    if value is None:
        return None
    match = _INT_RE.match(value)
    return int(match.group(1)) if match else None


def to_bool(value):
    """``Yes``/``Enabled``/``Active`` -> True, ``No``/``Disabled``/``Not Active`` -> False."""
    value = reported(value)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "enabled", "active", "true", "on"):
        return True
    if lowered in ("no", "disabled", "not active", "false", "off"):
        return False
    return None


def snake(text):
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def parse_tree(text):
    """The report as ``(preamble, [(bus_id_as_printed, Node)])``; the preamble is a Node of the
    lines before the first GPU block (``Driver Version``, ``Attached GPUs``...)."""
    preamble = Node("preamble", None, -1)
    blocks = []
    stack = [preamble]
    for raw in _nvsmi.strip_ansi(text).splitlines():
        line = raw.rstrip().replace("\t", "    ")
        stripped = line.strip()
        if not stripped or stripped.startswith("=====") or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        header = _GPU_HEADER_RE.match(stripped)
        if header and indent == 0:
            root = Node("GPU", header.group(1), 0)
            blocks.append((header.group(1), root))
            stack = [root]
            continue
        match = _LABEL_VALUE_RE.match(stripped)
        if match and ":" in stripped:
            node = Node(match.group("label").strip(), match.group("value"), indent)
        else:
            node = Node(stripped, None, indent)
        while len(stack) > 1 and stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    return preamble, blocks


# -- the per-GPU record ----------------------------------------------------------------------
def _sum(values):
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _ecc_counts(scope):
    """``(correctable, uncorrectable)`` of a ``Volatile``/``Aggregate`` section, any driver."""
    if scope is None:
        return None, None
    single = scope.find("Single Bit", "Total")
    double = scope.find("Double Bit", "Total")
    if single is not None or double is not None:
        return (
            to_int(single.value) if single is not None else None,
            to_int(double.value) if double is not None else None,
        )
    correctable, uncorrectable = [], []
    for child in scope.children:
        label = child.label.lower()
        if child.value is None:
            continue
        if "uncorrectable" in label:
            uncorrectable.append(to_int(child.value))
        elif "correctable" in label:
            correctable.append(to_int(child.value))
    return _sum(correctable), _sum(uncorrectable)


def _ecc(gpu):
    errors = gpu.find("ECC Errors")
    mode = gpu.text(("ECC Mode", "Ecc Mode"), "Current")
    if errors is None:
        return None
    vol_c, vol_u = _ecc_counts(errors.child("Volatile"))
    agg_c, agg_u = _ecc_counts(errors.child("Aggregate"))
    return {
        "enabled": to_bool(mode),
        "volatile_correctable": vol_c,
        "volatile_uncorrectable": vol_u,
        "aggregate_correctable": agg_c,
        "aggregate_uncorrectable": agg_u,
    }


def _retired_pages(gpu):
    section = gpu.child("Retired Pages")
    if section is None or not section.children:
        return None
    pending = None
    for child in section.children:
        if child.label.lower().startswith("pending"):
            pending = to_bool(child.value)
    record = {
        "single_bit_ecc": to_int(section.text("Single Bit ECC")),
        "double_bit_ecc": to_int(section.text("Double Bit ECC")),
        "pending": pending,
    }
    if all(value is None for value in record.values()):
        return None
    return record


def _remapped_rows(gpu):
    section = gpu.child("Remapped Rows")
    if section is None or not section.children:
        return None
    record = {
        "correctable": to_int(section.text("Correctable Error")),
        "uncorrectable": to_int(section.text("Uncorrectable Error")),
        "pending": to_bool(section.text("Pending")),
        "failure": to_bool(section.text("Remapping Failure Occurred")),
    }
    if all(value is None for value in record.values()):
        return None
    return record


def _clock_reasons(gpu):
    section = None
    for name in CLOCK_SECTIONS:
        section = gpu.child(name)
        if section is not None:
            break
    if section is None or not section.children:
        return None
    active = []
    for node in section.walk():
        if to_bool(node.value):
            active.append(CLOCK_REASON_NAMES.get(node.label, snake(node.label)))
    return active


def _pcie(gpu):
    link = gpu.find("PCI", "GPU Link Info")
    replays = gpu.text("PCI", "Replays Since Reset")
    if link is None:
        return {
            "gen_current": None,
            "gen_max": None,
            "width_current": None,
            "width_max": None,
            "replays": to_int(replays),
        }
    gen_max = to_int(link.text("PCIe Generation", "Max"))
    host_max = to_int(link.text("PCIe Generation", "Host Max"))
    if gen_max is not None and host_max is not None:
        gen_max = min(gen_max, host_max)
    return {
        "gen_current": to_int(link.text("PCIe Generation", "Current")),
        "gen_max": gen_max,
        "width_current": to_int(link.text("Link Width", "Current")),
        "width_max": to_int(link.text("Link Width", "Max")),
        "replays": to_int(replays),
    }


def _fabric(gpu):
    section = gpu.child("Fabric")
    if section is None:
        return None
    state = section.text("State")
    status = section.text("Status")
    if state is None and status is None:
        return None
    return {"state": snake(state) if state else None, "status": snake(status) if status else None}


def _path_of(trail):
    return " > ".join(trail)


def field_problems(gpu):
    """``(unreadable, unsupported)`` of a GPU block: ``[{'field', 'error'}]`` for the judged values
    the driver could not read, ``[{'field', 'reason'}]`` for those the GPU model lacks."""
    unreadable, unsupported = [], []
    wanted = [label.lower() for label in JUDGED_SECTIONS]
    counted = [label.lower() for label in COUNT_OR_STATE_SECTIONS]

    def visit(node, trail, strict):
        trail = trail + [node.label]
        if node.value is not None:
            value = node.value.strip().lower()
            if value in _UNREADABLE:
                unreadable.append({"field": _path_of(trail), "error": node.value.strip()})
            elif value in _UNSUPPORTED:
                unsupported.append({"field": _path_of(trail), "reason": "nvidia-smi -q: %s" % node.value.strip()})
            elif (
                strict
                and reported(node.value) is not None
                and to_int(node.value) is None
                and to_bool(node.value) is None
            ):
                unreadable.append({"field": _path_of(trail), "error": "unrecognised value %r" % node.value.strip()})
        for child in node.children:
            visit(child, trail, strict)

    for child in gpu.children:
        if child.label.lower() in wanted:
            visit(child, [], child.label.lower() in counted)
    return unreadable, unsupported


def gpu_record(bus_id, gpu):
    unreadable, unsupported = field_problems(gpu)
    return {
        "bus_id": _nvsmi.normalize_bus_id(bus_id),
        "uuid": gpu.text("GPU UUID"),
        "name": gpu.text("Product Name"),
        "persistence_mode": to_bool(gpu.text("Persistence Mode")),
        "ecc": _ecc(gpu),
        "retired_pages": _retired_pages(gpu),
        "remapped_rows": _remapped_rows(gpu),
        "clocks_event_reasons": _clock_reasons(gpu),
        "pcie": _pcie(gpu),
        "fabric": _fabric(gpu),
        "nvlinks": None,
        "unreadable": unreadable,
        "unsupported": unsupported,
    }


def parse_query(text):
    """``nvidia-smi -q`` -> ``{'driver_version', 'attached_gpus', 'gpus': [record]}``.

    Raises ``_nvsmi.NvidiaSmiParseError`` when the text has no GPU block while it says GPUs are
    attached, prints another number of GPU blocks than ``Attached GPUs`` says, has a GPU block cut
    short (no ``Processes`` section), or is not a ``-q`` report at all.
    """
    preamble, blocks = parse_tree(text)
    attached = to_int(preamble.text("Attached GPUs"))
    if not blocks and not attached and preamble.text("Driver Version") is None:
        raise _nvsmi.NvidiaSmiParseError('not an nvidia-smi -q report (no "Driver Version", no GPU block)')
    if attached and not blocks:
        raise _nvsmi.NvidiaSmiParseError("nvidia-smi -q says %d GPU(s) are attached but prints no GPU block" % attached)
    for bus_id, node in blocks:
        if node.child(LAST_SECTION) is None:
            raise _nvsmi.NvidiaSmiParseError(
                "the nvidia-smi -q report is cut short inside the block of GPU %s (no %r section, which "
                "nvidia-smi prints last for every GPU): the report is not whole; run nvidia-smi -q again, "
                "and reset the GPU or reboot if it stays cut" % (bus_id, LAST_SECTION)
            )
    if attached is None and blocks:
        raise _nvsmi.NvidiaSmiParseError(
            'the nvidia-smi -q report has %d GPU block(s) but no readable "Attached GPUs" line' % len(blocks)
        )
    if attached is not None and attached != len(blocks):
        raise _nvsmi.NvidiaSmiParseError(
            "nvidia-smi -q says %d GPU(s) are attached but prints %d GPU block(s) (%s): the report is "
            "not whole; run nvidia-smi -q again, and reset the GPU or reboot if a GPU stays missing"
            % (attached, len(blocks), ", ".join(bus_id for bus_id, _node in blocks))
        )
    return {
        "driver_version": preamble.text("Driver Version"),
        "attached_gpus": attached,
        "gpus": [gpu_record(bus_id, node) for bus_id, node in blocks],
    }


# -- nvidia-smi nvlink -s ---------------------------------------------------------------------
def parse_nvlink_links(text):
    """``nvidia-smi nvlink -s`` -> ``[{'index', 'uuid', 'links': [{'link', 'active', 'speed_gbps'}]}]``.

    Per link, where ``_nvsmi.parse_nvlink_status`` gives the active count: ``Link N: 26.562 GB/s``
    is active at that speed, ``Link N: <inactive>`` is down.
    """
    gpus = []
    current = None
    for line in _nvsmi.strip_ansi(text).splitlines():
        match = _nvsmi._NVLINK_GPU_RE.match(line.strip())
        if match:
            uuid = _UUID_RE.search(line)
            current = {"index": int(match.group(1)), "uuid": uuid.group(1) if uuid else None, "links": []}
            gpus.append(current)
            continue
        match = _nvsmi._NVLINK_LINK_RE.match(line)
        if match and current is not None:
            speed = _NVLINK_SPEED_RE.match(match.group(2))
            current["links"].append(
                {
                    "link": int(match.group(1)),
                    "active": bool(speed),
                    "speed_gbps": float(speed.group(1)) if speed else None,
                }
            )
    return gpus


def attach_nvlinks(gpus, nvlink_gpus):
    """Put each GPU's links (``parse_nvlink_links``) on its record: by UUID, else by position
    (both list GPUs in nvidia-smi's index order)."""
    by_uuid = {entry["uuid"]: entry for entry in nvlink_gpus if entry["uuid"]}
    by_index = {entry["index"]: entry for entry in nvlink_gpus}
    for position, gpu in enumerate(gpus):
        entry = by_uuid.get(gpu.get("uuid")) or by_index.get(position)
        gpu["nvlinks"] = (
            [dict(link, crc_errors=None, replay_errors=None, recovery_errors=None) for link in entry["links"]]
            if entry
            else []
        )
    return gpus
