#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_state
short_description: Reload systemd, enable, start or stop a unit, with a unit that is not installed as a state
version_added: 0.1.0
description:
  - The one way the collection's roles and playbooks load their systemd units and set their state,
    with M(ansible.builtin.systemd_service) on the node (the same module run, the same result), with a
    unit that systemd cannot find judged in one place.
  - A unit that is not installed is fine when it is to be stopped or disabled (C(found=false),
    not changed), since there is nothing to stop.
  - A unit that is not installed and is to be started or enabled is a change in check mode (a
    check run does not write the unit file that an earlier task of the run would write), and a
    failure otherwise, that says what to do.
  - The usual sequence in a role is a template task for the unit files, registered, then this
    module with O(daemon_reload) set to whether they changed; no handler or handler flush.
  - This is an action plugin; the work is done by M(ansible.builtin.systemd_service) on the node.
author:
  - gpufleet.node developers (@gpufleet)
options:
  name:
    description:
      - The unit, for example V(vllm.service) or V(gpufleet-lb-agent.socket).
      - Required with O(state) or O(enabled).
    type: str
  state:
    description:
      - V(started), V(stopped), V(restarted) or V(reloaded), as in M(ansible.builtin.systemd_service).
      - V(stopped) of a unit that is not installed is fine.
    type: str
    choices: [started, stopped, restarted, reloaded]
  enabled:
    description:
      - Whether the unit starts at boot. V(false) of a unit that is not installed is fine.
    type: bool
  daemon_reload:
    description:
      - Run C(systemctl daemon-reload) first, so that changed unit files and drop-ins are loaded;
        typically V("{{ units is changed }}") of the task that wrote them. Not run in check mode.
      - Alone (without O(name)) it only reloads; V(false) alone does nothing.
    type: bool
    default: false
attributes:
  action:
    support: full
    description: An action plugin runs M(ansible.builtin.systemd_service) on the node and judges its result.
  async:
    support: none
    description: Not supported.
  check_mode:
    support: full
    description: Nothing is reloaded, started, stopped or enabled in check mode; the result says what would change.
  diff_mode:
    support: none
    description: The result says what would change; there is no diff.
  platform:
    support: full
    platforms: posix
    description: Nodes managed by systemd.
seealso:
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
- name: Write the agent's units
  ansible.builtin.template:
    src: "etc/systemd/system/{{ item }}.j2"
    dest: "/etc/systemd/system/{{ item }}"
    mode: '0644'
  loop: [gpufleet-lb-agent.socket, gpufleet-lb-agent@.service]
  register: agent_units

- name: Load changed units and listen for the balancer's agent checks
  gpufleet.node.service_state:
    name: gpufleet-lb-agent.socket
    enabled: true
    state: "{{ 'restarted' if agent_units is changed else 'started' }}"
    daemon_reload: "{{ agent_units is changed }}"

- name: Stop vLLM, if it is installed at all
  gpufleet.node.service_state:
    name: vllm.service
    state: stopped
"""

RETURN = r"""
found:
  description: Whether systemd knows the unit (it is installed). Absent when no unit was named.
  returned: when O(name) is given and the task did not fail for another reason
  type: bool
  sample: false
name:
  description: The unit.
  returned: when O(name) is given
  type: str
  sample: vllm.service
enabled:
  description: Whether the unit starts at boot after this task, as M(ansible.builtin.systemd_service) returns it.
  returned: when O(enabled) is given and the unit is installed
  type: bool
  sample: true
state:
  description: The unit's state after this task, as M(ansible.builtin.systemd_service) returns it.
  returned: when O(state) is given and the unit is installed
  type: str
  sample: started
status:
  description: The unit's properties (C(systemctl show)), as M(ansible.builtin.systemd_service) returns them.
  returned: when O(name) is given and the unit is installed
  type: dict
  sample: {"ActiveState": "active", "LoadState": "loaded", "UnitFileState": "enabled"}
msg:
  description: What happened to a unit that is not installed.
  returned: when the unit is not installed
  type: str
  sample: "vllm.service is not installed: nothing to stop or disable"
"""
