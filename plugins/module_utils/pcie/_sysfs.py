# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sysfs PCI tree, read: its functions, the bridges above each, their config space, drivers
and IOMMU groups.

Plain Python (no Ansible imports), runs on target Python 3.8+.

A sysfs PCI tree is what pciutils' ``-O sysfs.path=DIR`` reads: ``DIR/devices/<bdf>`` are links
into ``/sys/devices/pci<domain>:<bus>/<bdf>/<bdf>/...``; every BDF component of that path above a
device is a bridge it sits behind. Each ``config`` file is read once and decoded by
``_config_space``.
"""

from __future__ import annotations

import errno
import os
import re

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _path

DEFAULT_SYSFS_PATH = "/sys/bus/pci"

SYSFS_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")


class PciTreeMissing(_config_space.PciError):
    """The sysfs PCI tree does not exist or has no devices directory."""


class PciDeviceMissing(_config_space.PciError):
    """A BDF that is not in the tree."""


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
        return _path.is_gpu(self.config.vendor_id, self.config.class_code)

    @property
    def is_rdma_nic(self):
        return _path.is_rdma_nic(self.config.vendor_id, self.config.class_code, self.driver)


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
        if started and SYSFS_BDF_RE.match(part):
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
        raise _config_space.PciConfigTruncated(
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
            if not SYSFS_BDF_RE.match(name):
                continue
            dev_path = entry.path
            chain = _upstream_chain(devices_dir, name, entry.is_symlink())
            if with_config:
                try:
                    config = _config_space.PciConfig(read_config(os.path.join(dev_path, "config"), name))
                except _config_space.PciConfigTruncated:
                    raise
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM):
                        raise _config_space.PciConfigTruncated(
                            "%s: cannot read %s (%s): run as root (become: true)"
                            % (name, os.path.join(dev_path, "config"), exc.strerror)
                        ) from exc
                    raise _config_space.PciError(
                        "%s: cannot read %s: %s" % (name, os.path.join(dev_path, "config"), exc)
                    ) from exc
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
    if cls >> 8 == _config_space.CLASS_BRIDGE_PCI:
        data[0x0E] = 1
    return _config_space.PciConfig(bytes(data))


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
