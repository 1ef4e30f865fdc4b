# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nvbandwidth's copy matrix judged cell by cell: the bar of each cell from the physics of its path
(``_copy_physics``) and, where the caller has them, the median of healthy peers of the same
design.

Plain Python (no Ansible imports), runs on target Python 3.8+. :func:`judge` is a pure function
(the parsed record of ``_nvbandwidth.parse_output`` and the topology facts in, the result out), so
a stand-in's output can be checked against it; ``_copy_run`` runs the binary and calls it.

**The bar of a cell** is ``max(physics, baseline_fraction x the peers' median)``; the physics
figure is ``_copy_physics``'s, times ``threshold_fraction``, so a link trained down, an NVLink down
or a bridge redirecting peer traffic fails the cell instead of lowering its bar.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.node.plugins.module_utils.diag import _copy_physics, _nvbandwidth
from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _threshold

#: The physics bar is this fraction of what a healthy copy engine reaches on the cell's path.
DEFAULT_THRESHOLD_FRACTION = 0.85
#: The peers' bar is this fraction of their median: the NCCL gate's figure (Azure gates 8x H100
#: about 4 % under healthy figures), one home in nccl/_threshold.
DEFAULT_BASELINE_FRACTION = _threshold.DEFAULT_FRACTION

#: The testcases this module judges, by the path their cells measure.
HOST_TESTCASES = (_nvbandwidth.HOST_TO_DEVICE, _nvbandwidth.DEVICE_TO_HOST)
PEER_TESTCASES = (_nvbandwidth.PEER_READ, _nvbandwidth.PEER_WRITE)
JUDGED_TESTCASES = HOST_TESTCASES + PEER_TESTCASES

PHYSICS, PEERS = "physics", "peers"
#: Cell statuses: at or above the bar, under it, no figure for a GPU pair (N/A: no peer access),
#: or no bar (the facts lack what the physics needs and no peer median is given).
PASS, SLOW, NO_PEER_ACCESS, UNJUDGED = "pass", "slow", "no_peer_access", "unjudged"


class JudgeError(ValueError):
    """The options cannot be judged as given (nothing was run)."""


def cell_id(testcase, src, dst):
    """The key of a cell in ``peer_medians`` and in the result: ``TESTCASE:SRC->DST``."""
    return "%s:%s->%s" % (testcase, src, dst)


def check_options(threshold_fraction, baseline_fraction, peer_medians, testcases):
    """Raise JudgeError on options that cannot be judged."""
    for name, value in (("threshold_fraction", threshold_fraction), ("baseline_fraction", baseline_fraction)):
        if not (isinstance(value, (int, float)) and 0 < value <= 1.5):  # false for NaN too
            raise JudgeError("%s must be in (0, 1.5], got %r" % (name, value))
    if not testcases:
        raise JudgeError("testcases is empty: name at least one of %s" % ", ".join(JUDGED_TESTCASES))
    unknown = [t for t in testcases if t not in JUDGED_TESTCASES]
    if unknown:
        raise JudgeError(
            "testcases %s cannot be judged: the physics model covers %s"
            % (", ".join(unknown), ", ".join(JUDGED_TESTCASES))
        )
    if len(set(testcases)) != len(testcases):
        raise JudgeError("testcases names a testcase twice: %s" % ", ".join(testcases))
    for key, value in (peer_medians or {}).items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not (math.isfinite(number) and number > 0):
            raise JudgeError("peer_medians[%r] must be a positive number of GB/s, got %r" % (key, value))


# -- the judgement -----------------------------------------------------------------------------
def _direction(title):
    """Whether the title says the row is the source (``A(row) -> B(column)``) or the
    destination (``A(row) <- B(column)``), as nvbandwidth words it."""
    return "column_to_row" if "<-" in title and "<->" not in title else "row_to_column"


def _int_label(label):
    try:
        return int(label)
    except (TypeError, ValueError):
        return None


def _bar(physics, peer_median, threshold_fraction, baseline_fraction):
    """``(bar, rule, physics bar, peers bar)``; bar None when neither rule has a figure."""
    physics_bar = None if physics is None else physics * threshold_fraction
    peers_bar = None if peer_median is None else float(peer_median) * baseline_fraction
    if physics_bar is None and peers_bar is None:
        return None, None, None, None
    if peers_bar is not None and (physics_bar is None or peers_bar > physics_bar):
        return peers_bar, PEERS, physics_bar, peers_bar
    return physics_bar, PHYSICS, physics_bar, peers_bar


def _cell(testcase, src, dst, gpus, value, physics, basis, why, peer_median, fractions):
    threshold, rule, physics_bar, peers_bar = _bar(physics, peer_median, *fractions)
    # Judged against the bar as reported (2 decimals, as nvbandwidth prints its figures).
    threshold = None if threshold is None else round(threshold, 2)
    if threshold is None:
        status = UNJUDGED
    elif value is None:
        status = NO_PEER_ACCESS
    elif value < threshold:
        status = SLOW
    else:
        status = PASS
    return {
        "cell": cell_id(testcase, src, dst),
        "testcase": testcase,
        "src": src,
        "dst": dst,
        "gpus": gpus,
        "gbps": value,
        "bar": threshold,
        "rule": rule,
        "expected_gbps": None if physics is None else round(physics, 2),
        "physics_bar": None if physics_bar is None else round(physics_bar, 2),
        "peers_bar": None if peers_bar is None else round(peers_bar, 2),
        "peer_median": None if peer_median is None else float(peer_median),
        "basis": basis if physics is not None else why,
        "status": status,
        "causes": [],
        "actions": [],
    }


def _matrix_shape_problems(testcase, matrix, gpu_count):
    """What makes ``matrix`` not the shape ``testcase`` prints on a node of ``gpu_count`` GPUs."""
    problems = []
    labels = [_int_label(c) for c in matrix["columns"]]
    if labels != list(range(len(labels))):
        problems.append("%s: the columns are %s, not the GPU indices 0..N-1" % (testcase, " ".join(matrix["columns"])))
    if gpu_count and len(labels) != gpu_count:
        problems.append(
            "%s: nvbandwidth measured %d GPU(s) where the topology facts list %d (a GPU hidden by"
            " CUDA_VISIBLE_DEVICES, a GPU the driver lost, or facts from another node)"
            % (testcase, len(labels), gpu_count)
        )
    rows = list(matrix["rows"])
    if testcase in HOST_TESTCASES and len(rows) != 1:
        problems.append("%s: the matrix has %d rows where nvbandwidth prints one (the CPU)" % (testcase, len(rows)))
    if testcase in PEER_TESTCASES and [_int_label(r) for r in rows] != labels:
        problems.append("%s: the rows are %s, not one per GPU as the columns" % (testcase, " ".join(rows)))
    return problems


def _cells_of(testcase, matrix, topology, peer_medians, fractions, design_nvlinks):
    cells = []
    row_to_column = _direction(matrix["title"]) == "row_to_column"
    for row_label, row in matrix["rows"].items():
        for column, value in row.items():
            j = _int_label(column)
            if testcase in HOST_TESTCASES:
                gpu = _copy_physics.label(j)
                src, dst = ("CPU", gpu) if row_to_column else (gpu, "CPU")
                gpus = [j]
                try:
                    physics, basis = _copy_physics.host_physics(topology, j)
                    why = None
                except ValueError as exc:
                    physics, basis, why = None, None, str(exc)
            else:
                i = _int_label(row_label)
                if i == j:
                    continue  # a GPU with itself: N/A (0.00 before v0.2), never judged
                a, b = (i, j) if row_to_column else (j, i)
                src, dst = _copy_physics.label(a), _copy_physics.label(b)
                gpus = sorted((i, j))
                try:
                    physics, basis = _copy_physics.peer_physics(topology, i, j, design_nvlinks)
                    why = None
                except ValueError as exc:
                    physics, basis, why = None, None, str(exc)
            median = (peer_medians or {}).get(cell_id(testcase, src, dst))
            cells.append(_cell(testcase, src, dst, gpus, value, physics, basis, why, median, fractions))
    return cells


def _describe(cell):
    if cell["status"] == NO_PEER_ACCESS:
        text = "%s %s->%s: no figure (N/A%s)" % (
            cell["testcase"],
            cell["src"],
            cell["dst"],
            "" if cell["testcase"] in HOST_TESTCASES else ": nvbandwidth could not enable peer access",
        )
    else:
        text = "%s %s->%s %.2f GB/s under its bar %.2f GB/s (%s: %s x %s)" % (
            cell["testcase"],
            cell["src"],
            cell["dst"],
            cell["gbps"],
            cell["bar"],
            cell["rule"],
            cell["basis"] if cell["rule"] == PHYSICS else "peers' median %.2f GB/s" % cell["peer_median"],
            "threshold_fraction" if cell["rule"] == PHYSICS else "baseline_fraction",
        )
    if cell["causes"]:
        text += ": " + "; ".join(cell["causes"])
    return text


def _testcase_check(testcase, cells):
    if not cells:
        return _verdict.check(testcase, _verdict.FAIL, [], "the matrix has no cell to judge", _verdict.INSPECT)
    slow = [c for c in cells if c["status"] in (SLOW, NO_PEER_ACCESS)]
    unjudged = [c for c in cells if c["status"] == UNJUDGED]
    gpus = sorted({g for c in slow + unjudged for g in c["gpus"]})
    if slow or unjudged:
        reasons = [_describe(c) for c in slow]
        if unjudged:
            reasons.append(
                "%d cell(s) without a bar (%s)" % (len(unjudged), "; ".join(sorted({c["basis"] for c in unjudged})))
            )
        actions = [a for c in slow for a in c["actions"]] or [_verdict.INSPECT]
        action = max(actions, key=_verdict.ACTIONS.index)
        return _verdict.check(testcase, _verdict.FAIL, gpus, "; ".join(reasons), action)
    lowest = min(cells, key=lambda c: (c["gbps"] / c["bar"]) if c["bar"] else float("inf"))
    return _verdict.check(
        testcase,
        _verdict.PASS,
        [],
        "%d cells at or above their bars (closest: %s->%s %.2f GB/s, bar %.2f GB/s by %s)"
        % (len(cells), lowest["src"], lowest["dst"], lowest["gbps"], lowest["bar"], lowest["rule"]),
    )


def output_problems(parsed, testcases, topology):
    """``[(text, action)]``: what in the output, or in its agreement with the facts, keeps the
    run from being judged."""
    problems = [(text, _verdict.INSPECT) for text in parsed["problems"]]
    wanted = set(testcases)
    extra = [name for name in parsed["testcases"] if name not in wanted]
    if extra:
        problems.append(
            (
                "the output holds testcases that were not asked for (%s): is the binary nvbandwidth?"
                % ", ".join(extra),
                _verdict.CONFIGURE,
            )
        )
    for name in testcases:
        entry = parsed["testcases"].get(name)
        if entry is None:
            text = "%s is not in the output" % name
            if parsed["waived_unnamed"]:
                text += (
                    " and nvbandwidth printed %d 'Waived:' line(s): it waives a testcase that cannot run"
                    " here (device to device with one GPU, or without peer access between the GPUs)"
                    % parsed["waived_unnamed"]
                )
            problems.append((text, _verdict.INSPECT))
        elif entry["status"] == _nvbandwidth.WAIVED:
            problems.append(
                (
                    "%s was waived: it cannot run here (device to device with one GPU, or without peer"
                    " access between the GPUs)" % name,
                    _verdict.INSPECT,
                )
            )
        elif entry["status"] == _nvbandwidth.NOT_FOUND:
            problems.append(
                (
                    "%s: this nvbandwidth does not have it (%s): install a newer release"
                    % (name, "; ".join(entry["errors"])),
                    _verdict.CONFIGURE,
                )
            )
        elif entry["status"] != _nvbandwidth.PASSED:
            problems.append(("%s did not finish: %s" % (name, "; ".join(entry["errors"])), _verdict.INSPECT))
        elif len(entry["matrices"]) != 1:
            problems.append(
                ("%s printed %d matrices where it prints one" % (name, len(entry["matrices"])), _verdict.INSPECT)
            )
    gpus = _copy_physics.gpus_by_index(topology)
    for device in parsed["devices"]:
        gpu = gpus.get(device["index"])
        if (
            device["bus_id"]
            and gpu is not None
            and _copy_physics.bus(device["bus_id"]) != _copy_physics.bus(gpu.get("pci_bus_id"))
        ):
            problems.append(
                (
                    "nvbandwidth's device %d is at %s but the facts' %s is at %s: the cells cannot be matched to"
                    " the topology (facts from another boot or node?)"
                    % (device["index"], device["bus_id"], _copy_physics.label(device["index"]), gpu.get("pci_bus_id")),
                    _verdict.INSPECT,
                )
            )
    return problems


def judge(
    parsed,
    testcases,
    topology,
    threshold_fraction=DEFAULT_THRESHOLD_FRACTION,
    peer_medians=None,
    baseline_fraction=DEFAULT_BASELINE_FRACTION,
    acs=None,
    run_problems=(),
):
    """Judge the parsed output ``parsed`` of a run of ``testcases`` on the node described by
    ``topology`` (``ansible_facts.gpu_topology``). ``run_problems`` are ``(text, action)`` pairs
    of the run itself (exit status, timeout). Returns the result's judged keys: ``passed``,
    ``status``, ``version``, ``format``, ``matrices``, ``cells``, ``slow_cells``, ``checks``,
    ``reason``."""
    fractions = (threshold_fraction, baseline_fraction)
    problems = list(run_problems) + output_problems(parsed, testcases, topology)
    gpu_count = len(_copy_physics.gpus_by_index(topology))
    design_nvlinks = _copy_physics.design_nvlinks(topology)
    acs_pairs = _copy_physics.acs_pairs(topology, acs)
    cells, checks = [], []
    for name in testcases:
        entry = parsed["testcases"].get(name) or {}
        keys = entry.get("matrices") or []
        if entry.get("status") != _nvbandwidth.PASSED or len(keys) != 1:
            continue
        matrix = parsed["matrices"][keys[0]]
        shape = _matrix_shape_problems(name, matrix, gpu_count)
        if shape:
            problems += [(text, _verdict.INSPECT) for text in shape]
            continue
        these = _cells_of(name, matrix, topology, peer_medians, fractions, design_nvlinks)
        for cell in these:
            if cell["status"] in (SLOW, NO_PEER_ACCESS):
                if name in HOST_TESTCASES:
                    found = _copy_physics.host_causes(topology, cell["gpus"][0])
                else:
                    found = _copy_physics.peer_causes(
                        topology, cell["gpus"][0], cell["gpus"][1], acs_pairs, design_nvlinks
                    )
                cell["causes"] = [text for text, _action in found]
                cell["actions"] = sorted({action for _text, action in found}, key=_verdict.ACTIONS.index)
        cells += these
        checks.append(_testcase_check(name, these))
    if problems:
        action = max((a for _t, a in problems), key=_verdict.ACTIONS.index)
        checks.insert(
            0, _verdict.check("nvbandwidth_output", _verdict.FAIL, [], "; ".join(t for t, _a in problems), action)
        )
    else:
        checks.insert(
            0, _verdict.check("nvbandwidth_output", _verdict.PASS, [], "every testcase asked for printed its matrix")
        )
    status, _action = _verdict.worst((c["status"], c["action"]) for c in checks)
    slow = [c for c in cells if c["status"] in (SLOW, NO_PEER_ACCESS)]
    passed, failed, _warned = _verdict.verdict(checks)
    return {
        "passed": passed,
        "status": status,
        "version": parsed["version"],
        "format": parsed["format"],
        "matrices": {
            key: {"testcase": m["testcase"], "title": m["title"], "rows": m["rows"], "sum": m["sum"], "cv": m["cv"]}
            for key, m in parsed["matrices"].items()
        },
        "cells": cells,
        "slow_cells": slow,
        "checks": checks,
        "reason": "every cell at or above its bar"
        if passed
        else "; ".join("%s: %s" % (c["name"], c["reason"]) for c in checks if c["name"] in failed),
    }
