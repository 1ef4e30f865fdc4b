# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node's record of fatal XIDs across boots, and the two rules judged on it.

Plain Python (no Ansible imports), runs on target Python 3.8+. The module ``gpu_health_info``
and the node's GPU health watcher record each fatal XID of a boot here (one entry per boot, GPU
and code: ``boot_id``, ``gpu`` (its PCI address, ``0000:3b:00.0``: what an Xid line names and what
stays the same across boots in one chassis), ``code``, ``first_seen``, ``last_seen``, ``count``),
in one JSON file on persistent storage (``/var/lib/gpufleet/gpu-xid-history.json``), written
atomically and bounded (:data:`MAX_EVENTS`).

* **Recurrence** (GPUd, github.com/leptonai/gpud: an XID that two reboots did not clear calls for
  hardware inspection): the same fatal code on the same GPU in ``boots`` distinct boots (default
  2) puts a *hold* on the node. The hold is kept in the file: every later verdict fails with the
  action :data:`HARDWARE_INSPECTION`, in a boot where the XID did not come back too, until an
  operator clears it (:func:`clear`, the playbook ``clear_gpu_hold.yml``) after the inspection.
* **Correlation** (NVIDIA NVSentinel, github.com/NVIDIA/NVSentinel, tells a fault on one GPU,
  hardware, from the same fault on all of a node's GPUs, software): the same fatal code on every
  GPU of a node (two or more) in one boot is a software or driver event (action
  :data:`SOFTWARE_EVENT`); such a boot does not count towards a GPU's recurrence.
"""

from __future__ import annotations

import copy
import json
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _textfile
from ansible_collections.gpufleet.node.plugins.module_utils.health import _kernel_log
from ansible_collections.gpufleet.node.plugins.module_utils.health._checks import _gpu_of_bdf
from ansible_collections.gpufleet.node.plugins.module_utils.health._verdict import (
    FAIL,
    HARDWARE_INSPECTION,
    SOFTWARE_EVENT,
    check,
)

VERSION = 1
#: Distinct boots with the same fatal code on the same GPU that put the hold (GPUd's two reboots).
DEFAULT_BOOTS = 2
#: Entries kept (the oldest by ``last_seen`` go first); holds are kept apart and never dropped.
MAX_EVENTS = 256
MAX_CLEARED = 32
#: Bytes read at most: a larger file is not this collection's record.
MAX_BYTES = 1 << 20

CLEAR_HINT = (
    "fix or remove the file (after a hardware inspection: ansible-playbook "
    "gpufleet.node.clear_gpu_hold -l NODE writes a new one)"
)


class HistoryError(Exception):
    """The history file cannot be read or is not this collection's record."""


def empty():
    return {"version": VERSION, "events": [], "holds": [], "cleared": []}


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _valid_event(e):
    return (
        isinstance(e, dict)
        and isinstance(e.get("boot_id"), str)
        and isinstance(e.get("gpu"), str)
        and _int(e.get("code"))
        and _number(e.get("first_seen"))
        and _number(e.get("last_seen"))
        and _int(e.get("count"))
        and e.get("scope", "gpu") in ("gpu", "node")
    )


def _valid_hold(h):
    return (
        isinstance(h, dict)
        and isinstance(h.get("gpu"), str)
        and _int(h.get("code"))
        and isinstance(h.get("boots"), list)
        and all(isinstance(b, str) for b in h["boots"])
        and _number(h.get("since"))
    )


def parse(text, path):
    """The history in ``text`` (the file at ``path``); :class:`HistoryError` naming the file and
    what to do when it is not a history this collection wrote."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise HistoryError("the GPU XID history %s is not JSON (%s): %s" % (path, exc, CLEAR_HINT)) from None
    problem = None
    if not isinstance(doc, dict):
        problem = "not a JSON object"
    elif doc.get("version") != VERSION:
        problem = "version %r, not %d" % (doc.get("version"), VERSION)
    elif not isinstance(doc.get("events"), list) or not all(_valid_event(e) for e in doc["events"]):
        problem = "its events are not records of boot_id, gpu, code, first_seen, last_seen, count"
    elif not isinstance(doc.get("holds"), list) or not all(_valid_hold(h) for h in doc["holds"]):
        problem = "its holds are not records of gpu, code, boots, since"
    elif not isinstance(doc.get("cleared", []), list):
        problem = "its cleared list is not a list"
    if problem:
        raise HistoryError("the GPU XID history %s is unreadable: %s; %s" % (path, problem, CLEAR_HINT))
    doc.setdefault("cleared", [])
    return doc


def load(path):
    """The history at ``path``: an empty one when there is no file yet; :class:`HistoryError`
    when it cannot be read (a node whose record is lost must not pass as one without a hold)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return empty()
    except OSError as exc:
        raise HistoryError(
            "cannot read the GPU XID history %s: %s; %s" % (path, exc.strerror or exc, CLEAR_HINT)
        ) from None
    if len(data) > MAX_BYTES:
        raise HistoryError("the GPU XID history %s is larger than %d bytes: %s" % (path, MAX_BYTES, CLEAR_HINT))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HistoryError("the GPU XID history %s is not text (%s): %s" % (path, exc.reason, CLEAR_HINT)) from None
    return parse(text, path)


def dump(history):
    return json.dumps(history, indent=2, sort_keys=True) + "\n"


def fatal_by_gpu(xids, bus_ids):
    """``{(gpu, code): [events]}`` of the fatal Xid events with a code (``_kernel_log``'s verdict),
    each GPU by its bus id (``_checks``' mapping of the driver's ``0000:3b:00``)."""
    found = {}
    for event in xids:
        if event.get("code") is None or _kernel_log.xid_verdict(event)[0] != FAIL:
            continue
        found.setdefault((_gpu_of_bdf(event["bdf"], bus_ids), event["code"]), []).append(event)
    return found


def node_wide_codes(found, bus_ids):
    """The codes of ``found`` seen on every GPU of the node (two or more GPUs: the known ones and
    those the events name)."""
    gpus = {b for b in bus_ids if b} | {gpu for gpu, _code in found}
    codes = {code for _gpu, code in found}
    return sorted(c for c in codes if len(gpus) > 1 and gpus <= {g for g, code in found if code == c})


def observe(history, boot_id, xids, bus_ids, now=None, boots=DEFAULT_BOOTS):
    """``(history, changed)``: ``history`` with this boot's fatal Xid events (``xids`` as
    ``_kernel_log.parse_kernel_log`` returns them; ``bus_ids`` the node's GPUs) recorded, and a
    hold added for each GPU and code now seen in ``boots`` distinct boots. ``count`` is the
    number of lines of the boot (the largest seen: the kernel log of a boot only grows)."""
    now = time.time() if now is None else now
    history = copy.deepcopy(history)
    found = fatal_by_gpu(xids, bus_ids)
    wide = node_wide_codes(found, bus_ids)
    events = history["events"]
    index = {(e["boot_id"], e["gpu"], e["code"]): e for e in events}
    changed = False
    for (gpu, code), lines in sorted(found.items()):
        scope = "node" if code in wide else "gpu"
        entry = index.get((boot_id, gpu, code))
        if entry is None:
            entry = {
                "boot_id": boot_id,
                "gpu": gpu,
                "code": code,
                "first_seen": now,
                "last_seen": now,
                "count": len(lines),
                "scope": scope,
            }
            events.append(entry)
            index[(boot_id, gpu, code)] = entry
            changed = True
        elif len(lines) > entry["count"] or entry.get("scope", "gpu") != scope:
            entry.update(count=max(entry["count"], len(lines)), last_seen=now, scope=scope)
            changed = True
    held = {(h["gpu"], h["code"]) for h in history["holds"]}
    for gpu, code in sorted(found):
        if (gpu, code) in held:
            continue
        seen = recurring_boots(history, gpu, code)
        if len(seen) >= boots:
            history["holds"].append({"gpu": gpu, "code": code, "boots": seen, "since": now})
            held.add((gpu, code))
            changed = True
    if len(events) > MAX_EVENTS:
        events.sort(key=lambda e: e["last_seen"])
        del events[: len(events) - MAX_EVENTS]
        changed = True
    return history, changed


def recurring_boots(history, gpu, code):
    """The distinct boots, in the order first seen, in which ``code`` hit ``gpu`` alone (not as a
    node-wide event)."""
    seen = []
    for e in sorted(history["events"], key=lambda e: e["first_seen"]):
        if e["gpu"] == gpu and e["code"] == code and e.get("scope", "gpu") == "gpu" and e["boot_id"] not in seen:
            seen.append(e["boot_id"])
    return seen


def judge(history, boot_id):
    """The failed checks of the history for the boot ``boot_id``: ``xid_recurrence`` (the holds,
    whatever this boot's log says) and ``xid_node_wide`` (codes seen on every GPU in this boot)."""
    checks = []
    holds = history["holds"]
    if holds:
        parts = [
            "XID %d on %s in %d boots (held since %s)" % (h["code"], h["gpu"], len(h["boots"]), _when(h["since"]))
            for h in holds
        ]
        checks.append(
            check(
                "xid_recurrence",
                FAIL,
                [h["gpu"] for h in holds],
                "%s: the same fatal XID came back after a reboot; the node stays out until the hardware "
                "is inspected and the hold cleared (playbooks/clear_gpu_hold.yml)" % "; ".join(parts),
                HARDWARE_INSPECTION,
            )
        )
    wide = {}
    for e in history["events"]:
        if e["boot_id"] == boot_id and e.get("scope") == "node":
            wide.setdefault(e["code"], []).append(e["gpu"])
    if wide:
        checks.append(
            check(
                "xid_node_wide",
                FAIL,
                [g for gpus in wide.values() for g in gpus],
                "; ".join(
                    "XID %d on every GPU of the node in this boot (%d GPUs)" % (code, len(gpus))
                    for code, gpus in sorted(wide.items())
                )
                + ": a software or driver event, not one GPU's fault (check the driver, firmware and the "
                "workload; it does not count towards a GPU's hardware inspection)",
                SOFTWARE_EVENT,
            )
        )
    return checks


def _when(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def clear(history, now=None):
    """``(history, cleared)``: ``history`` without its holds and without the events of the held
    GPU and code (the inspected or replaced GPU starts afresh), each clear kept in ``cleared``
    (the last :data:`MAX_CLEARED`). ``cleared`` is ``[]`` when there was no hold."""
    now = time.time() if now is None else now
    history = copy.deepcopy(history)
    cleared = history["holds"]
    if not cleared:
        return history, []
    held = {(h["gpu"], h["code"]) for h in cleared}
    history["events"] = [e for e in history["events"] if (e["gpu"], e["code"]) not in held]
    history["holds"] = []
    history["cleared"] = (history.get("cleared") or []) + [dict(h, cleared=now) for h in cleared]
    history["cleared"] = history["cleared"][-MAX_CLEARED:]
    return history, cleared


def textfile(history, boot_id):
    """The node-exporter textfile of the history (``gpufleet_gpu_health_xid.prom``): per GPU and
    fatal code the lines of this boot and of every recorded boot (a counter that a reboot does
    not reset), the boots it was seen in, when it was last seen, the holds, and the node-wide
    events of this boot."""
    per = {}
    for e in history["events"]:
        row = per.setdefault((e["gpu"], e["code"]), {"boot": 0, "total": 0, "boots": set(), "last": 0})
        row["total"] += e["count"]
        row["boots"].add(e["boot_id"])
        row["last"] = max(row["last"], e["last_seen"])
        if e["boot_id"] == boot_id:
            row["boot"] += e["count"]
    rows = sorted(per.items())
    out = _textfile.Exposition()
    out.metric(
        "gpufleet_gpu_health_xid_count",
        "gauge",
        "Fatal Xid lines per GPU and code: scope boot (this boot) "
        "or history (every boot the node recorded; a reboot does not reset it).",
        [
            ((("gpu", gpu), ("code", code), ("scope", scope)), row["boot"] if scope == "boot" else row["total"])
            for (gpu, code), row in rows
            for scope in ("boot", "history")
        ],
    )
    out.metric(
        "gpufleet_gpu_health_xid_boots",
        "gauge",
        "Distinct boots in which the fatal Xid was recorded on the GPU.",
        [((("gpu", gpu), ("code", code)), len(row["boots"])) for (gpu, code), row in rows],
    )
    out.metric(
        "gpufleet_gpu_health_xid_last_seen_timestamp_seconds",
        "gauge",
        "When the fatal Xid was last seen on the GPU.",
        [((("gpu", gpu), ("code", code)), float(row["last"])) for (gpu, code), row in rows],
        decimals=3,
    )
    out.metric(
        "gpufleet_gpu_health_hold",
        "gauge",
        "1 while the node is held for hardware inspection (the same fatal "
        "Xid on the same GPU in several boots), until an operator clears it.",
        [((), 1 if history["holds"] else 0)],
    )
    out.metric(
        "gpufleet_gpu_health_hold_xid",
        "gauge",
        "The GPU and fatal Xid of each hold for hardware inspection.",
        [((("gpu", h["gpu"]), ("code", h["code"])), 1) for h in history["holds"]],
    )
    wide = sorted({e["code"] for e in history["events"] if e["boot_id"] == boot_id and e.get("scope") == "node"})
    out.metric(
        "gpufleet_gpu_health_xid_node_wide",
        "gauge",
        "1 for a fatal Xid seen on every GPU of the node in this boot (a software or driver event).",
        [((("code", code),), 1) for code in wide],
    )
    return out.text()
