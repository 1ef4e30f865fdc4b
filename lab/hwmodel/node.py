# SPDX-License-Identifier: GPL-3.0-or-later
"""A built lab machine, answering from its CURRENT registers.

Stand-ins (nvidia-smi, NVML, all_reduce_perf, the vLLM server) ask a `Node` what the hardware
does now: which bridges peer traffic between two GPUs crosses, whether any of them redirects it
(read from the config files on every call, so a `setpci` by a role is seen by the next
measurement), how each link trained.  This reader is deliberately independent of the
collection's own decoder (plugins/module_utils/pcie/_config_space.py): the lab must not share the bugs of the
code it tests.  It knows where it put each register, because it put them there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import health as H
from . import tree as B
from .profiles import CMPLT_REDIR, DRIVER_VERSION, EGRESS_CTRL, GPU_MODELS, REQ_REDIR

REDIRECT_BITS = REQ_REDIR | CMPLT_REDIR | EGRESS_CTRL
ROOT_ENV = "GPUFLEET_LAB_ROOT"


class Device:
    """One PCI function of the node, with live register reads."""

    def __init__(self, node, rec):
        self._node = node
        self.rec = rec
        self.bdf = rec["bdf"]
        self.kind = rec["kind"]
        self.role = rec["role"]
        self.parent = rec["parent"]
        self.numa_node = rec["numa_node"]
        self.host_bridge = rec["host_bridge"]
        self.gen_max = rec["gen_max"]
        self.width_max = rec["width_max"]
        self.name = rec.get("name", "")
        self.index = rec.get("index")

    def __repr__(self):
        return f"<{self.kind} {self.bdf}>"

    @property
    def config_path(self):
        return self._node.sysfs / "devices" / self.bdf / "config"

    def _read(self, offset, size=2):
        with open(self.config_path, "rb") as f:
            f.seek(offset)
            raw = f.read(size)
        return int.from_bytes(raw, "little")

    @property
    def acs_ctl(self):
        """Current ACS Control register, or None for a function without ACS."""
        return None if self.rec["acs_cap"] is None else self._read(B.ACS_ECAP + 6)

    @property
    def link_status(self):
        return self._read(B.PCIE_CAP + 0x12)

    @property
    def gen_current(self):
        return self.link_status & 0xF

    @property
    def width_current(self):
        return (self.link_status >> 4) & 0x3F

    @property
    def driver(self):
        link = self._node.sysfs / "devices" / self.bdf / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None


class Gpu(Device):
    def __init__(self, node, rec):
        super().__init__(node, rec)
        self.uuid = rec["uuid"]
        self.serial = rec["serial"]
        self.memory_total_mib = rec["memory_total_mib"]
        self.nvlinks = rec["nvlinks"]
        model = next(m for m in GPU_MODELS.values() if m["name"] == rec["name"])  # profiles.GPU_MODELS
        self.nvlink_gbps = model["nvlink_gbps"]  # per link; None without NVLink
        self.compute_capability = model["compute_capability"]  # "8.9"
        self.cpu_affinity = rec["cpu_affinity"]


class Node:
    """A lab machine laid out by `build()` under `root`."""

    def __init__(self, root, data):
        self.root = Path(root)
        self.sysfs = self.root / "sys" / "bus" / "pci"
        self.data = data
        self.profile = data
        self.name = data["profile"]
        self.devices = {}
        for rec in data["devices"]:
            cls = Gpu if rec["kind"] == "gpu" else Device
            self.devices[rec["bdf"]] = cls(self, rec)
        self.gpus = sorted((d for d in self.devices.values() if d.kind == "gpu"), key=lambda d: d.index)
        self.nics = sorted((d for d in self.devices.values() if d.kind == "nic"), key=lambda d: d.index)
        self.bridges = [d for d in self.devices.values() if d.kind == "bridge"]

    @classmethod
    def load(cls, root=None):
        root = root or os.environ.get(ROOT_ENV)
        if not root:
            raise RuntimeError(f"no lab machine: set {ROOT_ENV} to the directory hw.build() wrote")
        path = Path(root) / B.NODE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise RuntimeError(f"{path} is missing: {root} is not a lab machine") from None
        return cls(root, data)

    # --- topology (from the model) -------------------------------------------------------------
    def chain(self, bdf):
        """Bridges above a device, nearest first."""
        out, parent = [], self.devices[bdf].parent
        while parent:
            out.append(parent)
            parent = self.devices[parent].parent
        return out

    def _gpu(self, i):
        return self.gpus[i]

    def path_bridges(self, i, j):
        """BDFs of the bridges that peer traffic between GPU i and GPU j crosses."""
        if i == j:
            return []
        a, b = self.chain(self._gpu(i).bdf), self.chain(self._gpu(j).bdf)
        common = set(a) & set(b)
        return [x for x in a if x not in common] + [x for x in reversed(b) if x not in common]

    def pcie_class(self, bdf_a, bdf_b):
        """nvidia-smi's PCIe path class between two functions (GPUs or NICs), ignoring NVLink."""
        if bdf_a == bdf_b:
            return "X"
        a, b = self.devices[bdf_a], self.devices[bdf_b]
        if a.numa_node != b.numa_node:
            return "SYS"
        if a.host_bridge != b.host_bridge:
            return "NODE"
        chain_b = self.chain(bdf_b)
        common = [x for x in self.chain(bdf_a) if x in chain_b]
        if not common:
            return "PHB"
        # Both below the same switch's downstream ports: one switch crossed.
        return "PIX" if self.devices[common[0]].role == "upstream" else "PXB"

    def pcie_link_type(self, i, j):
        """nvidia-smi's PCIe path class between two GPUs, ignoring NVLink."""
        return self.pcie_class(self._gpu(i).bdf, self._gpu(j).bdf)

    def link_type(self, i, j):
        if i == j:
            return "X"
        nv = min(self._gpu(i).nvlinks, self._gpu(j).nvlinks)
        return f"NV{nv}" if nv else self.pcie_link_type(i, j)

    # --- live state (from the current registers) ------------------------------------------------
    def redirecting_bridges(self, i, j):
        """Bridges between GPU i and j whose ACS Control redirects peer traffic right now."""
        return [b for b in self.path_bridges(i, j) if (self.devices[b].acs_ctl or 0) & REDIRECT_BITS]

    def redirected(self, i, j):
        return bool(self.redirecting_bridges(i, j))

    def p2p_status(self, i, j, mode):
        """nvidia-smi topo -p2p status: mode is read|write|nvlink|atomics|pcie (or r w n a p)."""
        mode = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "pcie"}.get(mode, mode)
        if i == j:
            return "X"
        nvlink = min(self._gpu(i).nvlinks, self._gpu(j).nvlinks) > 0
        if mode == "nvlink":
            return "OK" if nvlink else "NS"
        if nvlink and mode != "pcie":
            return "OK"
        if self._gpu(i).driver != "nvidia" or self._gpu(j).driver != "nvidia":
            return "NS"
        if self.pcie_link_type(i, j) == "SYS" and not self.data["interconnect"]["p2p_across_sockets"]:
            return "CNS"
        if self.redirected(i, j):
            return "CNS"
        if mode == "atomics":
            return "NS"
        return "OK"

    # --- GPU health (lab/hwmodel/health.py; read afresh on every call) -------------------------
    @property
    def driver_version(self):
        return self.data.get("driver_version", DRIVER_VERSION)

    @property
    def health(self):
        """The machine's health state now (health.json): faults take effect at once."""
        return H.load(self.root, self.data)

    def gpu_health(self, i, state=None):
        """Health record of model GPU i (ecc, remapped_rows, hw_slowdown, nvlinks_down...)."""
        state = state or self.health
        return state["gpus"].get(str(i)) or H.default_gpu()

    def nvlink_active(self, i, link, state=None):
        return 0 <= link < self._gpu(i).nvlinks and link not in self.gpu_health(i, state)["nvlinks_down"]

    def nvlinks_active(self, i, state=None):
        """How many of GPU i's NVLinks are up right now."""
        return self._gpu(i).nvlinks - len(self.gpu_health(i, state)["nvlinks_down"])

    @property
    def nvswitch_bdfs(self):
        return list((self.data.get("nvswitch") or {}).get("bdfs", []))

    def fabric_manager_active(self, state=None):
        """None on a machine without NVSwitches, else whether nvidia-fabricmanager runs."""
        fm = (state or self.health)["fabric_manager"]
        return None if not fm else bool(fm["active"])

    def set_fabric_manager(self, active):
        """The fabric manager (re)started or stopped (its lab stand-in calls this)."""
        state = self.health
        if state["fabric_manager"]:
            state["fabric_manager"]["active"] = bool(active)
            H.save(self.root, state)

    def driver_fault(self, state=None):
        """None, or how the driver fails nvidia-smi and NVML (health.DRIVER_FAULTS)."""
        return (state or self.health).get("driver")

    def gpu_lost(self, i, state=None):
        """Whether model GPU i fell off the bus (no device handle for it)."""
        return bool(self.gpu_health(i, state).get("lost"))

    def copy_engine_slow(self, i, state=None):
        """Whether model GPU i's copy engines are slow (`lab fault NODE copy-engine-slow --gpu i`):
        what nvbandwidth measures to, from or between it falls behind."""
        return bool(self.gpu_health(i, state).get("copy_engine_slow"))

    def dcgm_faults(self, i, state=None):
        """What only DCGM's active tests find on model GPU i (`lab fault NODE dcgm-memory|dcgm-pcie`):
        a set of `memory`, `pcie`."""
        return set(self.gpu_health(i, state).get("dcgm") or [])

    def nvlink_path(self, i, j):
        """(links up now on both GPUs of the pair, per-link rate GB/s), or None without NVLink."""
        kind = self.link_type(i, j)
        if not kind.startswith("NV"):
            return None
        links = min(int(kind[2:]), self.nvlinks_active(i), self.nvlinks_active(j))
        return links, min(self.gpus[i].nvlink_gbps, self.gpus[j].nvlink_gbps)

    def allreduce_fault(self, state=None):
        """None, or how all_reduce_perf misbehaves: wrong, hang, truncate, crash or slow."""
        return (state or self.health).get("allreduce")

    @property
    def kernel_log(self):
        return H.kmsg_path(self.root)

    def inject(self, kind, gpu=0, code=None):
        """Inject one health fault (see health.KINDS); returns what it did, in words."""
        return H.inject(self.root, self.data, kind, gpu, code)

    # --- lifecycle ------------------------------------------------------------------------------
    def reset_firmware(self):
        """Power cycle: every register back to what firmware and the kernel leave at boot, and
        the health state through a reboot (a new kernel log, a pending remap applied, volatile
        ECC counts reset; faults of the hardware itself stay)."""
        B.write_config_spaces(self.root, self.data)
        H.reboot(self.root, self.data, self.driver_version)
