# SPDX-License-Identifier: GPL-3.0-or-later
"""Sysfs trees of RDMA nodes for the rdma_health tests, in the kernel's layout: the device under
its PCI function (``devices/pci0000:00/<bridges>/<bdf>/infiniband/<dev>``), linked from
``class/infiniband/<dev>``, with ``device`` pointing back at the function, ``ports/<n>/`` files
and ``counters/``, ``class/infiniband_verbs/uverbs<N>/ibdev``, and ``/dev/infiniband/uverbs<N>``
(a plain file: only its existence is read).

The values are those of the real samples in tests/data/rdma (see its SOURCE): an HGX H100's
ConnectX-7 (``fw_ver``, ``hca_type``, ``board_id``, ``rate``, ``state``, ``phys_state``,
``link_layer`` from sysfs-h100/, the counter names and values from counters-h100-cx7-mlx5_1.txt).
The trees themselves are synthetic: a healthy port resets that dump's three saturated error
counters (link_downed 255, excessive_buffer_overrun_errors 15, port_xmit_discards 65535) to 0.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "rdma"


def sample(name):
    return (DATA / name).read_text()


def sysfs_value(relpath):
    """A file of tests/data/rdma/sysfs-h100 (gpud's capture of an H100 node), as the kernel
    prints it (with its newline)."""
    return (DATA / "sysfs-h100" / relpath).read_text().strip() + "\n"


def dump_counters(name="counters-h100-cx7-mlx5_1.txt"):
    """``{counter: text}`` of a ``=== ./name ===`` dump of a counters directory."""
    found = re.findall(r"^=== \./(\S+) ===\n(.*)\n", sample(name), re.M)
    return dict(found)


def healthy_counters():
    counters = {k: int(v) for k, v in dump_counters().items()}
    counters.update(link_downed=0, excessive_buffer_overrun_errors=0, port_xmit_discards=0)
    return counters


CX7_NDR = {
    "fw_ver": sysfs_value("mlx5_4/fw_ver"),
    "hca_type": sysfs_value("mlx5_9/hca_type"),
    "board_id": sysfs_value("mlx5_7/board_id"),
}
NDR_PORT = {
    "state": sysfs_value("mlx5_0/ports/1/state"),
    "phys_state": sysfs_value("mlx5_6/ports/1/phys_state"),
    "rate": sysfs_value("mlx5_0/ports/1/rate"),
    "link_layer": sysfs_value("mlx5_5/ports/1/link_layer"),
}


class Node:
    """A node's sysfs tree under ``root/sys`` and its device nodes under ``root/dev``."""

    def __init__(self, root):
        self.root = Path(root)
        self.sys = self.root / "sys"
        self.dev = self.root / "dev"
        (self.sys / "class").mkdir(parents=True, exist_ok=True)
        self.dirs = {}

    def add(self, name, bdf, bridges=(), ports=None, device=None, uverbs=None, dev_node=True, hw_counters=None):
        """One device; ``ports`` is ``{n: {file: text}}`` (NDR_PORT and healthy counters by
        default), ``device`` its own files (CX7_NDR by default)."""
        pci = self.sys / "devices" / "pci0000:00"
        for bridge in bridges:
            pci = pci / bridge
        dev_dir = pci / bdf / "infiniband" / name
        dev_dir.mkdir(parents=True)
        for file, text in (device if device is not None else CX7_NDR).items():
            (dev_dir / file).write_text(text)
        os.symlink(os.path.join("..", "..", "..", bdf), dev_dir / "device")
        klass = self.sys / "class" / "infiniband"
        klass.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(dev_dir, klass), klass / name)
        for number, files in (ports if ports is not None else {1: dict(NDR_PORT)}).items():
            port_dir = dev_dir / "ports" / str(number)
            (port_dir / "counters").mkdir(parents=True)
            for file, text in files.items():
                (port_dir / file).write_text(text)
            for counter, value in healthy_counters().items():
                (port_dir / "counters" / counter).write_text("%d\n" % value)
            if hw_counters is not None:
                (port_dir / "hw_counters").mkdir()
                for counter, value in hw_counters.items():
                    (port_dir / "hw_counters" / counter).write_text("%s\n" % value)
        if uverbs is not None:
            verbs = self.sys / "class" / "infiniband_verbs" / uverbs
            verbs.mkdir(parents=True)
            (verbs / "ibdev").write_text(name + "\n")
            if dev_node:
                (self.dev / "infiniband").mkdir(parents=True, exist_ok=True)
                (self.dev / "infiniband" / uverbs).write_text("")
        self.dirs[name] = dev_dir
        return dev_dir

    def port_file(self, name, port, relpath):
        return self.dirs[name] / "ports" / str(port) / relpath

    def write(self, name, port, relpath, text):
        path = self.port_file(name, port, relpath)
        if text is None:
            path.unlink()
        else:
            path.write_text(text)


def hgx_ndr(root, count=8):
    """An HGX H100 node: ``count`` ConnectX-7 NDR InfiniBand ports mlx5_0.. behind PCIe switches,
    each with its uverbs node."""
    node = Node(root)
    for i in range(count):
        node.add(
            "mlx5_%d" % i,
            "0000:%02x:00.0" % (0x18 + 0x10 * i),
            bridges=(
                "0000:00:01.%d" % (i % 8),
                "0000:%02x:00.0" % (0x16 + 0x10 * i),
                "0000:%02x:00.0" % (0x17 + 0x10 * i),
            ),
            uverbs="uverbs%d" % i,
        )
    return node
