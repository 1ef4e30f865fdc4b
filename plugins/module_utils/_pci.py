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

DEFAULT_SYSFS_PATH = '/sys/bus/pci'

# ACS Capability / Control bits, in the order and with the names lspci prints.
ACS_FLAGS = (
    ('SrcValid', 0x0001),
    ('TransBlk', 0x0002),
    ('ReqRedir', 0x0004),
    ('CmpltRedir', 0x0008),
    ('UpstreamFwd', 0x0010),
    ('EgressCtrl', 0x0020),
    ('DirectTrans', 0x0040),
)
ACS_FLAG_NAMES = tuple(name for name, _mask in ACS_FLAGS)
ACS_FLAG_MASK = dict(ACS_FLAGS)
ACS_KNOWN_MASK = 0x007f
# The bits that send peer-to-peer traffic up to the root complex (what the kernel's
# pci=disable_acs_redir= clears and what NCCL's troubleshooting guide says to turn off).
ACS_REDIRECT_MASK = 0x0004 | 0x0008 | 0x0020
ACS_REDIRECT_NAMES = ('ReqRedir', 'CmpltRedir', 'EgressCtrl')

PCI_CAP_ID_EXP = 0x10
PCI_EXT_CAP_ID_ACS = 0x000d
PCI_STATUS_CAP_LIST = 0x10

PORT_TYPES = {
    0x0: 'endpoint',
    0x1: 'legacy_endpoint',
    0x2: 'unknown_2',
    0x3: 'unknown_3',
    0x4: 'root_port',
    0x5: 'upstream_port',
    0x6: 'downstream_port',
    0x7: 'pcie_to_pci_bridge',
    0x8: 'pci_to_pcie_bridge',
    0x9: 'root_complex_integrated_endpoint',
    0xa: 'root_complex_event_collector',
}
# Port types that have no link registers (lspci skips them too).
_NO_LINK_TYPES = (0x9, 0xa)

# Link speed encoding (Link Capabilities / Link Status bits 3:0) -> (generation, lspci text).
LINK_SPEEDS = {
    1: (1, '2.5GT/s'),
    2: (2, '5GT/s'),
    3: (3, '8GT/s'),
    4: (4, '16GT/s'),
    5: (5, '32GT/s'),
    6: (6, '64GT/s'),
}

VENDOR_NVIDIA = 0x10de
VENDOR_MELLANOX = 0x15b3
CLASS_BRIDGE_PCI = 0x0604
GPU_CLASSES = (0x0300, 0x0302)
CLASS_INFINIBAND = 0x0207
CLASS_ETHERNET = 0x0200

# Intel PCH root ports whose ACS Control register sits at cap+8 instead of cap+6 (Linux
# drivers/pci/quirks.c, pci_quirk_intel_spt_pch_acs_match): lspci shows garbage for them and a
# write to ECAP_ACS+0x6 hits the wrong register.
_INTEL_SPT_PCH_RANGES = ((0xa110, 0xa11f), (0xa167, 0xa16a), (0xa290, 0xa29f),
                         (0xa2e7, 0xa2ee), (0x9d10, 0x9d1b))

_BDF_RE = re.compile(r'^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$')
_SYSFS_BDF_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$')


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
        raise ValueError('PCI address %r is not a string' % (text,))
    match = _BDF_RE.match(text.strip())
    if not match:
        raise ValueError(
            "malformed PCI address %r: expected [domain:]bus:device.function in hex, "
            "e.g. 0000:01:00.0 (device 00-1f, function 0-7)" % (text,))
    domain, bus, dev, fn = match.groups()
    return '%04x:%02x:%02x.%d' % (int(domain or '0', 16), int(bus, 16), int(dev, 16), int(fn))


def decode_acs(value):
    """Decode an ACS Capability or Control value into ``{lspci name: bool}``.

    Unknown high bits (enhanced ACS and beyond) are returned under ``other_bits`` as an int.
    ``None`` in, ``None`` out.
    """
    if value is None:
        return None
    flags = dict((name, bool(value & mask)) for name, mask in ACS_FLAGS)
    flags['other_bits'] = value & ~ACS_KNOWN_MASK & 0xffff
    return flags


def format_acs(value):
    """The text lspci prints after ``ACSCap:``/``ACSCtl:`` for a value."""
    return ' '.join('%s%s' % (name, '+' if value & mask else '-') for name, mask in ACS_FLAGS)


def acs_bits_mask(names):
    """Mask for a list of lspci flag names; ValueError on an unknown name."""
    mask = 0
    for name in names:
        if name not in ACS_FLAG_MASK:
            raise ValueError('unknown ACS flag %r; known flags: %s' % (name, ', '.join(ACS_FLAG_NAMES)))
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


class PciConfig(object):
    """Decoded configuration space of one function.

    Tolerates short data (dumps of 64 or 256 bytes): whatever lies beyond the end is absent.
    Problems found on the way (broken or looped chains) are listed in ``warnings``.
    """

    __slots__ = ('length', 'vendor_id', 'device_id', 'class_code', 'prog_if', 'header_type',
                 'caps', 'ext_caps', 'pcie', 'acs', 'warnings')

    def __init__(self, data):
        if len(data) < 64:
            raise PciConfigTruncated('config space is %d bytes; at least the 64-byte header is needed'
                                     % len(data))
        self.length = len(data)
        self.vendor_id = _word(data, 0x00)
        self.device_id = _word(data, 0x02)
        self.prog_if = data[0x09]
        self.class_code = _word(data, 0x0a)  # base class << 8 | subclass
        self.header_type = data[0x0e] & 0x7f
        self.caps = []       # [(id, offset)]
        self.ext_caps = []   # [(id, version, offset)]
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
                    self.warnings.append('capability at 0x%02x lies beyond the %d bytes read'
                                         % (where, len(data)))
                break
            if where in seen:
                self.warnings.append('capability chain looped at 0x%02x' % where)
                break
            seen.add(where)
            cap_id = data[where]
            if cap_id == 0xff:
                self.warnings.append('capability chain broken at 0x%02x' % where)
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
            if header in (0, 0xffffffff):
                break
            if where in seen:
                self.warnings.append('extended capability chain looped at 0x%03x' % where)
                break
            seen.add(where)
            self.ext_caps.append((header & 0xffff, (header >> 16) & 0xf, where))
            where = (header >> 20) & 0xffc
            if where and where < 0x100:
                self.warnings.append('extended capability next pointer 0x%03x is below 0x100' % where)
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
        ptype = (flags >> 4) & 0xf
        pcie = {
            'offset': off,
            'version': flags & 0xf,
            'port_type_code': ptype,
            'port_type': PORT_TYPES.get(ptype, 'unknown_%d' % ptype),
            'link_cap_speed': None, 'link_cap_width': None,
            'link_sta_speed': None, 'link_sta_width': None,
        }
        if ptype not in _NO_LINK_TYPES:
            lnkcap = _dword(data, off + 0x0c)
            lnksta = _word(data, off + 0x12)
            if lnkcap is not None:
                pcie['link_cap_speed'] = lnkcap & 0xf
                pcie['link_cap_width'] = (lnkcap >> 4) & 0x3f
            if lnksta is not None:
                pcie['link_sta_speed'] = lnksta & 0xf
                pcie['link_sta_width'] = (lnksta >> 4) & 0x3f
        self.pcie = pcie

    @property
    def port_type(self):
        return self.pcie['port_type'] if self.pcie else None

    def link(self):
        """``{gen_max, width_max, gen_current, width_current, speed_max, speed_current}`` or None."""
        if not self.pcie or self.pcie['link_cap_speed'] is None:
            return None
        pcie = self.pcie

        def gen(code):
            return LINK_SPEEDS.get(code, (None, 'unknown'))

        return {
            'gen_max': gen(pcie['link_cap_speed'])[0],
            'speed_max': gen(pcie['link_cap_speed'])[1],
            'width_max': pcie['link_cap_width'],
            'gen_current': gen(pcie['link_sta_speed'])[0] if pcie['link_sta_speed'] is not None else None,
            'speed_current': gen(pcie['link_sta_speed'])[1] if pcie['link_sta_speed'] is not None else None,
            'width_current': pcie['link_sta_width'],
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
            'offset': off,
            'cap': cap,
            'ctl': ctl,
            'egress_vector_bits': (cap >> 8) & 0xff if cap & 0x0020 else 0,
            'quirk': None,
        }
        ptype = self.pcie['port_type_code'] if self.pcie else None
        if _intel_spt_pch_quirk(self.vendor_id, self.device_id, ptype):
            acs['quirk'] = 'intel_spt_pch'
            self.warnings.append('Intel PCH root port %04x:%04x keeps ACS Control at cap+8 '
                                 '(kernel quirk); lspci and setpci ECAP_ACS+0x6 see the wrong register'
                                 % (self.vendor_id, self.device_id))
        self.acs = acs

    @property
    def acs_cap(self):
        return self.acs['cap'] if self.acs else None

    @property
    def acs_ctl(self):
        return self.acs['ctl'] if self.acs else None

    @property
    def is_bridge(self):
        return self.class_code == CLASS_BRIDGE_PCI or self.header_type == 1


def acs_ctl_at(data, offset):
    """ACS Control word of a config blob whose ACS capability is at ``offset`` (for read-back)."""
    return _word(data, offset + 6)


# -- dumps -----------------------------------------------------------------------------------
_DUMP_DEV_RE = re.compile(r'^((?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s')
_DUMP_HEX_RE = re.compile(r'^([0-9a-fA-F]{2,3}):((?:\s[0-9a-fA-F]{2})+)\s*$')


def parse_lspci_dump(text):
    """Parse ``lspci -x/-xxx/-xxxx`` output (also with ``-vvv`` text between) into ``{bdf: bytes}``.

    This is the format ``lspci -F FILE`` reads. BDFs are kept as printed (``00:02.0``).
    """
    result = {}
    current = None
    for line in text.splitlines():
        match = _DUMP_DEV_RE.match(line)
        if match:
            current = match.group(1)
            result[current] = bytearray()
            continue
        match = _DUMP_HEX_RE.match(line)
        if match and current is not None:
            off = int(match.group(1), 16)
            values = bytes(int(x, 16) for x in match.group(2).split())
            blob = result[current]
            if len(blob) < off:
                blob.extend(b'\xff' * (off - len(blob)))
            blob[off:off + len(values)] = values
    return dict((bdf, bytes(blob)) for bdf, blob in result.items() if blob)


# -- sysfs trees -----------------------------------------------------------------------------
class PciDevice(object):
    """One function of a sysfs PCI tree."""

    __slots__ = ('bdf', 'path', 'chain', 'config', 'driver', 'iommu_group')

    def __init__(self, bdf, path, chain, config, driver, iommu_group):
        self.bdf = bdf
        self.path = path            # the device's directory, as found under <sysfs_path>/devices
        self.chain = chain          # upstream bridges, root first, parent last
        self.config = config        # PciConfig, or None when read without config
        self.driver = driver        # basename of the driver link, or None
        self.iommu_group = iommu_group  # group name (str) or None

    @property
    def vendor_id(self):
        return self.config.vendor_id

    @property
    def class_code(self):
        return self.config.class_code

    @property
    def is_gpu(self):
        return self.config.vendor_id == VENDOR_NVIDIA and self.config.class_code in GPU_CLASSES

    @property
    def is_rdma_nic(self):
        cls = self.config.class_code
        return cls == CLASS_INFINIBAND or (cls == CLASS_ETHERNET and self.config.vendor_id == VENDOR_MELLANOX)


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
    parts = target.replace('\\', '/').split('/')
    chain = []
    started = False
    for part in parts:
        if part.startswith('pci') and ':' in part:
            started = True
            chain = []
            continue
        if started and _SYSFS_BDF_RE.match(part):
            chain.append(part)
    if chain and chain[-1] == entry_name:
        chain.pop()
    return chain


def _devices_dir(sysfs_path):
    devices_dir = os.path.join(sysfs_path, 'devices')
    if not os.path.isdir(devices_dir):
        raise PciTreeMissing(
            "no PCI devices directory at %s: sysfs_path must be a sysfs PCI tree like /sys/bus/pci "
            "(the same meaning as pciutils' -O sysfs.path=); is /sys mounted, or is the path right?"
            % devices_dir)
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
            '%s: read only %d bytes of PCI config space from %s; the kernel gives the capabilities '
            '(ACS lives at 0x100 and above) only to readers with CAP_SYS_ADMIN: run as root '
            '(become: true)' % (bdf or path, len(data), path))
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
                    config = PciConfig(read_config(os.path.join(dev_path, 'config'), name))
                except PciConfigTruncated:
                    raise
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM):
                        raise PciConfigTruncated(
                            '%s: cannot read %s (%s): run as root (become: true)'
                            % (name, os.path.join(dev_path, 'config'), exc.strerror))
                    raise PciError('%s: cannot read %s: %s' % (name, os.path.join(dev_path, 'config'), exc))
            else:
                config = _header_only_config(dev_path)
            devices[name] = PciDevice(
                bdf=name, path=dev_path, chain=chain, config=config,
                driver=_link_basename(os.path.join(dev_path, 'driver')),
                iommu_group=_link_basename(os.path.join(dev_path, 'iommu_group')))
    if not devices and not os.listdir(devices_dir):
        raise PciTreeMissing('no PCI devices under %s: is this a sysfs PCI tree?' % devices_dir)
    return devices


def _read_hex_file(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip(), 16)
    except (OSError, ValueError):
        return None


def _header_only_config(dev_path):
    vendor = _read_hex_file(os.path.join(dev_path, 'vendor')) or 0xffff
    device = _read_hex_file(os.path.join(dev_path, 'device')) or 0xffff
    cls = _read_hex_file(os.path.join(dev_path, 'class')) or 0
    data = bytearray(64)
    data[0:2] = vendor.to_bytes(2, 'little')
    data[2:4] = device.to_bytes(2, 'little')
    data[9] = cls & 0xff
    data[0x0a] = (cls >> 8) & 0xff
    data[0x0b] = (cls >> 16) & 0xff
    if cls >> 8 == CLASS_BRIDGE_PCI:
        data[0x0e] = 1
    return PciConfig(bytes(data))


def read_text(path):
    """Contents of a small text file (a sysfs attribute), stripped, or None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536).decode('utf-8', 'replace').strip()
    except OSError:
        return None
    finally:
        os.close(fd)


# -- topology and audit ----------------------------------------------------------------------
def crossed_bridges(chain_a, chain_b):
    """Bridges peer traffic between two functions crosses: both chains minus their common top.

    Two functions below one switch cross only the two downstream ports; below different root
    ports they cross every bridge of both chains (the root ports included).
    """
    common = 0
    for upper_a, upper_b in zip(chain_a, chain_b):
        if upper_a != upper_b:
            break
        common += 1
    # Below the last common bridge the two chains run through different subtrees.
    return list(chain_a[common:]) + list(chain_b[common:])


def redirects(ctl):
    return bool(ctl is not None and ctl & ACS_REDIRECT_MASK)


class PciTopology(object):
    """A scanned tree with the GPU/NIC view the ACS modules need."""

    def __init__(self, devices, sysfs_path=DEFAULT_SYSFS_PATH):
        self.sysfs_path = sysfs_path
        self.devices = devices
        self.gpus = sorted(bdf for bdf, dev in devices.items() if dev.is_gpu)
        self.nics = sorted(bdf for bdf, dev in devices.items() if dev.is_rdma_nic)
        self._redirect_set = frozenset(bdf for bdf, dev in devices.items() if redirects(dev.config.acs_ctl))
        self._pairs = None
        self._nic_pairs = None

    @classmethod
    def scan(cls, sysfs_path=DEFAULT_SYSFS_PATH):
        return cls(scan_tree(sysfs_path), sysfs_path)

    def chain(self, bdf):
        return self.devices[bdf].chain

    def gpu_pairs(self):
        """``[(gpu_a, gpu_b, crossed_bridges, redirecting_bridges)]`` for every GPU pair."""
        if self._pairs is None:
            pairs = []
            for i, gpu_a in enumerate(self.gpus):
                chain_a = self.devices[gpu_a].chain
                for gpu_b in self.gpus[i + 1:]:
                    crossed = crossed_bridges(chain_a, self.devices[gpu_b].chain)
                    pairs.append((gpu_a, gpu_b, crossed, self._redirecting(crossed)))
            self._pairs = pairs
        return list(self._pairs)

    def gpu_nic_pairs(self):
        """Like gpu_pairs, for every GPU and RDMA NIC (GPUDirect RDMA)."""
        if self._nic_pairs is None:
            pairs = []
            for gpu in self.gpus:
                chain_gpu = self.devices[gpu].chain
                for nic in self.nics:
                    crossed = crossed_bridges(chain_gpu, self.devices[nic].chain)
                    pairs.append((gpu, nic, crossed, self._redirecting(crossed)))
            self._nic_pairs = pairs
        return list(self._nic_pairs)

    def _redirecting(self, bridges):
        red = self._redirect_set
        return [bdf for bdf in bridges if bdf in red]

    def gpu_path_bridges(self):
        """Bridges in any GPU's upstream chain."""
        result = set()
        for gpu in self.gpus:
            result.update(self.chain(gpu))
        return result

    def peer_path_bridges(self):
        """Bridges crossed by GPU-GPU and GPU-RDMA-NIC peer traffic (the default scope)."""
        result = set()
        for _a, _b, crossed, _red in self.gpu_pairs() + self.gpu_nic_pairs():
            result.update(crossed)
        return result

    def ports(self):
        """BDFs of every bridge and every function with an ACS capability, sorted."""
        return sorted(bdf for bdf, dev in self.devices.items()
                      if dev.config.is_bridge or dev.config.acs is not None)

    def acs_bridges(self):
        return sorted(bdf for bdf, dev in self.devices.items()
                      if dev.config.is_bridge and dev.config.acs is not None)

    def below(self, bdf):
        """Functions whose upstream chain contains ``bdf``."""
        return sorted(other for other, dev in self.devices.items() if bdf in dev.chain)

    def iommu_group_members(self, bdf):
        """BDFs in the same IOMMU group as ``bdf`` (read from the group's ``devices`` dir)."""
        dev = self.devices[bdf]
        if dev.iommu_group is None:
            return []
        group_dir = os.path.join(dev.path, 'iommu_group', 'devices')
        try:
            return sorted(name for name in os.listdir(group_dir) if _SYSFS_BDF_RE.match(name))
        except OSError:
            return sorted(other for other, odev in self.devices.items()
                          if odev.iommu_group == dev.iommu_group)

    def host_bridge_of(self, bdf):
        """The ``pci<domain>:<bus>`` directory a function sits under (None when unknown)."""
        dev = self.devices[bdf]
        top = dev.chain[0] if dev.chain else bdf
        return top.rsplit(':', 1)[0]

    def affected_by(self, bdf):
        """Functions whose isolation a change of ``bdf``'s ACS Control touches.

        Redirect at a switch downstream port decides whether peer requests from below it reach
        the ports beside it directly, so every function below the port's upstream bridge counts;
        for a root port, every function below any root port of the same host bridge.
        """
        dev = self.devices[bdf]
        if dev.chain:
            parent = dev.chain[-1]
            return sorted(other for other, odev in self.devices.items()
                          if parent in odev.chain and other != bdf)
        host = self.host_bridge_of(bdf)
        return sorted(other for other, odev in self.devices.items()
                      if other != bdf and odev.chain and self.host_bridge_of(other) == host)

    def vfio_conflicts(self, bdfs, driver='vfio-pci'):
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
                conflicts.append({'bdf': other, 'driver': driver, 'port': port, 'reason': reason})

        for port in bdfs:
            add(port, port, 'the port itself is bound to %s' % driver)
            for member in self.iommu_group_members(port):
                add(member, port, 'in IOMMU group %s with %s' % (self.devices[port].iommu_group, port))
            for other in self.affected_by(port):
                add(other, port, 'its peer traffic is routed by %s' % port)
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
            'bdf': bdf,
            'vendor_id': '0x%04x' % cfg.vendor_id,
            'device_id': '0x%04x' % cfg.device_id,
            'class': '0x%04x' % cfg.class_code,
            'port_type': cfg.port_type,
            'is_bridge': cfg.is_bridge,
            'acs_offset': acs['offset'] if acs else None,
            'acs_cap': acs['cap'] if acs else None,
            'acs_ctl': acs['ctl'] if acs else None,
            'acs_cap_flags': decode_acs(acs['cap']) if acs else None,
            'acs_ctl_flags': decode_acs(acs['ctl']) if acs else None,
            'acs_quirk': acs['quirk'] if acs else None,
            'redirect': redirects(acs['ctl']) if acs else False,
            'on_gpu_path': bdf in gpu_path,
            'on_peer_path': bdf in peer_path,
            'link': cfg.link(),
            'upstream': list(dev.chain),
            'driver': dev.driver,
            'iommu_group': dev.iommu_group,
        }

    def endpoint_record(self, bdf):
        dev = self.devices[bdf]
        cfg = dev.config
        return {
            'bdf': bdf,
            'vendor_id': '0x%04x' % cfg.vendor_id,
            'device_id': '0x%04x' % cfg.device_id,
            'class': '0x%04x' % cfg.class_code,
            'upstream': list(dev.chain),
            'redirecting_upstream': self._redirecting(dev.chain),
            'link': cfg.link(),
            'driver': dev.driver,
            'iommu_group': dev.iommu_group,
            'numa_node': _int_or_none(read_text(os.path.join(dev.path, 'numa_node'))),
        }

    def audit(self):
        gpu_path = self.gpu_path_bridges()
        peer_path = self.peer_path_bridges()
        ports = [self.port_record(bdf, gpu_path, peer_path) for bdf in self.ports()]
        pairs = []
        blocked = []
        for gpu_a, gpu_b, crossed, redirecting in self.gpu_pairs():
            record = {'gpus': [gpu_a, gpu_b], 'bridges': crossed, 'redirecting': redirecting,
                      'blocked': bool(redirecting)}
            pairs.append(record)
            if redirecting:
                blocked.append(record)
        nic_pairs = []
        for gpu, nic, crossed, redirecting in self.gpu_nic_pairs():
            nic_pairs.append({'gpu': gpu, 'nic': nic, 'bridges': crossed, 'redirecting': redirecting,
                              'blocked': bool(redirecting)})
        warnings = []
        for bdf in sorted(self.devices):
            for text in self.devices[bdf].config.warnings:
                warnings.append('%s: %s' % (bdf, text))
        acs_ports = [p for p in ports if p['acs_cap'] is not None]
        summary = {
            'devices': len(self.devices),
            'ports': len(ports),
            'acs_capable_ports': len(acs_ports),
            'redirecting_ports': sum(1 for p in acs_ports if p['redirect']),
            'redirecting_peer_path_ports': sum(1 for p in acs_ports if p['redirect'] and p['on_peer_path']),
            'gpus': len(self.gpus),
            'nics': len(self.nics),
            'gpu_pairs': len(pairs),
            'blocked_gpu_pairs': len(blocked),
            'blocked_gpu_nic_pairs': sum(1 for p in nic_pairs if p['blocked']),
            'peer_to_peer_clear': not blocked and not any(p['blocked'] for p in nic_pairs),
        }
        return {
            'ports': ports,
            'gpus': [self.endpoint_record(bdf) for bdf in self.gpus],
            'nics': [self.endpoint_record(bdf) for bdf in self.nics],
            'gpu_pairs': pairs,
            'blocked_gpu_pairs': blocked,
            'gpu_nic_pairs': nic_pairs,
            'summary': summary,
            'warnings': warnings,
        }


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


# -- writes (planning only; the module runs setpci) ------------------------------------------
def plan_acs_write(ctl, mask, state):
    """Target ACS Control value for ``state`` ('cleared' or 'set') of the bits in ``mask``."""
    if state == 'cleared':
        return ctl & ~mask & 0xffff
    if state == 'set':
        return (ctl | mask) & 0xffff
    raise ValueError('state must be cleared or set, not %r' % (state,))


def setpci_args(bdf, value, mask, sysfs_path=DEFAULT_SYSFS_PATH):
    """argv (without the setpci binary) for a masked write of ACS Control."""
    args = []
    if sysfs_path and os.path.normpath(sysfs_path) != DEFAULT_SYSFS_PATH:
        args.extend(['-O', 'sysfs.path=%s' % sysfs_path])
    args.extend(['-s', bdf, 'ECAP_ACS+0x6.w=%04x:%04x' % (value & mask, mask)])
    return args


def read_acs_ctl(sysfs_path, bdf, offset):
    """Re-read one device's ACS Control from its config file (for read-back after a write)."""
    path = os.path.join(sysfs_path, 'devices', bdf, 'config')
    with open(path, 'rb') as handle:
        handle.seek(offset + 6)
        data = handle.read(2)
    if len(data) != 2:
        raise PciConfigTruncated('%s: could not read ACS Control at 0x%03x from %s'
                                 % (bdf, offset + 6, path))
    return data[0] | (data[1] << 8)


def kernel_param(bdfs):
    """The ``pci=disable_acs_redir=`` kernel parameter for a list of BDFs ('' when empty)."""
    if not bdfs:
        return ''
    return 'pci=disable_acs_redir=%s' % ';'.join(bdfs)
