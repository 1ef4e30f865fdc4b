# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PCI configuration space of one function, decoded: the field knowledge behind the ACS modules.

Plain Python (no Ansible imports), runs on target Python 3.8+.

What is decoded, and where it comes from:

* Standard capability list: pointer byte at 0x34, valid only when Status (0x06) has bit 0x10;
  each entry is ``id, next`` bytes; next pointers are dword aligned (``& ~3``).
* Extended capability list: starts at 0x100, walked only when the function has a PCI Express
  capability (ID 0x10), exactly as pciutils' ``lspci``/``setpci`` do; header dword: ID = bits 15:0,
  version = bits 19:16, next = ``(h >> 20) & 0xffc``; stop at 0 or 0xffffffff; loop guard.
* PCI Express capability: flags at +2 (port type in bits 7:4), Link Capabilities at +0x0c,
  Link Status at +0x12 (speed bits 3:0, width bits 9:4).
* ACS extended capability (ID 0x000d): Capability register at +4, Control at +6, same bit layout
  (lspci names SrcValid TransBlk ReqRedir CmpltRedir UpstreamFwd EgressCtrl DirectTrans); bits
  above 0x40 (enhanced ACS on newer hardware) are kept in the raw value and in ``other_bits``.

Where the bytes come from is ``_sysfs`` (a sysfs PCI tree); what a tree's ACS state means for
peer traffic is ``_topology`` and ``_path``.
"""

from __future__ import annotations

import re

# ACS Capability / Control bits, in the order and with the names lspci prints.
ACS_FLAGS = (
    ("SrcValid", 0x0001),
    ("TransBlk", 0x0002),
    ("ReqRedir", 0x0004),
    ("CmpltRedir", 0x0008),
    ("UpstreamFwd", 0x0010),
    ("EgressCtrl", 0x0020),
    ("DirectTrans", 0x0040),
)
ACS_FLAG_NAMES = tuple(name for name, _mask in ACS_FLAGS)
ACS_FLAG_MASK = dict(ACS_FLAGS)
ACS_KNOWN_MASK = 0x007F
# Which of these bits redirect peer traffic is path vocabulary: _path.ACS_REDIRECT_MASK.

PCI_CAP_ID_EXP = 0x10
PCI_EXT_CAP_ID_ACS = 0x000D
PCI_STATUS_CAP_LIST = 0x10

PORT_TYPES = {
    0x0: "endpoint",
    0x1: "legacy_endpoint",
    0x2: "unknown_2",
    0x3: "unknown_3",
    0x4: "root_port",
    0x5: "upstream_port",
    0x6: "downstream_port",
    0x7: "pcie_to_pci_bridge",
    0x8: "pci_to_pcie_bridge",
    0x9: "root_complex_integrated_endpoint",
    0xA: "root_complex_event_collector",
}
# Port types that have no link registers (lspci skips them too).
_NO_LINK_TYPES = (0x9, 0xA)

# Link speed encoding (Link Capabilities / Link Status bits 3:0) -> (generation, lspci text).
LINK_SPEEDS = {
    1: (1, "2.5GT/s"),
    2: (2, "5GT/s"),
    3: (3, "8GT/s"),
    4: (4, "16GT/s"),
    5: (5, "32GT/s"),
    6: (6, "64GT/s"),
}

CLASS_BRIDGE_PCI = 0x0604

# Intel PCH root ports whose ACS Control register sits at cap+8 instead of cap+6 (Linux
# drivers/pci/quirks.c, pci_quirk_intel_spt_pch_acs_match): lspci shows garbage for them and a
# write to ECAP_ACS+0x6 hits the wrong register.
_INTEL_SPT_PCH_RANGES = ((0xA110, 0xA11F), (0xA167, 0xA16A), (0xA290, 0xA29F), (0xA2E7, 0xA2EE), (0x9D10, 0x9D1B))

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")


class PciError(Exception):
    """Any problem reading a PCI tree; the message says what, where and what to do."""


class PciConfigTruncated(PciError):
    """Config space came back cut short (sysfs gives 64 bytes to readers without CAP_SYS_ADMIN)."""


def normalize_bdf(text):
    """Return ``dddd:bb:dd.f`` (lower case) for ``[domain:]bus:dev.fn``; ValueError otherwise."""
    if not isinstance(text, str):
        raise ValueError("PCI address %r is not a string" % (text,))
    match = _BDF_RE.match(text.strip())
    if not match:
        raise ValueError(
            "malformed PCI address %r: expected [domain:]bus:device.function in hex, "
            "e.g. 0000:01:00.0 (device 00-1f, function 0-7)" % (text,)
        )
    domain, bus, dev, fn = match.groups()
    return "%04x:%02x:%02x.%d" % (int(domain or "0", 16), int(bus, 16), int(dev, 16), int(fn))


def decode_acs(value):
    """Decode an ACS Capability or Control value into ``{lspci name: bool}``.

    Unknown high bits (enhanced ACS and beyond) are returned under ``other_bits`` as an int.
    ``None`` in, ``None`` out.
    """
    if value is None:
        return None
    flags = {name: bool(value & mask) for name, mask in ACS_FLAGS}
    flags["other_bits"] = value & ~ACS_KNOWN_MASK & 0xFFFF
    return flags


def format_acs(value):
    """The text lspci prints after ``ACSCap:``/``ACSCtl:`` for a value."""
    return " ".join("%s%s" % (name, "+" if value & mask else "-") for name, mask in ACS_FLAGS)


def acs_bits_mask(names):
    """Mask for a list of lspci flag names; ValueError on an unknown name."""
    mask = 0
    for name in names:
        if name not in ACS_FLAG_MASK:
            raise ValueError("unknown ACS flag %r; known flags: %s" % (name, ", ".join(ACS_FLAG_NAMES)))
        mask |= ACS_FLAG_MASK[name]
    return mask


def _word(data, off):
    if off + 2 > len(data):
        return None
    return data[off] | (data[off + 1] << 8)


def _dword(data, off):
    if off + 4 > len(data):
        return None
    return data[off] | (data[off + 1] << 8) | (data[off + 2] << 16) | (data[off + 3] << 24)


def _intel_spt_pch_quirk(vendor_id, device_id, port_type):
    if vendor_id != 0x8086 or port_type != 0x4:
        return False
    return any(lo <= device_id <= hi for lo, hi in _INTEL_SPT_PCH_RANGES)


class PciConfig:
    """Decoded configuration space of one function.

    Tolerates short data (dumps of 64 or 256 bytes): whatever lies beyond the end is absent.
    Problems found on the way (broken or looped chains) are listed in ``warnings``.
    """

    __slots__ = (
        "length",
        "vendor_id",
        "device_id",
        "class_code",
        "prog_if",
        "header_type",
        "caps",
        "ext_caps",
        "pcie",
        "acs",
        "warnings",
    )

    def __init__(self, data):
        if len(data) < 64:
            raise PciConfigTruncated("config space is %d bytes; at least the 64-byte header is needed" % len(data))
        self.length = len(data)
        self.vendor_id = _word(data, 0x00)
        self.device_id = _word(data, 0x02)
        self.prog_if = data[0x09]
        self.class_code = _word(data, 0x0A)  # base class << 8 | subclass
        self.header_type = data[0x0E] & 0x7F
        self.caps = []  # [(id, offset)]
        self.ext_caps = []  # [(id, version, offset)]
        self.pcie = None
        self.acs = None
        self.warnings = []
        self._walk_caps(data)
        if any(cap_id == PCI_CAP_ID_EXP for cap_id, _off in self.caps):
            self._walk_ext_caps(data)
        self._decode_pcie(data)
        self._decode_acs(data)

    # -- capability lists -------------------------------------------------------------------
    def _walk_caps(self, data):
        status = _word(data, 0x06)
        if not status & PCI_STATUS_CAP_LIST:
            return
        where = data[0x34] & ~3
        seen = set()
        while where:
            if where + 2 > len(data):
                if len(data) > 64:
                    self.warnings.append("capability at 0x%02x lies beyond the %d bytes read" % (where, len(data)))
                break
            if where in seen:
                self.warnings.append("capability chain looped at 0x%02x" % where)
                break
            seen.add(where)
            cap_id = data[where]
            if cap_id == 0xFF:
                self.warnings.append("capability chain broken at 0x%02x" % where)
                break
            self.caps.append((cap_id, where))
            where = data[where + 1] & ~3

    def _walk_ext_caps(self, data):
        where = 0x100
        seen = set()
        while where:
            header = _dword(data, where)
            if header is None:
                break
            if header in (0, 0xFFFFFFFF):
                break
            if where in seen:
                self.warnings.append("extended capability chain looped at 0x%03x" % where)
                break
            seen.add(where)
            self.ext_caps.append((header & 0xFFFF, (header >> 16) & 0xF, where))
            where = (header >> 20) & 0xFFC
            if where and where < 0x100:
                self.warnings.append("extended capability next pointer 0x%03x is below 0x100" % where)
                break

    def cap_offset(self, cap_id):
        for cid, off in self.caps:
            if cid == cap_id:
                return off
        return None

    def ext_cap_offset(self, cap_id):
        for cid, _ver, off in self.ext_caps:
            if cid == cap_id:
                return off
        return None

    # -- PCI Express -------------------------------------------------------------------------
    def _decode_pcie(self, data):
        off = self.cap_offset(PCI_CAP_ID_EXP)
        if off is None:
            return
        flags = _word(data, off + 2)
        if flags is None:
            return
        ptype = (flags >> 4) & 0xF
        pcie = {
            "offset": off,
            "version": flags & 0xF,
            "port_type_code": ptype,
            "port_type": PORT_TYPES.get(ptype, "unknown_%d" % ptype),
            "link_cap_speed": None,
            "link_cap_width": None,
            "link_sta_speed": None,
            "link_sta_width": None,
        }
        if ptype not in _NO_LINK_TYPES:
            lnkcap = _dword(data, off + 0x0C)
            lnksta = _word(data, off + 0x12)
            if lnkcap is not None:
                pcie["link_cap_speed"] = lnkcap & 0xF
                pcie["link_cap_width"] = (lnkcap >> 4) & 0x3F
            if lnksta is not None:
                pcie["link_sta_speed"] = lnksta & 0xF
                pcie["link_sta_width"] = (lnksta >> 4) & 0x3F
        self.pcie = pcie

    @property
    def port_type(self):
        return self.pcie["port_type"] if self.pcie else None

    def link(self):
        """``{gen_max, width_max, gen_current, width_current, speed_max, speed_current}`` or None."""
        if not self.pcie or self.pcie["link_cap_speed"] is None:
            return None
        pcie = self.pcie

        def gen(code):
            return LINK_SPEEDS.get(code, (None, "unknown"))

        return {
            "gen_max": gen(pcie["link_cap_speed"])[0],
            "speed_max": gen(pcie["link_cap_speed"])[1],
            "width_max": pcie["link_cap_width"],
            "gen_current": gen(pcie["link_sta_speed"])[0] if pcie["link_sta_speed"] is not None else None,
            "speed_current": gen(pcie["link_sta_speed"])[1] if pcie["link_sta_speed"] is not None else None,
            "width_current": pcie["link_sta_width"],
        }

    # -- ACS ---------------------------------------------------------------------------------
    def _decode_acs(self, data):
        off = self.ext_cap_offset(PCI_EXT_CAP_ID_ACS)
        if off is None:
            return
        cap = _word(data, off + 4)
        ctl = _word(data, off + 6)
        if cap is None or ctl is None:
            return
        acs = {
            "offset": off,
            "cap": cap,
            "ctl": ctl,
            "egress_vector_bits": (cap >> 8) & 0xFF if cap & 0x0020 else 0,
            "quirk": None,
        }
        ptype = self.pcie["port_type_code"] if self.pcie else None
        if _intel_spt_pch_quirk(self.vendor_id, self.device_id, ptype):
            acs["quirk"] = "intel_spt_pch"
            self.warnings.append(
                "Intel PCH root port %04x:%04x keeps ACS Control at cap+8 "
                "(kernel quirk); lspci and setpci ECAP_ACS+0x6 see the wrong register"
                % (self.vendor_id, self.device_id)
            )
        self.acs = acs

    @property
    def acs_cap(self):
        return self.acs["cap"] if self.acs else None

    @property
    def acs_ctl(self):
        return self.acs["ctl"] if self.acs else None

    @property
    def is_bridge(self):
        return self.class_code == CLASS_BRIDGE_PCI or self.header_type == 1

    @property
    def ext_space_unknown(self):
        """A PCI Express function whose extended config space (0x100 and above) was not read.

        Its ACS state is unknown, never "no ACS": the kernel gives a reader without
        CAP_SYS_ADMIN less, a capture made with ``lspci -xxx`` (not ``-xxxx``) or a copied tree
        stops at 256 bytes, and a kernel without extended config access (no MMCONFIG/ECAM,
        ``pci=nommconf``) shows only 256.
        """
        return self.pcie is not None and self.length <= 0x100

    def ext_space_reason(self, bdf):
        """What ``ext_space_unknown`` means for ``bdf``, with the likely causes."""
        return (
            "%s: only %d bytes of PCI config space could be read, so its extended capabilities "
            "(ACS lives at 0x100 and above) are unknown, not absent: run as root (become: true); "
            "if this is a captured tree, capture all 4096 bytes (lspci -xxxx, or copy the config "
            "files as root); otherwise the kernel has no extended config access (MMCONFIG/ECAM, "
            "pci=nommconf)" % (bdf, self.length)
        )
