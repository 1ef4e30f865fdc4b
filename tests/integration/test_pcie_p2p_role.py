# SPDX-License-Identifier: GPL-3.0-or-later
"""Role pcie_p2p through ansible-playbook on simulated trees: fix, idempotence, the boot unit
re-applying the writes after a 'reboot', drift in check mode, and the VFIO refusal."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.playbook import run_playbook

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests/integration/playbooks/pcie_p2p_role.yml"
UNIT = "gpufleet-acs.service"

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")


def play(ansible_env, root, *extra):
    run = run_playbook(PLAYBOOK, *extra, extra_vars=[f"lab_root={root}"], env=ansible_env, json_callback=True)
    result = run.json
    return run.returncode, result["stats"]["localhost"], result


def failed_messages(result):
    return [
        host["msg"]
        for play_ in result["plays"]
        for task in play_["tasks"]
        for host in task["hosts"].values()
        if host.get("failed")
    ]


@pytest.fixture
def machine(lab_node):
    def _make(profile):
        node = lab_node(profile)
        (node.root / "etc").mkdir()
        return node

    return _make


def all_pairs_clear(node):
    n = len(node.gpus)
    return all(not node.redirected(i, j) for i in range(n) for j in range(i + 1, n))


def test_fix_is_idempotent_and_the_boot_unit_reapplies_it(machine, ansible_env):
    node = machine("l40s-4x-switch")
    assert node.redirected(0, 1)

    rc, stats, result = play(ansible_env, node.root)
    assert rc == 0 and stats["changed"] == 2  # the registers, the unit file
    assert all_pairs_clear(node)
    # One scan of the tree: pcie_acs's own run carries the RDMA NICs (no separate audit module run).
    ran = {task["task"]["name"]: task["hosts"]["localhost"] for task in result["plays"][0]["tasks"]}
    assert not any("Read ACS" in name for name in ran), list(ran)
    acs = next(r for name, r in ran.items() if "Clear ACS redirect" in name)
    assert [(n["class"], n["vendor_id"]) for n in acs["nics"]] == [("0x0207", "0x15b3")], acs["nics"]
    unit = (node.root / "etc" / UNIT).read_text()
    execs = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    # Exactly the bridges on the GPU and NIC paths: both root ports, the five downstream ports;
    # never the switches' upstream ports (no ACS there) and nothing off the paths.
    assert [shlex.split(line)[4] for line in execs] == [
        "0000:40:01.1",
        "0000:40:03.1",
        "0000:42:00.0",
        "0000:42:01.0",
        "0000:42:02.0",
        "0000:47:00.0",
        "0000:47:01.0",
    ]
    assert all(line.endswith("ECAP_ACS+0x6.w=0000:002c") for line in execs)
    if shutil.which("systemd-analyze"):
        copy = node.root / "verify" / UNIT
        copy.parent.mkdir()
        copy.write_text(unit)
        verify = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr

    rc, stats, _ = play(ansible_env, node.root)
    assert rc == 0 and stats["changed"] == 0

    # Reboot: firmware puts ACS back. A check-mode run reports the drift and writes nothing.
    node.reset_firmware()
    rc, stats, _ = play(ansible_env, node.root, "--check")
    assert rc == 0 and stats["changed"] == 1
    assert node.redirected(0, 1) and node.redirected(2, 3)

    # What systemd runs at boot: the unit's ExecStart lines, as argv.
    for line in execs:
        subprocess.run(shlex.split(line), check=True)
    assert all_pairs_clear(node)
    rc, stats, _ = play(ansible_env, node.root, "--check")
    assert rc == 0 and stats["changed"] == 0


def test_vfio_passthrough_host_is_refused_untouched(machine, ansible_env):
    node = machine("vfio-passthrough")
    before = {b.bdf: b.acs_ctl for b in node.bridges}
    rc, stats, result = play(ansible_env, node.root)
    assert rc != 0 and stats["failures"] == 1
    assert any("vfio-pci" in msg for msg in failed_messages(result))
    assert {b.bdf: b.acs_ctl for b in node.bridges} == before
    assert not (node.root / "etc" / UNIT).exists()


# -- kernel_param persistence: what reaches the kernel -------------------------------------------
def grub_words(line):
    """Split one grub.cfg line the way GRUB's script lexer does: blanks separate words, an unquoted
    ';' or newline ends the command, quotes ('...', "...") and a backslash protect, and are removed.
    Returns the words of the FIRST command (what `linux` receives). A model of the GRUB 2 lexer
    (grub-core/script/yylex.l), not GRUB itself: this machine has no grub-mkconfig."""
    words, word, quote, i, in_word = [], "", None, 0, False
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(line) and line[i + 1] in '"\\$':
                i += 1
                word += line[i]
            else:
                word += c
        elif c in "'\"":
            quote, in_word = c, True
        elif c == "\\" and i + 1 < len(line):
            i += 1
            word, in_word = word + line[i], True
        elif c in " \t":
            if in_word:
                words.append(word)
            word, in_word = "", False
        elif c in ";\n":
            break
        else:
            word, in_word = word + c, True
        i += 1
    if in_word:
        words.append(word)
    return words


def linux_line(dropin):
    """grub-mkconfig: `. dropin` in sh, then 10_linux's `linux ... ro ${args}` (args is
    "${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}"), echoed verbatim into grub.cfg."""
    script = (
        'GRUB_CMDLINE_LINUX="console=ttyS0"; GRUB_CMDLINE_LINUX_DEFAULT="quiet"; . "$1"; '
        'args="${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}"; '
        'echo "\tlinux\t/vmlinuz-6.8.0 root=UUID=0d6f ro ${args}"'
    )
    return subprocess.run(["sh", "-c", script, "sh", str(dropin)], check=True, capture_output=True, text=True).stdout


def test_grub_kernel_param_keeps_every_bridge(machine, ansible_env, tmp_path):
    node = machine("l40s-4x-switch")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "update-grub").write_text("#!/bin/sh\ntouch %s\n" % (tmp_path / "update-grub-ran"))
    (bindir / "update-grub").chmod(0o755)
    dropin = tmp_path / "gpufleet-acs.cfg"
    env = dict(ansible_env, PATH="%s:%s" % (bindir, ansible_env.get("PATH", "/usr/bin:/bin")))
    rc, stats, _ = play(
        env, node.root, "-e", "pcie_p2p_persistence=kernel_param", "-e", "pcie_p2p_grub_dropin=%s" % dropin
    )
    assert rc == 0, stats
    assert (tmp_path / "update-grub-ran").exists()
    bridges = [
        "0000:40:01.1",
        "0000:40:03.1",
        "0000:42:00.0",
        "0000:42:01.0",
        "0000:42:02.0",
        "0000:47:00.0",
        "0000:47:01.0",
    ]
    words = grub_words(linux_line(dropin))
    # The whole list is one argument of `linux`, after the settings before it, before those after.
    assert words == [
        "linux",
        "/vmlinuz-6.8.0",
        "root=UUID=0d6f",
        "ro",
        "console=ttyS0",
        "pci=disable_acs_redir=" + ";".join(bridges),
        "quiet",
    ]
    # What the drop-in used to write loses every bridge after the first ';' in the same model.
    old = tmp_path / "old.cfg"
    old.write_text('GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX pci=disable_acs_redir=%s"\n' % ";".join(bridges))
    assert grub_words(linux_line(old))[-1] == "pci=disable_acs_redir=" + bridges[0]
