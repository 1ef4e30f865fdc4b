#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: drift_report
short_description: The drift check's bookkeeping on the controller (token, judgement, report files)
version_added: 0.1.0
description:
  - Used by C(gpufleet.node.drift) around the check-mode run that the C(gpufleet.node.drift)
    callback records. It runs in the controller's own process (an action plugin, no module run,
    no connection to any host), once per run (C(run_once)).
  - O(state=started) writes a fresh token in O(dir) (C(token)); the callback carries it into its
    record (C(record.json)), which tells the report that the record is from this run.
  - O(state=reported) reads the record, refuses it unless it carries this run's token, judges
    every host in O(hosts) (a host without any result as unreachable; a host whose only items are
    C(out_of_service) did not drift), writes C(report.json), C(report.txt) and the Prometheus
    textfile metrics (O(metrics_path)), removes the token, and fails with the table when any host
    drifted.
author:
  - gpufleet.node developers (@gpufleet)
options:
  state:
    description:
      - V(started) at the start of the run, V(reported) at its end.
    type: str
    choices: [started, reported]
    required: true
  dir:
    description:
      - Directory of the token, the callback's record and the report (the callback's C(dir),
        C(GPUFLEET_DRIFT_DIR)).
    type: path
    required: true
  metrics_path:
    description:
      - The Prometheus textfile; default C(gpufleet_drift.prom) in O(dir).
    type: path
  hosts:
    description:
      - The hosts the check targeted; default C(ansible_play_hosts_all).
    type: list
    elements: str
attributes:
  action:
    support: full
    description: All of it runs in the controller's process.
  async:
    support: none
    description: Not supported.
  check_mode:
    support: full
    description: It writes its files in check mode too (they are the report of a check-mode run).
  diff_mode:
    support: none
    description: No diff.
  platform:
    support: full
    platforms: posix
    description: The controller.
seealso:
  - plugin: gpufleet.node.drift
    plugin_type: callback
"""

EXAMPLES = r"""
- name: Write this run's token beside the record
  gpufleet.node.drift_report:
    state: started
    dir: /var/lib/gpufleet/drift
  run_once: true

- name: Report the drift (and fail when anything drifted)
  gpufleet.node.drift_report:
    state: reported
    dir: /var/lib/gpufleet/drift
    metrics_path: /var/lib/node_exporter/textfile/gpufleet_drift.prom
  run_once: true
"""

RETURN = r"""
dir:
  description: The directory, absolute.
  returned: always
  type: str
  sample: /var/lib/gpufleet/drift
nodes:
  description: Every host the check targeted, with what was recorded for it (C(kind) changed,
    failed, unreachable or out_of_service; C(role); C(task); C(detail)); an empty list is clean.
  returned: with O(state=reported)
  type: dict
  sample: {"node1": [], "node2": [{"kind": "changed", "role": "pcie_p2p", "task": "Clear ACS redirect (gpu_paths)", "detail": "changed_ports: 0000:02:08.0"}]}
drifted:
  description: The hosts that drifted.
  returned: with O(state=reported)
  type: list
  elements: str
  sample: [node2]
msg:
  description: The drift table, when anything drifted.
  returned: when a host drifted
  type: str
"""
