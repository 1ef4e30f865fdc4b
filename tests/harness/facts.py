# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's facts of a lab machine, built from the lab's own model (not by the modules
that gather them), for tests that feed a module facts of a known machine."""

from __future__ import annotations


def topology_facts(node):
    """ansible_facts.gpu_topology as gpufleet.node.gpu_topology_facts reports a lab machine.

    Like NVML, only GPUs bound to the nvidia driver exist, numbered without the others.
    """
    model_idx = [i for i, g in enumerate(node.gpus) if g.driver == "nvidia"]
    gpus = []
    for cuda, i in enumerate(model_idx):
        g = node.gpus[i]
        gpus.append(
            {
                "index": cuda,
                "uuid": g.uuid,
                "name": g.name,
                "pci_bus_id": g.bdf,
                "memory_total_mib": g.memory_total_mib,
                "nvlinks": g.nvlinks,
                "upstream_port": node.chain(g.bdf)[0],
                "pcie": {
                    "gen_current": g.gen_current,
                    "gen_max": g.gen_max,
                    "width_current": g.width_current,
                    "width_max": g.width_max,
                },
            }
        )
    links, p2p, redirecting = {}, {"read": {}}, {}
    for a, i in enumerate(model_idx):
        others = [(b, j) for b, j in enumerate(model_idx)]
        links[f"GPU{a}"] = {f"GPU{b}": node.link_type(i, j) for b, j in others}
        p2p["read"][f"GPU{a}"] = {f"GPU{b}": node.p2p_status(i, j, "read") for b, j in others}
        redirecting[f"GPU{a}"] = {f"GPU{b}": node.redirecting_bridges(i, j) for b, j in others if b != a}
    return {"gpus": gpus, "links": links, "p2p": p2p, "pci_tree": {"redirecting": redirecting}}
