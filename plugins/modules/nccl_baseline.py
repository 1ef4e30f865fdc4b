#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_baseline
short_description: Read or update the NCCL gate's peer baselines on the controller
version_added: 0.2.0
description:
  - The baseline store of the NCCL gate (role C(gpufleet.node.nccl_gate)); a directory on the
    controller with one JSON file per design key (C(<design_key>.json)), each holding the latest
    healthy gate figure of each node of that design (at most O(window) nodes, the most recent).
  - "V(read): every design's samples, for the O(gpufleet.node.nccl_allreduce#module:baselines)
    option of M(gpufleet.node.nccl_allreduce), which takes the median of this node's peers."
  - "V(update): adds the verdicts that passed (C(passed=true), C(kind=ok)) judged by their design's
    own rule (C(rule) V(peer_median) or V(physics_floor); a figure gated against a hand-set fixed
    threshold is not a peer), with a finite judged figure, a finite timestamp and a design key. A
    timestamp more than 300 s ahead of the controller's clock is taken as the controller's time. A
    node keeps only its newest figure, which replaces the stored one. Every verdict that does not
    count and every figure the window pushes out is in RV(dropped) with the reason (a warning unless
    the verdict failed)."
  - One writer at a time (C(fcntl.flock) on C(.lock) in the directory, readers share it on a
    read-only descriptor, so reading needs no write access; a reader that cannot open the lock
    reads without it), every file written atomically (a temporary file in the same directory,
    fsync, rename).
  - A design file that does not parse, is of another format, names another design or fails its
    checksum is corrupt; it is reported (a warning, RV(corrupt), and the gate's verdict for that
    design says the physics floor decided because of it) and never rewritten or reset. Repair it
    or move it away.
  - This is an action plugin; it runs on the controller only (no module runs on the nodes). Run it
    once per play or batch (C(run_once)).
author:
  - gpufleet.node developers (@gpufleet)
options:
  path:
    description: The store's directory (created by the first update, mode C(0755)).
    type: path
    required: true
  state:
    description: V(read) the baselines, or V(update) them with O(verdicts).
    type: str
    choices: [read, update]
    default: read
  verdicts:
    description:
      - With V(update), gate verdicts as the C(nccl_gate) role composes them (C(host),
        C(design_key), C(design), C(passed), C(kind), C(judged_busbw_gbps), C(timestamp), C(boot_id)).
    type: list
    elements: dict
    default: []
  window:
    description: A design keeps the latest figures of at most this many nodes.
    type: int
    default: 50
attributes:
  action:
    support: full
    description: Runs on the controller only.
  async:
    support: none
    description: Not supported.
  check_mode:
    support: full
    description: In check mode an update reports what it would add and writes nothing.
  diff_mode:
    support: none
    description: No diff.
  platform:
    support: full
    platforms: posix
    description: The controller (C(fcntl) locks).
seealso:
  - module: gpufleet.node.nccl_allreduce
"""

EXAMPLES = r"""
- name: Read the peer baselines
  gpufleet.node.nccl_baseline:
    path: /var/lib/gpufleet-baselines
  run_once: true
  register: baselines

- name: Record the healthy verdicts of this batch
  gpufleet.node.nccl_baseline:
    path: /var/lib/gpufleet-baselines
    state: update
    verdicts: >-
      {{ ansible_play_batch | map('extract', hostvars) | selectattr('__nccl_gate_verdict', 'defined')
         | map(attribute='__nccl_gate_verdict') | list }}
  run_once: true
"""

RETURN = r"""
path:
  description: The store's directory.
  returned: always
  type: str
designs:
  description:
    - With V(read), per design key C({samples - [{host, gbps, timestamp, boot_id}]}), or C({error})
      for a corrupt file.
  returned: state is read
  type: dict
counts:
  description: With V(read), the number of samples per readable design.
  returned: state is read
  type: dict
  sample: {"h100-80gb-hbm3-8x-nvswitch-4f1c0a9e": 7}
corrupt:
  description: Per design key whose file is corrupt, what is wrong with it.
  returned: always
  type: dict
updated:
  description: With V(update), per design key the hosts whose figures were added.
  returned: state is update
  type: dict
  sample: {"l40s-4x-pcie-91b2e0d4": ["node1", "node2"]}
ignored:
  description: With V(update), how many verdicts did not count (failed, another rule, no figure, timestamp or key).
  returned: state is update
  type: int
dropped:
  description:
    - With V(update), every verdict that did not count and every figure not kept (an older verdict
      of the same host, outside the window), each C({host, design_key, gbps, reason}).
  returned: state is update
  type: list
  elements: dict
  sample: [{"host": "node3", "design_key": "l40s-4x-pcie-91b2e0d4", "gbps": 21.4, "reason": "judged by rule 'fixed', ..."}]
problem:
  description: Why the store could not be used at all (a directory that cannot be created or locked), else C(null).
  returned: always
  type: str
"""
