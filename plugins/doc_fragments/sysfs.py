# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sysfs_path option every module that reads the PCI tree takes."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  sysfs_path:
    description:
      - The sysfs PCI tree, with the meaning of pciutils' C(-O sysfs.path=); the devices are
        C(<sysfs_path>/devices/<domain:bus:dev.fn>).
      - Point it at a captured or simulated tree to read that instead of this host.
    type: path
    default: /sys/bus/pci
"""
