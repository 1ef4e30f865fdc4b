# SPDX-License-Identifier: GPL-3.0-or-later
"""Role pcie_p2p's RHEL-family kernel parameter (grubby) through ansible-playbook on a simulated
tree, with RHEL 9's real facts (tests/data/ansible-facts/rhel-9.json) as the run's ansible_facts
and a stand-in grubby first on PATH: it lists a real RHEL 9.1 `grubby --info=ALL`
(tests/data/grubby/, SOURCE there) and records every other call. Check mode reports the commands
the run would give grubby, with the boot entries before and after as the diff (what drift.yml
sees); the run gives them; a node whose entries carry the parameter changes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.harness.playbook import run_playbook
from tests.unit.test_node_python import facts

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "tests/integration/playbooks/pcie_p2p_role.yml"
LISTING = REPO / "tests/data/grubby/rhel-9.1-info-all.txt"
REPORT = "Report the boot entries that lack the kernel parameter (grubby, check mode)"
SET = "Set the kernel parameter on the boot entries that lack it (grubby)"

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="pciutils is not installed")


@pytest.fixture
def rhel_node(lab_node, tmp_path, ansible_env):
    """(run, listing, calls): run(*args) plays the role on a RHEL 9 node of the l40s-4x-switch
    profile with persistence kernel_param; listing is the file the stand-in grubby lists, calls
    the file where it records each other call (one line of arguments each)."""
    node = lab_node("l40s-4x-switch")
    (node.root / "etc").mkdir()
    bindir, listing, calls = tmp_path / "bin", tmp_path / "grubby-info-all.txt", tmp_path / "grubby-calls"
    bindir.mkdir()
    listing.write_text(LISTING.read_text())
    grubby = bindir / "grubby"
    grubby.write_text(
        '#!/bin/sh\nif [ "$*" = "--info=ALL" ]; then cat %s; else printf "%%s\\n" "$*" >> %s; fi\n' % (listing, calls)
    )
    grubby.chmod(0o755)
    env = dict(ansible_env, PATH="%s:%s" % (bindir, ansible_env.get("PATH", "/usr/bin:/bin")))
    extra = [
        "lab_root=%s" % node.root,
        "pcie_p2p_persistence=kernel_param",
        "pcie_p2p_setpci=%s" % shutil.which("setpci"),  # RHEL's is /usr/sbin/setpci; this machine's is not
        json.dumps({"ansible_facts": facts("rhel-9")}),
    ]

    def run(*args):
        played = run_playbook(PLAYBOOK, *args, extra_vars=extra, env=env, json_callback=True, timeout=300)
        assert played.returncode == 0, played.explain()
        tasks = {
            t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"]
            for play in played.json["plays"]
            for t in play["tasks"]
            if "localhost" in t["hosts"]
        }
        return played, tasks

    return run, listing, calls


def test_check_mode_reports_what_grubby_would_be_given_and_the_run_gives_it(rhel_node):
    run, listing, calls = rhel_node
    _, tasks = run("--check", "--diff")
    report = tasks[REPORT]
    assert report["changed"] is True
    (command,) = report["commands"]
    assert command.startswith('grubby --update-kernel=ALL --args="pci=disable_acs_redir=0000:40:01.1;')
    param = command.split('--args="', 1)[1][:-1]
    (diff,) = report["diff"] if isinstance(report["diff"], list) else [report["diff"]]
    assert diff["before_header"] == "grubby --info=ALL"
    assert diff["before"].count('kernel="') == diff["after"].count('kernel="') == 3  # the three entries
    assert diff["after"].count('"%s""' % param) == 3 and param not in diff["before"]
    assert tasks[SET].get("skipped") is True
    assert not calls.exists()  # check mode gave grubby nothing

    _, tasks = run()
    assert calls.read_text().splitlines() == [command[len("grubby ") :]]
    assert REPORT not in tasks or tasks[REPORT].get("skipped") is True

    # grubby has written the parameter into every entry: nothing would change, in check mode or not
    listing.write_text(
        "\n".join(
            line[:-1] + ' "%s""' % param if line.startswith('args="') else line
            for line in LISTING.read_text().splitlines()
        )
        + "\n"
    )
    calls.unlink()
    _, tasks = run("--check", "--diff")
    assert tasks[REPORT]["changed"] is False and tasks[REPORT]["commands"] == [] and "diff" not in tasks[REPORT]
    played, tasks = run()
    assert not calls.exists() and played.host("localhost")["changed"] == 0
