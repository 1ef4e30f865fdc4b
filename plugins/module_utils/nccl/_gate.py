# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's run: from the ``nccl_allreduce`` options to the plan (GPUs, sizes, design key,
threshold), then the measuring loop (repeats, the best run kept, no retry past a correctness or
completeness failure) and the result.

Plain Python, no Ansible: the module parses its arguments, finds the binary, and calls
``prepare``, ``planned_result`` and ``measure``; the parts are ``_command`` (argv, one bounded
run), ``_output`` (parse), ``_threshold`` (the model and the rule), ``_diagnose`` (likely causes),
``_judge`` (the verdict), ``_design`` and ``_baseline`` (the design key and the peers' figures).
"""

from __future__ import annotations

import math
import time

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import (
    _baseline,
    _command,
    _design,
    _diagnose,
    _judge,
    _output,
    _threshold,
)
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _sysfs

#: The result's keys that only a run (or check mode) fills.
VERDICT_KEYS = ("passed", "judged_busbw_gbps", "reason", "kind", "avg_busbw_gbps", "out_of_bounds", "timestamp")
#: Options that count something and must be at least 1, with their defaults.
COUNTS = {"step_factor": 2, "iters": 20, "repeats": 1, "judge_sizes": 2, "timeout": 900}


class GateError(Exception):
    """The gate cannot run as asked; the message says why and what to do (nothing was run)."""


def visible_devices(environment, topology):
    """Topology indices named by CUDA_VISIBLE_DEVICES (indices or GPU UUIDs), or None.

    None when it is unset, or names something the facts cannot map (MIG instances): the run
    then uses the first GPUs of the facts, as CUDA numbers them.
    """
    text = str(environment.get("CUDA_VISIBLE_DEVICES", "")).strip()
    if not text:
        return None
    by_uuid = {str(g.get("uuid")): g["index"] for g in (topology or {}).get("gpus") or [] if g.get("uuid")}
    picked = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item.isdigit():
            picked.append(int(item))
        elif item in by_uuid:
            picked.append(by_uuid[item])
        else:
            return None
    return picked


def design_of(topology, sysfs_path, warn):
    """``(key, descriptor)`` of this node's design, or ``(None, None)`` without GPU facts. The
    RDMA NICs come from the sysfs tree the facts were read from (``sysfs_path`` first); a tree
    that cannot be read leaves them out of the key, with a warning."""
    if not (topology or {}).get("gpus"):
        return None, None
    sysfs = sysfs_path or ((topology.get("pci_tree") or {}).get("sysfs_path")) or _sysfs.DEFAULT_SYSFS_PATH
    try:
        nics = _design.rdma_nics(sysfs)
    except (_config_space.PciError, OSError) as e:
        warn(f"the design key leaves the RDMA NICs out: cannot read the PCI tree at {sysfs}: {e}")
        nics = ["unknown"]
    try:
        return _design.design_key(topology, nics)
    except (ValueError, KeyError, TypeError) as e:
        raise GateError(f"cannot derive the design key from the topology facts: {e}") from None


def decision_of(p, expected, design_key, warn):
    """The auto threshold: max(physics floor, fraction x the median of this design's peers)."""
    entry = (p["baselines"] or {}).get(design_key) if design_key else None
    stat, problem = None, None
    if isinstance(entry, dict) and entry.get("error"):
        problem = str(entry["error"])
        warn(f"the peer baseline of design {design_key} is not used: {problem}")
    elif isinstance(entry, dict):
        stat = _baseline.statistic(entry.get("samples") or [], p["host"], p["baseline_window"])
    decision = _threshold.decide(
        expected, p["threshold_fraction"], design_key, stat, p["baseline_fraction"], p["baseline_min_samples"]
    )
    if problem:
        decision["rule_text"] += f" (the baseline store's file for this design is corrupt: {problem})"
    decision["problem"] = problem
    return decision


def baseline_result(decision):
    if not decision:
        return None
    stat = decision["baseline"]
    return dict(
        median_gbps=stat["median"],
        count=stat["count"],
        hosts=stat["hosts"],
        outliers=stat["outliers"],
        threshold_gbps=decision["baseline_gbps"],
        problem=decision["problem"],
        rule_text=decision["rule_text"],
    )


def with_rule_defaults(p):
    """``p`` with the threshold rule's own fractions where an option is unset (None): each
    default is written once, in ``_threshold``."""
    defaults = dict(
        threshold_fraction=_threshold.DEFAULT_THRESHOLD_FRACTION,
        baseline_fraction=_threshold.DEFAULT_FRACTION,
    )
    return dict(p, **{name: value for name, value in defaults.items() if p.get(name) is None})


def prepare(p, warn):
    """Everything known before measuring, from the module's parameters ``p`` (an unset fraction is
    the rule's default, ``with_rule_defaults``): a dict with
    ``environment``, ``topology``, ``min_bytes``, ``max_bytes``, ``gpus``, ``design_key``,
    ``design``, ``expected``, ``model``, ``decision`` and ``threshold``. ``warn(text)`` gets the
    warnings; a GateError says why the gate cannot run."""
    p = with_rule_defaults(p)
    environment = p["environment"] or {}
    topology = p["topology"]

    if p["baseline_min_samples"] < 1 or p["baseline_window"] < 1:
        raise GateError("baseline_min_samples and baseline_window must be at least 1")
    for name in COUNTS:
        if p[name] < 1:
            raise GateError(f"{name} must be at least 1, got {p[name]}")
    try:
        min_bytes, max_bytes = _command.parse_size(p["min_bytes"]), _command.parse_size(p["max_bytes"])
    except ValueError as e:
        raise GateError(f"min_bytes/max_bytes: {e}") from None
    if min_bytes > max_bytes:
        raise GateError(f"min_bytes ({p['min_bytes']}) is larger than max_bytes ({p['max_bytes']})")

    visible = visible_devices(environment, topology)
    gpus = p["gpus"]
    if gpus is None:
        gpus = len(_threshold.select_gpus(topology, None, visible))
    if gpus < 1:
        raise GateError(
            "no GPUs to test: the topology facts list none; gather them with "
            "gpufleet.node.gpu_topology_facts or set gpus"
        )

    design_key, design = design_of(topology, p["sysfs_path"], warn)
    if design_key:
        try:
            used = sorted(g["index"] for g in _threshold.select_gpus(topology, gpus, visible))
        except ValueError:
            used = None
        if used is not None and len(used) != design["gpu_count"]:
            # A run over some of the GPUs is its own design: its figures are not the whole node's.
            design_key = "%s-g%s" % (design_key, "-".join(map(str, used)))
    expected, model, decision = None, None, None
    if p["min_busbw_gbps"].strip().lower() == "auto":
        try:
            model = _threshold.expected_busbw(topology, gpus, visible)
        except (ValueError, KeyError, TypeError) as e:
            raise GateError(
                f"cannot derive the auto threshold from the topology facts: {e}; pass "
                "ansible_facts.gpu_topology from gpufleet.node.gpu_topology_facts, or set "
                "min_busbw_gbps to a number"
            ) from None
        expected = model.pop("expected_gbps")
        if not 0 < p["threshold_fraction"] <= 1.5:  # false for NaN too
            raise GateError(f"threshold_fraction must be in (0, 1.5], got {p['threshold_fraction']}")
        if not 0 < p["baseline_fraction"] <= 1.5:
            raise GateError(f"baseline_fraction must be in (0, 1.5], got {p['baseline_fraction']}")
        decision = decision_of(p, expected, design_key, warn)
        threshold = decision["threshold_gbps"]
    else:
        try:
            threshold = float(p["min_busbw_gbps"])
        except ValueError:
            raise GateError(f"min_busbw_gbps must be a number of GB/s or 'auto', got {p['min_busbw_gbps']!r}") from None
        if not math.isfinite(threshold):
            raise GateError(
                f"min_busbw_gbps must be a finite number of GB/s or 'auto', got "
                f"{p['min_busbw_gbps']!r}: a NaN or infinite threshold can never be judged"
            )
        if threshold <= 0:
            raise GateError(f"min_busbw_gbps must be positive, got {threshold}")
    return dict(
        environment=environment,
        topology=topology,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        gpus=gpus,
        design_key=design_key,
        design=design,
        expected=expected,
        model=model,
        decision=decision,
        threshold=threshold,
    )


def planned_result(plan, argv):
    """What is known before measuring; the verdict's keys stay null until a run gives them."""
    decision = plan["decision"]
    result = dict(
        changed=False,
        cmd=argv,
        threshold_gbps=plan["threshold"],
        expected_busbw_gbps=plan["expected"],
        model=plan["model"],
        design_key=plan["design_key"],
        design=plan["design"],
        rule=decision["rule"] if decision else "fixed",
        physics_floor_gbps=decision["physics_floor_gbps"] if decision else None,
        baseline=baseline_result(decision),
    )
    result.update(dict.fromkeys(VERDICT_KEYS), rows=[], runs=[], duration_s=0.0)
    return result


def check_mode(result):
    """``result`` as check mode returns it: nothing was run."""
    result.update(
        kind="check_mode",
        timestamp=time.time(),
        reason="check mode: all_reduce_perf was not run (the result cannot be known without "
        "measuring, and measuring occupies the GPUs)",
    )
    return result


def measure(plan, argv, result, p, run=_command.run):
    """Run ``argv`` up to ``repeats`` times, until a run passes; a correctness or completeness
    failure ends the loop (no retry hides it), otherwise the run with the best judged figure is
    kept. Fills ``result`` (from ``planned_result``) and returns ``(result, stdout, message)``:
    ``message`` is the task's failure message, None when the gate passed."""
    threshold, expected, decision = plan["threshold"], plan["expected"], plan["decision"]
    best = None
    stdout = ""
    while len(result["runs"]) < p["repeats"]:
        rc, stdout, timed_out, duration = run(argv, plan["environment"], p["timeout"])
        parsed = _output.parse(stdout)
        rows = parsed["rows"]
        causes = None
        if rows and not timed_out:
            measured = _output.judged_busbw(rows, p["judge_sizes"])[0]
            if measured < threshold:
                peer_median = decision["baseline"]["median"] if decision and decision["rule"] == "peer_median" else None
                causes = _diagnose.diagnose(
                    plan["topology"], plan["environment"], measured, expected or threshold, peer_median
                )
        verdict = _judge.judge(
            parsed,
            threshold,
            p["judge_sizes"],
            rc=rc,
            timed_out=timed_out,
            timeout=p["timeout"],
            expected_gbps=expected,
            causes=causes,
            check=p["check"],
            rule_text=decision["rule_text"] if decision else None,
        )
        result["duration_s"] = round(result["duration_s"] + duration, 3)
        # Ansible fails any result whose rc is not 0, so rc is only there when the process exited.
        if rc is not None:
            result["rc"] = rc
        else:
            result.pop("rc", None)
        result["runs"].append(
            dict(
                judged_busbw_gbps=verdict["judged_busbw_gbps"],
                kind=verdict["kind"],
                rc=rc,
                duration_s=round(duration, 3),
            )
        )
        candidate = (verdict, parsed)
        if verdict["kind"] not in ("ok", "low_bandwidth"):
            best = candidate  # correctness or completeness failed: no retry hides that
            break
        if best is None or (verdict["judged_busbw_gbps"] or 0) > (best[0]["judged_busbw_gbps"] or 0):
            best = candidate
        if verdict["passed"]:
            break

    verdict, parsed = best
    result.update(
        passed=verdict["passed"],
        judged_busbw_gbps=verdict["judged_busbw_gbps"],
        reason=verdict["reason"],
        kind=verdict["kind"],
        rows=_judge.json_safe(parsed["rows"]),
        avg_busbw_gbps=_judge.json_safe(parsed["avg_busbw_gbps"]),
        out_of_bounds=parsed["out_of_bounds"],
        timestamp=time.time(),
    )
    message = None if verdict["passed"] else f"NCCL all-reduce gate failed on {' '.join(argv)}: {verdict['reason']}"
    return result, stdout, message
