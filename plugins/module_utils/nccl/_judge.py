# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's verdict on one parsed ``all_reduce_perf`` run: fail-closed, correctness and
completeness before bandwidth; anything it cannot vouch for is a failure with a reason that names
what was measured, what was expected, and the likely cause.

Plain Python, no Ansible.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _output


def non_finite(parsed):
    """The figures of a parsed run that are not finite numbers, as ``'busbw_ip nan at 4294967296 B'``.

    nccl-tests prints ``nan``/``inf`` (and C's ``-nan``) when a timer or a kernel failed; every
    comparison with NaN is false, so such a figure must fail the gate, never pass it."""
    bad = []
    for row in parsed["rows"]:
        for key in ("time_oop", "algbw_oop", "busbw_oop", "error_oop", "time_ip", "algbw_ip", "busbw_ip", "error_ip"):
            value = row.get(key)
            if value is not None and not math.isfinite(value):
                bad.append(f"{key} {value} at {row['size']} B")
    avg = parsed.get("avg_busbw_gbps")
    if avg is not None and not math.isfinite(avg):
        bad.append(f"'# Avg bus bandwidth : {avg}'")
    return bad


def unvalidated(rows):
    """Sizes whose correctness cell reads ``N/A`` (nothing was checked) in either place."""
    return [
        r["size"]
        for r in rows
        if any(r.get("wrong_" + p) is None and r.get("error_" + p) is None for p in ("oop", "ip"))
    ]


def json_safe(value):
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def judge(
    parsed,
    threshold_gbps,
    judge_sizes=2,
    rc=0,
    timed_out=False,
    timeout=None,
    expected_gbps=None,
    causes=None,
    check=None,
    rule_text=None,
):
    """Fail-closed verdict on one parsed run.

    Returns a dict: ``passed`` (bool), ``reason`` (one sentence, measured against expected and
    the likely cause), ``kind`` (``ok``, ``timeout``, ``exit``, ``wrong``, ``out_of_bounds``,
    ``no_rows``, ``truncated``, ``non_finite``, ``unvalidated``, ``low_bandwidth``),
    ``judged_busbw_gbps`` (None unless a finite figure), ``judged_rows``.
    Correctness and completeness come before bandwidth: a fast wrong answer is still wrong, a
    NaN or infinite figure was not measured, and with ``check`` (data checking asked, ``-c 1``;
    None: as the ``# nThread ... validation:`` line says) a ``#wrong`` of ``N/A`` means nothing
    was validated.  A threshold that is not a finite positive number is a ValueError.
    """
    if (
        isinstance(threshold_gbps, bool)
        or not isinstance(threshold_gbps, (int, float))
        or not math.isfinite(threshold_gbps)
        or threshold_gbps <= 0
    ):
        raise ValueError(f"the threshold must be a finite number of GB/s above 0, got {threshold_gbps!r}")
    rows = parsed["rows"]
    verdict = {"passed": False, "judged_busbw_gbps": None, "judged_rows": [], "kind": None, "reason": None}
    if rows:
        value, verdict["judged_rows"] = _output.judged_busbw(rows, judge_sizes)
        verdict["judged_busbw_gbps"] = value if math.isfinite(value) else None
    last = f" (last size measured: {rows[-1]['size']} B)" if rows else ""
    if timed_out:
        verdict["kind"] = "timeout"
        verdict["reason"] = (
            f"all_reduce_perf did not finish within {timeout} s and its process group was "
            f"killed{last}: a hang like this is typical of peer traffic that cannot flow "
            "(ACS redirect on AMD root ports, a dead NVLink, a wedged GPU)"
        )
        return verdict
    wrong = [
        (r["size"], r["wrong_oop"], r["wrong_ip"])
        for r in rows
        if (r["wrong_oop"] or 0) > 0 or (r["wrong_ip"] or 0) > 0
    ]
    if wrong:
        size, w_oop, w_ip = wrong[0]
        verdict["kind"] = "wrong"
        verdict["reason"] = (
            f"all-reduce returned wrong results: #wrong {w_oop} out-of-place and {w_ip} in-place "
            f"at {size} B ({len(wrong)} size(s) affected): data corruption on the peer path "
            "(faulty GPU, link or switch, or an NCCL/driver bug); never serve from this node"
        )
        return verdict
    if parsed["oob_status"] == "FAILED" or (parsed["out_of_bounds"] or 0) > 0:
        verdict["kind"] = "out_of_bounds"
        verdict["reason"] = (
            f"nccl-tests reported '# Out of bounds values : {parsed['out_of_bounds']} "
            f"{parsed['oob_status']}': results outside tolerance, data corruption on the peer path"
        )
        return verdict
    if rc != 0:
        detail = f"; it said: {parsed['failures'][0]}" if parsed["failures"] else ""
        how = f"was killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with status {rc}"
        verdict["kind"] = "exit"
        verdict["reason"] = f"all_reduce_perf {how}{last}{detail}: the run failed, so nothing it printed is vouched for"
        return verdict
    if not rows:
        verdict["kind"] = "no_rows"
        verdict["reason"] = (
            "all_reduce_perf printed no data rows"
            + ("" if parsed["header_found"] else " (and no column header)")
            + ": the test did not run (no GPUs visible, an NCCL init failure, or an unknown output format)"
        )
        return verdict
    if not parsed["footer"]:
        verdict["kind"] = "truncated"
        verdict["reason"] = (
            f"the output stops without the '# Out of bounds values' / '# Avg bus bandwidth' "
            f"footers{last}: the run was cut short (crash, kill, or a lost pipe)"
        )
        return verdict
    bad = non_finite(parsed)
    if bad:
        verdict["kind"] = "non_finite"
        verdict["reason"] = (
            f"all_reduce_perf printed {len(bad)} figure(s) that are not finite numbers "
            f"({'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}): a NaN or infinite "
            "bandwidth was not measured (a failed kernel or timer, or a corrupt output), so "
            "nothing is vouched for; run all_reduce_perf by hand and look at its errors"
        )
        return verdict
    if check is None:
        check = bool((parsed.get("params") or {}).get("validation"))
    unchecked = unvalidated(rows) if check else []
    if unchecked:
        verdict["kind"] = "unvalidated"
        verdict["reason"] = (
            f"data checking was asked (-c 1) but the {'#wrong' if parsed['columns'] == 'new' else 'error'} "
            f"column reads N/A at {len(unchecked)} size(s) (first {unchecked[0]} B): nothing was "
            "validated, so the results are not vouched for; use an all_reduce_perf that "
            "honours -c (not a wrapper that drops it)"
        )
        return verdict
    measured = verdict["judged_busbw_gbps"]
    sizes = sorted({r["size"] for r in verdict["judged_rows"]})
    if not measured >= threshold_gbps:
        verdict["kind"] = "low_bandwidth"
        why = "; ".join(causes or []) or "no likely cause found in the facts"
        if rule_text:
            model = f": under {rule_text}"
        else:
            model = f" (a healthy node of this design reaches {expected_gbps:.2f})" if expected_gbps else ""
        verdict["reason"] = (
            f"bus bandwidth {measured:.2f} GB/s at sizes {sizes} B is under the threshold "
            f"{threshold_gbps:.2f} GB/s{model}; likely cause: {why}"
        )
        return verdict
    verdict["passed"] = True
    verdict["kind"] = "ok"
    verdict["reason"] = (
        f"bus bandwidth {measured:.2f} GB/s at sizes {sizes} B meets the threshold {threshold_gbps:.2f} GB/s"
        + (f": {rule_text}" if rule_text else "")
    )
    return verdict
