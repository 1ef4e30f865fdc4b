# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The counter record: the port counters of the last run, so that the next run judges what grew
since (link flaps, error rates). Its builder (:func:`build`, :func:`dump`) and its reader
(:func:`load`) are here, side by side.

Plain Python (no Ansible imports), runs on target Python 3.8+. The file is JSON::

    {"version": 1, "timestamp": 1764403200.5,
     "ports": {"mlx5_0/1": {"counters": {"link_downed": 0, ...}, "hw_counters": {...}}}}

It is the module's own state file (like the GPU XID history), written atomically by
``common/_atomic``. A file that is not a record this collection wrote is a :class:`RecordError`
naming it.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic
from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _port

VERSION = 1
MAX_BYTES = 4 * 1024 * 1024


class RecordError(Exception):
    """A counter record that cannot be read; the message names the file."""


def _counts(value):
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in value.items()
    )


def parse(text, path):
    """The record in ``text`` (the file at ``path``), or :class:`RecordError`."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RecordError("the counter record %s is not JSON (%s)" % (path, exc)) from None
    problem = None
    if not isinstance(doc, dict):
        problem = "not a JSON object"
    elif doc.get("version") != VERSION:
        problem = "version %r, not %d" % (doc.get("version"), VERSION)
    elif not isinstance(doc.get("timestamp"), (int, float)) or isinstance(doc.get("timestamp"), bool):
        problem = "no timestamp"
    elif not isinstance(doc.get("ports"), dict) or not all(
        isinstance(p, dict) and _counts(p.get("counters", {})) and _counts(p.get("hw_counters", {}))
        for p in doc["ports"].values()
    ):
        problem = "its ports are not {counters, hw_counters} of non-negative integers"
    if problem:
        raise RecordError("the counter record %s is unreadable: %s" % (path, problem))
    return doc


def load(path):
    """The record at ``path``; None when there is none yet; :class:`RecordError` when it cannot
    be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError("cannot read the counter record %s: %s" % (path, exc.strerror or exc)) from None
    if len(data) > MAX_BYTES:
        raise RecordError("the counter record %s is larger than %d bytes" % (path, MAX_BYTES))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError("the counter record %s is not text (%s)" % (path, exc.reason)) from None
    return parse(text, path)


def snapshot(devices):
    """``{'mlx5_0/1': {'counters': {...}, 'hw_counters': {...}}}`` of the readable counters."""
    return {
        _port.port_key(d["name"], p["port"]): {"counters": dict(p["counters"]), "hw_counters": dict(p["hw_counters"])}
        for d in devices
        for p in d["ports"]
    }


def build(devices, timestamp):
    return {"version": VERSION, "timestamp": timestamp, "ports": snapshot(devices)}


def dump(record):
    return json.dumps(record, sort_keys=True, indent=1) + "\n"


def write(path, record):
    """Replace the record at ``path`` atomically (readers see the old one or the new one)."""
    _atomic.write(path, dump(record), 0o644)
