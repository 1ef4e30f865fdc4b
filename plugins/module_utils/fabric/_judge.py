# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The RDMA fabric of a node, judged check by check.

Plain Python (no Ansible imports), runs on target Python 3.8+. Each check has the shape of the
GPU health checks (``health/_verdict.check``: ``name``, ``status``, ``gpus`` (always empty
here), ``reason``, ``action``) plus ``ports``, the ports it names (``mlx5_0/1``). The checks:

* ``port_count`` - the judged ports against ``expect.ports``; no RDMA device passes only when
  no port is expected.
* ``readable`` - every file the checks need read as its format (unreadable is not healthy).
* ``port_state`` - every port ``ACTIVE`` and ``LinkUp``.
* ``link_layer`` - every port on ``expect.link_layer`` (only when it is given).
* ``rate`` - every active port at ``expect.rate_gbps``; without it, ports that disagree warn.
* ``link_flap`` - ``link_downed`` did not rise in any window.
* ``error_counters`` - the counters of ``_thresholds.COUNTER_LIMITS`` within their limits.
* ``verbs_device`` - each device has its ``/dev/infiniband/uverbs<N>``.

A window is a pair of reads the counters are compared across: the two reads of this run, and the
counter record of the previous run. A counter that went down was cleared in between (a driver
reload, a reboot, ``perfquery -R``): its value is what grew since (NVSentinel's reset rule).
"""

from __future__ import annotations

import fnmatch

from ansible_collections.gpufleet.node.plugins.module_utils.fabric import _port, _record, _thresholds
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict

PASS, WARN, FAIL = _verdict.PASS, _verdict.WARN, _verdict.FAIL


def check(name, status, ports, reason, action=_verdict.NONE):
    return dict(_verdict.check(name, status, [], reason, action), ports=sorted(set(ports), key=_port.natural_key))


def _strongest(actions):
    return max(actions, key=_verdict.ACTIONS.index) if actions else _verdict.NONE


def _gbps(value):
    return ("%g" % value) if value is not None else "?"


# -- selection and windows --------------------------------------------------------------------
def select(devices, patterns):
    """``(judged devices, patterns that match none)``: every device when ``patterns`` is empty,
    else those whose name matches one of them (shell patterns, ``mlx5_[0-7]``)."""
    if not patterns:
        return list(devices), []
    judged = [d for d in devices if any(fnmatch.fnmatchcase(d["name"], p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(d["name"], p) for d in devices)]
    return judged, unmatched


def windows(earlier, seconds, record, now):
    """The windows the counters are compared across: ``[{name, seconds, before}]``, ``before``
    as :func:`_record.snapshot` gives it. ``earlier`` is this run's first read (None for one
    read); ``record`` the previous run's record (None without one); ``now`` the wall time."""
    found = []
    if earlier is not None:
        found.append({"name": "in %.1f s" % seconds, "seconds": seconds, "before": _record.snapshot(earlier)})
    if record is not None and now - record["timestamp"] > 0:
        age = now - record["timestamp"]
        found.append({"name": "since the record of %.0f s ago" % age, "seconds": age, "before": record["ports"]})
    return found


def increase(before, after):
    """``(what grew, cleared)``: ``after - before``, or ``after`` when the counter went down."""
    if after < before:
        return after, True
    return after - before, False


# -- the checks -------------------------------------------------------------------------------
def check_port_count(ports, expected, unmatched, total_devices):
    keys = [k for k, _d, _p in ports]
    problems = ["devices: %r matches no RDMA device" % p for p in unmatched]
    if expected is not None and len(ports) != expected:
        if not ports:
            problems.insert(
                0,
                "no RDMA port, %d expected: is the adapter in the PCI tree (lspci) and its driver loaded "
                "(mlx5_core, mlx5_ib)?" % expected,
            )
        else:
            problems.insert(0, "%d ports, %d expected (%s)" % (len(ports), expected, ", ".join(keys)))
    if problems:
        return check("port_count", FAIL, keys, "; ".join(problems), _verdict.INSPECT)
    if not ports:
        return check("port_count", PASS, [], "no RDMA device" if not total_devices else "no port judged")
    suffix = ", as expected" if expected is not None else ""
    return check("port_count", PASS, keys, "%d ports%s: %s" % (len(ports), suffix, ", ".join(keys)))


def check_readable(judged, tool_reports):
    problems, keys = [], []
    for device in judged:
        for entry in device["unreadable"]:
            problems.append("%s: %s" % (entry["file"], entry["error"]))
            keys.extend(_port.port_key(device["name"], p["port"]) for p in device["ports"])
        for port in device["ports"]:
            key = _port.port_key(device["name"], port["port"])
            for entry in port["unreadable"]:
                problems.append("%s: %s" % (entry["file"], entry["error"]))
                keys.append(key)
            unread = {e["field"] for e in port["unreadable"]}
            for name in _thresholds.REQUIRED_COUNTERS:
                if "counters" not in unread and "counters/" + name not in unread and name not in port["counters"]:
                    problems.append("%s: no counters/%s" % (key, name))
                    keys.append(key)
    if not problems:
        return check("readable", PASS, [], "every file read")
    tools = [
        "%s: %s" % (r["name"], r["error"] or "printed none of it")
        for r in tool_reports
        if r["error"] or not r["filled"]
    ]
    reason = "unreadable, so not judged healthy: " + "; ".join(problems)
    if tools:
        reason += " (not filled by the tools: %s)" % "; ".join(tools)
    return check("readable", FAIL, keys, reason, _verdict.INSPECT)


def _state_problem(key, port):
    """``(text, action)`` of a port that is not ACTIVE/LinkUp; None when it is."""
    state, phys = port["state_id"], port["phys_state_id"]
    if state is None or phys is None:
        return "%s: state not read" % key, _verdict.INSPECT
    if state == _port.ACTIVE and phys == _port.LINK_UP:
        return None
    text = "%s: %s, %s" % (key, port["state"], port["phys_state"])
    if phys == _port.POLLING:
        return text + " (no link partner: the cable, the transceiver or the switch port)", _verdict.INSPECT
    if phys == _port.DISABLED:
        return text + " (the port is disabled: by the switch, the subnet manager or ibportstate)", _verdict.CONFIGURE
    if phys == _port.LINK_UP and state in (_port.INIT, _port.ARMED):
        return text + " (the link is up but no subnet manager made it ACTIVE: is opensm or UFM running?)", (
            _verdict.CONFIGURE
        )
    return text, _verdict.INSPECT


def check_port_state(ports):
    problems, actions, keys = [], [], []
    for key, _device, port in ports:
        found = _state_problem(key, port)
        if found:
            problems.append(found[0])
            actions.append(found[1])
            keys.append(key)
    if problems:
        return check("port_state", FAIL, keys, "; ".join(problems), _strongest(actions))
    return check("port_state", PASS, [], "every port ACTIVE, LinkUp")


def check_link_layer(ports, expected):
    wrong = [(k, p) for k, _d, p in ports if p["link_layer"] != expected]
    if not wrong:
        return check("link_layer", PASS, [], "every port on %s" % expected)
    reason = "; ".join(
        "%s runs %s, the design expects %s" % (k, p["link_layer"] or "an unread link layer", expected) for k, p in wrong
    )
    reason += ": set the adapter's port type (mlxconfig LINK_TYPE_P<n>) and reboot, or correct expect.link_layer"
    return check("link_layer", FAIL, [k for k, _p in wrong], reason, _verdict.CONFIGURE)


def _rate_text(port):
    shape = " ".join(x for x in (port["width"], port["speed"]) if x)
    return "%s Gb/s%s" % (_gbps(port["rate_gbps"]), " (%s)" % shape if shape else "")


def check_rate(ports, expected):
    active = [(k, p) for k, _d, p in ports if p["state_id"] == _port.ACTIVE]
    if not active:
        return check("rate", PASS, [], "no active port to judge (see port_state)")
    inactive = len(ports) - len(active)
    aside = " (%d not active, see port_state)" % inactive if inactive else ""
    unread = [k for k, p in active if p["rate_gbps"] is None]
    problems = ["%s: rate not read" % k for k in unread]
    measured = [(k, p) for k, p in active if p["rate_gbps"] is not None]
    if expected is not None:
        slow = [(k, p) for k, p in measured if p["rate_gbps"] < expected]
        fast = [(k, p) for k, p in measured if p["rate_gbps"] > expected]
        problems += ["%s at %s, %s Gb/s expected" % (k, _rate_text(p), _gbps(expected)) for k, p in slow]
        if problems:
            return check(
                "rate",
                FAIL,
                unread + [k for k, _p in slow],
                "; ".join(problems) + ": a link trained down - reseat or replace the cable or transceiver, "
                "check the switch port",
                _verdict.INSPECT,
            )
        if fast:
            return check(
                "rate",
                WARN,
                [k for k, _p in fast],
                "; ".join(
                    "%s at %s, faster than the %s Gb/s expected" % (k, _rate_text(p), _gbps(expected)) for k, p in fast
                )
                + ": is expect.rate_gbps right for this design?",
                _verdict.CONFIGURE,
            )
        return check("rate", PASS, [], "every active port at %s Gb/s%s" % (_gbps(expected), aside))
    if problems:
        return check("rate", FAIL, unread, "; ".join(problems), _verdict.INSPECT)
    rates = {p["rate_gbps"] for _k, p in measured}
    if len(rates) > 1:
        top = max(rates)
        slow = [(k, p) for k, p in measured if p["rate_gbps"] < top]
        return check(
            "rate",
            WARN,
            [k for k, _p in slow],
            "ports disagree: %s, while others run at %s Gb/s (give expect.rate_gbps to judge against the design)"
            % ("; ".join("%s at %s" % (k, _rate_text(p)) for k, p in slow), _gbps(top)),
            _verdict.INSPECT,
        )
    return check("rate", PASS, [], "every active port at %s Gb/s%s" % (_gbps(rates.pop()), aside))


def _not_measured(name):
    return check(
        name,
        WARN,
        [],
        "not measured: one read (sample_interval 0) and no earlier counter record (record_path)",
        _verdict.CONFIGURE,
    )


def check_link_flap(ports, found_windows):
    if not found_windows:
        return _not_measured("link_flap")
    fails, warns, keys_f, keys_w = [], [], [], []
    name = _thresholds.LINK_DOWNED
    for key, device, port in ports:
        now = port["counters"].get(name)
        if now is None:
            continue  # reported by readable
        for window in found_windows:
            before = window["before"].get(key, {}).get("counters", {}).get(name)
            if before is None:
                continue
            grew, cleared = increase(before, now)
            if grew > 0:
                fails.append(
                    "%s: link_downed rose by %d %s (%d -> %d%s): the link went down and retrained"
                    % (key, grew, window["name"], before, now, ", counters cleared in between" if cleared else "")
                )
                keys_f.append(key)
        if _thresholds.saturated(name, now):
            warns.append(
                "%s: link_downed is at its maximum %d and can no longer show a flap: clear the counters "
                "(perfquery -C %s -P %s -R)" % (key, now, device["name"], port["port"])
            )
            keys_w.append(key)
    return _physical("link_flap", fails, keys_f, warns, keys_w, "link_downed steady", found_windows)


def check_error_counters(ports, found_windows, limits):
    if not found_windows:
        return _not_measured("error_counters")
    fails, warns, keys_f, keys_w = [], [], [], []
    for key, device, port in ports:
        for name, (directory, _default, status, _source) in sorted(_thresholds.COUNTER_LIMITS.items()):
            now = port[directory].get(name)
            if now is None:
                continue
            limit = limits[name]
            for window in found_windows:
                before = window["before"].get(key, {}).get(directory, {}).get(name)
                if before is None:
                    continue
                grew, cleared = increase(before, now)
                rate = _thresholds.rate_per_minute(grew, window["seconds"])
                if not (grew > 0 if limit == 0 else rate > limit):
                    continue
                text = "%s: %s rose by %d %s (%.1f/min%s; limit %s)" % (
                    key,
                    name,
                    grew,
                    window["name"],
                    rate,
                    ", counters cleared in between" if cleared else "",
                    "any increase" if limit == 0 else "%g/min" % limit,
                )
                (fails if status == FAIL else warns).append(text)
                (keys_f if status == FAIL else keys_w).append(key)
            if directory == "counters" and _thresholds.saturated(name, now):
                warns.append(
                    "%s: %s is at its maximum %d and can no longer rise: clear the counters "
                    "(perfquery -C %s -P %s -R)" % (key, name, now, device["name"], port["port"])
                )
                keys_w.append(key)
    return _physical("error_counters", fails, keys_f, warns, keys_w, "error counters within limits", found_windows)


def _physical(name, fails, keys_f, warns, keys_w, pass_reason, found_windows):
    """A check of the link's physical health: FAIL (naming the warnings too) with the cable fix,
    else WARN, else PASS with ``pass_reason`` and the windows it held across."""
    if fails:
        return check(
            name,
            FAIL,
            keys_f + keys_w,
            "; ".join(fails + warns) + "; reseat or replace the cable or transceiver, check the switch port",
            _verdict.INSPECT,
        )
    if warns:
        return check(name, WARN, keys_w, "; ".join(warns), _verdict.INSPECT)
    return check(name, PASS, [], "%s %s" % (pass_reason, " and ".join(w["name"] for w in found_windows)))


def check_verbs_device(judged, verbs_problem):
    problems, keys = [], []
    for device in judged:
        ports = [_port.port_key(device["name"], p["port"]) for p in device["ports"]]
        if device["uverbs"] is None:
            problems.append(
                "%s has no uverbs device (%s)"
                % (device["name"], verbs_problem or "not named by any class/infiniband_verbs/uverbs*/ibdev")
            )
            keys.extend(ports)
        elif not device["verbs_device_present"]:
            problems.append("%s (%s) is missing" % (device["verbs_device"], device["name"]))
            keys.extend(ports)
    if problems:
        return check(
            "verbs_device",
            FAIL,
            keys,
            "; ".join(problems) + ": RDMA verbs are unusable - load ib_uverbs, check the udev rules, or give a "
            "container /dev/infiniband",
            _verdict.CONFIGURE,
        )
    return check(
        "verbs_device",
        PASS,
        [],
        "every device has its verbs node (%s)" % ", ".join("%s %s" % (d["name"], d["uverbs"]) for d in judged),
    )


def judge(devices, verbs_problem, found_windows, options, tool_reports=()):
    """The checks of the fabric ``devices`` (the latest read, tools' values filled in).
    ``options``: ``expect`` (``ports``, ``rate_gbps``, ``link_layer``, each None when not
    given), ``devices`` (name patterns), ``limits`` (:func:`_thresholds.limits`)."""
    expect = options.get("expect") or {}
    judged, unmatched = select(devices, options.get("devices") or [])
    ports = [(_port.port_key(d["name"], p["port"]), d, p) for d in judged for p in d["ports"]]
    checks = [check_port_count(ports, expect.get("ports"), unmatched, len(devices))]
    if not judged:
        return checks
    checks.append(check_readable(judged, tool_reports))
    checks.append(check_port_state(ports))
    if expect.get("link_layer"):
        checks.append(check_link_layer(ports, expect["link_layer"]))
    checks.append(check_rate(ports, expect.get("rate_gbps")))
    checks.append(check_link_flap(ports, found_windows))
    checks.append(check_error_counters(ports, found_windows, options["limits"]))
    checks.append(check_verbs_device(judged, verbs_problem))
    return checks


def status(checks):
    """``(status, action)``: the worst of the checks."""
    return _verdict.worst([(c["status"], c["action"]) for c in checks])
