# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NVIDIA DCGM's ``dcgmi diag``: its command line, and its output read by structure, as JSON (the
``-j`` document of DCGM 2.x, 3.x and 4.x) or as the text table. No judgement here
(``_dcgm_judge`` judges).

Plain Python (no Ansible imports), runs on target Python 3.8+. Checked against DCGM's JSON writer
(``nvvs/src/JsonOutput.cpp``), its 4.x schema (``testing/python3/dcgm_diag_schema.json``) and
real outputs of DCGM 3.1 to 4.4 (tests/data/dcgm):

* **Command.** ``dcgmi diag -r LEVEL -j [-i 0,1,...] [-p test.param=value;...]``; levels 1 (the
  deployment/software checks), 2 (adds memory and PCIe), 3 (adds the diagnostic, targeted stress,
  targeted power and memory bandwidth) and 4 (adds memtest and the pulse test).
* **JSON, 2.x/3.x.** ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_ids" | "gpu_id", "status", "warnings", "info"}]}]}], "version", "Driver
  Version Detected", "runtime_error"}}``. ``gpu_ids`` is a CSV string for the deployment tests
  (one result for every GPU) and a number or string elsewhere; statuses are ``Pass``/``PASS``,
  ``Fail``, ``Warn``, ``Skip``/``SKIPPED``; ``warnings`` is a string, a list of strings, or a list
  of ``{"warning", "error_id"}``; lists can hold ``null`` where jsoncpp filled an index gap.
* **JSON, 4.x.** The root is ``"DCGM Diagnostic"``, results are per entity (``entity_group``
  ``GPU``, ``entity_group_id``, ``entity_id``), warnings ``{"warning", "error_id",
  "error_category", "error_severity"}``, a ``test_summary`` (``status``, ``info``) per test, and
  the version under the document's ``metadata`` (``version``, ``Driver Version Detected``).
* **Text table** (what a DCGM prints where ``-j`` gives no JSON): a ``| Diagnostic | Result |``
  header, category rows (``|-----  Deployment  ---+---|`` or ``+-----  Hardware  ---+---+``), the
  Metadata rows (``DCGM Version``, ``Driver Version Detected``, ``GPU Device IDs Detected``), one row
  per test (``| PCIe | Pass - All |``, ``| GPU Memory | Pass - GPUs: 1, 2 |`` then ``| | Fail -
  GPU: 0 |``; 4.x: ``| pcie | Fail |`` then ``| | GPU0: Pass |`` per GPU), and ``Warning``/``Error``/
  ``Info`` rows whose text DCGM wraps over continuation rows at the column width.

:func:`parse_output` returns one record for both formats and never raises: what does not fit the
structure (an unknown status, a truncated document, a table without its closing border, a row
that is not a table row) is listed in ``problems``, each naming where it is.
"""

from __future__ import annotations

import json
import re

LEVELS = (1, 2, 3, 4)
#: Seconds a run may take by level when no timeout is given, several times what dcgmi's reference
#: (docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html)
#: says a level normally lasts: 1 seconds, 2 about two minutes, 3 about 15 minutes, 4 longer.
DEFAULT_TIMEOUTS = {1: 300, 2: 900, 3: 3600, 4: 7200}

PASS, FAIL, WARN, SKIP, NOT_RUN = "pass", "fail", "warn", "skip", "not_run"
_STATUS_WORDS = {
    "pass": PASS,
    "passed": PASS,
    "fail": FAIL,
    "failed": FAIL,
    "warn": WARN,
    "warning": WARN,
    "skip": SKIP,
    "skipped": SKIP,
    "not run": NOT_RUN,
}
#: Worst first, for a test's status over its results.
_SEVERITY = {PASS: 0, SKIP: 1, NOT_RUN: 1, WARN: 2, FAIL: 3}

#: DCGM's wording when dcgmi cannot reach nv-hostengine (dcgmi/Command.cpp,
#: ``DoExecuteConnectionFailure``, and the connection errors it prints).
_ENGINE_DOWN_RE = re.compile(
    r"Unable to connect to host engine|Host engine connection invalid|unable to establish a connection to the"
    r" specified host",
    re.I,
)

_PARAM_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\.[A-Za-z][A-Za-z0-9_]*$")
_PARAM_VALUE_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")

_ROW_RE = re.compile(r"^\|([^|]*)\|(.*)\|$")
_BORDER_RE = re.compile(r"^\+[-=]+\+[-=]+\+$")
_CATEGORY_RE = re.compile(r"^[|+]-{3,}\s+(\S.*?)\s+-*\+-*[|+]$")
_RESULT_RE = re.compile(r"^(pass|fail|warn|skip|not run)(?:\s+-\s+(.*))?$", re.I)
_RESULT_GPUS_RE = re.compile(r"^(?:all|GPUs?:?\s*([\d,\s]+))$", re.I)
_PER_GPU_RE = re.compile(r"^GPU(\d+):\s+(\S.*)$")
_MESSAGE_LABELS = {"warning": "warnings", "error": "warnings", "info": "info"}
_BANNER = "Successfully ran diagnostic for group."


class ParameterError(ValueError):
    """The ``parameters`` option cannot be rendered safely."""


# -- the command line --------------------------------------------------------------------------
def render_parameters(parameters):
    """``{"test.param": value}`` as dcgmi's ``-p`` takes it (``a.b=v;c.d=w``, sorted by key).

    Keys must be ``test.parameter`` (letters, digits, underscores); values a number, a boolean or
    a word of letters, digits and ``_.+-``: nothing a shell or DCGM's own ``;``/``=`` parsing could
    split. Returns None for no parameters."""
    if not parameters:
        return None
    rendered = []
    for key in sorted(parameters):
        value = parameters[key]
        if not isinstance(key, str) or not _PARAM_KEY_RE.match(key):
            raise ParameterError(
                "parameters key %r is not of the form test.parameter (for example diagnostic.test_duration)" % (key,)
            )
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = str(value)
        elif isinstance(value, str) and _PARAM_VALUE_RE.match(value):
            text = value
        else:
            raise ParameterError(
                "parameters[%r] = %r: a value must be a number, a boolean or a word of letters, digits and _.+-"
                % (key, value)
            )
        rendered.append("%s=%s" % (key, text))
    return ";".join(rendered)


def build_argv(binary, level, gpus=None, parameters=None):
    """``dcgmi diag -r LEVEL -j [-i GPUS] [-p PARAMS]``."""
    argv = [binary, "diag", "-r", str(level), "-j"]
    if gpus:
        argv += ["-i", ",".join(str(g) for g in gpus)]
    rendered = render_parameters(parameters)
    if rendered:
        argv += ["-p", rendered]
    return argv


# -- the record --------------------------------------------------------------------------------
def empty_record(fmt):
    return {
        "format": fmt,
        "dcgm_version": None,
        "driver_version": None,
        "device_ids": [],
        "tests": [],
        "runtime_error": None,
        "engine_down": None,
        "other_lines": [],
        "problems": [],
    }


def normalize_status(word):
    """DCGM's status word as ``pass``/``fail``/``warn``/``skip``/``not_run``; None when unknown."""
    if not isinstance(word, str):
        return None
    return _STATUS_WORDS.get(" ".join(word.strip().lower().split()))


def worst_status(statuses):
    statuses = [s for s in statuses if s is not None]
    return max(statuses, key=lambda s: _SEVERITY[s]) if statuses else None


def engine_down_message(text):
    """The lines of ``text`` in which dcgmi says it cannot reach the host engine (joined), else
    None."""
    lines = [line.strip() for line in (text or "").splitlines() if _ENGINE_DOWN_RE.search(line)]
    return " ".join(lines) if lines else None


def parse_output(text):
    """The record of one ``dcgmi diag -j`` run: its JSON document when it printed one, else its
    text table, else a record whose ``problems`` say why neither could be read."""
    text = text or ""
    record = None
    if _json_start(text) is not None:
        record = parse_json(text)
    elif any(_ROW_RE.match(line.strip()) for line in text.splitlines()):
        record = parse_text(text)
    else:
        record = empty_record(None)
        record["other_lines"] = [line.strip() for line in text.splitlines() if line.strip()]
        record["problems"].append(
            "the output holds neither a JSON document nor a result table%s"
            % (": " + record["other_lines"][-1] if record["other_lines"] else " (no output)")
        )
    record["engine_down"] = engine_down_message(text)
    return record


def _json_start(text):
    """The offset of the ``{`` that opens the document: the first line that begins with one."""
    offset = 0
    for line in text.splitlines(True):
        if line.lstrip().startswith("{"):
            return offset + len(line) - len(line.lstrip())
        offset += len(line)
    return None


# -- JSON --------------------------------------------------------------------------------------
def parse_json(text):
    record = empty_record("json")
    start = _json_start(text)
    if start is None:
        record["problems"].append("the output holds no JSON document")
        return record
    record["other_lines"] = [line.strip() for line in text[:start].splitlines() if line.strip()]
    try:
        document, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as exc:
        record["problems"].append("the JSON document does not decode: %s (truncated or mangled output)" % exc)
        return record
    record["other_lines"] += [line.strip() for line in text[end:].splitlines() if line.strip()]
    if not isinstance(document, dict):
        record["problems"].append("the JSON document is a %s, not an object" % type(document).__name__)
        return record
    root_key = next((k for k in ("DCGM Diagnostic", "DCGM GPU Diagnostic") if k in document), None)
    if root_key is None:
        record["problems"].append(
            'the JSON document has no "DCGM Diagnostic" (4.x) or "DCGM GPU Diagnostic" (2.x/3.x) object; its keys: %s'
            % ", ".join(sorted(str(k) for k in document))
            or "none"
        )
        return record
    root = document[root_key]
    if not isinstance(root, dict):
        record["problems"].append('"%s" is not an object' % root_key)
        return record
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    for key, names in (("dcgm_version", ("version",)), ("driver_version", ("Driver Version Detected",))):
        for source in (metadata, root):
            value = next((source.get(n) for n in names if source.get(n) not in (None, "")), None)
            if value is not None:
                record[key] = str(value)
                break
    if root.get("runtime_error"):
        record["runtime_error"] = str(root["runtime_error"])
    if isinstance(root.get("GPU Device IDs"), list):
        record["device_ids"] = [str(d) for d in root["GPU Device IDs"]]
    for group in document.get("entity_groups") or []:
        if isinstance(group, dict) and group.get("entity_group") == "GPU":
            record["device_ids"] = [str(e.get("device_id")) for e in group.get("entities") or [] if isinstance(e, dict)]
    categories = root.get("test_categories")
    if categories is None:
        if record["runtime_error"] is None:
            record["problems"].append('"%s" has no "test_categories" and no "runtime_error"' % root_key)
        return record
    if not isinstance(categories, list):
        record["problems"].append('"test_categories" is not a list')
        return record
    for category in categories:
        if category is None:
            continue
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            record["problems"].append("a test category without a tests list: %r" % (category,))
            continue
        name = str(category.get("category") or "")
        for test in category["tests"]:
            if test is not None:
                _json_test(record, name, test)
    return record


def _messages(value, where, record, warnings):
    """DCGM's ``warnings``/``info`` as ``[{"message", "error_id"}]`` or ``[str]``."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if item is None:
            continue
        if isinstance(item, str):
            text, error_id = item, None
        elif isinstance(item, dict) and isinstance(item.get("warning", item.get("message")), str):
            text = item.get("warning", item.get("message"))
            error_id = item.get("error_id", item.get("error_code"))
        else:
            record["problems"].append("%s: a message that is neither text nor {warning}: %r" % (where, item))
            continue
        text = " ".join(text.split())
        if warnings:
            out.append({"message": text, "error_id": error_id if isinstance(error_id, int) else None})
        else:
            out.append(text)
    return out


def _gpu_ids(value):
    """``"0,1,2"``, ``"3"`` or ``3`` as ``[0, 1, 2]``; None when it is none of these."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value] if value >= 0 else None
    if isinstance(value, str) and re.match(r"^\s*\d+(\s*,\s*\d+)*\s*$", value):
        return [int(v) for v in value.split(",")]
    return None


def _json_test(record, category, item):
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
        record["problems"].append("a test without a name in category %r: %r" % (category, item))
        return
    name = item["name"].strip()
    test = new_test(name, category)
    results = item.get("results")
    if not isinstance(results, list):
        record["problems"].append("%s: the test has no results list" % name)
        results = []
    for raw in results:
        if raw is None:
            continue
        where = "%s, result %r" % (name, raw)
        if not isinstance(raw, dict):
            record["problems"].append("%s: not an object" % where)
            continue
        status = normalize_status(raw.get("status"))
        if status is None:
            record["problems"].append("%s: unknown status %r" % (name, raw.get("status")))
        group = raw.get("entity_group")
        if "entity_id" in raw:
            ids = _gpu_ids(raw.get("entity_id"))
            entity = "%s%s" % (group or "GPU", raw.get("entity_id"))
            gpus = ids if (group in (None, "GPU") and ids is not None) else []
        else:
            ids = _gpu_ids(raw.get("gpu_ids", raw.get("gpu_id")))
            gpus = ids or []
            entity = "GPU" + ",".join(str(g) for g in gpus) if ids is not None else None
        if ids is None:
            record["problems"].append(
                "%s: result without a readable GPU (gpu_ids %r, entity_id %r)"
                % (name, raw.get("gpu_ids", raw.get("gpu_id")), raw.get("entity_id"))
            )
        test["results"].append(
            {
                "entity": entity,
                "gpus": gpus,
                "status": status,
                "raw_status": raw.get("status"),
                "warnings": _messages(raw.get("warnings"), name, record, True),
                "info": _messages(raw.get("info"), name, record, False),
            }
        )
    summary = item.get("test_summary")
    if isinstance(summary, dict):
        test["summary_status"] = normalize_status(summary.get("status"))
        if summary.get("status") is not None and test["summary_status"] is None:
            record["problems"].append("%s: unknown test_summary status %r" % (name, summary.get("status")))
        test["info"] += _messages(summary.get("info"), name, record, False)
        test["warnings"] += _messages(summary.get("warnings"), name, record, True)
    if not test["results"] and test["summary_status"] is None:
        record["problems"].append("%s: the test has no result" % name)
    finish_test(test)
    record["tests"].append(test)


def new_test(name, category):
    return {
        "name": name,
        "category": category,
        "status": None,
        "summary_status": None,
        "results": [],
        "warnings": [],
        "info": [],
    }


def finish_test(test):
    """The test's status: the worst of its results and its summary."""
    test["status"] = worst_status([r["status"] for r in test["results"]] + [test["summary_status"]])


# -- text --------------------------------------------------------------------------------------
def parse_text(text):
    """The record of dcgmi's result table (see the module docstring)."""
    record = empty_record("text")
    header_seen = closed = False
    category = None
    test = None
    message = None  # [test, key, chunks] of the Warning/Error/Info row being read

    def flush():
        if message is not None:
            owner, key, chunks = message[0], message[1], message[2]
            body = " ".join("".join(chunks).split())
            owner[key].append({"message": body, "error_id": None} if key == "warnings" else body)

    for number, raw in enumerate((text or "").splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        match = _CATEGORY_RE.match(stripped)
        if match:
            flush()
            message = None
            category = match.group(1)
            test = None
            continue
        if _BORDER_RE.match(stripped):
            flush()
            message = None
            if header_seen and category is not None:
                closed = True
            continue
        row = _ROW_RE.match(stripped)
        if not row:
            if stripped == _BANNER or not (header_seen or record["tests"]):
                record["other_lines"].append(stripped)
            else:
                flush()
                message = None
                record["problems"].append(
                    "line %d is not a table row: %r (truncated or mangled output)" % (number, stripped)
                )
            continue
        left, cell = row.group(1).strip(), row.group(2)
        value = cell.strip()
        if left == "Diagnostic" and value == "Result":
            header_seen = True
            continue
        if closed:
            record["problems"].append("line %d comes after the table's closing border: %r" % (number, stripped))
            continue
        if category == "Metadata" and left:
            _metadata(record, left, value)
            continue
        if left.lower() in _MESSAGE_LABELS:
            flush()
            if test is None:
                # An Error/Warning row straight under a category names no test: DCGM reports the
                # category itself (as DCGM 2.x prints a deployment error).
                test = new_test(category or "unknown", category)
                test["results"].append(_text_result(None, FAIL if left.lower() != "info" else PASS))
                record["tests"].append(test)
            message = [test, _MESSAGE_LABELS[left.lower()], [_chunk(cell)]]
            continue
        if left:
            flush()
            message = None
            if category is None:
                record["problems"].append("line %d: test %r comes before any category row" % (number, left))
            test = new_test(left, category)
            record["tests"].append(test)
            _result_cell(record, test, value, number)
            continue
        # A continuation row: a per-GPU result, another "Fail - GPU: 0" line, or wrapped text.
        per_gpu = _PER_GPU_RE.match(value)
        if test is not None and (per_gpu or _RESULT_RE.match(value)):
            flush()
            message = None
            if per_gpu:
                status = normalize_status(per_gpu.group(2))
                if status is None:
                    record["problems"].append(
                        "%s: unknown status %r for GPU%s" % (test["name"], per_gpu.group(2), per_gpu.group(1))
                    )
                # DCGM 4.x: the test's own row ("| pcie | Fail |") is its summary, the GPUn rows
                # its per-GPU results.
                bare = [r for r in test["results"] if r["entity"] is None]
                if bare:
                    test["summary_status"] = worst_status([test["summary_status"]] + [r["status"] for r in bare])
                    test["results"] = [r for r in test["results"] if r["entity"] is not None]
                test["results"].append(_text_result([int(per_gpu.group(1))], status, per_gpu.group(2)))
            else:
                _result_cell(record, test, value, number)
            continue
        if message is not None:
            message[2].append(_chunk(cell))
            continue
        record["problems"].append("line %d: a continuation row with nothing to continue: %r" % (number, stripped))
    flush()
    for entry in record["tests"]:
        finish_test(entry)
    if not header_seen:
        record["problems"].append(
            "the output has no '| Diagnostic | Result |' header row (a fragment, not a whole table)"
        )
    if not closed:
        record["problems"].append("the table has no closing border (the output was cut short)")
    return record


def _chunk(cell):
    """The text of one cell of a wrapped message. DCGM cuts the message every (column width - 3)
    characters, mid-word, and pads the cell with one space before and two after; a space at the
    cut belongs to the text, so the chunk is sliced, not stripped."""
    return cell[1 : max(len(cell) - 2, 1)]


def _metadata(record, key, value):
    if key == "DCGM Version":
        record["dcgm_version"] = value
    elif key == "Driver Version Detected":
        record["driver_version"] = value
    elif key == "GPU Device IDs Detected":
        record["device_ids"] = [v.strip() for v in value.split(",") if v.strip()]


def _text_result(gpus, status, raw_status=None):
    """``gpus`` None: the row names no GPU ("Pass", "Pass - All": every GPU of the run)."""
    return {
        "entity": None if gpus is None else "GPU" + ",".join(str(g) for g in gpus),
        "gpus": list(gpus or []),
        "status": status,
        "raw_status": raw_status,
        "warnings": [],
        "info": [],
    }


def _result_cell(record, test, value, number):
    match = _RESULT_RE.match(value)
    if not match:
        record["problems"].append("line %d: %s: unknown result %r" % (number, test["name"], value))
        test["results"].append(_text_result(None, None, value))
        return
    status = normalize_status(match.group(1))
    scope = match.group(2)
    gpus = None
    if scope is not None:
        scoped = _RESULT_GPUS_RE.match(scope.strip())
        if not scoped:
            record["problems"].append("line %d: %s: unknown result scope %r" % (number, test["name"], scope))
        elif scoped.group(1):
            gpus = [int(g) for g in scoped.group(1).replace(" ", "").split(",") if g]
    test["results"].append(_text_result(gpus, status, value))
