# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PCI configuration space and sysfs PCI trees: the field knowledge behind the ACS modules.

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

A sysfs PCI tree is what pciutils' ``-O sysfs.path=DIR`` reads: ``DIR/devices/<bdf>`` are links
into ``/sys/devices/pci<domain>:<bus>/<bdf>/<bdf>/...``; every BDF component of that path above a
device is a bridge it sits behind.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.gpufleet.node.plugins.module_utils import _pcipath

DEFAULT_SYSFS_PATH = "/sys/bus/pci"

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
# Which of these bits redirect peer traffic is path vocabulary: _pcipath.ACS_REDIRECT_MASK.

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
_SYSFS_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")


class PciError(Exception):
    """Any problem reading a PCI tree; the message says what, where and what to do."""


class PciTreeMissing(PciError):
    """The sysfs PCI tree does not exist or has no devices directory."""


class PciConfigTruncated(PciError):
    """Config space came back cut short (sysfs gives 64 bytes to readers without CAP_SYS_ADMIN)."""


class PciDeviceMissing(PciError):
    """A BDF that is not in the tree."""


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


# -- sysfs trees -----------------------------------------------------------------------------
class PciDevice:
    """One function of a sysfs PCI tree."""

    __slots__ = ("bdf", "path", "chain", "config", "driver", "iommu_group")

    def __init__(self, bdf, path, chain, config, driver, iommu_group):
        self.bdf = bdf
        self.path = path  # the device's directory, as found under <sysfs_path>/devices
        self.chain = chain  # upstream bridges, root first, parent last
        self.config = config  # PciConfig, or None when read without config
        self.driver = driver  # basename of the driver link, or None
        self.iommu_group = iommu_group  # group name (str) or None

    @property
    def vendor_id(self):
        return self.config.vendor_id

    @property
    def class_code(self):
        return self.config.class_code

    @property
    def is_gpu(self):
        return _pcipath.is_gpu(self.config.vendor_id, self.config.class_code)

    @property
    def is_rdma_nic(self):
        return _pcipath.is_rdma_nic(self.config.vendor_id, self.config.class_code, self.driver)


def _link_basename(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _upstream_chain(devices_dir, entry_name, is_symlink):
    """BDFs above a device, root first, from the path its sysfs link points at."""
    link_path = os.path.join(devices_dir, entry_name)
    if is_symlink:
        target = os.readlink(link_path)
    else:
        target = os.path.realpath(link_path)
    parts = target.replace("\\", "/").split("/")
    chain = []
    started = False
    for part in parts:
        if part.startswith("pci") and ":" in part:
            started = True
            chain = []
            continue
        if started and _SYSFS_BDF_RE.match(part):
            chain.append(part)
    if chain and chain[-1] == entry_name:
        chain.pop()
    return chain


def _devices_dir(sysfs_path):
    devices_dir = os.path.join(sysfs_path, "devices")
    if not os.path.isdir(devices_dir):
        raise PciTreeMissing(
            "no PCI devices directory at %s: sysfs_path must be a sysfs PCI tree like /sys/bus/pci "
            "(the same meaning as pciutils' -O sysfs.path=); is /sys mounted, or is the path right?" % devices_dir
        )
    return devices_dir


def read_config(path, bdf=None):
    """Read a ``config`` file once; raise PciConfigTruncated when the kernel cut it to 64 bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 8192)
        while data and len(data) < 4096:
            more = os.read(fd, 8192)
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) <= 64:
        raise PciConfigTruncated(
            "%s: read only %d bytes of PCI config space from %s; the kernel gives the capabilities "
            "(ACS lives at 0x100 and above) only to readers with CAP_SYS_ADMIN: run as root "
            "(become: true)" % (bdf or path, len(data), path)
        )
    return data


def scan_tree(sysfs_path=DEFAULT_SYSFS_PATH, with_config=True):
    """Enumerate ``<sysfs_path>/devices`` into ``{bdf: PciDevice}`` (one read of each config file).

    ``with_config=False`` reads only ``vendor``/``class`` text files (readable by any user) and
    leaves ``config`` as a header-only PciConfig (no capabilities).
    """
    devices_dir = _devices_dir(sysfs_path)
    devices = {}
    with os.scandir(devices_dir) as entries:
        for entry in entries:
            name = entry.name
            if not _SYSFS_BDF_RE.match(name):
                continue
            dev_path = entry.path
            chain = _upstream_chain(devices_dir, name, entry.is_symlink())
            if with_config:
                try:
                    config = PciConfig(read_config(os.path.join(dev_path, "config"), name))
                except PciConfigTruncated:
                    raise
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM):
                        raise PciConfigTruncated(
                            "%s: cannot read %s (%s): run as root (become: true)"
                            % (name, os.path.join(dev_path, "config"), exc.strerror)
                        ) from exc
                    raise PciError("%s: cannot read %s: %s" % (name, os.path.join(dev_path, "config"), exc)) from exc
            else:
                config = _header_only_config(dev_path)
            devices[name] = PciDevice(
                bdf=name,
                path=dev_path,
                chain=chain,
                config=config,
                driver=_link_basename(os.path.join(dev_path, "driver")),
                iommu_group=_link_basename(os.path.join(dev_path, "iommu_group")),
            )
    if not devices and not os.listdir(devices_dir):
        raise PciTreeMissing("no PCI devices under %s: is this a sysfs PCI tree?" % devices_dir)
    return devices


def _read_hex_file(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip(), 16)
    except (OSError, ValueError):
        return None


def _header_only_config(dev_path):
    vendor = _read_hex_file(os.path.join(dev_path, "vendor")) or 0xFFFF
    device = _read_hex_file(os.path.join(dev_path, "device")) or 0xFFFF
    cls = _read_hex_file(os.path.join(dev_path, "class")) or 0
    data = bytearray(64)
    data[0:2] = vendor.to_bytes(2, "little")
    data[2:4] = device.to_bytes(2, "little")
    data[9] = cls & 0xFF
    data[0x0A] = (cls >> 8) & 0xFF
    data[0x0B] = (cls >> 16) & 0xFF
    if cls >> 8 == CLASS_BRIDGE_PCI:
        data[0x0E] = 1
    return PciConfig(bytes(data))


def read_text(path):
    """Contents of a small text file (a sysfs attribute), stripped, or None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


# -- topology and audit ----------------------------------------------------------------------
class PciTopology:
    """A scanned tree with the GPU/NIC view the ACS modules and the GPU facts need.

    Which devices are GPUs and RDMA NICs, which bridges two devices' peer traffic crosses and
    which of them redirect it are the rules of ``_pcipath``; this class applies them to a tree.
    """

    def __init__(self, devices, sysfs_path=DEFAULT_SYSFS_PATH):
        self.sysfs_path = sysfs_path
        self.devices = devices
        self.gpus = sorted(bdf for bdf, dev in devices.items() if dev.is_gpu)
        self.nics = sorted(bdf for bdf, dev in devices.items() if dev.is_rdma_nic)
        self._pairs = None
        self._nic_pairs = None

    @classmethod
    def scan(cls, sysfs_path=DEFAULT_SYSFS_PATH, with_config=True):
        return cls(scan_tree(sysfs_path, with_config=with_config), sysfs_path)

    def chain(self, bdf):
        return self.devices[bdf].chain

    def acs_ctl(self, bdf):
        """ACS Control of a function, or None (not in the tree, or no ACS capability)."""
        dev = self.devices.get(bdf)
        return dev.config.acs_ctl if dev is not None else None

    def bridges_between(self, bdf_a, bdf_b):
        """Bridges peer traffic from ``bdf_a`` to ``bdf_b`` crosses, in the order it crosses them."""
        return _pcipath.crossed_bridges(self.devices[bdf_a].chain, self.devices[bdf_b].chain)

    def redirecting(self, bridges):
        """Those of ``bridges`` whose ACS Control redirects peer traffic."""
        return _pcipath.redirecting(bridges, self.acs_ctl)

    def acs_unknown(self, bridges):
        """Those of ``bridges`` whose extended config space (where ACS lives) could not be read."""
        return [bdf for bdf in bridges if bdf in self.devices and self.devices[bdf].config.ext_space_unknown]

    def _pair(self, bdf_a, bdf_b, **ends):
        crossed = self.bridges_between(bdf_a, bdf_b)
        redirecting = self.redirecting(crossed)
        record = dict(ends)
        record.update(
            bridges=crossed, redirecting=redirecting, acs_unknown=self.acs_unknown(crossed), blocked=bool(redirecting)
        )
        return record

    def gpu_pairs(self):
        """``[{gpus, bridges, redirecting, acs_unknown, blocked}]`` for every GPU pair."""
        if self._pairs is None:
            self._pairs = [
                self._pair(gpu_a, gpu_b, gpus=[gpu_a, gpu_b])
                for i, gpu_a in enumerate(self.gpus)
                for gpu_b in self.gpus[i + 1 :]
            ]
        return [dict(pair) for pair in self._pairs]

    def gpu_nic_pairs(self):
        """``[{gpu, nic, bridges, redirecting, acs_unknown, blocked}]`` for every GPU and RDMA NIC
        (GPUDirect RDMA)."""
        if self._nic_pairs is None:
            self._nic_pairs = [self._pair(gpu, nic, gpu=gpu, nic=nic) for gpu in self.gpus for nic in self.nics]
        return [dict(pair) for pair in self._nic_pairs]

    def gpu_path_bridges(self):
        """Bridges in any GPU's upstream chain."""
        result = set()
        for gpu in self.gpus:
            result.update(self.chain(gpu))
        return result

    def peer_path_bridges(self):
        """Bridges crossed by GPU-GPU and GPU-RDMA-NIC peer traffic (the default scope)."""
        result = set()
        for pair in self.gpu_pairs() + self.gpu_nic_pairs():
            result.update(pair["bridges"])
        return result

    def unknown_path_ports(self):
        """``[{bdf, reason}]``: bridges on a GPU or peer path whose ACS state cannot be known."""
        on_path = self.gpu_path_bridges() | self.peer_path_bridges()
        return [
            {"bdf": bdf, "reason": self.devices[bdf].config.ext_space_reason(bdf)}
            for bdf in sorted(self.acs_unknown(on_path))
        ]

    def ports(self):
        """BDFs of every bridge and every function with an ACS capability, sorted."""
        return sorted(bdf for bdf, dev in self.devices.items() if dev.config.is_bridge or dev.config.acs is not None)

    def acs_bridges(self):
        return sorted(bdf for bdf, dev in self.devices.items() if dev.config.is_bridge and dev.config.acs is not None)

    def below(self, bdf):
        """Functions whose upstream chain contains ``bdf``."""
        return sorted(other for other, dev in self.devices.items() if bdf in dev.chain)

    def iommu_group_members(self, bdf):
        """BDFs in the same IOMMU group as ``bdf`` (read from the group's ``devices`` dir)."""
        dev = self.devices[bdf]
        if dev.iommu_group is None:
            return []
        group_dir = os.path.join(dev.path, "iommu_group", "devices")
        try:
            return sorted(name for name in os.listdir(group_dir) if _SYSFS_BDF_RE.match(name))
        except OSError:
            return sorted(other for other, odev in self.devices.items() if odev.iommu_group == dev.iommu_group)

    def host_bridge_of(self, bdf):
        """The ``pci<domain>:<bus>`` directory a function sits under (None when unknown)."""
        dev = self.devices[bdf]
        top = dev.chain[0] if dev.chain else bdf
        return top.rsplit(":", 1)[0]

    def affected_by(self, bdf):
        """Functions whose isolation a change of ``bdf``'s ACS Control touches.

        Redirect at a switch downstream port decides whether peer requests from below it reach
        the ports beside it directly, so every function below the port's upstream bridge counts;
        for a root port, every function below any root port of the same host bridge.
        """
        dev = self.devices[bdf]
        if dev.chain:
            parent = dev.chain[-1]
            return sorted(other for other, odev in self.devices.items() if parent in odev.chain and other != bdf)
        host = self.host_bridge_of(bdf)
        return sorted(
            other
            for other, odev in self.devices.items()
            if other != bdf and odev.chain and self.host_bridge_of(other) == host
        )

    def vfio_conflicts(self, bdfs, driver="vfio-pci"):
        """``[{bdf, driver, port, reason}]``: devices bound to ``driver`` that a change of the
        ACS Control of any of ``bdfs`` would expose (the port itself, its IOMMU group, or a
        function whose peer traffic it routes)."""
        conflicts = []
        seen = set()

        def add(other, port, reason):
            if (other, port) in seen:
                return
            if self.devices.get(other) is not None and self.devices[other].driver == driver:
                seen.add((other, port))
                conflicts.append({"bdf": other, "driver": driver, "port": port, "reason": reason})

        for port in bdfs:
            add(port, port, "the port itself is bound to %s" % driver)
            for member in self.iommu_group_members(port):
                add(member, port, "in IOMMU group %s with %s" % (self.devices[port].iommu_group, port))
            for other in self.affected_by(port):
                add(other, port, "its peer traffic is routed by %s" % port)
        return conflicts

    # -- the audit (what pcie_acs_info returns) -----------------------------------------------
    def port_record(self, bdf, gpu_path=None, peer_path=None):
        dev = self.devices[bdf]
        cfg = dev.config
        acs = cfg.acs
        if gpu_path is None:
            gpu_path = self.gpu_path_bridges()
        if peer_path is None:
            peer_path = self.peer_path_bridges()
        return {
            "bdf": bdf,
            "vendor_id": "0x%04x" % cfg.vendor_id,
            "device_id": "0x%04x" % cfg.device_id,
            "class": "0x%04x" % cfg.class_code,
            "port_type": cfg.port_type,
            "is_bridge": cfg.is_bridge,
            "acs_offset": acs["offset"] if acs else None,
            "acs_cap": acs["cap"] if acs else None,
            "acs_ctl": acs["ctl"] if acs else None,
            "acs_cap_flags": decode_acs(acs["cap"]) if acs else None,
            "acs_ctl_flags": decode_acs(acs["ctl"]) if acs else None,
            "acs_quirk": acs["quirk"] if acs else None,
            "redirect": _pcipath.redirects(acs["ctl"]) if acs else False,
            "acs_unknown": cfg.ext_space_unknown,
            "on_gpu_path": bdf in gpu_path,
            "on_peer_path": bdf in peer_path,
            "link": cfg.link(),
            "upstream": list(dev.chain),
            "driver": dev.driver,
            "iommu_group": dev.iommu_group,
        }

    def endpoint_record(self, bdf):
        dev = self.devices[bdf]
        cfg = dev.config
        return {
            "bdf": bdf,
            "vendor_id": "0x%04x" % cfg.vendor_id,
            "device_id": "0x%04x" % cfg.device_id,
            "class": "0x%04x" % cfg.class_code,
            "upstream": list(dev.chain),
            "redirecting_upstream": self.redirecting(dev.chain),
            "link": cfg.link(),
            "driver": dev.driver,
            "iommu_group": dev.iommu_group,
            "numa_node": _int_or_none(read_text(os.path.join(dev.path, "numa_node"))),
        }

    def audit(self):
        gpu_path = self.gpu_path_bridges()
        peer_path = self.peer_path_bridges()
        ports = [self.port_record(bdf, gpu_path, peer_path) for bdf in self.ports()]
        pairs = self.gpu_pairs()
        blocked = [pair for pair in pairs if pair["blocked"]]
        nic_pairs = self.gpu_nic_pairs()
        unknown = self.unknown_path_ports()
        warnings = []
        for bdf in sorted(self.devices):
            for text in self.devices[bdf].config.warnings:
                warnings.append("%s: %s" % (bdf, text))
        for port in unknown:
            warnings.append(port["reason"])
        acs_ports = [p for p in ports if p["acs_cap"] is not None]
        summary = {
            "devices": len(self.devices),
            "ports": len(ports),
            "acs_capable_ports": len(acs_ports),
            "redirecting_ports": sum(1 for p in acs_ports if p["redirect"]),
            "redirecting_peer_path_ports": sum(1 for p in acs_ports if p["redirect"] and p["on_peer_path"]),
            "gpus": len(self.gpus),
            "nics": len(self.nics),
            "gpu_pairs": len(pairs),
            "blocked_gpu_pairs": len(blocked),
            "blocked_gpu_nic_pairs": sum(1 for p in nic_pairs if p["blocked"]),
            "acs_unknown_path_ports": len(unknown),
            # Never clear on a port whose ACS state could not be read.
            "peer_to_peer_clear": not blocked and not any(p["blocked"] for p in nic_pairs) and not unknown,
        }
        return {
            "ports": ports,
            "gpus": [self.endpoint_record(bdf) for bdf in self.gpus],
            "nics": [self.endpoint_record(bdf) for bdf in self.nics],
            "gpu_pairs": pairs,
            "blocked_gpu_pairs": blocked,
            "gpu_nic_pairs": nic_pairs,
            "acs_unknown_ports": unknown,
            "summary": summary,
            "warnings": warnings,
        }


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# -- writes (planning only; the module runs setpci) ------------------------------------------
def plan_acs_write(ctl, mask, state):
    """Target ACS Control value for ``state`` ('cleared' or 'set') of the bits in ``mask``."""
    if state == "cleared":
        return ctl & ~mask & 0xFFFF
    if state == "set":
        return (ctl | mask) & 0xFFFF
    raise ValueError("state must be cleared or set, not %r" % (state,))


def setpci_args(bdf, value, mask, sysfs_path=DEFAULT_SYSFS_PATH):
    """argv (without the setpci binary) for a masked write of ACS Control."""
    args = []
    if sysfs_path and os.path.normpath(sysfs_path) != DEFAULT_SYSFS_PATH:
        args.extend(["-O", "sysfs.path=%s" % sysfs_path])
    args.extend(["-s", bdf, "ECAP_ACS+0x6.w=%04x:%04x" % (value & mask, mask)])
    return args


def read_acs_ctl(sysfs_path, bdf, offset):
    """Re-read one device's ACS Control from its config file (for read-back after a write)."""
    path = os.path.join(sysfs_path, "devices", bdf, "config")
    with open(path, "rb") as handle:
        handle.seek(offset + 6)
        data = handle.read(2)
    if len(data) != 2:
        raise PciConfigTruncated("%s: could not read ACS Control at 0x%03x from %s" % (bdf, offset + 6, path))
    return data[0] | (data[1] << 8)


def kernel_param(bdfs):
    """The ``pci=disable_acs_redir=`` kernel parameter for a list of BDFs ('' when empty)."""
    if not bdfs:
        return ""
    return "pci=disable_acs_redir=%s" % ";".join(bdfs)


# -- the plan of a pcie_acs run --------------------------------------------------------------
SCOPES = ("gpu_paths", "devices", "all_bridges")
_SCOPE_WHY = {
    "gpu_paths": "crossed by GPU-GPU or GPU-RDMA-NIC peer traffic",
    "devices": "named in devices",
    "all_bridges": "an ACS-capable bridge",
}


class AcsPlanError(PciError):
    """The plan cannot be made; nothing may be written. ``port`` is the port concerned, if one."""

    def __init__(self, message, port=None, vfio_conflicts=None):
        super().__init__(message)
        self.port = port
        self.vfio_conflicts = vfio_conflicts or []


def _unknown_error(topo, ports):
    reasons = [topo.devices[bdf].config.ext_space_reason(bdf) for bdf in ports]
    return AcsPlanError(
        "refusing to write ACS Control: the ACS state of %s is unknown. %s. Nothing was "
        "written." % (", ".join(ports), "; ".join(reasons)),
        port=ports[0],
    )


def scope_ports(topo, scope, devices=()):
    """The ports a run handles: BDFs with an ACS capability, sorted (``devices``: as given).

    Raises AcsPlanError when a port in scope cannot be judged (extended config space unread),
    or a named device is missing or has no ACS capability.
    """
    if scope == "devices":
        ports = []
        for bdf in devices:
            dev = topo.devices.get(bdf)
            if dev is None:
                raise AcsPlanError(
                    "PCI device %s is not present under %s/devices; check the address with "
                    "`lspci -D` (or the sysfs_path)" % (bdf, topo.sysfs_path),
                    port=bdf,
                )
            if dev.config.ext_space_unknown:
                raise _unknown_error(topo, [bdf])
            if dev.config.acs is None:
                raise AcsPlanError(
                    "PCI device %s has no ACS extended capability; there is nothing to change "
                    "on it (list the ports above it instead, see pcie_acs_info)" % bdf,
                    port=bdf,
                )
            if bdf not in ports:
                ports.append(bdf)
        return ports
    if scope == "all_bridges":
        unknown = sorted(
            bdf for bdf, dev in topo.devices.items() if dev.config.is_bridge and dev.config.ext_space_unknown
        )
        if unknown:
            raise _unknown_error(topo, unknown)
        return topo.acs_bridges()
    if scope != "gpu_paths":
        raise ValueError("scope must be one of %s, not %r" % (", ".join(SCOPES), scope))
    unknown = [port["bdf"] for port in topo.unknown_path_ports()]
    if unknown:
        raise _unknown_error(topo, unknown)
    return sorted(bdf for bdf in topo.peer_path_bridges() if topo.devices[bdf].config.acs is not None)


def plan_acs(topo, scope="gpu_paths", devices=(), bits=_pcipath.ACS_REDIRECT_NAMES, state="cleared", force=False):
    """What a pcie_acs run does, before anything is written (check mode and diff show this).

    Returns ``{'mask', 'ports', 'writes', 'skipped', 'vfio_conflicts', 'kernel_param', 'warnings'}``:
    ``ports`` holds one record per port in scope, in the order they are handled: ``bdf``,
    ``offset`` (of the ACS capability), ``current``, ``target``, ``mask`` (the bits this port may
    change), ``setpci_arg`` (the masked write that puts it in the target state), ``write`` (whether
    it differs now) and ``why``. ``writes`` are the records with ``write``. Raises AcsPlanError when
    a port cannot be judged, or when clearing would expose a vfio-pci device and not ``force``.
    """
    mask = acs_bits_mask(bits)
    plan = {
        "mask": mask,
        "ports": [],
        "writes": [],
        "skipped": [],
        "vfio_conflicts": [],
        "warnings": [],
        "kernel_param": "",
    }
    for bdf in scope_ports(topo, scope, devices):
        acs = topo.devices[bdf].config.acs
        if acs["quirk"]:
            plan["skipped"].append(bdf)
            plan["warnings"].append(
                "%s: skipped, its ACS Control register is not at the standard offset (%s quirk)" % (bdf, acs["quirk"])
            )
            continue
        port_mask = mask if state == "cleared" else mask & acs["cap"]
        target = plan_acs_write(acs["ctl"], port_mask, state)
        write = target != acs["ctl"]
        changing = (acs["ctl"] ^ target) & port_mask
        plan["ports"].append(
            {
                "bdf": bdf,
                "offset": acs["offset"],
                "current": acs["ctl"],
                "target": target,
                "mask": port_mask,
                "setpci_arg": "ECAP_ACS+0x6.w=%04x:%04x" % (target & port_mask, port_mask),
                "write": write,
                "why": "%s; %s"
                % (
                    _SCOPE_WHY[scope],
                    (
                        "%s %s"
                        % ("clear" if state == "cleared" else "set", " ".join(n for n, m in ACS_FLAGS if changing & m))
                        if write
                        else "already holds the target"
                    ),
                ),
            }
        )
    plan["writes"] = [port for port in plan["ports"] if port["write"]]
    if state == "cleared" and plan["writes"]:
        conflicts = topo.vfio_conflicts([port["bdf"] for port in plan["writes"]])
        plan["vfio_conflicts"] = conflicts
        if conflicts and not force:
            raise AcsPlanError(
                "refusing to clear ACS on %s: %s bound to vfio-pci would lose the isolation VMs "
                "rely on (%s); narrow the scope (scope: devices) to ports that route no "
                "passed-through device, or set force: true"
                % (
                    ", ".join(sorted({c["port"] for c in conflicts})),
                    ", ".join(sorted({c["bdf"] for c in conflicts})),
                    "; ".join("%s: %s" % (c["bdf"], c["reason"]) for c in conflicts),
                ),
                vfio_conflicts=conflicts,
            )
        if conflicts:
            plan["warnings"].append(
                "force: clearing ACS although %s is bound to vfio-pci"
                % ", ".join(sorted({c["bdf"] for c in conflicts}))
            )
    if state == "cleared" and set(bits) == set(_pcipath.ACS_REDIRECT_NAMES):
        plan["kernel_param"] = kernel_param([port["bdf"] for port in plan["ports"]])
    return plan
