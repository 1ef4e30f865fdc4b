# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Why an all-reduce was slow: the likely causes of a low bus bandwidth, from the GPU topology
facts and the NCCL environment, most specific first.

Plain Python, no Ansible.
"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path


def diagnose(topology, environment=None, measured=None, expected=None, peer_median=None):
    """Likely causes of a low bus bandwidth, most specific first, from the facts and the NCCL env.

    The facts describe the node when they were gathered: a link's trained width rarely changes
    at run time, but ACS may have been cleared since, so that cause is worded as what the facts
    showed.
    """
    causes = []
    topology = topology or {}
    for g in sorted(topology.get("gpus") or [], key=lambda x: x.get("index", 0)):
        p = g.get("pcie") or {}
        try:
            wc, wm = int(p["width_current"]), int(p["width_max"])
        except (KeyError, TypeError, ValueError):
            continue
        if wc < wm:
            port = f" below port {g['upstream_port']}" if g.get("upstream_port") else ""
            causes.append(
                "GPU%s (%s) trained to x%d of x%d%s: a link trained down (reseat the card, check "
                "the riser/slot and AER errors)" % (g.get("index"), g.get("pci_bus_id", "?"), wc, wm, port)
            )
    by_name = {}
    for g in topology.get("gpus") or []:
        if isinstance(g.get("nvlinks"), int):
            by_name.setdefault(g.get("name"), []).append(g)
    for same in by_name.values():
        most = max(g["nvlinks"] for g in same)
        for g in sorted(same, key=lambda x: x.get("index", 0)):
            if g["nvlinks"] < most:
                causes.append(
                    "GPU%s (%s) has %d NVLinks active where its peers of the same model have %d: an "
                    "NVLink down costs its share of the bandwidth (nvidia-smi nvlink -s; reseat or "
                    "replace the GPU or baseboard)" % (g.get("index"), g.get("pci_bus_id", "?"), g["nvlinks"], most)
                )
    links = topology.get("links") or {}
    p2p_read = (topology.get("p2p") or {}).get("read") or {}
    redirecting = ((topology.get("pci_tree") or {}).get("redirecting")) or {}
    blocked, bridges = [], set()
    for a, row in sorted(p2p_read.items()):
        for b, status in sorted(row.items()):
            if a < b and status not in ("OK", "X") and _path.nvlink_count((links.get(a) or {}).get(b)) is None:
                blocked.append(f"{a}-{b} {status}")
                bridges.update((redirecting.get(a) or {}).get(b) or [])
    if blocked:
        where = f" (redirecting bridges: {', '.join(sorted(bridges))})" if bridges else ""
        causes.append(
            "the topology facts showed peer-to-peer reads not OK between "
            + ", ".join(blocked)
            + where
            + ": ACS redirect on a bridge between the GPUs, unless it was cleared since "
            "(gpufleet.node.pcie_acs), or P2P disabled"
        )
    env = environment or {}
    if str(env.get("NCCL_P2P_DISABLE", "0")) not in ("0", ""):
        causes.append("NCCL_P2P_DISABLE is set: NCCL copies through host memory")
    if env.get("NCCL_P2P_LEVEL"):
        causes.append(f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} may keep NCCL off peer-to-peer on this path")
    if not causes and measured is not None and peer_median:
        causes.append(
            "%.1f %% under the median of this design's healthy peers, with nothing in the facts to "
            "explain it: a degraded NVLink or riser, a GPU held back by its clocks (nvidia-smi -q -d "
            "PERFORMANCE), or a busy GPU" % (100.0 * (1.0 - measured / peer_median))
        )
    if not causes and measured is not None and expected:
        ratio = measured / expected
        if 0.3 <= ratio <= 0.65:
            causes.append(
                "about half the expected bandwidth: typical of ACS P2P redirect sending peer "
                "traffic through the root complex, or of a link trained down"
            )
        else:
            causes.append(
                "check ACS on the bridges between the GPUs, the links' trained width/speed, and that the GPUs are idle"
            )
    return causes
