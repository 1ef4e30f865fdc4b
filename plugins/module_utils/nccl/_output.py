# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests ``all_reduce_perf``'s output, read, and the figure the gate judges in it.

Plain Python, no Ansible. ``parse`` reads the output by the column header it prints rather than
by fixed positions: the ``#wrong`` column (nccl-tests 2.13+) or the older ``error`` column, with
or without a ``root`` column (older still: without ``redop``), ``N/A`` where validation is off
(``-c 0``), wide times printed without decimals, NCCL ``INFO``/``WARN`` lines and loader warnings
interleaved anywhere, and the prefixes launchers put in front of each line (Open MPI
``--tag-output`` ``[1,0]<stdout>:``, Slurm ``srun -l`` ``0:``, ``[0]``).  The footers ``# Out of
bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X`` are read too; a missing footer means
the output was cut short. ``judged_busbw`` is the figure the gate judges (the weakest of the
largest sizes).
"""

from __future__ import annotations

import math
import re

# Launcher prefixes, removed before anything else looks at a line.
_PREFIXES = (
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:"),  # Open MPI --tag-output
    re.compile(r"^\s*\d+: "),  # Slurm srun -l / --label
    re.compile(r"^\[\d+\] "),  # mpirun -prepend-rank style "[0] "
)
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\b")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+]?(?:nan|inf)\w*|[-+0-9.eE]+)", re.IGNORECASE)
_PARAMS_RE = re.compile(
    r"^#?\s*nThread\s+(?P<nthread>\d+)\s+nGpus\s+(?P<ngpus>\d+)\s+minBytes\s+(?P<min>\d+)\s+"
    r"maxBytes\s+(?P<max>\d+)\s+step:\s*(?P<step>\d+)\((?P<steptype>factor|bytes)\)"
    r"\s+warmup iters:\s*(?P<warmup>\d+)\s+iters:\s*(?P<iters>\d+)"
    r"(?:\s+agg iters:\s*\d+)?\s+validation:\s*(?P<validation>\d+)"
)
_DEVICE_RE = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+\d+)?\s+on\s+(?P<host>\S+)\s+device\s+"
    r"(?P<device>\d+)\s+\[(?P<bus>[0-9a-fA-Fx:]+)\]\s+(?P<name>.+?)\s*$"
)
_VERSION_RE = re.compile(r"^#\s*nccl-tests version\s+(\S+)")

# Column names as nccl-tests prints them, by the key they get in a row.
_PREAMBLE_KEYS = {
    "size": "size",
    "bytes": "size",
    "count": "count",
    "n": "count",
    "type": "type",
    "redop": "redop",
    "op": "redop",
    "root": "root",
}
_WRONG_NAMES = ("#wrong", "error", "res")


class ParseError(ValueError):
    """The output has no all_reduce_perf table that can be read."""


def strip_prefix(line):
    for rx in _PREFIXES:
        m = rx.match(line)
        if m:
            return line[m.end() :]
    return line


def _layout(tokens):
    """Column layout from the tokens of the header line (``#`` removed).

    Returns ``(preamble_keys, wrong_name)``: the keys of the leading columns in order, and the
    name of the correctness column; the rest is two groups of ``time algbw busbw <wrong>``
    (out-of-place, then in-place).
    """
    lowered = [t.lower() for t in tokens]
    try:
        first_time = lowered.index("time")
    except ValueError:
        return None
    preamble = lowered[:first_time]
    group = lowered[first_time:]
    if len(group) != 8 or group[0:3] != ["time", "algbw", "busbw"] or group[4:7] != ["time", "algbw", "busbw"]:
        return None
    if group[3] not in _WRONG_NAMES or group[7] != group[3]:
        return None
    if not preamble or any(t not in _PREAMBLE_KEYS for t in preamble):
        return None
    keys = [_PREAMBLE_KEYS[t] for t in preamble]
    if "size" not in keys or "count" not in keys:
        return None
    return keys, group[3]


def _wrong(text, name):
    """(wrong_count, error_value) for one correctness cell; None where it was not checked."""
    if text.upper() == "N/A":
        return None, None
    if name == "#wrong":
        if not re.match(r"^\d+$", text):
            raise ValueError(text)
        return int(text), None
    # Old nccl-tests: the maximum error as a float; out-of-bounds counts only in the footer.
    return None, float(text)


def _row(tokens, keys, wrong_name):
    if len(tokens) != len(keys) + 8:
        return None
    row = {"size": None, "count": None, "type": None, "redop": None, "root": None}
    try:
        for key, tok in zip(keys, tokens):
            if key in ("size", "count"):
                if not tok.isdigit():
                    return None
                row[key] = int(tok)
            elif key == "root":
                row[key] = int(tok)
            else:
                if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", tok):
                    return None
                row[key] = tok
        rest = tokens[len(keys) :]
        for place, offset in (("oop", 0), ("ip", 4)):
            row["time_" + place] = float(rest[offset])
            row["algbw_" + place] = float(rest[offset + 1])
            row["busbw_" + place] = float(rest[offset + 2])
            wrong, error = _wrong(rest[offset + 3], wrong_name)
            row["wrong_" + place] = wrong
            if wrong_name != "#wrong":
                row["error_" + place] = error
    except ValueError:
        return None
    return row


def parse(text):
    """Read an all_reduce_perf output.

    Returns a dict: ``rows`` (see the module's RETURN), ``columns`` (``new`` with ``#wrong``,
    ``old`` with ``error``), ``has_root``, ``out_of_bounds`` (int or None), ``oob_status``
    (``OK``/``FAILED``/None), ``avg_busbw_gbps`` (float or None), ``footer`` (both footers
    seen), ``params`` (the ``# nThread ...`` line), ``devices``, ``version``, ``noise_lines``
    (lines that were neither table nor known header: NCCL logs, warnings), ``failures`` (lines
    where nccl-tests reported a test failure).
    """
    out = {
        "rows": [],
        "columns": None,
        "has_root": None,
        "header_found": False,
        "out_of_bounds": None,
        "oob_status": None,
        "avg_busbw_gbps": None,
        "footer": False,
        "params": None,
        "devices": [],
        "version": None,
        "noise_lines": 0,
        "failures": [],
    }
    layout = None
    for raw in text.splitlines():
        line = strip_prefix(raw.rstrip("\r\n"))
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").split()
            candidate = _layout(body) if body else None
            if candidate:
                layout = candidate
                out["header_found"] = True
                out["columns"] = "new" if candidate[1] == "#wrong" else "old"
                out["has_root"] = "root" in candidate[0]
                continue
            m = _OOB_RE.match(stripped)
            if m:
                out["out_of_bounds"], out["oob_status"] = int(m.group(1)), m.group(2)
                continue
            m = _AVG_RE.match(stripped)
            if m:
                out["avg_busbw_gbps"] = _number(m.group(1))
                continue
            m = _DEVICE_RE.match(stripped)
            if m:
                out["devices"].append(
                    {
                        "rank": int(m.group("rank")),
                        "host": m.group("host"),
                        "device": int(m.group("device")),
                        "bus_id": m.group("bus"),
                        "name": m.group("name"),
                    }
                )
                continue
            m = _PARAMS_RE.match(stripped)
            if m:
                out["params"] = _params(m)
                continue
            m = _VERSION_RE.match(stripped)
            if m:
                out["version"] = m.group(1)
            continue
        m = _PARAMS_RE.match(stripped)  # very old versions print it without '#'
        if m:
            out["params"] = _params(m)
            continue
        if layout:
            row = _row(stripped.split(), *layout)
            if row is not None:
                out["rows"].append(row)
                continue
        if "Test failure" in stripped or "Test NCCL failure" in stripped or "Test CUDA failure" in stripped:
            out["failures"].append(stripped)
        out["noise_lines"] += 1
    out["footer"] = out["oob_status"] is not None and out["avg_busbw_gbps"] is not None
    return out


def _number(text):
    """A printed figure as a float; NaN where it is not one (C's printf writes ``-nan`` too)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _params(m):
    return {
        "nthread": int(m.group("nthread")),
        "ngpus": int(m.group("ngpus")),
        "min_bytes": int(m.group("min")),
        "max_bytes": int(m.group("max")),
        "step": int(m.group("step")),
        "step_type": m.group("steptype"),
        "warmup_iters": int(m.group("warmup")),
        "iters": int(m.group("iters")),
        "validation": int(m.group("validation")),
    }


def judged_busbw(rows, judge_sizes):
    """Bus bandwidth judged on the ``judge_sizes`` largest message sizes.

    The lowest of the out-of-place and in-place bus bandwidths over those sizes: the gate
    vouches for what the node does at every large size, never for an average that small sizes
    drag down (``# Avg bus bandwidth`` is the mean over all sizes).
    Returns ``(value, judged_rows)``; the value is NaN when any of those figures is not finite
    (``min`` with a NaN depends on the order, so it is never left to decide).
    """
    sizes = sorted({r["size"] for r in rows}, reverse=True)[: max(1, judge_sizes)]
    judged = [r for r in rows if r["size"] in sizes]
    figures = [r[k] for r in judged for k in ("busbw_oop", "busbw_ip")]
    value = min(figures) if all(math.isfinite(f) for f in figures) else math.nan
    return value, judged
