# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A scanned PCI tree's GPU/NIC view: the bridges between devices and which of them redirect
peer traffic, IOMMU groups, what a change of a port's ACS Control exposes, and the audit
``pcie_acs_info`` returns.

Plain Python (no Ansible imports), runs on target Python 3.8+. The rules (what a GPU is, which
bridges a path crosses, which ACS bits redirect) are ``_path``'s; this file applies them to a tree
read by ``_sysfs``.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _path, _sysfs


class PciTopology:
    """A scanned tree with the GPU/NIC view the ACS modules and the GPU facts need.

    Which devices are GPUs and RDMA NICs, which bridges two devices' peer traffic crosses and
    which of them redirect it are the rules of ``_path``; this class applies them to a tree.
    """

    def __init__(self, devices, sysfs_path=_sysfs.DEFAULT_SYSFS_PATH):
        self.sysfs_path = sysfs_path
        self.devices = devices
        self.gpus = sorted(bdf for bdf, dev in devices.items() if dev.is_gpu)
        self.nics = sorted(bdf for bdf, dev in devices.items() if dev.is_rdma_nic)
        self._pairs = None
        self._nic_pairs = None

    @classmethod
    def scan(cls, sysfs_path=_sysfs.DEFAULT_SYSFS_PATH, with_config=True):
        return cls(_sysfs.scan_tree(sysfs_path, with_config=with_config), sysfs_path)

    def chain(self, bdf):
        return self.devices[bdf].chain

    def acs_ctl(self, bdf):
        """ACS Control of a function, or None (not in the tree, or no ACS capability)."""
        dev = self.devices.get(bdf)
        return dev.config.acs_ctl if dev is not None else None

    def bridges_between(self, bdf_a, bdf_b):
        """Bridges peer traffic from ``bdf_a`` to ``bdf_b`` crosses, in the order it crosses them."""
        return _path.crossed_bridges(self.devices[bdf_a].chain, self.devices[bdf_b].chain)

    def redirecting(self, bridges):
        """Those of ``bridges`` whose ACS Control redirects peer traffic."""
        return _path.redirecting(bridges, self.acs_ctl)

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
            return sorted(name for name in os.listdir(group_dir) if _sysfs.SYSFS_BDF_RE.match(name))
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
            "acs_cap_flags": _config_space.decode_acs(acs["cap"]) if acs else None,
            "acs_ctl_flags": _config_space.decode_acs(acs["ctl"]) if acs else None,
            "acs_quirk": acs["quirk"] if acs else None,
            "redirect": _path.redirects(acs["ctl"]) if acs else False,
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
            "numa_node": _int_or_none(_sysfs.read_text(os.path.join(dev.path, "numa_node"))),
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
