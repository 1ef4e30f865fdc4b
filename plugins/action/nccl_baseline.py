# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action of gpufleet.node.nccl_baseline: the NCCL gate's peer baseline store, on the controller,
with no module run on any node (see the module's documentation and module_utils/nccl/_baseline.py)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _baseline

ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["read", "update"], "default": "read"},
    "verdicts": {"type": "list", "elements": "dict", "default": []},
    "window": {"type": "int", "default": _baseline.DEFAULT_WINDOW},
}


def read(store):
    """The module's result for state=read."""
    try:
        designs, corrupt = store.read()
    except (_baseline.BaselineError, OSError) as exc:
        return dict(changed=False, designs={}, corrupt={}, problem=str(exc), warnings=[str(exc)])
    out = {key: {"samples": samples} for key, samples in designs.items()}
    out.update({key: {"error": message} for key, message in corrupt.items()})
    return dict(
        changed=False,
        designs=out,
        corrupt=corrupt,
        problem=None,
        counts={key: len(samples) for key, samples in designs.items()},
        warnings=list(corrupt.values()),
    )


def update(store, verdicts, window, check_mode):
    """The module's result for state=update."""
    descriptors = {v.get("design_key"): v.get("design") for v in verdicts if isinstance(v, dict) and v.get("design")}
    try:
        outcome = store.update(verdicts, window=window, designs=descriptors, dry_run=check_mode)
    except (_baseline.BaselineError, OSError) as exc:
        return dict(
            changed=False,
            updated={},
            corrupt={},
            ignored=len(verdicts),
            dropped=[],
            problem=str(exc),
            warnings=[str(exc)],
        )
    # a verdict that failed is expected not to count; any other figure not kept is said aloud
    notes = [
        "nccl_baseline: %s (design %s, %s GB/s) not kept: %s" % (d["host"], d["design_key"], d["gbps"], d["reason"])
        for d in outcome["dropped"]
        if not d["reason"].startswith("did not pass")
    ]
    return dict(
        changed=bool(outcome["updated"]),
        updated=outcome["updated"],
        corrupt=outcome["corrupt"],
        ignored=outcome["ignored"],
        dropped=outcome["dropped"],
        problem=None,
        warnings=list(outcome["corrupt"].values()) + notes,
    )


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["window"] < 1:
            return dict(failed=True, msg=f"window must be at least 1, got {args['window']}")
        store = _baseline.Store(args["path"])
        if args["state"] == "read":
            result = read(store)
        else:
            result = update(store, args["verdicts"], args["window"], bool(self._task.check_mode))
        result["path"] = args["path"]
        return result
