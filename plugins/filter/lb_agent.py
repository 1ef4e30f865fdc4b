# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The lb_registration role's check of its HAProxy agent's allow list, with the agent's own parser
(``plugins/module_utils/lb/_allow.py``), so the role refuses exactly what the agent could not parse:

    that: lb_registration_agent_allow | gpufleet.node.lb_agent_allow_problems | length == 0
"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.module_utils.lb import _allow


def lb_agent_allow_problems(entries):
    """Why each entry of ``entries`` is refused, naming it; [] when the agent parses them all."""
    return _allow.problems(entries)


class FilterModule:
    def filters(self):
        return {"lb_agent_allow_problems": lb_agent_allow_problems}
