# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether a node's NCCL gate verdict lets it take traffic: the one rule, used by the
node_readiness_info module (nccl_gate, lb_registration, validate.yml) and by the node's HAProxy
agent (copied beside it onto the node). Plain Python 3 standard library, no Ansible.

The rule: the readiness marker (JSON, under /run) exists, carries the CURRENT boot id, and says
``"passed": true`` (a JSON true, nothing truthy); and no GPU health verdict of the current boot
says otherwise. The GPU health verdict (``gpu-health.json`` beside the marker, written by the
gpu_health role at every boot and by the node's gpufleet-gpu-health-watch when a GPU fails while
serving) counts only when it carries the current boot id: then anything but ``"passed": true``
keeps the node out, as does a verdict file that cannot be read. No verdict, or one of an earlier
boot, leaves the decision to the gate's marker. Where the node runs the serving prober
(lb_registration), the agent also reads its record (serving/_probe_record, beside the marker): an
engine that is wedged or down, or a record missing, stale or unreadable, keeps the node out.

The records the gate writes are built here too, beside the rule that reads them (``gate_records``:
the full result and the marker, from the ``nccl_allreduce`` result); their fields are listed in
docs/gate.md, which a unit test keeps equal to ``RESULT_FIELDS`` and ``MARKER_FIELDS``.
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.node.plugins.module_utils.serving import _probe_record

#: The GPU health verdict's file name, beside the gate's marker.
HEALTH_FILE = "gpu-health.json"

#: The full result's fields (role nccl_gate writes it to nccl_gate_result_path).
RESULT_FIELDS = (
    "host",
    "boot_id",
    "passed",
    "kind",
    "reason",
    "judged_busbw_gbps",
    "threshold_gbps",
    "expected_busbw_gbps",
    "model",
    "design_key",
    "design",
    "rule",
    "physics_floor_gbps",
    "baseline",
    "avg_busbw_gbps",
    "out_of_bounds",
    "rows",
    "runs",
    "cmd",
    "rc",
    "duration_s",
    "timestamp",
)
#: The marker's fields copied from the full result.
_MARKER_FROM_RESULT = (
    "passed",
    "kind",
    "judged_busbw_gbps",
    "threshold_gbps",
    "design_key",
    "rule",
    "timestamp",
    "reason",
)
#: The readiness marker's fields: what the rule below reads (``boot_id``, ``passed``, ``reason``),
#: the verdict in short, the serving choice and where the full result is.
MARKER_FIELDS = ("boot_id",) + _MARKER_FROM_RESULT + ("serving_backend", "serving_backend_reason", "result_path")
#: Fields of the full result that are lists; a result without them records [].
_LIST_FIELDS = ("rows", "runs", "cmd")


def gate_records(result, host=None, boot_id=None, result_path=None, serving_backend=None, serving_backend_reason=None):
    """``(full result, marker)`` of one gate run, ready to write as JSON.

    ``result`` is what ``nccl_allreduce`` returned, or the failed task's result when the module
    could not say more (its ``msg`` then is the reason, the kind is ``error``); the other
    arguments are what only the caller knows: the host, the boot the verdict holds for, where the
    full result is written, and the serving backend chosen for the node and why. A field the result
    lacks is null ([] for the lists); ``passed`` is true only for a JSON true.
    """

    def field(name, default=None):
        return result[name] if name in result else default

    full = {name: field(name, [] if name in _LIST_FIELDS else None) for name in RESULT_FIELDS}
    full.update(
        host=host,
        boot_id=boot_id,
        passed=field("passed", False) is True,
        kind=field("kind", "error"),
        reason=field("reason", field("msg", "the gate did not run")),
    )
    marker = {name: full[name] for name in _MARKER_FROM_RESULT}
    marker.update(
        boot_id=boot_id,
        serving_backend=serving_backend,
        serving_backend_reason=serving_backend_reason,
        result_path=result_path,
    )
    return full, marker


def read_boot_id(path):
    """The boot id at ``path``; OSError when it cannot be read, is not text or is empty (an empty
    boot id would match a marker that carries none)."""
    try:
        with open(path, encoding="ascii") as f:
            boot_id = f.read(4096).strip()
    except UnicodeDecodeError as exc:
        raise OSError(f"not a boot id ({exc.reason} at byte {exc.start})") from None
    if not boot_id:
        raise OSError("empty")
    return boot_id


def _read_json_object(path, what):
    """``(data, problem)``: the JSON object at ``path`` as a dict and None, or None and why the
    ``what`` there is unusable (None, None when there is no file)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"unreadable {what} at {path}: {exc}"
    except RecursionError:  # json's own recursion limit: a verdict nested thousands deep
        return None, f"unreadable {what} at {path}: nested too deep"
    if not isinstance(data, dict):
        return None, f"unreadable {what} at {path}: not a JSON object"
    return data, None


def read_marker(path):
    """``(marker, problem)``: the marker as a dict and None, or None and why it is unusable
    (None, None when there is no marker)."""
    return _read_json_object(path, "NCCL gate marker")


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


def health_path_for(marker_path):
    """Where the GPU health verdict lives: ``gpu-health.json`` in the marker's directory."""
    return os.path.join(os.path.dirname(marker_path) or ".", HEALTH_FILE)


def read_health(path):
    """``(verdict, problem)`` of the GPU health verdict file, as :func:`read_marker`."""
    return _read_json_object(path, "GPU health verdict")


def health_failures(verdict):
    """``name: reason (action)`` of each failed check of a verdict (its ``reason`` when it lists
    none). A malformed verdict (``checks`` not a list, a reason that is not text) is described,
    never a TypeError: the verdict still keeps the node out."""
    checks = verdict.get("checks")
    if not isinstance(checks, list):
        checks = []
    failed = [c for c in checks if isinstance(c, dict) and c.get("status", "fail") == "fail"]
    if not failed:
        return [f"{verdict.get('reason') or 'no reason recorded'}"]
    return [
        f"{c.get('name', '?')}: {c.get('reason') or 'no reason recorded'} (action: {c.get('action') or '?'})"
        for c in failed
    ]


def health_reasons(verdict, problem, boot_id, path):
    """Why the GPU health verdict keeps the node out; [] when it does not (no verdict, one of
    another boot, or ``"passed": true``)."""
    if problem:
        return [problem]
    if verdict is None or verdict.get("boot_id") != boot_id or verdict.get("passed") is True:
        return []
    source = verdict.get("source") or "?"
    return [f"GPU health failed ({source}): " + "; ".join(health_failures(verdict))]


def agent_verdict(marker_path, boot_id_path, health_path=None, probe_path=None, probe_max_age=None, now=None):
    """``(word, reasons)``: ``(None, [])`` when the node may take traffic, else the short word of
    the first reason (what the HAProxy agent may tell the balancer: no boot id, BDF or figure) and
    every reason in full (what the agent logs to the node's journal).

    ``health_path`` defaults to :func:`health_path_for` the marker. ``probe_path``: the serving
    probe's record (serving/_probe_record), read where the node's prober runs; then a record of
    this boot, at most ``probe_max_age`` seconds old, must say the engine serves (``serving`` or
    ``busy``): ``engine-wedged``, ``engine-down``, ``probe-missing``, ``probe-stale`` and
    ``probe-unreadable`` otherwise. Without it the engine is not judged here (no prober: the
    balancer's health check alone judges the server).
    """
    words, reasons = agent_words(marker_path, boot_id_path, health_path, probe_path, probe_max_age, now, first=True)
    return (words[0] if words else None), reasons


def agent_words(
    marker_path, boot_id_path, health_path=None, probe_path=None, probe_max_age=None, now=None, first=False
):
    """``(words, reasons)``: the short word of every part that keeps the node out, in
    :func:`agent_verdict`'s order (GPU health, gate, serving probe), and their reasons; ``first``:
    the first part's only (the probe is then read only where health and gate pass). The HAProxy
    agent holds a node for the pool's budget (``--budgeted``) only where every word is budgeted:
    a node whose marker is missing or whose engine does not serve leaves at once."""
    if health_path is None:
        health_path = health_path_for(marker_path)
    try:
        boot_id = read_boot_id(boot_id_path)
    except OSError as exc:
        return ["boot-id-unreadable"], [f"cannot read the boot id at {boot_id_path}: {exc.strerror or exc}"]
    words, reasons = [], []
    verdict, problem = read_health(health_path)
    health = health_reasons(verdict, problem, boot_id, health_path)
    if health:
        words.append("health-unreadable" if verdict is None else "gpu-health-failed")
    marker, problem = read_marker(marker_path)
    gate = marker_reasons(marker, problem, boot_id, marker_path)
    if gate:
        if problem:
            words.append("marker-unreadable")
        elif marker is None:
            words.append("no-marker")
        elif marker.get("boot_id") != boot_id:
            words.append("stale-marker")
        else:
            words.append("gate-failed")
    reasons = health + gate
    if first and words:
        return words[:1], reasons
    if probe_path:
        record, problem = _read_json_object(probe_path, "serving probe record")
        word, reason = _probe_record.record_problem(record, problem, boot_id, probe_path, probe_max_age, now)
        if word:
            words.append(word)
            reasons.append(reason)
    return words, reasons


def agent_answer(marker_path, boot_id_path, health_path=None):
    """The verdict as one line with its full reason: ``up``, or ``down #<why>``. This is what the
    node's HAProxy agent logs to the journal; the balancer gets only the short word of
    :func:`agent_verdict` (``down #gate-failed``). The space before ``#`` is HAProxy's syntax.
    """
    _word, reasons = agent_verdict(marker_path, boot_id_path, health_path)
    if not reasons:
        return "up"
    return "down #" + " ".join("; ".join(reasons).split())[:200]
