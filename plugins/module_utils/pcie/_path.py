# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The PCIe/GPU path vocabulary: one home for every rule about the path between two devices.

Plain Python (no Ansible imports), runs on target Python 3.8+. Every other file asks here:

* **Path classes** and their order, best first: ``X`` (self), ``NV#`` (a bonded set of #
  NVLinks; more is better), then the PCIe classes of ``nvidia-smi topo -m``: ``PIX`` < ``PXB``
  < ``PHB`` < ``NODE`` < ``SYS`` (``PATH_CLASSES``, ``link_rank``), and NVML's
  ``nvmlDeviceGetTopologyCommonAncestor`` levels mapped onto them (``NVML_TOPOLOGY_LEVELS``).
  ``HOST_BRIDGE_CLASSES`` are the classes whose path stays under one PCIe host bridge.
* **The bandwidth model**: raw PCIe rate per generation and width, the fraction of it an
  all-reduce hop reaches on each class (``PATH_EFFICIENCY``), NVLink per-link rates
  (``hop_gbps``). ``nccl/_threshold.expected_busbw`` builds the gate's threshold from it.
* **Bridges crossed** between two devices (``crossed_bridges``), and **redirect blocking**:
  which ACS Control bits send peer traffic up to the root complex (``ACS_REDIRECT_MASK``,
  ``redirects``) and which crossed bridges do (``redirecting``).
* **Device classes**: what a GPU is and what an RDMA NIC is (``is_gpu``, ``is_rdma_nic``).

The lab (``lab/``) simulates the same facts from its hardware model and never imports this
file: it is the oracle the rules here are checked against.
"""

from __future__ import annotations

import re

# -- path classes ------------------------------------------------------------------------------
#: nvidia-smi topo -m PCIe path classes, best to worst (NV# ranks above every one of them).
PATH_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")
#: The classes whose path stays below one PCIe host bridge (NODE and SYS leave it).
HOST_BRIDGE_CLASSES = PATH_CLASSES[: PATH_CLASSES.index("PHB") + 1]
LINK_MEANINGS = {
    "X": "self",
    "NV#": "a bonded set of # NVLinks",
    "PIX": "at most a single PCIe bridge",
    "PXB": "multiple PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (typically the CPU)",
    "NODE": "the interconnect between PCIe host bridges within a NUMA node",
    "SYS": "the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric)",
}
#: nvmlDeviceGetTopologyCommonAncestor: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30,
#: NODE 40, SYSTEM 50 (nvidia-ml-py 13.615.71).
NVML_TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

_NV_RE = re.compile(r"^NV(\d+)$")


def nvlink_count(link):
    """``NV18`` -> 18; anything else -> None."""
    match = _NV_RE.match(str(link or ""))
    return int(match.group(1)) if match else None


def link_rank(link):
    """Sort key, best first: X, NV# (more links better), PIX, PXB, PHB, NODE, SYS, unknown."""
    if link == "X":
        return (0, 0)
    count = nvlink_count(link)
    if count is not None:
        return (1, -count)
    if link in PATH_CLASSES:
        return (2 + PATH_CLASSES.index(link), 0)
    return (99, 0)


# -- the bandwidth model -----------------------------------------------------------------------
#: GT/s and line-code efficiency per PCIe generation.
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}
#: Fraction of the raw link rate an all-reduce hop reaches on each path class (sources in
#: nccl/_threshold.MODEL_DOC).
PATH_EFFICIENCY = {"PIX": 0.80, "PXB": 0.80, "PHB": 0.78, "NODE": 0.60, "SYS": 0.50}
NVLINK_GBPS_PER_LINK = 25.0
NVLINK5_GBPS_PER_LINK = 50.0
NVLINK_EFFICIENCY = 0.80
_NVLINK5_NAMES = ("B100", "B200", "B300", "GB200", "GB300")
#: NVSwitch systems of the NVLink SHARP (NVLS) era: the switch reduces in the fabric, so an
#: 8-GPU all-reduce reaches about the full per-link rate as bus bandwidth (published: 440-480 GB/s
#: on 8x H100/H200 with 18 links, nccl-tests issue 272: 475 on 8x H200). Hopper only: no
#: published NVLS figure backs Blackwell yet, which stays at NVLINK_EFFICIENCY.
NVLS_EFFICIENCY = 1.0
_NVLS_NAMES = ("H100", "H200", "H800", "H20", "GH200")
#: The most NVLinks one GPU has (H100/B200: 18): a GPU shown NV# to more peers than that allows
#: (count x peers > this) reaches them through NVSwitches.
NVLINK_MAX_LINKS = 18


def nvswitch_fabric(counts, peers):
    """Whether NV# links of ``counts`` to each of ``peers`` GPUs can only go through NVSwitches."""
    return peers >= 2 and bool(counts) and min(counts) * peers > NVLINK_MAX_LINKS


def pcie_raw_gbps(gen, width):
    """Raw PCIe rate per direction in GB/s (Gen4 x16 = 31.5)."""
    if gen not in PCIE_GTS or not width:
        raise ValueError("unknown PCIe link: gen %r width %r" % (gen, width))
    return PCIE_GTS[gen] * width * PCIE_ENCODING[gen] / 8.0


def hop_gbps(link, gen=None, width=None, names="", switched=False):
    """``(GB/s, basis)`` an all-reduce hop reaches on one path of class ``link``.

    NVLink: count x per-link rate (NVLink 5 when ``names`` holds a Blackwell GPU name) x
    efficiency (NVLS_EFFICIENCY through the NVSwitches of a Hopper system, ``switched``);
    PCIe: the raw rate of ``gen`` x ``width`` x the class's efficiency. ValueError on an unknown
    class or link.
    """
    count = nvlink_count(link)
    if count is not None:
        upper = str(names).upper()
        nvlink5 = any(n in upper for n in _NVLINK5_NAMES)
        per_link = NVLINK5_GBPS_PER_LINK if nvlink5 else NVLINK_GBPS_PER_LINK
        nvls = switched and not nvlink5 and any(n in upper for n in _NVLS_NAMES)
        eff = NVLS_EFFICIENCY if nvls else NVLINK_EFFICIENCY
        return (
            count * per_link * eff,
            "%s%s: %d links x %g GB/s x %g" % (link, " via NVSwitch (NVLS)" if nvls else "", count, per_link, eff),
        )
    if link not in PATH_EFFICIENCY:
        raise ValueError("unknown link type %r" % (link,))
    raw = pcie_raw_gbps(gen, width)
    eff = PATH_EFFICIENCY[link]
    return raw * eff, "%s: PCIe Gen%s x%s %.2f GB/s x %g" % (link, gen, width, raw, eff)


# -- bridges crossed and redirect blocking -----------------------------------------------------
#: The ACS Control bits that send peer-to-peer traffic up to the root complex (what the kernel's
#: pci=disable_acs_redir= clears and what NCCL's troubleshooting guide says to turn off).
ACS_REDIRECT_NAMES = ("ReqRedir", "CmpltRedir", "EgressCtrl")
ACS_REDIRECT_MASK = 0x0004 | 0x0008 | 0x0020


def crossed_bridges(chain_a, chain_b):
    """Bridges peer traffic from device A to device B crosses, in the order it crosses them.

    Chains are the bridges above each device, root first. Traffic goes up A's chain to the last
    bridge the two share (exclusive), then down B's: two functions below one switch cross only
    its two downstream ports; below different root ports every bridge of both chains, the root
    ports included.
    """
    common = 0
    for upper_a, upper_b in zip(chain_a, chain_b):
        if upper_a != upper_b:
            break
        common += 1
    return list(reversed(chain_a[common:])) + list(chain_b[common:])


def redirects(ctl):
    """Whether an ACS Control value redirects peer traffic (None: no ACS, so no)."""
    return bool(ctl is not None and ctl & ACS_REDIRECT_MASK)


def redirecting(bridges, acs_ctl_of):
    """The bridges (in order) whose ACS Control redirects; ``acs_ctl_of(bdf)`` gives it or None."""
    return [bdf for bdf in bridges if redirects(acs_ctl_of(bdf))]


# -- device classes ----------------------------------------------------------------------------
VENDOR_NVIDIA = 0x10DE
VENDOR_MELLANOX = 0x15B3
GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible / 3D controller
CLASS_INFINIBAND = 0x0207
CLASS_ETHERNET = 0x0200
#: PCI drivers that are RDMA providers themselves. Intel's irdma and Broadcom's bnxt_re bind
#: auxiliary devices of ice/bnxt_en, which drive plain Ethernet NICs as well: such a node must say
#: so itself (gpu_runtime_env_rdma: true) rather than be guessed.
RDMA_PCI_DRIVERS = ("mlx5_core", "mlx4_core", "efa")


def is_gpu(vendor_id, class_code):
    """An NVIDIA function of class VGA (0x0300) or 3D controller (0x0302)."""
    return vendor_id == VENDOR_NVIDIA and class_code in GPU_CLASSES


def is_rdma_nic(vendor_id, class_code, driver=None):
    """An RDMA NIC (a GPUDirect RDMA peer, a transport NCCL's IB/RoCE path can use).

    The rule: every InfiniBand controller (class 0x0207); an Ethernet controller (0x0200) when
    it is a Mellanox/NVIDIA ConnectX (vendor 0x15b3, RoCE) or bound to a PCI driver that is an
    RDMA provider (``RDMA_PCI_DRIVERS``, e.g. AWS EFA). Nothing else.
    """
    if class_code == CLASS_INFINIBAND:
        return True
    if class_code != CLASS_ETHERNET:
        return False
    return vendor_id == VENDOR_MELLANOX or (driver or "") in RDMA_PCI_DRIVERS
