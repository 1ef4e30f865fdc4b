#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: planned_change
short_description: Check mode's answer for commands a role runs outside check mode
version_added: 0.1.0
description:
  - For a change a role makes with commands (M(ansible.builtin.command) skips in check mode, and
    so reports nothing), the commands the role computed beforehand from what it read, reported as
    this task's change - C(changed) when there is any - with the state before and after as the
    diff, so that a check-mode run (C(playbooks/drift.yml --check --diff)) sees the drift.
  - It runs in the controller's process (an action plugin) and runs nothing on the node. Outside
    check mode it fails - run it only when C(ansible_check_mode) is true, beside the tasks that run the commands.
  - Role P(gpufleet.node.pcie_p2p#role) reports with it the C(grubby) commands that would give the
    boot entries of a RHEL-family node their kernel parameter.
author:
  - gpufleet.node developers (@gpufleet)
options:
  commands:
    description:
      - The commands (each an argv list) the role would run; empty - nothing would change.
    type: list
    elements: list
    required: true
  header:
    description:
      - What O(before) and O(after) show (the diff's header), e.g. the command that read it.
    type: str
    default: ""
  before:
    description:
      - The state as the role read it.
    type: str
    default: ""
  after:
    description:
      - The state as the commands would leave it.
    type: str
    default: ""
attributes:
  action:
    support: full
    description: All of it runs in the controller's process.
  async:
    support: none
    description: Not supported.
  check_mode:
    support: full
    description: It runs in check mode only.
  diff_mode:
    support: full
    description: O(before) to O(after), when some command would run and they differ.
  platform:
    support: full
    platforms: posix
    description: The controller.
"""

EXAMPLES = r"""
- name: Report the boot entries that lack the kernel parameter (grubby, check mode)
  gpufleet.node.planned_change:
    commands: "{{ plan.commands }}"
    header: grubby --info=ALL
    before: "{{ plan.diff.before }}"
    after: "{{ plan.diff.after }}"
  when: ansible_check_mode
"""

RETURN = r"""
commands:
  description: Each command that would run, as one line.
  returned: always
  type: list
  elements: str
  sample: ['grubby --update-kernel=ALL --args="pci=disable_acs_redir=0000:40:01.1"']
"""
