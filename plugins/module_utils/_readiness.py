# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether a node's NCCL gate verdict lets it take traffic: the one rule, used by the
node_readiness_info module (nccl_gate, lb_registration, validate.yml) and by the node's HAProxy
agent (copied beside it onto the node). Plain Python 3 standard library, no Ansible.

The rule: the readiness marker (JSON, under /run) exists, carries the CURRENT boot id, and says
``"passed": true`` (a JSON true, nothing truthy).
"""
from __future__ import annotations

import json


def read_boot_id(path):
    """The boot id at ``path``; OSError when it cannot be read."""
    with open(path) as f:
        return f.read().strip()


def read_marker(path):
    """``(marker, problem)``: the marker as a dict and None, or None and why it is unusable
    (None, None when there is no marker)."""
    try:
        with open(path) as f:
            marker = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"unreadable NCCL gate marker at {path}: {exc}"
    if not isinstance(marker, dict):
        return None, f"unreadable NCCL gate marker at {path}: not a JSON object"
    return marker, None


def marker_reasons(marker, problem, boot_id, path):
    """Why the marker does not let the node take traffic; [] when it does."""
    if problem:
        return [problem]
    if marker is None:
        return [f"no NCCL gate marker at {path}: the gate has not run since boot"]
    if marker.get("boot_id") != boot_id:
        return [f"the gate marker is from another boot ({marker.get('boot_id') or '?'}), not the current {boot_id}"]
    if marker.get("passed") is not True:
        return [f"the NCCL gate failed: {marker.get('reason') or 'no reason recorded'}"]
    return []


def agent_answer(marker_path, boot_id_path):
    """The HAProxy agent's one line (without its end): ``up``, or ``down #<why>``.

    HAProxy wants a space before the ``#`` of the description (``down#why`` is read as an unknown
    word and ignored), and reads one line.
    """
    try:
        boot_id = read_boot_id(boot_id_path)
    except OSError as exc:
        reasons = [f"cannot read the boot id at {boot_id_path}: {exc.strerror or exc}"]
    else:
        reasons = marker_reasons(*read_marker(marker_path), boot_id, marker_path)
    if not reasons:
        return "up"
    return "down #" + " ".join("; ".join(reasons).split())[:200]
