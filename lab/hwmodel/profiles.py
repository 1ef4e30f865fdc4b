# SPDX-License-Identifier: GPL-3.0-or-later
"""Declarative node profiles: the single source of truth for every lab stand-in.

A profile describes one kind of machine as its firmware leaves it: sockets and host bridges,
the PCIe tree below each root port (switches, GPUs, NICs), each port's ACS capability and the
ACS Control value the firmware/kernel leaves at boot, trained link widths and NVLink.  Faults
are not part of a profile: they go into a machine's health state (health.py, `lab fault`).  `build.py` turns a profile into a sysfs tree with real config
space; `node.py` answers questions about it from the CURRENT registers.

Device ids are real (pci.ids), so the real `lspci` names what it decodes.
"""

from __future__ import annotations

import copy

# ACS Capability/Control bits (PCIe base spec 7.7.8; lspci names).
SRC_VALID, TRANS_BLK, REQ_REDIR, CMPLT_REDIR, UPSTREAM_FWD, EGRESS_CTRL, DIRECT_TRANS = (
    0x01,
    0x02,
    0x04,
    0x08,
    0x10,
    0x20,
    0x40,
)
#: What Linux's pci_std_enable_acs() sets when an IOMMU is in use (and what AMD root ports showed
#: in NVIDIA/nccl issue 2079): SrcValid, ReqRedir, CmpltRedir, UpstreamFwd.
KERNEL_ACS_CTL = SRC_VALID | REQ_REDIR | CMPLT_REDIR | UPSTREAM_FWD  # 0x001d
PLX_ACS_CAP = SRC_VALID | TRANS_BLK | REQ_REDIR | CMPLT_REDIR | UPSTREAM_FWD | DIRECT_TRANS  # 0x5f
AMD_RP_ACS_CAP = SRC_VALID | TRANS_BLK | REQ_REDIR | CMPLT_REDIR | UPSTREAM_FWD  # 0x1f

#: The driver the lab's machines run (nvidia-smi, NVML and the kernel log say so).
DRIVER_VERSION = "570.133.20"

#: Per GPU model: what it is on the bus (name, device id, class, PCIe generation and width), its
#: memory, its NVLinks and the rate of each (GB/s, as `nvidia-smi nvlink -s` prints it; None
#: without NVLink), and its CUDA compute capability (NVIDIA's "CUDA GPUs" table), which
#: nvidia-smi (`--query-gpu=compute_cap`), NVML and all_reduce_perf read from the node.
GPU_MODELS = {
    "L40S": {
        "name": "NVIDIA L40S",
        "device_id": 0x26B9,
        "class": 0x030200,
        "memory_total_mib": 46068,
        "gen_max": 4,
        "width_max": 16,
        "nvlinks": 0,
        "nvlink_gbps": None,
        "compute_capability": "8.9",
    },
    "H100-SXM": {
        "name": "NVIDIA H100 80GB HBM3",
        "device_id": 0x2330,
        "class": 0x030200,
        "memory_total_mib": 81559,
        "gen_max": 5,
        "width_max": 16,
        "nvlinks": 18,
        "nvlink_gbps": 26.562,
        "compute_capability": "9.0",
    },
    "A100-PCIE": {
        "name": "NVIDIA A100 80GB PCIe",
        "device_id": 0x20B5,
        "class": 0x030200,
        "memory_total_mib": 81920,
        "gen_max": 4,
        "width_max": 16,
        "nvlinks": 0,
        "nvlink_gbps": None,
        "compute_capability": "8.0",
    },
    # The heterogeneous node's cards (workstation/consumer boards: VGA class 0x0300).
    "RTX-A6000": {
        "name": "NVIDIA RTX A6000",
        "device_id": 0x2230,
        "class": 0x030000,
        "memory_total_mib": 49140,
        "gen_max": 4,
        "width_max": 16,
        "nvlinks": 0,
        "nvlink_gbps": None,
        "compute_capability": "8.6",
    },
    "RTX-4090": {
        "name": "NVIDIA GeForce RTX 4090",
        "device_id": 0x2684,
        "class": 0x030000,
        "memory_total_mib": 24564,
        "gen_max": 4,
        "width_max": 16,
        "nvlinks": 0,
        "nvlink_gbps": None,
        "compute_capability": "8.9",
    },
}

NIC_MODELS = {
    "CX6": {
        "name": "Mellanox Technologies MT28908 Family [ConnectX-6]",
        "vendor_id": 0x15B3,
        "device_id": 0x101B,
        "class": 0x020700,
        "gen_max": 4,
        "width_max": 16,
    },
    "CX7": {
        "name": "Mellanox Technologies MT2910 Family [ConnectX-7]",
        "vendor_id": 0x15B3,
        "device_id": 0x1021,
        "class": 0x020700,
        "gen_max": 5,
        "width_max": 16,
    },
}

BRIDGE_MODELS = {
    # AMD EPYC 7002/7003 GPP bridge (root port).
    "amd-rp": {"vendor_id": 0x1022, "device_id": 0x1483, "gen_max": 4, "acs_cap": AMD_RP_ACS_CAP},
    # Intel Sapphire Rapids PCIe root port.
    "intel-rp": {"vendor_id": 0x8086, "device_id": 0x352A, "gen_max": 5, "acs_cap": AMD_RP_ACS_CAP},
    # Broadcom/PLX PEX880xx (Gen4) and PEX890xx (Gen5) switch ports.
    "pex-gen4": {"vendor_id": 0x1000, "device_id": 0xC010, "gen_max": 4, "acs_cap": PLX_ACS_CAP},
    "pex-gen5": {"vendor_id": 0x1000, "device_id": 0xC030, "gen_max": 5, "acs_cap": PLX_ACS_CAP},
}


def gpu(model, **overrides):
    return {"kind": "gpu", "model": model, **overrides}


def nic(model, **overrides):
    return {"kind": "nic", "model": model, **overrides}


def switch(model, downstream, dsp_acs_ctl=KERNEL_ACS_CTL):
    """A PCIe switch: one upstream port, one downstream port per child."""
    return {"kind": "switch", "model": model, "dsp_acs_ctl": dsp_acs_ctl, "children": downstream}


def root_port(model, child, acs_ctl=0x0000, dev=1, fn=1):
    return {"kind": "root_port", "model": model, "acs_ctl": acs_ctl, "dev": dev, "fn": fn, "child": child}


def _l40s_4x_switch(**changes):
    """A dual-socket EPYC host, 4x L40S behind two Gen4 switches, ACS on at the switches'
    downstream ports, a ConnectX-6 beside the first pair (GPUDirect RDMA); the base of the
    degraded and vfio-passthrough profiles."""
    profile = {
        "description": "Dual-socket EPYC, 4x L40S behind two PCIe Gen4 switches, ACS on",
        "cpu": {"sockets": 2, "cpulists": ["0-31,64-95", "32-63,96-127"]},
        "kernel_cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=UUID=3f1c6f8e ro amd_iommu=on iommu=pt quiet",
        "iommu": {"vendor": "amd", "group_type": "identity"},
        "interconnect": {"p2p_across_sockets": False},
        "host_bridges": [
            {
                "bus": 0x40,
                "numa_node": 0,
                "root_ports": [
                    root_port("amd-rp", switch("pex-gen4", [gpu("L40S"), gpu("L40S"), nic("CX6")]), dev=1, fn=1),
                    root_port("amd-rp", switch("pex-gen4", [gpu("L40S"), gpu("L40S")]), dev=3, fn=1),
                ],
            },
            {"bus": 0xC0, "numa_node": 1, "root_ports": []},
        ],
        "expect_registered": True,
    }
    profile.update(changes)
    return profile


def _degraded_x8():
    profile = _l40s_4x_switch(
        description="The 4x L40S switch host whose GPU 2 trained down to x8: must never be registered",
        expect_registered=False,
    )
    profile["host_bridges"][0]["root_ports"][1]["child"]["children"][0]["width_current"] = 8
    return profile


def _vfio():
    profile = _l40s_4x_switch(
        description="The 4x L40S switch host with GPU 3 bound to vfio-pci for a VM: ACS must stay on",
        kernel_cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=UUID=3f1c6f8e ro "
        "amd_iommu=on iommu=nopt vfio-pci.ids=10de:26b9",
        iommu={"vendor": "amd", "group_type": "DMA-FQ"},
        expect_registered=False,
    )
    profile["host_bridges"][0]["root_ports"][1]["child"]["children"][1]["driver"] = "vfio-pci"
    return profile


def _epyc_rootports():
    return {
        "description": "2x A100 PCIe straight on AMD EPYC root ports with ACSCtl 0x001d (PHB; NVIDIA/nccl issue 2079)",
        "cpu": {"sockets": 1, "cpulists": ["0-63"]},
        "kernel_cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.5.0-35-generic root=UUID=8a02 ro amd_iommu=on",
        "iommu": {"vendor": "amd", "group_type": "DMA-FQ"},
        "interconnect": {"p2p_across_sockets": False},
        "host_bridges": [
            {
                "bus": 0x00,
                "numa_node": 0,
                "root_ports": [
                    root_port("amd-rp", gpu("A100-PCIE"), acs_ctl=KERNEL_ACS_CTL, dev=1, fn=1),
                    root_port("amd-rp", gpu("A100-PCIE"), acs_ctl=KERNEL_ACS_CTL, dev=1, fn=2),
                ],
            },
        ],
        "expect_registered": True,
    }


def _h100_sxm():
    def pair(nic_model):
        return switch("pex-gen5", [gpu("H100-SXM"), gpu("H100-SXM"), nic(nic_model)])

    return {
        "description": "8x H100 SXM (NVLink NV18 all-to-all) behind four PCIe Gen5 switches, "
        "4x ConnectX-7, dual-socket Sapphire Rapids",
        "cpu": {"sockets": 2, "cpulists": ["0-55,112-167", "56-111,168-223"]},
        "kernel_cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=UUID=c0ffee ro intel_iommu=on iommu=pt",
        "iommu": {"vendor": "intel", "group_type": "identity"},
        "interconnect": {"p2p_across_sockets": True},
        # Four third-generation NVSwitches on the HGX baseboard (the fabric manager's devices; the
        # kernel's nvidia-nvswitchN). Not in the model's PCI tree: the GPUs' peer paths never
        # cross them as PCIe, and the tree's function list stays what the lab has always shown.
        "nvswitch": {"bdfs": ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]},
        "host_bridges": [
            {"bus": 0x15, "numa_node": 0, "root_ports": [root_port("intel-rp", pair("CX7"), dev=1, fn=0)]},
            {"bus": 0x37, "numa_node": 0, "root_ports": [root_port("intel-rp", pair("CX7"), dev=1, fn=0)]},
            {"bus": 0x97, "numa_node": 1, "root_ports": [root_port("intel-rp", pair("CX7"), dev=1, fn=0)]},
            {"bus": 0xB7, "numa_node": 1, "root_ports": [root_port("intel-rp", pair("CX7"), dev=1, fn=0)]},
        ],
        "expect_registered": True,
    }


def _a6000_4090():
    """The heterogeneous node: one RTX A6000 (48 GB) and one RTX 4090 (24 GB) on EPYC root
    ports. Tensor parallelism cannot split a model evenly here: `gpufleet_serving_backend: auto`
    serves it with llama.cpp's layer offload."""
    profile = _epyc_rootports()
    profile["description"] = "RTX A6000 48 GB + RTX 4090 24 GB on EPYC root ports: llama.cpp layer offload"
    ports = profile["host_bridges"][0]["root_ports"]
    ports[0]["child"] = gpu("RTX-A6000")
    ports[1]["child"] = gpu("RTX-4090")
    return profile


_PROFILES = {
    "l40s-4x-switch": _l40s_4x_switch,
    "l40s-x8-degraded": _degraded_x8,
    "vfio-passthrough": _vfio,
    "epyc-rootport-acs": _epyc_rootports,
    "h100-sxm-8x": _h100_sxm,
    "a6000-4090-hetero": _a6000_4090,
}

#: name -> profile (a fresh deep copy each time a caller asks through `get`).
PROFILES = {name: make() for name, make in _PROFILES.items()}


def get(name):
    try:
        return copy.deepcopy(PROFILES[name])
    except KeyError:
        raise KeyError(f"unknown lab profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
