# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action of gpufleet.node.drift_report: the drift check's bookkeeping on the controller, in this
process, with no module run (see the module's documentation)."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.node.plugins.module_utils.common import _textfile

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["started", "reported"], "required": True},
    "dir": {"type": "path", "required": True},
    "metrics_path": {"type": "path"},
    "hosts": {"type": "list", "elements": "str"},
}
# A node without any result was never reached.
UNREACHED = {"kind": "unreachable", "role": "", "task": "-", "detail": "no result from the node"}
NOT_DRIFT = "out_of_service"  # out of service for a reason of this boot: reported, not drift
DETAIL_WIDTH = 70


def judge(record_hosts, hosts):
    """{host: [items]} for every host the check targeted, in their order (a host without any
    result as unreachable), and the hosts that drifted."""
    nodes = {host: list(record_hosts.get(host, [UNREACHED])) for host in hosts}
    drifted = [host for host, items in nodes.items() if any(i.get("kind") != NOT_DRIFT for i in items)]
    return nodes, drifted


def report_doc(nodes, drifted, timestamp):
    """report.json: what drifted, which nodes are out of service (and did not drift), every item."""
    return {
        "timestamp": int(timestamp),
        "drifted": drifted,
        "out_of_service": [host for host, items in nodes.items() if items and host not in drifted],
        "nodes": nodes,
    }


def _truncate(text, width=DETAIL_WIDTH, end="...", leeway=5):
    # as Jinja's truncate(width, killwords=true), which the report's template used
    return text if len(text) <= width + leeway else text[: width - len(end)] + end


def table(nodes):
    """report.txt (and the failure message): one row per item, `clean` for a node without any."""
    rows = [["node", "state", "concern", "task", "detail"]]
    for host in sorted(nodes):
        for item in nodes[host]:
            detail = _truncate(str(item.get("detail") or ""))
            rows.append([host, item.get("kind", ""), item.get("role") or "-", str(item.get("task", "")), detail])
        if not nodes[host]:
            rows.append([host, "clean", "-", "-", "-"])
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    return "".join(
        ("  ".join(str(cell).ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]).strip() + "\n"
        for row in rows
    )


def prometheus(nodes, drifted, timestamp):
    """The textfile metrics (node_exporter's textfile collector)."""
    hosts = sorted(nodes)
    out = _textfile.Exposition()
    out.metric(
        "gpufleet_drift_items",
        "gauge",
        "What drifted on the node: check-mode changes, failures, no answer.",
        [({"node": h}, sum(1 for i in nodes[h] if i.get("kind") != NOT_DRIFT)) for h in hosts],
    )
    out.metric(
        "gpufleet_drift_detected",
        "gauge",
        "1 when anything drifted on the node.",
        [({"node": h}, 1 if h in drifted else 0) for h in hosts],
    )
    out.metric(
        "gpufleet_node_out_of_service",
        "gauge",
        "1 when the node is out of service for a reason recorded in this boot (a failed gate).",
        [({"node": h}, 1 if any(i.get("kind") == NOT_DRIFT for i in nodes[h]) else 0) for h in hosts],
    )
    out.metric(
        "gpufleet_drift_last_run_timestamp_seconds",
        "gauge",
        "When the drift check ran.",
        [({}, int(timestamp))],
    )
    return out.text()


def write_file(path, text, mode=0o644):
    """Write atomically (a temporary file beside it, then a rename)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def start(directory):
    """A fresh token beside the record: the callback carries it into the record, which tells the
    report that the record is from this run."""
    token = secrets.token_hex(16)
    write_file(os.path.join(directory, "token"), token + "\n")
    return token


def report(directory, hosts, metrics_path=None, now=None):
    """Read this run's record, judge every host, write report.json, report.txt and the metrics;
    end the run's record (remove the token). Returns (nodes, drifted, table text)."""
    token_path = os.path.join(directory, "token")
    try:
        with open(token_path) as f:
            token = f.read().strip()
    except FileNotFoundError:
        token = None
    try:
        with open(os.path.join(directory, "record.json")) as f:
            record = json.load(f)
    except (FileNotFoundError, ValueError):
        record = {}
    if not token or record.get("token") != token:
        raise AnsibleActionFail(
            f"No drift record from this run in {directory}/record.json: enable the recorder with "
            "ANSIBLE_CALLBACKS_ENABLED=gpufleet.node.drift (the repository's ansible.cfg does); set "
            "GPUFLEET_DRIFT_DIR to move the record and the report."
        )
    timestamp = time.time() if now is None else now
    nodes, drifted = judge(record.get("hosts") or {}, hosts)
    text = table(nodes)
    write_file(
        os.path.join(directory, "report.json"),
        json.dumps(report_doc(nodes, drifted, timestamp), indent=4, sort_keys=True) + "\n",
    )
    write_file(os.path.join(directory, "report.txt"), text)
    write_file(metrics_path or os.path.join(directory, "gpufleet_drift.prom"), prometheus(nodes, drifted, timestamp))
    os.unlink(token_path)
    return nodes, drifted, text


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True  # bookkeeping of a check-mode run: it writes in check mode too

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        directory = os.path.abspath(args["dir"])
        if args["state"] == "started":
            start(directory)
            return dict(result, changed=False, dir=directory)
        hosts = (
            args["hosts"] if args["hosts"] is not None else list((task_vars or {}).get("ansible_play_hosts_all", []))
        )
        nodes, drifted, text = report(directory, hosts, args["metrics_path"])
        result.update(changed=False, dir=directory, nodes=nodes, drifted=drifted)
        if drifted:
            result.update(failed=True, msg=text)
        return result
