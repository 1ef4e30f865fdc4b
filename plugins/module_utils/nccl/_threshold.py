# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's threshold: what a healthy node of this design reaches (the ``auto`` model,
``expected_busbw``), and the rule that turns it and the peers' baseline into the threshold
(``decide``). The one home of the gate's model rule.

Plain Python, no Ansible. The figures the model values each hop with (PCIe rates, path-class
efficiencies, NVLink rates: ``hop_gbps``) are path vocabulary and live in ``pcie/_path.py``; the
peers' median comes from the baseline store (``_baseline.statistic``).

* **The model** (``expected_busbw``, see ``MODEL_DOC``): the weakest hop of the best ring NCCL can
  build through the GPUs, each hop valued for the node's design.
* **The rule** (``decide``): ``max(physics floor, fraction x baseline)``. The physics floor is
  the model's expectation x ``threshold_fraction`` (default ``DEFAULT_THRESHOLD_FRACTION``);
  the baseline counts once it has ``min_samples`` peers. The default fraction of the peers'
  median (``DEFAULT_FRACTION``) is the anchors' (Azure's HPC health checks gate 8x H100 at
  460 GB/s, about 96 % of the 475-480 healthy systems reach) and sits between the healthy spread
  (about 1 % between runs and nodes at large messages: 4 standard deviations above it) and one
  NVLink down of 18 (-5.6 %, under it even on the best node). These constants are the one place
  the defaults are written; the module, the role and docs/gate.md refer to them.
"""

from __future__ import annotations

import itertools

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path

#: The physics floor: this fraction of what the model gives a healthy node of the design.
DEFAULT_THRESHOLD_FRACTION = 0.85
#: The peers' rule: this fraction of the median of the design's healthy peers ...
DEFAULT_FRACTION = 0.96
#: ... once the baseline has this many of them.
DEFAULT_MIN_SAMPLES = 5


MODEL_DOC = """\
The expected bus bandwidth is that of the weakest hop of the best ring NCCL can build through
the GPUs, each hop valued for the node's DESIGN (the maximum PCIe generation and width of the
two GPUs' links, the NVLink count), never for how the links trained today: a link trained down
or a bridge redirecting peer traffic must fail the gate, not lower its bar.
PCIe hop = raw link rate per direction (GT/s x lanes x encoding / 8: Gen3 x16 15.75 GB/s, Gen4
x16 31.5 GB/s, Gen5 x16 63 GB/s) x a path efficiency by the nvidia-smi topology class:
PIX/PXB 0.80, PHB 0.78, NODE 0.60, SYS 0.50.  NVLink hop = NV count x 25 GB/s per link per
direction (50 GB/s from NVLink 5, Blackwell) x 0.80, and x 1.0 through the NVSwitches of a
Hopper system (NVLink SHARP: 8x H100 = 450 GB/s).  The physics floor is that figure x
threshold_fraction (default %(threshold_fraction)s); once min_samples healthy peers of the same design
are in the baseline store, the threshold is max(physics floor, baseline_fraction (%(fraction)s) x their
median).
Sources of the figures: PCIe Gen4 x16 measures about 25 GB/s at best against 31.5 raw
(0.80); 4x RTX 4090 reach 22-26 GB/s bus bandwidth with P2P and about 18 through host memory;
ACS redirect roughly halves bus bandwidth (NVIDIA/nccl issue 700); 8-GPU NVLink all-reduce
reaches about 230 GB/s on A100 (12 links: 240 here) and 440-480 GB/s on H100/H200 with NVLS
(nccl-tests issue 272: 475 on 8x H200; 18 links: 450 here); Azure's per-SKU floors (228 for
8x A100, 460 for 8x H100 at 8-16 GB) sit a few percent under healthy figures (docs/gate.md).""" % dict(
    threshold_fraction=DEFAULT_THRESHOLD_FRACTION, fraction=DEFAULT_FRACTION
)

# The figures (PCIe rates, path-class efficiencies, NVLink rates) and the valuation of one hop
# live with the path vocabulary in pcie/_path.py; the gate's ring model is here.


def _gpu_key(gpu):
    return "GPU%d" % gpu["index"]


def _pcie(gpu):
    p = gpu.get("pcie") or {}
    return p


def _link_class(topology, gi, gj):
    links = topology.get("links") or {}
    cls = (links.get(_gpu_key(gi)) or {}).get(_gpu_key(gj)) or (links.get(_gpu_key(gj)) or {}).get(_gpu_key(gi))
    return None if cls is None else str(cls).upper()


def nvswitch_system(topology):
    """Whether every GPU of the facts reaches every other over NVLink through NVSwitches (an HGX
    baseboard): all pairs NV#, more of them than one GPU's links could bond directly."""
    gpus = sorted(topology.get("gpus") or [], key=lambda g: g["index"])
    counts = []
    for gi, gj in itertools.combinations(gpus, 2):
        count = _path.nvlink_count(_link_class(topology, gi, gj))
        if count is None:
            return False
        counts.append(count)
    return _path.nvswitch_fabric(counts, len(gpus) - 1)


def _hop(topology, gi, gj, switched=False):
    """(class, expected GB/s, basis) for one ring hop between two GPU fact entries."""
    cls = _link_class(topology, gi, gj)
    if cls is None:
        raise ValueError(f"the topology facts have no link type between {_gpu_key(gi)} and {_gpu_key(gj)}")
    gen = width = None
    if _path.nvlink_count(cls) is None:
        if cls not in _path.PATH_EFFICIENCY:
            raise ValueError(f"unknown link type {cls!r} between {_gpu_key(gi)} and {_gpu_key(gj)}")
        pi, pj = _pcie(gi), _pcie(gj)
        try:
            gen = min(int(pi["gen_max"]), int(pj["gen_max"]))
            width = min(int(pi["width_max"]), int(pj["width_max"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"the topology facts lack pcie.gen_max/width_max for {_gpu_key(gi)} or {_gpu_key(gj)}"
            ) from None
    names = str(gi.get("name", "")) + " " + str(gj.get("name", ""))
    gbps, basis = _path.hop_gbps(cls, gen, width, names, switched)
    return cls, gbps, basis


def select_gpus(topology, count=None, visible=None):
    """The GPU fact entries a run uses: CUDA_VISIBLE_DEVICES order if given, then the first ``count``."""
    gpus = sorted(topology.get("gpus") or [], key=lambda g: g["index"])
    if visible:
        by_index = {g["index"]: g for g in gpus}
        picked = []
        for item in visible:
            if item not in by_index:
                raise ValueError(f"CUDA_VISIBLE_DEVICES names GPU {item}, which the topology facts do not have")
            picked.append(by_index[item])
        gpus = picked
    if count is not None:
        if count > len(gpus):
            raise ValueError(f"{count} GPUs requested but the topology facts list {len(gpus)}")
        gpus = gpus[:count]
    return gpus


def expected_busbw(topology, count=None, visible=None):
    """What a healthy node of this design reaches, from ``ansible_facts.gpu_topology``.

    Returns a dict: ``expected_gbps``, ``worst_link`` (class), ``worst_pair`` ([i, j]),
    ``ring`` (GPU indices in the best ring order), ``basis`` (how the weakest hop was valued).
    """
    gpus = select_gpus(topology, count, visible)
    if len(gpus) < 2:
        raise ValueError("an all-reduce gate needs at least 2 GPUs (bus bandwidth of 1 rank is 0)")
    hops = {}
    switched = nvswitch_system(topology)
    for a, b in itertools.combinations(range(len(gpus)), 2):
        hops[(a, b)] = hops[(b, a)] = _hop(topology, gpus[a], gpus[b], switched)
    best = None
    # The ring NCCL would pick: the order whose weakest hop is strongest (n <= 8: 5040 orders).
    for perm in itertools.permutations(range(1, len(gpus))):
        order = (0,) + perm
        if len(order) > 2 and order[1] > order[-1]:
            continue  # a ring and its reverse are the same ring
        weakest = min((hops[(order[k], order[(k + 1) % len(order)])][1], k) for k in range(len(order)))
        if best is None or weakest[0] > best[0][0] + 1e-9:
            best = (weakest, order)
    (gbps, k), order = best
    a, b = order[k], order[(k + 1) % len(order)]
    cls, basis = hops[(a, b)][0], hops[(a, b)][2]
    return {
        "expected_gbps": round(gbps, 2),
        "worst_link": cls,
        "worst_pair": [gpus[a]["index"], gpus[b]["index"]],
        "ring": [gpus[i]["index"] for i in order],
        "basis": basis,
    }


def decide(
    expected_gbps, threshold_fraction, design_key, stat=None, fraction=DEFAULT_FRACTION, min_samples=DEFAULT_MIN_SAMPLES
):
    """``max(physics floor, fraction x baseline)``, and which of them decided.

    Returns ``threshold_gbps``, ``rule`` (``peer_median`` or ``physics_floor``), ``rule_text``
    (the words a verdict uses after "under"/"meets"), ``physics_floor_gbps``,
    ``baseline_gbps`` (fraction x median, None until ``min_samples`` peers), ``baseline``
    (the statistic).
    """
    floor = round(expected_gbps * threshold_fraction, 2)
    stat = stat or {"median": None, "count": 0, "hosts": [], "outliers": []}
    peer = None
    if stat["median"] is not None and stat["count"] >= max(1, min_samples):
        peer = round(stat["median"] * fraction, 2)
    physics = "the physics floor %.2f GB/s (%g x the %.2f GB/s the model gives a healthy node of this design)" % (
        floor,
        threshold_fraction,
        expected_gbps,
    )
    if peer is not None and peer > floor:
        return {
            "threshold_gbps": peer,
            "rule": "peer_median",
            "rule_text": "%g x the median %.1f GB/s of %d healthy nodes of design %s"
            % (fraction, stat["median"], stat["count"], design_key),
            "physics_floor_gbps": floor,
            "baseline_gbps": peer,
            "baseline": stat,
        }
    if peer is not None:
        note = "; above %g x the median %.1f GB/s of %d healthy nodes of design %s" % (
            fraction,
            stat["median"],
            stat["count"],
            design_key,
        )
    elif stat["count"]:
        note = "; the peer baseline of design %s has %d of the %d healthy nodes it needs" % (
            design_key,
            stat["count"],
            min_samples,
        )
    else:
        note = "; no peer baseline yet for design %s" % design_key
    return {
        "threshold_gbps": floor,
        "rule": "physics_floor",
        "rule_text": physics + note,
        "physics_floor_gbps": floor,
        "baseline_gbps": peer,
        "baseline": stat,
    }
