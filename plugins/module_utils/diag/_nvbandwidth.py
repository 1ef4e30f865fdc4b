# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA nvbandwidth (github.com/NVIDIA/nvbandwidth): its command line, its ``--help``, and its
output read by structure, as text or as JSON. No judgement here (``_copy_judge`` judges).

Plain Python (no Ansible imports), runs on target Python 3.8+. Checked against nvbandwidth's
source (``nvbandwidth.cpp``, ``output.cpp``, ``json_output.cpp``, ``inline_common.h``, v0.8) and
real outputs of v0.2 to v0.10.0 (tests/data/nvbandwidth):

* **Options.** ``-t/--testcase NAME`` (repeatable; in v0.2 already), ``--bufferSize MiB``
  (default 64 MiB in v0.2, 512 MiB in v0.8; the short ``-b`` is not in v0.2 and named a benchmark
  before it), ``-i/--testSamples N`` (not in v0.2; in v0.8), ``-j/--json`` (v0.5, its release
  notes). ``--help`` prints the version lines and the option list under ``nvbandwidth CLI:``, and
  exits 0 without touching a GPU: :func:`parse_help` reads what this build supports, so the output
  format is decided from the binary's own answer, never guessed from a version number.
* **Text output.** ``nvbandwidth Version:``, ``Built from Git version:``, the CUDA and driver
  versions (``CUDA Runtime Version: 12040``, or ``13.2 (13020)`` and ``CUDA Driver Version
  (API):`` in v0.10), ``Device N: NAME`` (with ``(00000000:99:00)`` since v0.5; v0.10 prints no
  device list), then per testcase ``Running NAME.``, and per matrix: a title ending in ``(GB/s)``
  or ``(ns)`` (``memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)``), a header of column labels,
  one row per source (label, then one cell per column: a figure with 2 decimals or ``N/A``), a
  blank line, ``SUM KEY VALUE`` (KEY is the testcase, or ``_read1``/``_total``... for the
  three matrices of a bidirectional testcase) and, in v0.10, ``COEFFICIENT_OF_VARIATION KEY
  VALUE``. A waived testcase prints ``Waived:`` without its name (as v0.6 does) or ``Waiving NAME.``
  (v0.2); an unknown one ``ERROR: Testcase NAME not found!``; a failing CUDA call prints its
  error and exits 1 in the middle of a block.
* **JSON output** (``-j``): one object ``{"nvbandwidth": {"version", "git_version", "CUDA Runtime
  Version", "Driver Version", "GPU Device list", "testcases": [{"name", "status",
  "bandwidth_description", "bandwidth_matrix": [[str]], "sum"}], "error", "warning"}}`` printed
  from a line holding only ``{`` to a line holding only ``}``; lines around it (warnings on the
  merged stderr) are kept aside. Cells are strings (6 significant digits) or ``N/A``; the
  columns are positions.

:func:`parse_output` returns one record for both formats and never raises: everything that does
not fit the structure (a row with the wrong number of cells, a matrix without its SUM line, a
figure that is not a finite non-negative number, a SUM that does not add up) is listed in
``problems``, each naming where it is.
"""

from __future__ import annotations

import json
import math
import re

#: The testcases this collection runs by default: host to device, device to host, and device to
#: device (peer read) with the copy engines.
HOST_TO_DEVICE = "host_to_device_memcpy_ce"
DEVICE_TO_HOST = "device_to_host_memcpy_ce"
PEER_READ = "device_to_device_memcpy_read_ce"
PEER_WRITE = "device_to_device_memcpy_write_ce"
DEFAULT_TESTCASES = (HOST_TO_DEVICE, DEVICE_TO_HOST, PEER_READ)

PASSED, WAIVED, ERROR, NOT_FOUND, INCOMPLETE = "passed", "waived", "error", "not_found", "incomplete"

_VERSION_RE = re.compile(r"^nvbandwidth Version:\s*(\S+)")
_GIT_RE = re.compile(r"^Built from Git version:\s*(.*\S)")
_CUDA_RUNTIME_RE = re.compile(r"^CUDA Runtime Version:\s*(.*\S)")
_CUDA_DRIVER_RE = re.compile(r"^CUDA Driver Version(?: \(API\))?:\s*(.*\S)")
_DRIVER_RE = re.compile(r"^Driver Version:\s*(.*\S)")
_DEVICE_RE = re.compile(r"^Device (\d+): (.*?)(?: \(([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\))?$")
_JSON_DEVICE_RE = re.compile(r"^(\d+): (.*?)(?: \(([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\))?(?:: \((.*)\))?$")
_RUNNING_RE = re.compile(r"^Running (\S+?)\.?$")
_WAIVING_RE = re.compile(r"^Waiving (\S+?)\.?$")
_WAIVED_RE = re.compile(r"^Waived:")
_NOT_FOUND_RE = re.compile(r"^ERROR: Testcase (?:index )?(\S+) (?:not found!|out of bound!)")
_TITLE_RE = re.compile(r"\((?:GB/s|ns)\)$")
_SUM_RE = re.compile(r"^SUM (\S+) (\S+)$")
_CV_RE = re.compile(r"^COEFFICIENT_OF_VARIATION (\S+) (\S+)$")
_VERBOSE_STAT_RE = re.compile(r"^(?:MIN|MAX|AVG) \S+ \S+$")
_OPTION_RE = re.compile(r"--([A-Za-z][\w-]*)")

#: JSON testcase statuses (json_output.cpp: NVB_PASSED, NVB_WAIVED, NVB_NOT_FOUND, NVB_ERROR_STATUS,
#: "ERROR" for a name it does not know, and "Running" left behind by a run that died mid-testcase).
_JSON_STATUS = {
    "passed": PASSED,
    "waived": WAIVED,
    "not found": NOT_FOUND,
    "error": ERROR,
    "running": INCOMPLETE,
}


# -- the command line --------------------------------------------------------------------------
def parse_help(text):
    """What ``nvbandwidth --help`` says this build supports.

    Returns ``{"nvbandwidth", "version", "git_version", "options", "json", "testcase",
    "buffer_size", "test_samples"}``: ``nvbandwidth`` is whether the text is nvbandwidth's option
    list at all (its ``nvbandwidth CLI`` heading, any case: v0.2 prints ``NVBandwidth CLI``),
    ``options`` the long option names it lists, and the booleans whether ``--json``,
    ``--testcase``, ``--bufferSize`` and ``--testSamples`` are among them.
    """
    text = text or ""
    lines = [line.strip() for line in text.splitlines()]
    heading = any(line.lower().startswith("nvbandwidth cli") for line in lines)
    options = []
    for line in lines:
        if line.startswith("-"):
            for name in _OPTION_RE.findall(line):
                if name not in options:
                    options.append(name)
    return {
        "nvbandwidth": heading and bool(options),
        "version": _first(lines, _VERSION_RE),
        "git_version": _first(lines, _GIT_RE),
        "options": options,
        "json": "json" in options,
        "testcase": "testcase" in options,
        "buffer_size": "bufferSize" in options,
        "test_samples": "testSamples" in options,
    }


def build_argv(binary, testcases, json_output, buffer_size=None, iterations=None):
    """The argv of one run: ``-j`` when the build has it, ``-t NAME`` per testcase, then
    ``--bufferSize MiB`` and ``--testSamples N`` when given (long names: ``-b`` is not in every
    release)."""
    argv = [binary]
    if json_output:
        argv.append("-j")
    for name in testcases:
        argv += ["-t", name]
    if buffer_size is not None:
        argv += ["--bufferSize", str(buffer_size)]
    if iterations is not None:
        argv += ["--testSamples", str(iterations)]
    return argv


# -- the output --------------------------------------------------------------------------------
def empty_record(fmt):
    return {
        "format": fmt,
        "version": None,
        "git_version": None,
        "cuda_runtime_version": None,
        "cuda_driver_version": None,
        "driver_version": None,
        "devices": [],
        "testcases": {},
        "matrices": {},
        "waived_unnamed": 0,
        "errors": [],
        "other_lines": [],
        "problems": [],
    }


def parse_output(text, fmt):
    """The record of one run's output (``fmt`` ``"text"`` or ``"json"``, as the run was asked)."""
    if fmt == "json":
        return parse_json(text)
    return parse_text(text)


def _first(lines, regex):
    for line in lines:
        match = regex.match(line)
        if match:
            return match.group(1)
    return None


def _figure(token):
    """``(value, problem)`` for one printed cell: ``N/A`` is None; anything else must be a
    finite, non-negative number."""
    if token == "N/A":
        return None, None
    try:
        value = float(token)
    except (TypeError, ValueError):
        return None, "%r is not a number" % (token,)
    if not math.isfinite(value):
        return None, "%r is not a finite figure" % (token,)
    if value < 0:
        return None, "%r is negative" % (token,)
    return value, None


def _check_sum(record, key, matrix, decimals_tolerance):
    """A SUM that does not add up to its cells means the output was mangled (interleaved or cut)."""
    cells = [v for row in matrix["rows"].values() for v in row.values() if v is not None]
    total = sum(cells)
    if matrix["sum"] is not None and abs(matrix["sum"] - total) > decimals_tolerance(len(cells), total):
        record["problems"].append(
            "%s: SUM %s does not match its cells (they add up to %.2f): the output is mangled"
            % (key, _fmt(matrix["sum"]), total)
        )


def _fmt(value):
    return "%.2f" % value if isinstance(value, float) else str(value)


def _text_tolerance(count, _total):
    # Each cell is printed rounded to 2 decimals (at most 0.005 off), the SUM too.
    return 0.005 * count + 0.011


def _json_tolerance(_count, total):
    # Cells are printed with 6 significant digits (at most 5e-6 of each off); the sum is the
    # unrounded double.
    return 1e-5 * abs(total) + 0.01


def parse_text(text):
    """The record of nvbandwidth's plain-text output (see the module docstring)."""
    record = empty_record("text")
    lines = [line.rstrip() for line in (text or "").splitlines()]
    headers = (
        ("version", _VERSION_RE),
        ("git_version", _GIT_RE),
        ("cuda_runtime_version", _CUDA_RUNTIME_RE),
        ("cuda_driver_version", _CUDA_DRIVER_RE),
        ("driver_version", _DRIVER_RE),
    )
    current = None  # the testcase whose "Running" line came last and has no matrix yet, or has some
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        header = next(((key, rx.match(line)) for key, rx in headers if rx.match(line)), None)
        if header and record[header[0]] is None:
            record[header[0]] = header[1].group(1)
            continue
        match = _DEVICE_RE.match(line)
        if match and current is None:
            bus = match.group(3)
            record["devices"].append({"index": int(match.group(1)), "name": match.group(2), "bus_id": bus})
            continue
        match = _RUNNING_RE.match(line)
        if match:
            current = match.group(1)
            if current in record["testcases"]:
                record["problems"].append("%s: it ran twice in one output" % current)
            record["testcases"][current] = {"status": "running", "matrices": [], "errors": []}
            continue
        match = _WAIVING_RE.match(line)
        if match:
            record["testcases"][match.group(1)] = {"status": WAIVED, "matrices": [], "errors": []}
            current = None
            continue
        if _WAIVED_RE.match(line):
            record["waived_unnamed"] += 1
            current = None
            continue
        match = _NOT_FOUND_RE.match(line)
        if match:
            record["testcases"][match.group(1)] = {"status": NOT_FOUND, "matrices": [], "errors": [line]}
            record["errors"].append(line)
            current = None
            continue
        if _TITLE_RE.search(line):
            i = _read_matrix(record, lines, i - 1, current)
            continue
        if _SUM_RE.match(line) or _CV_RE.match(line):
            record["problems"].append("%r comes without a matrix before it" % line)
            continue
        if _VERBOSE_STAT_RE.match(line):
            continue
        entry = record["testcases"].get(current) if current else None
        if entry is not None and not entry["matrices"]:
            # Between "Running NAME." and its matrix nvbandwidth prints only its errors.
            entry["errors"].append(line)
        else:
            record["other_lines"].append(line)
    for name, entry in record["testcases"].items():
        if entry["status"] == "running":
            if entry["matrices"] and not entry["errors"]:
                entry["status"] = PASSED
            elif entry["errors"]:
                entry["status"] = ERROR if entry["matrices"] else INCOMPLETE
            else:
                entry["status"] = INCOMPLETE
                entry["errors"].append("%s printed no matrix" % name)
    _check_columns(record)
    return record


def _read_matrix(record, lines, start, current):
    """Read the matrix whose title is ``lines[start]``; returns the index after it."""
    title = lines[start].strip()
    where = "%s (%r)" % (current, title) if current else repr(title)
    i = start + 1
    if i >= len(lines) or not lines[i].strip():
        record["problems"].append("%s: the output ends after the title, without the matrix (truncated)" % where)
        return i
    columns = lines[i].split()
    if len(set(columns)) != len(columns):
        record["problems"].append("%s: the column header %r repeats a label" % (where, lines[i].strip()))
    i += 1
    rows = {}
    bad = False
    while i < len(lines) and lines[i].strip() and not _SUM_RE.match(lines[i].strip()):
        tokens = lines[i].split()
        label, cells = tokens[0], tokens[1:]
        if len(cells) != len(columns):
            record["problems"].append(
                "%s: row %s has %d cells where the header has %d columns (truncated or mangled output)"
                % (where, label, len(cells), len(columns))
            )
            bad = True
        row = {}
        for column, token in zip(columns, cells):
            value, problem = _figure(token)
            if problem:
                record["problems"].append("%s: row %s, column %s: %s" % (where, label, column, problem))
                bad = True
            row[column] = value
        if label in rows:
            record["problems"].append("%s: row %s appears twice" % (where, label))
            bad = True
        rows[label] = row
        i += 1
    if not rows:
        record["problems"].append("%s: the matrix has no rows (truncated)" % where)
        return i
    while i < len(lines) and not lines[i].strip():
        i += 1
    match = _SUM_RE.match(lines[i].strip()) if i < len(lines) else None
    if not match:
        record["problems"].append(
            "%s: the matrix ends without its SUM line (the output was cut short, or nvbandwidth died"
            " while printing it)" % where
        )
        return i
    key = match.group(1)
    total, problem = _figure(match.group(2))
    if problem:
        record["problems"].append("%s: SUM %s" % (key, problem))
        bad = True
    i += 1
    cv = None
    if i < len(lines):
        cv_match = _CV_RE.match(lines[i].strip())
        if cv_match and cv_match.group(1) == key:
            cv, problem = _figure(cv_match.group(2))
            if problem:
                record["problems"].append("%s: COEFFICIENT_OF_VARIATION %s" % (key, problem))
            i += 1
    testcase = current or key
    if key in record["matrices"]:
        record["problems"].append("%s: two matrices have this SUM key" % key)
    matrix = {"testcase": testcase, "title": title, "columns": columns, "rows": rows, "sum": total, "cv": cv}
    record["matrices"][key] = matrix
    entry = record["testcases"].setdefault(testcase, {"status": "running", "matrices": [], "errors": []})
    entry["matrices"].append(key)
    if not bad:
        _check_sum(record, key, matrix, _text_tolerance)
    return i


def parse_json(text):
    """The record of nvbandwidth's ``-j`` output (see the module docstring)."""
    record = empty_record("json")
    lines = (text or "").splitlines()
    starts = [n for n, line in enumerate(lines) if line.strip() == "{"]
    ends = [n for n, line in enumerate(lines) if line.strip() == "}"]
    if not starts or not ends or ends[-1] < starts[0]:
        record["problems"].append(
            "the output holds no JSON object (no line with only '{' ... '}'), though -j was given"
        )
        record["other_lines"] = [line.strip() for line in lines if line.strip()]
        return record
    first, last = starts[0], ends[-1]
    record["other_lines"] = [line.strip() for line in lines[:first] + lines[last + 1 :] if line.strip()]
    try:
        document = json.loads("\n".join(lines[first : last + 1]))
    except ValueError as exc:
        record["problems"].append("the JSON output does not decode: %s (truncated or mangled output)" % exc)
        return record
    root = document.get("nvbandwidth") if isinstance(document, dict) else None
    if not isinstance(root, dict):
        record["problems"].append('the JSON output has no "nvbandwidth" object')
        return record
    for key, name in (
        ("version", "version"),
        ("git_version", "git_version"),
        ("cuda_runtime_version", "CUDA Runtime Version"),
        ("cuda_driver_version", "CUDA Driver Version"),
        ("driver_version", "Driver Version"),
    ):
        if root.get(name) not in (None, ""):
            record[key] = str(root[name])
    for item in root.get("GPU Device list") or []:
        match = _JSON_DEVICE_RE.match(str(item).strip())
        if match:
            record["devices"].append({"index": int(match.group(1)), "name": match.group(2), "bus_id": match.group(3)})
        else:
            record["problems"].append('"GPU Device list" entry %r is not "N: NAME (BUS)"' % (item,))
    if root.get("error"):
        record["errors"].append(str(root["error"]))
    if root.get("warning"):
        record["other_lines"].append(str(root["warning"]))
    testcases = root.get("testcases")
    if not isinstance(testcases, list):
        record["problems"].append('the JSON output has no "testcases" list')
        return record
    for item in testcases:
        _json_testcase(record, item)
    _check_columns(record)
    return record


def _check_columns(record):
    """Every matrix nvbandwidth prints has one column per device it listed."""
    if not record["devices"]:
        return
    for key, matrix in record["matrices"].items():
        if len(matrix["columns"]) != len(record["devices"]):
            record["problems"].append(
                "%s: the matrix has %d columns but nvbandwidth listed %d device(s)"
                % (key, len(matrix["columns"]), len(record["devices"]))
            )


def _json_testcase(record, item):
    if not isinstance(item, dict) or not item.get("name"):
        record["problems"].append("a JSON testcase without a name: %r" % (item,))
        return
    name = str(item["name"])
    status = _JSON_STATUS.get(str(item.get("status", "")).strip().lower())
    if str(item.get("status", "")).strip() == "ERROR":
        status = NOT_FOUND  # addTestcase(name, "ERROR", ...): a name or index it does not know
    errors = [str(item["error"])] if item.get("error") else []
    if status is None:
        record["problems"].append("%s: unknown status %r" % (name, item.get("status")))
        status = ERROR
    if name in record["testcases"]:
        record["problems"].append("%s: it ran twice in one output" % name)
    entry = record["testcases"][name] = {"status": status, "matrices": [], "errors": errors}
    if "bandwidth_matrix" not in item:
        if status == PASSED:
            entry["status"] = INCOMPLETE
            entry["errors"].append("%s printed no matrix" % name)
        return
    raw = item["bandwidth_matrix"]
    where = "%s (%r)" % (name, str(item.get("bandwidth_description", "")).strip())
    if not isinstance(raw, list) or not raw or not all(isinstance(row, list) and row for row in raw):
        record["problems"].append("%s: bandwidth_matrix is not a list of non-empty rows" % where)
        return
    width = len(raw[0])
    columns = [str(n) for n in range(width)]
    rows = {}
    bad = False
    for r, raw_row in enumerate(raw):
        if len(raw_row) != width:
            record["problems"].append(
                "%s: row %d has %d cells where row 0 has %d (mangled output)" % (where, r, len(raw_row), width)
            )
            bad = True
        row = {}
        for column, token in zip(columns, raw_row):
            value, problem = _figure(token if isinstance(token, str) else str(token))
            if problem:
                record["problems"].append("%s: row %d, column %s: %s" % (where, r, column, problem))
                bad = True
            row[column] = value
        rows[str(r)] = row
    total = None
    if "sum" in item:
        total, problem = _figure(str(item["sum"]))
        if problem:
            record["problems"].append("%s: sum %s" % (name, problem))
            bad = True
    else:
        record["problems"].append("%s: the testcase has a matrix but no sum (truncated output)" % name)
        bad = True
    matrix = {
        "testcase": name,
        "title": str(item.get("bandwidth_description", "")).strip(),
        "columns": columns,
        "rows": rows,
        "sum": total,
        "cv": None,
    }
    record["matrices"][name] = matrix
    entry["matrices"].append(name)
    if not bad:
        _check_sum(record, name, matrix, _json_tolerance)
