# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The physics of nvbandwidth's copy cells: what a healthy copy engine reaches on a cell's path as
the node is BUILT (the design maxima in the topology facts: ``pcie.gen_max``/``width_max``, the
NVLink count of the design), and the likely causes of a slow cell from the same facts.

Plain Python (no Ansible imports), runs on target Python 3.8+; ``_copy_judge`` sets the bars from
these figures.

* Host <-> device (``host_to_device_memcpy_ce``, ``device_to_host_memcpy_ce``): the GPU's PCIe
  link, raw rate per direction (GT/s x lanes x encoding / 8: Gen3 x16 15.75, Gen4 x16 31.5, Gen5
  x16 63 GB/s, ``pcie._path.pcie_raw_gbps``) x :data:`CE_HOST_EFFICIENCY`.
* Device <-> device (``device_to_device_memcpy_read_ce``/``_write_ce``): over NVLink, the pair's
  NVLink count (on an NVSwitch system the most any pair shows: every pair is built the same) x
  the per-link rate (25 GB/s, 50 from NVLink 5, as ``pcie._path`` has them) x
  :data:`CE_NVLINK_EFFICIENCY`; over PCIe, the raw rate of the slower of the two links x the
  collection's path-class efficiency (``pcie._path.PATH_EFFICIENCY``: PIX/PXB 0.80, PHB 0.78,
  NODE 0.60, SYS 0.50).

Sources of the efficiencies (real outputs in tests/data/nvbandwidth): H100 80GB HBM3 on PCIe Gen5
x16 copies 55.18-55.37 GB/s host<->device (v0.10.0; 0.876-0.879 of 63.0), H800 55.09-55.34
(v0.2); PCIe Gen4 x16 26.0 GB/s in nvbandwidth's README (0.82-0.83 of 31.5), 8x RTX 4090
23.90-27.11 (v0.2). NVLink: 8x H100 NV18 370.26-372.96 GB/s peer read (v0.4; 0.823-0.829 of
450) and 395.05-395.25 (v0.10.0), H800 NV8 171.88-172.57 (0.86 of 200), B300 NV18 (NVLink 5)
764.16-766.34 (0.85 of 900). PCIe peers: 6x RTX A6000 26.34 GB/s within a group, 21.80-22.67
across (v0.8; 0.84 and 0.69 of 31.5), above the path-class figures. The healthy spread of these
samples sits well inside ``threshold_fraction`` (0.85); every fault the bar must catch costs far
more (a link at x8 or one generation down halves a host cell, ACS redirect roughly halves a PCIe
peer copy (NVIDIA/nccl issue 700), a pair that falls back from NVLink to PCIe keeps a tenth).
Azure's HPC health checks gate the same three testcases at fixed floors (48 GB/s host<->device,
335 GB/s device<->device on H100/H200, ``check_gpu_bw 48 335``): the physics bars here are 46.60
and 313.65 for that design, the peers' rule (0.96 of their median: 356 for peers at 371) sits
above Azure's.
"""

from __future__ import annotations

import itertools

from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path

#: Fraction of the raw PCIe rate a copy engine reaches host<->device, by generation (Gen5 from
#: H100/H800 outputs; Gen4 from the README's and the RTX 4090 outputs; Gen3 and older share
#: Gen4's 128b/130b-era figure, Gen6 Gen5's: no published output backs either yet).
CE_HOST_EFFICIENCY = {5: 0.87, 6: 0.87}
CE_HOST_EFFICIENCY_DEFAULT = 0.82
#: Fraction of count x per-link rate a copy engine reaches GPU<->GPU over NVLink (the lowest of
#: the healthy H100, H800 and B300 outputs).
CE_NVLINK_EFFICIENCY = 0.82

ACS_FIX = "clear ReqRedir/CmpltRedir/EgressCtrl there: gpufleet.node.pcie_acs"


def host_efficiency(gen):
    return CE_HOST_EFFICIENCY.get(gen, CE_HOST_EFFICIENCY_DEFAULT)


def nvlink_rate_per_link(names):
    """GB/s per NVLink per direction for GPUs named ``names`` (NVLink 5 for Blackwell), as
    ``pcie._path.hop_gbps`` values one link before its all-reduce efficiency."""
    return _path.hop_gbps("NV1", names=names)[0] / _path.NVLINK_EFFICIENCY


# -- the topology ------------------------------------------------------------------------------
def label(index):
    return "GPU%d" % index


def gpus_by_index(topology):
    return {int(g["index"]): g for g in (topology or {}).get("gpus") or [] if g.get("index") is not None}


def link_class(topology, a, b):
    links = (topology or {}).get("links") or {}
    cls = (links.get(label(a)) or {}).get(label(b)) or (links.get(label(b)) or {}).get(label(a))
    return None if cls is None else str(cls).strip().upper()


def design_nvlinks(topology):
    """The NVLink count every pair is built with on an NVSwitch system (the most any pair shows),
    else None (each directly linked pair keeps its own count)."""
    indices = sorted(gpus_by_index(topology))
    counts = [_path.nvlink_count(link_class(topology, a, b)) for a, b in itertools.combinations(indices, 2)]
    if not counts or any(c is None for c in counts):
        return None
    return max(counts) if _path.nvswitch_fabric(counts, len(indices) - 1) else None


def _pcie(gpu):
    return gpu.get("pcie") or {}


def bus(text):
    """``0000:99:00.0`` or ``00000000:99:00`` -> ``0000:99:00`` (domain:bus:device)."""
    parts = str(text or "").strip().lower().split(":")
    if len(parts) < 3:
        return None
    try:
        return "%04x:%02x:%02x" % (int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16))
    except ValueError:
        return None


def acs_pairs(topology, acs):
    """``{frozenset({a, b}): [redirecting bridges]}`` from the topology facts' PCI tree
    (``pci_tree.redirecting``) and from ``pcie_acs_info``'s ``gpu_pairs`` (BDFs mapped to GPU
    indices by the facts' ``pci_bus_id``)."""
    pairs = {}
    redirecting = ((topology or {}).get("pci_tree") or {}).get("redirecting") or {}
    for la, row in redirecting.items():
        for lb, bridges in (row or {}).items():
            if bridges:
                try:
                    key = frozenset((int(la[3:]), int(lb[3:])))
                except ValueError:
                    continue
                pairs.setdefault(key, [])
                pairs[key] += [b for b in bridges if b not in pairs[key]]
    by_bus = {bus(g.get("pci_bus_id")): i for i, g in gpus_by_index(topology).items()}
    for pair in (acs or {}).get("gpu_pairs") or []:
        ends = [by_bus.get(bus(bdf)) for bdf in pair.get("gpus") or []]
        if len(ends) == 2 and None not in ends and pair.get("redirecting"):
            key = frozenset(ends)
            pairs.setdefault(key, [])
            pairs[key] += [b for b in pair["redirecting"] if b not in pairs[key]]
    return pairs


# -- physics -----------------------------------------------------------------------------------
def host_physics(topology, gpu_index):
    """``(expected GB/s, basis)`` of a host<->device copy to ``gpu_index``; ValueError when the
    facts cannot say."""
    gpu = gpus_by_index(topology).get(gpu_index)
    if gpu is None:
        raise ValueError("the topology facts have no %s" % label(gpu_index))
    gen, width = _pcie(gpu).get("gen_max"), _pcie(gpu).get("width_max")
    if not gen or not width:
        raise ValueError("the topology facts lack pcie.gen_max/width_max for %s" % label(gpu_index))
    raw = _path.pcie_raw_gbps(int(gen), int(width))
    eff = host_efficiency(int(gen))
    return raw * eff, "PCIe Gen%d x%d %.2f GB/s x %g (copy engine)" % (int(gen), int(width), raw, eff)


def peer_physics(topology, a, b, design_nvlinks=None):
    """``(expected GB/s, basis)`` of a copy between GPUs ``a`` and ``b``; ValueError when the
    facts cannot say."""
    gpus = gpus_by_index(topology)
    for index in (a, b):
        if index not in gpus:
            raise ValueError("the topology facts have no %s" % label(index))
    cls = link_class(topology, a, b)
    if cls is None:
        raise ValueError("the topology facts have no link type between %s and %s" % (label(a), label(b)))
    count = _path.nvlink_count(cls)
    if count is not None:
        design = design_nvlinks or count
        per_link = nvlink_rate_per_link("%s %s" % (gpus[a].get("name", ""), gpus[b].get("name", "")))
        basis = "NV%d: %d links x %g GB/s x %g (copy engine)" % (design, design, per_link, CE_NVLINK_EFFICIENCY)
        if design != count:
            basis += "; the facts show %s" % cls
        return design * per_link * CE_NVLINK_EFFICIENCY, basis
    if cls not in _path.PATH_EFFICIENCY:
        raise ValueError("unknown link type %r between %s and %s" % (cls, label(a), label(b)))
    try:
        gen = min(int(_pcie(gpus[a])["gen_max"]), int(_pcie(gpus[b])["gen_max"]))
        width = min(int(_pcie(gpus[a])["width_max"]), int(_pcie(gpus[b])["width_max"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError("the topology facts lack pcie.gen_max/width_max for %s or %s" % (label(a), label(b))) from None
    raw = _path.pcie_raw_gbps(gen, width)
    eff = _path.PATH_EFFICIENCY[cls]
    return raw * eff, "%s: PCIe Gen%d x%d %.2f GB/s x %g" % (cls, gen, width, raw, eff)


# -- causes ------------------------------------------------------------------------------------
def _link_causes(topology, index):
    """The likely causes on one GPU's PCIe link: ``[(text, action)]``."""
    gpu = gpus_by_index(topology).get(index) or {}
    p = _pcie(gpu)
    causes = []
    wc, wm, gc, gm = p.get("width_current"), p.get("width_max"), p.get("gen_current"), p.get("gen_max")
    if wc is not None and wm is not None and wc < wm:
        causes.append(
            (
                "%s's PCIe link trained to x%s of x%s (reseat the card, check the slot, the riser and the"
                " BIOS lane settings)" % (label(index), wc, wm),
                _verdict.INSPECT,
            )
        )
    if gc is not None and gm is not None and gc < gm:
        causes.append(
            (
                "%s's PCIe link runs at Gen%s of Gen%s (read when the facts were gathered: an idle GPU"
                " downshifts, so gather them again under load before acting)" % (label(index), gc, gm),
                _verdict.INSPECT,
            )
        )
    return causes


def host_causes(topology, index):
    causes = _link_causes(topology, index)
    if not causes:
        p = _pcie(gpus_by_index(topology).get(index) or {})
        causes.append(
            (
                "the topology facts show no fault on %s's link (x%s Gen%s): look at the host side (the NUMA"
                " node of the host buffer, IOMMU translation, memory bandwidth) and at other traffic below"
                " the same root port" % (label(index), p.get("width_current"), p.get("gen_current")),
                _verdict.INSPECT,
            )
        )
    return causes


def peer_causes(topology, a, b, acs_pairs, design_nvlinks=None):
    cls = link_class(topology, a, b)
    count = _path.nvlink_count(cls)
    causes = []
    if count is not None:
        if design_nvlinks and count < design_nvlinks:
            causes.append(
                (
                    "%s and %s have %s where the design has NV%d: an NVLink is down (nvidia-smi nvlink -s)"
                    % (label(a), label(b), cls, design_nvlinks),
                    _verdict.INSPECT,
                )
            )
        else:
            causes.append(
                (
                    "%s and %s are %s: check the NVLinks (nvidia-smi nvlink -s and their error counters), the"
                    " fabric manager, and other work on the two GPUs" % (label(a), label(b), cls),
                    _verdict.INSPECT,
                )
            )
        return causes
    if cls in ("NODE", "SYS"):
        causes.append(
            (
                "%s and %s have no NVLink: their copies cross %s (%s)"
                % (label(a), label(b), cls, _path.LINK_MEANINGS[cls]),
                _verdict.INSPECT,
            )
        )
    bridges = acs_pairs.get(frozenset((a, b)))
    if bridges:
        causes.append(
            (
                "a bridge on the path still redirects peer traffic (ACS): %s (%s)" % (", ".join(bridges), ACS_FIX),
                _verdict.CONFIGURE,
            )
        )
    p2p = (((topology or {}).get("p2p") or {}).get("read") or {}).get(label(a)) or {}
    status = p2p.get(label(b))
    if status not in (None, "OK", "X"):
        causes.append(
            ("nvidia-smi topo -p2p r reports %s for %s -> %s" % (status, label(a), label(b)), _verdict.CONFIGURE)
        )
    causes += _link_causes(topology, a) + _link_causes(topology, b)
    if not causes:
        causes.append(
            (
                "the topology facts show no fault on the %s path between %s and %s: look for other traffic on"
                " the bridges they share" % (cls, label(a), label(b)),
                _verdict.INSPECT,
            )
        )
    return causes
