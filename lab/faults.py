# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m lab fault NODE KIND [CODE] [--gpu N]`: faults on a lab node (GPU health, the
driver, all_reduce_perf's misbehaviour, a wedged vLLM engine: `engine-wedge`, slow copy engines:
`copy-engine-slow`, what only DCGM's active tests find: `dcgm-memory`, `dcgm-pcie`).

The fault is written into the node's hardware model (lab/hwmodel/health.py), the lab's one fault
channel, which every stand-in reads on every call: it takes effect at once, as on a live machine,
whether the node runs or not.  On a running node, `fabric-manager-stop` also stops the node's real
`nvidia-fabricmanager` unit (and `clear` starts it again), so `systemctl is-active` agrees.
"""

from __future__ import annotations

import lab.hwmodel as hw

from .preflight import LabError

CODE_KINDS = ("xid", "sxid")


def inject(fleet, name, kind, code=None, gpu=0, log=print):
    if kind not in hw.health.KINDS:
        raise LabError(f"unknown fault {kind!r}; known: {', '.join(hw.health.KINDS)}")
    if kind in CODE_KINDS and code is None:
        raise LabError(
            f"`fault {name} {kind}` needs a code, e.g. `fault {name} {kind} {79 if kind == 'xid' else 20034}`"
        )
    if kind not in CODE_KINDS and code is not None:
        raise LabError(f"`fault {name} {kind}` takes no code (only {' and '.join(CODE_KINDS)} do)")
    with fleet.locked("fault"):
        m = fleet.machine(name)
        node = m.hw_node()
        running = bool(m.pid())
        unit = hw.units.FABRIC_MANAGER_UNIT
        if running and node.fabric_manager_active() is not None:
            if kind == "fabric-manager-stop":
                m.nsenter("systemctl", "stop", unit, timeout=60)
        try:
            what = node.inject(kind, gpu, code)
        except hw.health.FaultError as exc:
            raise LabError(str(exc)) from None
        if running and kind == "clear" and node.fabric_manager_active() is not None:
            m.nsenter("systemctl", "start", unit, timeout=60)
        log(f"lab fault: {name}: {what}")
        return what
