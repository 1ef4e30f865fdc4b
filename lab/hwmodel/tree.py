# SPDX-License-Identifier: GPL-3.0-or-later
"""Turn a profile into a machine: a sysfs PCI tree with real config space, IOMMU groups and
/proc/cmdline, laid out under one root directory.

The layout is the kernel's: `sys/devices/pci0000:40/0000:40:01.1/0000:41:00.0/...` holds the
device directories nested as the bridges nest, `sys/bus/pci/devices/<bdf>` are relative links to
them, so the real `lspci`/`setpci -O sysfs.path=<root>/sys/bus/pci` read and write the tree, and a
device's upstream bridges are visible from its path.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import uuid
from pathlib import Path

from . import health
from . import profiles as P
from .regs import ACS_ECAP, AER_ECAP, LINK_SPEED_TEXT, PCIE_CAP, PM_CAP, PORT_TYPE

CONFIG_SIZE = 4096

NODE_FILE = "lab-node.json"


def bdf(bus, dev=0, fn=0, domain=0):
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def config_space(dev):
    """Config-space bytes for one device record (see `_layout`)."""
    b = bytearray(CONFIG_SIZE)
    is_bridge = dev["role"] != "endpoint"
    struct.pack_into("<HHHH", b, 0x00, dev["vendor_id"], dev["device_id"], 0x0407, 0x0010)
    struct.pack_into("<I", b, 0x08, (dev["class"] << 8) | dev.get("revision", 0xA1))
    b[0x0E] = 0x01 if is_bridge else 0x00
    if is_bridge:
        b[0x18], b[0x19], b[0x1A] = dev["primary"], dev["secondary"], dev["subordinate"]
    else:
        struct.pack_into("<HH", b, 0x2C, dev["vendor_id"], dev.get("subsystem_id", 0x0000))
    b[0x34] = PM_CAP
    # Power Management capability, then PCI Express.
    b[PM_CAP], b[PM_CAP + 1] = 0x01, PCIE_CAP
    struct.pack_into("<HH", b, PM_CAP + 2, 0x0003, 0x0008)
    flags = 0x0002 | (PORT_TYPE[dev["role"]] << 4) | (0x0100 if dev["role"] in ("root_port", "downstream") else 0)
    b[PCIE_CAP], b[PCIE_CAP + 1] = 0x10, 0x00
    struct.pack_into("<H", b, PCIE_CAP + 0x02, flags)
    struct.pack_into("<I", b, PCIE_CAP + 0x04, 0x00008022)  # DevCap: MaxPayload 512, RBE
    struct.pack_into("<HH", b, PCIE_CAP + 0x08, 0x2930, 0x0000)
    gen_max, width_max = dev["gen_max"], dev["width_max"]
    gen_cur, width_cur = dev["gen_current"], dev["width_current"]
    port_no = dev.get("port_number", 0)
    struct.pack_into("<I", b, PCIE_CAP + 0x0C, gen_max | (width_max << 4) | (0x3 << 10) | (port_no << 24))
    dl_active = 0x2000 if dev["role"] in ("root_port", "downstream") else 0
    struct.pack_into("<HH", b, PCIE_CAP + 0x10, 0x0040, gen_cur | (width_cur << 4) | 0x1000 | dl_active)
    struct.pack_into("<I", b, PCIE_CAP + 0x2C, ((1 << gen_max) - 1) << 1)  # LnkCap2 speed vector
    struct.pack_into("<H", b, PCIE_CAP + 0x30, gen_max)  # LnkCtl2 target speed
    # Extended capabilities: AER, then ACS where the port has it.
    acs = dev.get("acs_cap") is not None
    struct.pack_into("<I", b, AER_ECAP, 0x0001 | (2 << 16) | ((ACS_ECAP if acs else 0) << 20))
    if acs:
        struct.pack_into("<IHH", b, ACS_ECAP, 0x000D | (1 << 16), dev["acs_cap"], dev["acs_ctl"])
    return bytes(b)


class _Layout:
    """Walks a profile, numbers buses depth-first (as firmware does), and records each device."""

    def __init__(self, profile):
        self.profile = profile
        self.devices = []  # in enumeration order
        self.gpus, self.nics = [], []

    def run(self):
        for hb in self.profile["host_bridges"]:
            self.next_bus = hb["bus"] + 1
            for rp in hb["root_ports"]:
                model = P.BRIDGE_MODELS[rp["model"]]
                rec = self._bridge(
                    "root_port",
                    model,
                    hb["bus"],
                    rp["dev"],
                    rp["fn"],
                    parent=None,
                    host_bridge=hb,
                    acs_ctl=rp["acs_ctl"],
                )
                self._below(rec, rp["child"], hb)
        return self

    def _bridge(self, role, model, bus, dev, fn, parent, host_bridge, acs_ctl, port_number=0):
        rec = {
            "bdf": bdf(bus, dev, fn),
            "role": role,
            "kind": "bridge",
            "parent": parent,
            "host_bridge": host_bridge["bus"],
            "numa_node": host_bridge["numa_node"],
            "vendor_id": model["vendor_id"],
            "device_id": model["device_id"],
            "class": 0x060400,
            "gen_max": model["gen_max"],
            "width_max": 16,
            "gen_current": model["gen_max"],
            "width_current": 16,
            "port_number": port_number,
            "driver": "pcieport",
            "acs_cap": None if role == "upstream" else model["acs_cap"],
            "acs_ctl": None if role == "upstream" else acs_ctl,
            "primary": bus,
        }
        self.devices.append(rec)
        return rec

    def _below(self, port, child, hb):
        """Give `port` a secondary bus and lay `child` out on it."""
        secondary = self.next_bus
        self.next_bus += 1
        port["secondary"] = secondary
        if child["kind"] == "switch":
            model = P.BRIDGE_MODELS[child["model"]]
            usp = self._bridge("upstream", model, secondary, 0, 0, port["bdf"], hb, None)
            usp["secondary"] = internal = self.next_bus
            self.next_bus += 1
            for n, grandchild in enumerate(child["children"]):
                dsp = self._bridge(
                    "downstream", model, internal, n, 0, usp["bdf"], hb, child["dsp_acs_ctl"], port_number=n
                )
                self._below(dsp, grandchild, hb)
            usp["subordinate"] = self.next_bus - 1
        else:
            self._endpoint(child, secondary, port, hb)
        port["subordinate"] = self.next_bus - 1

    def _endpoint(self, spec, bus, port, hb):
        is_gpu = spec["kind"] == "gpu"
        model = (P.GPU_MODELS if is_gpu else P.NIC_MODELS)[spec["model"]]
        rec = {
            "bdf": bdf(bus),
            "role": "endpoint",
            "kind": spec["kind"],
            "parent": port["bdf"],
            "host_bridge": hb["bus"],
            "numa_node": hb["numa_node"],
            "vendor_id": model.get("vendor_id", 0x10DE),
            "device_id": model["device_id"],
            "class": model["class"],
            "name": model["name"],
            "gen_max": model["gen_max"],
            "width_max": model["width_max"],
            "gen_current": spec.get("gen_current", model["gen_max"]),
            "width_current": spec.get("width_current", model["width_max"]),
            "driver": spec.get("driver", "nvidia" if is_gpu else "mlx5_core"),
            "acs_cap": None,
            "acs_ctl": None,
        }
        # The port trains to what the endpoint trained to.
        port["gen_current"], port["width_current"] = rec["gen_current"], rec["width_current"]
        if is_gpu:
            rec.update(
                index=len(self.gpus),
                memory_total_mib=model["memory_total_mib"],
                nvlinks=model["nvlinks"],
                subsystem_id=0x1851,
            )
            self.gpus.append(rec)
        else:
            rec["index"] = len(self.nics)
            self.nics.append(rec)
        self.devices.append(rec)


def describe(name):
    """The node's data (what `lab-node.json` holds): the profile plus its laid-out devices."""
    profile = P.get(name)
    layout = _Layout(profile).run()
    seed = hashlib.sha256(name.encode()).hexdigest()
    cpulists = profile["cpu"]["cpulists"]
    for g in layout.gpus:
        g["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet-lab/{name}/{g['index']}"))
        g["serial"] = str(1320000000000 + int(seed[:6], 16) % 1000 * 100 + g["index"])
        g["cpu_affinity"] = cpulists[g["numa_node"]]
    return {
        "profile": name,
        **{k: v for k, v in profile.items() if k != "host_bridges"},
        "host_bridges": [{"bus": hb["bus"], "numa_node": hb["numa_node"]} for hb in profile["host_bridges"]],
        "devices": layout.devices,
    }


def _write(path, text):
    path.write_text(text if text.endswith("\n") else text + "\n")


def write_config_spaces(root, data):
    """(Re)write every device's config space: what firmware leaves at power-on."""
    sysfs = Path(root) / "sys" / "bus" / "pci" / "devices"
    for dev in data["devices"]:
        (sysfs / dev["bdf"] / "config").write_bytes(config_space(dev))


def build(name, root):
    """Lay the machine of profile `name` out under `root` (created; must not hold a machine)."""
    root = Path(root)
    if (root / NODE_FILE).exists():
        raise FileExistsError(f"{root} already holds a lab machine; remove it or use reset_firmware()")
    data = describe(name)
    sys_dir = root / "sys"
    bus_devices = sys_dir / "bus" / "pci" / "devices"
    drivers = sys_dir / "bus" / "pci" / "drivers"
    groups = sys_dir / "kernel" / "iommu_groups"
    for d in (bus_devices, drivers, groups):
        d.mkdir(parents=True, exist_ok=True)
    dirs = {}
    for hb in data["host_bridges"]:
        (sys_dir / "devices" / f"pci0000:{hb['bus']:02x}").mkdir(parents=True, exist_ok=True)
    for group_no, dev in enumerate(data["devices"]):
        parent = dev["parent"]
        base = dirs[parent] if parent else sys_dir / "devices" / f"pci0000:{dev['host_bridge']:02x}"
        ddir = dirs[dev["bdf"]] = base / dev["bdf"]
        ddir.mkdir()
        _write(ddir / "vendor", f"0x{dev['vendor_id']:04x}")
        _write(ddir / "device", f"0x{dev['device_id']:04x}")
        _write(ddir / "class", f"0x{dev['class']:06x}")
        _write(ddir / "subsystem_vendor", f"0x{dev['vendor_id']:04x}")
        _write(ddir / "subsystem_device", f"0x{dev.get('subsystem_id', 0):04x}")
        _write(ddir / "revision", "0xa1")
        _write(ddir / "irq", "0")
        _write(ddir / "numa_node", str(dev["numa_node"]))
        _write(ddir / "local_cpulist", data["cpu"]["cpulists"][dev["numa_node"]])
        _write(ddir / "resource", "\n".join(["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 13))
        _write(ddir / "current_link_speed", LINK_SPEED_TEXT[dev["gen_current"]])
        _write(ddir / "current_link_width", str(dev["width_current"]))
        _write(ddir / "max_link_speed", LINK_SPEED_TEXT[dev["gen_max"]])
        _write(ddir / "max_link_width", str(dev["width_max"]))
        driver_dir = drivers / dev["driver"]
        driver_dir.mkdir(exist_ok=True)
        os.symlink(os.path.relpath(driver_dir, ddir), ddir / "driver")
        os.symlink(os.path.relpath(ddir, driver_dir), driver_dir / dev["bdf"])
        # ACS is on everywhere it matters in these profiles, so every function is its own group.
        gdir = groups / str(group_no)
        (gdir / "devices").mkdir(parents=True)
        _write(gdir / "type", data["iommu"]["group_type"])
        os.symlink(os.path.relpath(ddir, gdir / "devices"), gdir / "devices" / dev["bdf"])
        os.symlink(os.path.relpath(gdir, ddir), ddir / "iommu_group")
        os.symlink(os.path.relpath(ddir, bus_devices), bus_devices / dev["bdf"])
        dev["iommu_group"] = group_no
    iommu_class = sys_dir / "class" / "iommu"
    iommu_class.mkdir(parents=True)
    for n in range(len(data["host_bridges"])):
        name_ = f"ivhd{n}" if data["iommu"]["vendor"] == "amd" else f"dmar{n}"
        (iommu_class / name_).mkdir()
    proc = root / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    _write(proc / "cmdline", data["kernel_cmdline"])
    _write(proc / "sys" / "kernel" / "random" / "boot_id", str(uuid.uuid4()))
    write_config_spaces(root, data)
    (root / NODE_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    health.init(root, data, data.get("driver_version", P.DRIVER_VERSION))
    from .node import Node

    return Node.load(root)
