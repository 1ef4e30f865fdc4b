# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The design key of a GPU node: what the hardware is BUILT to be, so that two nodes with the same
key are expected to reach the same all-reduce bus bandwidth and can be judged against each other.

Plain Python, no Ansible. Built from the GPU topology facts (``gpu_topology_facts``) and the
node's RDMA NICs (``_topology.PciTopology.nics``), never from how the links trained today:

* the GPU models, in index order, and their count;
* each GPU's PCIe generation and width MAXIMUMS (a GPU trained to x8 keeps its x16 design);
* the link class between every GPU pair (``NV#`` counted as ``NV``: an inactive NVLink lowers the
  count nvidia-smi shows, not the design) and the number of PCIe bridges between the pair (the
  tree's shape);
* the NVLink capability of each GPU model (``NVLINK_CAPABILITY``) and whether the GPUs reach
  each other through NVSwitches;
* the RDMA NICs by PCI vendor:device id.

The key reads ``<gpu>-<count>x-<fabric>-<hash>``, e.g. ``h100-80gb-hbm3-8x-nvswitch-4f1c0a9e``:
a person can tell designs apart, and the hash (SHA-256 of the canonical descriptor) keeps two
designs that read alike apart.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _threshold
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path, _sysfs

#: NVLinks per GPU by product name (first match wins, longest names first); 0 for PCIe-only
#: parts. A model not listed keeps None: its pairs' ``NV`` classes still go into the key.
NVLINK_CAPABILITY = (
    ("GB200", 18),
    ("B200", 18),
    ("B100", 18),
    ("GH200", 18),
    ("H200", 18),
    ("H100 NVL", 18),
    ("H100 PCIE", 0),
    ("H100", 18),
    ("H800", 8),
    ("H20", 18),
    ("A100-SXM", 12),
    ("A100 PCIE", 0),
    ("A800", 8),
    ("V100-SXM", 6),
    ("L40S", 0),
    ("L40", 0),
    ("L4", 0),
    ("A40", 4),
    ("A10", 0),
    ("RTX", 0),
)

_SLUG_RE = re.compile(r"[^a-z0-9]+")


def nvlink_capability(name):
    """NVLinks a GPU of this product name has, or None when the model is not known."""
    upper = str(name or "").upper()
    for pattern, links in NVLINK_CAPABILITY:
        if pattern in upper:
            return links
    return None


def _slug(name):
    text = str(name or "gpu").lower()
    text = text.replace("nvidia", "")
    return _SLUG_RE.sub("-", text).strip("-") or "gpu"


def _pair_class(cls):
    cls = str(cls or "?").upper()
    return "NV" if _path.nvlink_count(cls) is not None else cls


def descriptor(topology, nics=()):
    """The canonical description of a node's design (a dict of plain values).

    ``topology`` is ``ansible_facts.gpu_topology``; ``nics`` the RDMA NICs as ``"15b3:1021"``
    strings (any order). ValueError when the facts hold no GPU.
    """
    gpus = sorted((topology or {}).get("gpus") or [], key=lambda g: g["index"])
    if not gpus:
        raise ValueError("the topology facts list no GPU: a node without GPUs has no design to judge")
    links = (topology or {}).get("links") or {}
    bridges = (topology or {}).get("bridges") or {}
    pairs = []
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            ka, kb = "GPU%d" % gpus[a]["index"], "GPU%d" % gpus[b]["index"]
            cls = (links.get(ka) or {}).get(kb) or (links.get(kb) or {}).get(ka)
            crossed = (bridges.get(ka) or {}).get(kb)
            pairs.append([_pair_class(cls), None if crossed is None else len(crossed)])
    models = []
    for g in gpus:
        pcie = g.get("pcie") or {}
        models.append(
            {
                "name": str(g.get("name") or "?"),
                "gen_max": pcie.get("gen_max"),
                "width_max": pcie.get("width_max"),
                "nvlinks": nvlink_capability(g.get("name")),
            }
        )
    return {
        "gpu_count": len(gpus),
        "gpus": models,
        "pairs": pairs,
        "nvswitch": _threshold.nvswitch_system(topology),
        "nics": sorted(str(n).lower() for n in nics),
    }


def key_of(desc):
    """The key of a descriptor: ``<gpu>-<count>x-<fabric>-<hash8>``."""
    names = sorted({m["name"] for m in desc["gpus"]})
    gpu = _slug(names[0]) if len(names) == 1 else "mixed"
    classes = {p[0] for p in desc["pairs"]}
    if desc["nvswitch"]:
        fabric = "nvswitch"
    elif classes == {"NV"}:
        fabric = "nvlink"
    elif "NV" in classes:
        fabric = "nvlink-pcie"
    else:
        fabric = "pcie"
    canonical = json.dumps(desc, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]
    return "%s-%dx-%s-%s" % (gpu, desc["gpu_count"], fabric, digest)


def rdma_nics(sysfs_path=_sysfs.DEFAULT_SYSFS_PATH):
    """The node's RDMA NICs as ``vendor:device`` ids (``15b3:1021``), read from the sysfs tree's
    ``vendor``/``device``/``class`` files (no config space: any user can read them)."""
    devices = _sysfs.scan_tree(sysfs_path, with_config=False)
    return sorted(
        "%04x:%04x" % (dev.config.vendor_id, dev.config.device_id) for dev in devices.values() if dev.is_rdma_nic
    )


def design_key(topology, nics=()):
    """``(key, descriptor)`` of a node; see the module docstring."""
    desc = descriptor(topology, nics)
    return key_of(desc), desc
