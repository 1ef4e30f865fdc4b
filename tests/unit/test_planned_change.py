# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.planned_change's answer (plugins/action/planned_change.py): changed with a
command, each command as one line, the diff only in diff mode and where there is a change.
(tests/integration/test_pcie_p2p_grubby.py runs it in role pcie_p2p.)"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.action.planned_change import report

COMMAND = ["grubby", "--update-kernel=ALL", '--args="pci=disable_acs_redir=0000:40:01.1"']


def test_a_command_is_a_change_with_its_diff():
    result = report([COMMAND], "grubby --info=ALL", 'args="ro"\n', 'args="ro pci=..."\n', diff=True)
    assert result == {
        "changed": True,
        "commands": ['grubby --update-kernel=ALL --args="pci=disable_acs_redir=0000:40:01.1"'],
        "diff": {
            "before_header": "grubby --info=ALL",
            "after_header": "grubby --info=ALL",
            "before": 'args="ro"\n',
            "after": 'args="ro pci=..."\n',
        },
    }


def test_no_diff_outside_diff_mode():
    assert "diff" not in report([COMMAND], "h", "a", "b", diff=False)
    assert report([COMMAND], "h", "a", "b", diff=False)["changed"] is True


def test_no_command_is_no_change_and_no_diff():
    assert report([], "h", "same", "same", diff=True) == {"changed": False, "commands": []}
    assert report([], "h", "a", "b", diff=True) == {"changed": False, "commands": []}
