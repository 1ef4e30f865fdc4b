# SPDX-License-Identifier: GPL-3.0-or-later
"""Role pcie_p2p through ansible-playbook on simulated trees: fix, idempotence, the boot unit
re-applying the writes after a 'reboot', drift in check mode, and the VFIO refusal."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests/integration/playbooks/pcie_p2p_role.yml"
UNIT = "gpufleet-acs.service"

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")


def play(ansible_env, root, *extra):
    env = dict(ansible_env, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    proc = subprocess.run(
        [str(Path(ansible_env["PATH"].split(":")[0]) / "ansible-playbook"), str(PLAYBOOK),
         "-e", f"lab_root={root}", *extra],
        cwd=REPO, env=env, capture_output=True, text=True)
    result = json.loads(proc.stdout)
    return proc.returncode, result["stats"]["localhost"], result


def failed_messages(result):
    return [host["msg"] for play_ in result["plays"] for task in play_["tasks"]
            for host in task["hosts"].values() if host.get("failed")]


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

    rc, stats, _ = play(ansible_env, node.root)
    assert rc == 0 and stats["changed"] == 2  # the registers, the unit file
    assert all_pairs_clear(node)
    unit = (node.root / "etc" / UNIT).read_text()
    execs = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    # Exactly the bridges on the GPU and NIC paths: both root ports, the five downstream ports;
    # never the switches' upstream ports (no ACS there) and nothing off the paths.
    assert [shlex.split(line)[4] for line in execs] == [
        "0000:40:01.1", "0000:40:03.1", "0000:42:00.0", "0000:42:01.0", "0000:42:02.0",
        "0000:47:00.0", "0000:47:01.0"]
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
