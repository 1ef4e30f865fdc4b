# SPDX-License-Identifier: GPL-3.0-or-later
"""Sysfs tree enumeration and the GPU-path audit (_topology.PciTopology) on the lab's generated trees,
checked against the real `lspci -vvv -O sysfs.path=...` and against the hardware model."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _acs, _config_space, _sysfs, _topology
from tests.harness.parsers import lspci_acs, needs_lspci


def flags(value):
    decoded = _config_space.decode_acs(value)
    decoded.pop("other_bits")
    return decoded


LSPCI_PORT_TYPES = {
    "Root Port": "root_port",
    "Upstream Port": "upstream_port",
    "Downstream Port": "downstream_port",
    "Endpoint": "endpoint",
    "Legacy Endpoint": "legacy_endpoint",
}


def lspci_tree(node):
    return subprocess.run(
        ["lspci", "-D", "-vvv", "-O", "sysfs.path=%s" % node.sysfs], check=True, capture_output=True, text=True
    ).stdout


def lspci_blocks(text):
    blocks, current = {}, None
    for line in text.splitlines():
        match = re.match(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if match:
            current = match.group(1)
            blocks[current] = []
        elif current:
            blocks[current].append(line)
    return blocks


@needs_lspci
def test_acs_decode_agrees_with_lspci_on_every_profile(lab_node, any_profile):
    node = lab_node(any_profile)
    text = lspci_tree(node)
    seen = lspci_acs(text)
    audit = _topology.PciTopology.scan(str(node.sysfs)).audit()
    ports = {p["bdf"]: p for p in audit["ports"]}
    with_acs = {bdf: acs for bdf, acs in seen.items() if acs}
    assert set(with_acs) == {bdf for bdf, p in ports.items() if p["acs_cap"] is not None}
    assert with_acs, "the profile has ACS-capable ports"
    for bdf, acs in with_acs.items():
        assert acs == {"ACSCap": flags(ports[bdf]["acs_cap"]), "ACSCtl": flags(ports[bdf]["acs_ctl"])}, bdf
        assert ports[bdf]["acs_ctl_flags"] == dict(flags(ports[bdf]["acs_ctl"]), other_bits=0)


@needs_lspci
def test_port_types_and_links_agree_with_lspci(lab_node, any_profile):
    node = lab_node(any_profile)
    blocks = lspci_blocks(lspci_tree(node))
    topo = _topology.PciTopology.scan(str(node.sysfs))
    assert set(blocks) == set(topo.devices)
    for bdf, lines in blocks.items():
        cfg = topo.devices[bdf].config
        express = [line for line in lines if "Express (v" in line][0]
        name = re.search(r"Express \(v\d\) (.+?)(?: \(Slot.\))?, MSI", express).group(1)
        assert cfg.port_type == LSPCI_PORT_TYPES[name], bdf
        lnksta = [line for line in lines if "LnkSta:" in line][0]
        speed, width = re.search(r"Speed ([0-9.]+GT/s)[^,]*, Width x(\d+)", lnksta).groups()
        link = cfg.link()
        assert (link["speed_current"], link["width_current"]) == (speed, int(width)), bdf


def test_gpu_pairs_agree_with_the_hardware_model(lab_node, any_profile):
    node = lab_node(any_profile)
    topo = _topology.PciTopology.scan(str(node.sysfs))
    assert topo.gpus == sorted(g.bdf for g in node.gpus)
    assert topo.nics == sorted(n.bdf for n in node.nics)
    pairs = {tuple(p["gpus"]): (p["bridges"], p["redirecting"]) for p in topo.gpu_pairs()}
    for i, gi in enumerate(node.gpus):
        for j in range(i + 1, len(node.gpus)):
            key = tuple(sorted((gi.bdf, node.gpus[j].bdf)))
            crossed, redirecting = pairs[key]
            assert crossed == node.path_bridges(i, j)
            assert sorted(redirecting) == sorted(node.redirecting_bridges(i, j))


def test_upstream_chain_from_the_sysfs_path(lab_node):
    node = lab_node("l40s-4x-switch")
    topo = _topology.PciTopology.scan(str(node.sysfs))
    for gpu in node.gpus:
        assert topo.chain(gpu.bdf) == list(reversed(node.chain(gpu.bdf)))


def test_seed000_audit(lab_node):
    node = lab_node("l40s-4x-switch")
    audit = _topology.PciTopology.scan(str(node.sysfs)).audit()
    summary = audit["summary"]
    assert summary["gpus"] == 4 and summary["nics"] == 1 and summary["gpu_pairs"] == 6
    assert summary["blocked_gpu_pairs"] == 6 and not summary["peer_to_peer_clear"]
    downstream = [p for p in audit["ports"] if p["port_type"] == "downstream_port"]
    assert len(downstream) == 5
    assert all(p["acs_ctl"] == 0x001D and p["redirect"] and p["on_peer_path"] for p in downstream)
    upstream = [p for p in audit["ports"] if p["port_type"] == "upstream_port"]
    assert len(upstream) == 2
    assert all(p["acs_cap"] is None and p["on_peer_path"] and p["on_gpu_path"] for p in upstream)
    pair = [p for p in audit["gpu_pairs"] if p["gpus"] == ["0000:43:00.0", "0000:44:00.0"]][0]
    assert pair["bridges"] == ["0000:42:00.0", "0000:42:01.0"]
    gpu = audit["gpus"][0]
    assert gpu["numa_node"] == 0 and gpu["driver"] == "nvidia" and gpu["link"]["gen_max"] == 4


def test_rootport_profile_blocked_by_root_ports(lab_node):
    node = lab_node("epyc-rootport-acs")
    audit = _topology.PciTopology.scan(str(node.sysfs)).audit()
    (pair,) = audit["blocked_gpu_pairs"]
    assert pair["redirecting"] == ["0000:00:01.1", "0000:00:01.2"]
    assert all(p["acs_ctl"] == 0x001D for p in audit["ports"])


def test_clear_pairs_after_registers_change(lab_node):
    node = lab_node("epyc-rootport-acs")
    for bdf in ("0000:00:01.1", "0000:00:01.2"):
        path = os.path.join(str(node.sysfs), "devices", bdf, "config")
        cfg = _config_space.PciConfig(open(path, "rb").read())
        with open(path, "r+b") as handle:
            handle.seek(cfg.acs["offset"] + 6)
            handle.write((0x0011).to_bytes(2, "little"))
        assert _acs.read_acs_ctl(str(node.sysfs), bdf, cfg.acs["offset"]) == 0x0011
    summary = _topology.PciTopology.scan(str(node.sysfs)).audit()["summary"]
    assert summary["blocked_gpu_pairs"] == 0 and summary["peer_to_peer_clear"]
    assert not node.redirected(0, 1)


def test_truncated_config_is_a_clear_error(lab_node):
    node = lab_node("l40s-4x-switch")
    path = os.path.join(str(node.sysfs), "devices", "0000:42:00.0", "config")
    with open(path, "r+b") as handle:
        handle.truncate(64)
    with pytest.raises(
        _config_space.PciConfigTruncated, match=r"0000:42:00.0: read only 64 bytes.*CAP_SYS_ADMIN.*root"
    ):
        _topology.PciTopology.scan(str(node.sysfs))


def truncate_config(node, bdf, size):
    with open(os.path.join(str(node.sysfs), "devices", bdf, "config"), "r+b") as handle:
        handle.truncate(size)


@pytest.mark.parametrize("size", [256, 200])
def test_short_config_space_is_unknown_not_clear(lab_node, size):
    """A bridge on the GPU path read without its extended space: ACS unknown, never clear."""
    node = lab_node("epyc-rootport-acs")
    topo = _topology.PciTopology.scan(str(node.sysfs))
    bdf = "0000:00:01.1"
    for port in topo.ports():  # ACS off everywhere: the tree would be clear...
        cfg = topo.devices[port].config
        if cfg.acs is not None:
            path = os.path.join(str(node.sysfs), "devices", port, "config")
            with open(path, "r+b") as handle:
                handle.seek(cfg.acs["offset"] + 6)
                handle.write((0x0011).to_bytes(2, "little"))
    assert _topology.PciTopology.scan(str(node.sysfs)).audit()["summary"]["peer_to_peer_clear"]
    truncate_config(node, bdf, size)  # ...but one root port's extended space is not there
    audit = _topology.PciTopology.scan(str(node.sysfs)).audit()
    assert audit["summary"]["peer_to_peer_clear"] is False
    assert audit["summary"]["acs_unknown_path_ports"] == 1
    (unknown,) = audit["acs_unknown_ports"]
    assert unknown["bdf"] == bdf and "%d bytes" % size in unknown["reason"]
    assert "run as root" in unknown["reason"] and "lspci -xxxx" in unknown["reason"]
    port = [p for p in audit["ports"] if p["bdf"] == bdf][0]
    assert port["acs_unknown"] is True and port["acs_cap"] is None
    (pair,) = audit["gpu_pairs"]
    assert pair["acs_unknown"] == [bdf] and pair["blocked"] is False
    assert any(bdf in w and "unknown, not absent" in w for w in audit["warnings"])


def test_missing_tree_is_a_clear_error(tmp_path):
    with pytest.raises(_sysfs.PciTreeMissing, match="no PCI devices directory at .*sysfs.path"):
        _sysfs.scan_tree(str(tmp_path / "nope"))


def test_header_only_scan_needs_no_config(lab_node):
    node = lab_node("vfio-passthrough")
    # What a user without CAP_SYS_ADMIN reads: the 64-byte header only.
    for bdf in node.devices:
        with open(os.path.join(str(node.sysfs), "devices", bdf, "config"), "r+b") as handle:
            handle.truncate(64)
    with pytest.raises(_config_space.PciConfigTruncated):
        _sysfs.scan_tree(str(node.sysfs))
    devices = _sysfs.scan_tree(str(node.sysfs), with_config=False)
    gpus = sorted(b for b, d in devices.items() if d.is_gpu)
    assert gpus == sorted(g.bdf for g in node.gpus)
    assert [b for b, d in devices.items() if d.driver == "vfio-pci"] == [node.gpus[3].bdf]


def test_vfio_conflicts(lab_node):
    node = lab_node("vfio-passthrough")
    topo = _topology.PciTopology.scan(str(node.sysfs))
    vfio_gpu = node.gpus[3].bdf
    dsp_above, dsp_beside = node.chain(vfio_gpu)[0], node.chain(node.gpus[2].bdf)[0]
    # The port above the passed-through GPU, and the one beside it under the same switch.
    for port in (dsp_above, dsp_beside):
        conflicts = topo.vfio_conflicts([port])
        assert [c["bdf"] for c in conflicts] == [vfio_gpu], port
    # The other switch routes none of its traffic.
    other = node.chain(node.gpus[0].bdf)[0]
    assert topo.vfio_conflicts([other]) == []
    # A root port of the same host bridge does.
    assert [c["bdf"] for c in topo.vfio_conflicts([node.chain(node.gpus[0].bdf)[-1]])] == [vfio_gpu]


def test_scan_is_one_read_per_config_file(lab_node, monkeypatch):
    node = lab_node("h100-sxm-8x")
    reads = []
    real = _sysfs.read_config

    def counting(path, bdf=None):
        reads.append(path)
        return real(path, bdf)

    monkeypatch.setattr(_sysfs, "read_config", counting)
    topo = _topology.PciTopology.scan(str(node.sysfs))
    topo.audit()
    assert len(reads) == len(node.devices) == len(set(reads))
