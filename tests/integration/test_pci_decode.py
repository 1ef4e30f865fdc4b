# SPDX-License-Identifier: GPL-3.0-or-later
"""Config-space decoding (_config_space.PciConfig) against hand-made edge cases and real dumps, checked
against the real `lspci -F` wherever a dump exists."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _acs, _config_space
from tests.harness.parsers import DEV_LINE, lspci_acs, needs_lspci, parse_lspci_dump

DATA = Path(__file__).resolve().parent.parent / "data" / "pci"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "lspci"


def flags(value):
    decoded = _config_space.decode_acs(value)
    decoded.pop("other_bits")
    return decoded


# -- registers and names -------------------------------------------------------------------------
def test_every_acs_bit_has_its_lspci_name():
    assert _config_space.ACS_FLAG_NAMES == (
        "SrcValid",
        "TransBlk",
        "ReqRedir",
        "CmpltRedir",
        "UpstreamFwd",
        "EgressCtrl",
        "DirectTrans",
    )
    for bit, name in enumerate(_config_space.ACS_FLAG_NAMES):
        decoded = _config_space.decode_acs(1 << bit)
        assert [n for n in _config_space.ACS_FLAG_NAMES if decoded[n]] == [name]
        assert decoded["other_bits"] == 0


def test_unknown_high_bits_are_kept_raw():
    decoded = _config_space.decode_acs(0x0180 | 0x001D)
    assert decoded["other_bits"] == 0x0180
    assert [n for n in _config_space.ACS_FLAG_NAMES if decoded[n]] == [
        "SrcValid",
        "ReqRedir",
        "CmpltRedir",
        "UpstreamFwd",
    ]


def test_format_is_lspci_text():
    assert _config_space.format_acs(0x001D) == (
        "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    )


def test_bits_mask_by_lspci_names():
    assert _config_space.acs_bits_mask(["ReqRedir", "CmpltRedir", "EgressCtrl"]) == 0x002C
    with pytest.raises(ValueError, match="unknown ACS flag"):
        _config_space.acs_bits_mask(["ReqRedirect"])


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0000:42:00.0", "0000:42:00.0"),
        ("42:00.0", "0000:42:00.0"),
        ("0001:C1:1F.7", "0001:c1:1f.7"),
        (" 0000:01:00.1 ", "0000:01:00.1"),
    ],
)
def test_bdf_normalized(text, expected):
    assert _config_space.normalize_bdf(text) == expected


@pytest.mark.parametrize(
    "text", ["0000:4g:00.0", "0000:42:20.0", "0000:42:00.8", "42:00", "", "pci0000:00", "0000:42:00.0;0000:43:00.0"]
)
def test_malformed_bdf_rejected(text):
    with pytest.raises(ValueError, match="malformed PCI address"):
        _config_space.normalize_bdf(text)


def test_plan_and_setpci_argv():
    assert _acs.plan_acs_write(0x001D, 0x002C, "cleared") == 0x0011
    assert _acs.plan_acs_write(0x0011, 0x002C, "set") == 0x003D
    assert _acs.setpci_args("0000:42:00.0", 0x0011, 0x002C) == ["-s", "0000:42:00.0", "ECAP_ACS+0x6.w=0000:002c"]
    assert _acs.setpci_args("0000:42:00.0", 0x003D, 0x002C, "/srv/n1/sys/bus/pci") == [
        "-O",
        "sysfs.path=/srv/n1/sys/bus/pci",
        "-s",
        "0000:42:00.0",
        "ECAP_ACS+0x6.w=002c:002c",
    ]
    assert _acs.kernel_param(["0000:01:00.0", "0000:02:00.0"]) == "pci=disable_acs_redir=0000:01:00.0;0000:02:00.0"
    assert _acs.kernel_param([]) == ""


# -- hand-made config spaces ---------------------------------------------------------------------
def make_config(
    port_type=0x6,
    acs=(0x5F, 0x1D),
    status=0x0010,
    ext_next=None,
    std_loop=False,
    lnkcap=(4, 16),
    lnksta=(3, 8),
    size=4096,
):
    b = bytearray(size)
    struct.pack_into("<HHHH", b, 0, 0x1000, 0xC010, 0x0407, status)
    struct.pack_into("<I", b, 0x08, 0x060400A1)
    b[0x0E] = 1
    b[0x34] = 0x40
    b[0x40], b[0x41] = 0x01, 0x60  # PM -> PCIe
    b[0x60], b[0x61] = 0x10, 0x40 if std_loop else 0x00
    struct.pack_into("<H", b, 0x62, 0x0002 | (port_type << 4))
    struct.pack_into("<I", b, 0x6C, lnkcap[0] | (lnkcap[1] << 4))
    struct.pack_into("<H", b, 0x72, lnksta[0] | (lnksta[1] << 4))
    nxt = 0x150 if acs else 0
    struct.pack_into("<I", b, 0x100, 0x0001 | (2 << 16) | (nxt << 20))
    if acs:
        follow = ext_next if ext_next is not None else 0
        struct.pack_into("<IHH", b, 0x150, 0x000D | (1 << 16) | (follow << 20), acs[0], acs[1])
    return bytes(b)


def test_switch_port_decoded():
    cfg = _config_space.PciConfig(make_config())
    assert cfg.port_type == "downstream_port"
    assert cfg.is_bridge
    assert cfg.acs == {"offset": 0x150, "cap": 0x5F, "ctl": 0x1D, "egress_vector_bits": 0, "quirk": None}
    assert cfg.link() == {
        "gen_max": 4,
        "speed_max": "16GT/s",
        "width_max": 16,
        "gen_current": 3,
        "speed_current": "8GT/s",
        "width_current": 8,
    }
    assert [c for c, _ in cfg.caps] == [0x01, 0x10]
    assert [c for c, _v, _o in cfg.ext_caps] == [0x0001, 0x000D]
    assert cfg.warnings == []


def test_no_capability_list_without_status_bit():
    cfg = _config_space.PciConfig(make_config(status=0x0000))
    assert cfg.caps == [] and cfg.pcie is None
    # Extended capabilities are walked only for PCI Express functions, as lspci/setpci do.
    assert cfg.ext_caps == [] and cfg.acs is None


def test_extended_chain_loop_is_guarded():
    cfg = _config_space.PciConfig(make_config(ext_next=0x100))
    assert [o for _c, _v, o in cfg.ext_caps] == [0x100, 0x150]
    assert cfg.acs["ctl"] == 0x1D
    assert any("looped at 0x100" in w for w in cfg.warnings)


def test_standard_chain_loop_is_guarded():
    cfg = _config_space.PciConfig(make_config(std_loop=True))
    assert [o for _c, o in cfg.caps] == [0x40, 0x60]
    assert any("looped at 0x40" in w for w in cfg.warnings)


def test_extended_pointer_below_0x100_stops():
    cfg = _config_space.PciConfig(make_config(ext_next=0x0C0))
    assert cfg.acs["ctl"] == 0x1D
    assert any("below 0x100" in w for w in cfg.warnings)


def test_all_ones_header_ends_chain():
    data = bytearray(make_config(acs=None))
    struct.pack_into("<I", data, 0x100, 0xFFFFFFFF)
    cfg = _config_space.PciConfig(bytes(data))
    assert cfg.ext_caps == [] and cfg.acs is None


def test_256_byte_config_has_no_extended_space():
    cfg = _config_space.PciConfig(make_config()[:256])
    assert cfg.pcie["port_type"] == "downstream_port"
    assert cfg.ext_caps == [] and cfg.acs is None
    # ... which means its ACS state is unknown, not "no ACS"
    assert cfg.ext_space_unknown
    assert "run as root" in cfg.ext_space_reason("0000:42:00.0")
    assert not _config_space.PciConfig(make_config()).ext_space_unknown


def test_header_shorter_than_64_bytes_is_an_error():
    with pytest.raises(_config_space.PciConfigTruncated):
        _config_space.PciConfig(b"\x00" * 32)


def test_intel_spt_pch_root_port_flagged():
    data = bytearray(make_config(port_type=0x4))
    struct.pack_into("<HH", data, 0, 0x8086, 0xA114)
    cfg = _config_space.PciConfig(bytes(data))
    assert cfg.acs["quirk"] == "intel_spt_pch"
    assert any("cap+8" in w for w in cfg.warnings)


def test_high_bits_survive_parsing():
    cfg = _config_space.PciConfig(make_config(acs=(0x1DF, 0x19D)))
    assert cfg.acs_cap == 0x1DF and cfg.acs_ctl == 0x19D
    assert _config_space.decode_acs(cfg.acs_ctl)["other_bits"] == 0x180


@needs_lspci
@pytest.mark.parametrize("cap,ctl", [(0x5F, 0x1D), (0x7F, 0x7F), (0x1F, 0x00), (0x7F, 0x2C), (0x1DF, 0x19D)])
def test_hand_made_dump_agrees_with_lspci(tmp_path, cap, ctl):
    data = make_config(acs=(cap, ctl))
    dump = tmp_path / "dump"
    dump.write_text(
        "42:00.0 PCI bridge: test\n"
        + "".join("%02x: %s\n" % (o, " ".join("%02x" % x for x in data[o : o + 16])) for o in range(0, 4096, 16))
    )
    seen = lspci_acs(run_lspci_dump(dump))["42:00.0"]
    cfg = _config_space.PciConfig(parse_lspci_dump(dump.read_text())["42:00.0"])
    assert seen == {"ACSCap": flags(cfg.acs_cap), "ACSCtl": flags(cfg.acs_ctl)}


# -- real dumps ----------------------------------------------------------------------------------
def run_lspci_dump(path):
    return subprocess.run(["lspci", "-F", str(path), "-vvv"], check=True, capture_output=True, text=True).stdout


def hex_only(text):
    """The dump lines of a file that mixes `lspci -vvv` text with its hex dump."""
    keep = [line for line in text.splitlines() if DEV_LINE.match(line) or re.match(r"^[0-9a-f]{2,3}: ", line)]
    return "\n".join(keep) + "\n"


def assert_agrees_with_lspci(dump_path):
    """Our decode of every function in a dump equals what the real lspci prints for it."""
    dumps = parse_lspci_dump(dump_path.read_text())
    seen = lspci_acs(run_lspci_dump(dump_path))
    assert set(seen) == set(dumps)
    for bdf, data in dumps.items():
        cfg = _config_space.PciConfig(data)
        if cfg.acs is None:
            assert seen[bdf] == {}, bdf
        else:
            assert seen[bdf] == {"ACSCap": flags(cfg.acs_cap), "ACSCtl": flags(cfg.acs_ctl)}, bdf
    return dumps


CORPUS_FILES = sorted(CORPUS.glob("*.txt")) if CORPUS.is_dir() else []


@needs_lspci
@pytest.mark.optional_input
@pytest.mark.skipif(not CORPUS_FILES, reason="no ../shared/corpus/lspci (a plain clone has none)")
@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_pciutils_corpus_agrees_with_lspci_and_expectations(tmp_path, path):
    dump = tmp_path / "dump"
    dump.write_text(hex_only(path.read_text()))
    dumps = assert_agrees_with_lspci(dump)
    expect_path = path.with_suffix(".expect.json")
    if not expect_path.exists():
        return
    printed = lspci_acs(path.read_text())  # the -vvv text captured with the dump
    for entry in json.loads(expect_path.read_text()):
        cfg = _config_space.PciConfig(dumps[entry["bdf"]])
        if entry["acscap"] is None:
            assert cfg.acs is None
            continue
        # The captured text is the reference; the hex kept next to it may stop at 0x100.
        assert printed[entry["bdf"]] == {"ACSCap": entry["acscap"], "ACSCtl": entry["acsctl"]}
        if cfg.acs is None:
            assert len(dumps[entry["bdf"]]) <= 256, "ACS missed although the dump covers 0x100+"
            continue
        assert flags(cfg.acs_cap) == entry["acscap"]
        assert flags(cfg.acs_ctl) == entry["acsctl"]


@needs_lspci
def test_public_dump_amd_gpu_acs_at_0x2a0():
    """RX 5600 XT from the amd-gfx list (see tests/data/pci/amdgpu-rx5600xt.source)."""
    dumps = assert_agrees_with_lspci(DATA / "amdgpu-rx5600xt.dump")
    cfg = _config_space.PciConfig(dumps["28:00.0"])
    assert (cfg.vendor_id, cfg.device_id, cfg.class_code) == (0x1002, 0x731F, 0x0300)
    assert cfg.port_type == "legacy_endpoint"
    assert cfg.acs == {"offset": 0x2A0, "cap": 0, "ctl": 0, "egress_vector_bits": 0, "quirk": None}
    assert [hex(o) for _c, _v, o in cfg.ext_caps] == [
        "0x100",
        "0x150",
        "0x200",
        "0x240",
        "0x270",
        "0x2a0",
        "0x2b0",
        "0x2c0",
        "0x2d0",
        "0x320",
        "0x400",
        "0x410",
        "0x440",
    ]
    assert cfg.warnings == []


@needs_lspci
def test_pciutils_dump_plx_chain_jumps_backwards():
    """PLX PEX 8796 upstream port from pciutils' tests (see plx-pex8796-usp.source)."""
    dumps = assert_agrees_with_lspci(DATA / "plx-pex8796-usp.dump")
    cfg = _config_space.PciConfig(dumps["07:00.0"])
    assert cfg.port_type == "upstream_port"
    assert [o for _c, _v, o in cfg.ext_caps] == [0x100, 0xFB4, 0x138, 0x10C, 0x148, 0xE00, 0xB00, 0xB70]
    assert cfg.acs is None and cfg.warnings == []
    assert cfg.link()["gen_max"] == 3


def test_sources_are_recorded():
    for dump in DATA.glob("*.dump"):
        source = dump.with_suffix(".source").read_text()
        assert source.startswith("SOURCE: ")
