#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_readiness_info
short_description: Read what decides whether a GPU node may take traffic, in one call
version_added: 0.1.0
description:
  - Reads the node's boot id and the NCCL gate's readiness marker, and, when asked, the vLLM
    server's C(/health) and C(/v1/models); says why the node may not take traffic.
  - The marker lets a node take traffic only when it carries the CURRENT boot id and says
    C(passed) (a JSON true). The same rule answers the balancer's agent checks on the node
    (role gpufleet.node.lb_registration).
  - A GPU health verdict of the current boot (O(health_path), written by role
    gpufleet.node.gpu_health and by its watcher while the node serves) that does not say
    C(passed) keeps the node out too, with its failed checks, their reasons and actions as the
    reason. No verdict, or one of an earlier boot, leaves the decision to the marker.
  - One module run instead of a task per file and URL; read-only.
author:
  - gpufleet.node developers (@gpufleet)
options:
  marker_path:
    description: The NCCL gate's readiness marker (JSON, written by role gpufleet.node.nccl_gate).
    type: path
    required: true
  health_path:
    description:
      - The GPU health verdict (JSON with C(boot_id), C(passed), C(checks)).
      - Default, C(gpu-health.json) in the directory of O(marker_path).
    type: path
  boot_id_path:
    description: Where the current boot id is read.
    type: path
    default: /proc/sys/kernel/random/boot_id
  health_url:
    description: The server's health URL (http or https only); must answer 200. Not asked when omitted.
    type: str
  models_url:
    description: The server's OpenAI models URL; must list O(model). Not asked when omitted.
    type: str
  model:
    description: The model id that O(models_url) must list. Required with O(models_url).
    type: str
  api_key:
    description: Bearer token for O(models_url) (vLLM's C(--api-key)). Never logged.
    type: str
  timeout:
    description: Seconds each URL may take in all - connect, headers and body (an overall deadline, not per read).
    type: float
    default: 5.0
  max_bytes:
    description: Most bytes read of each answer; a larger answer counts as no answer.
    type: int
    default: 1048576
  validate_certs:
    description: Verify the TLS certificate of the node's server (https URLs).
    type: bool
    default: true
extends_documentation_fragment:
  - gpufleet.node.attributes.read_only
seealso:
  - module: gpufleet.node.nccl_allreduce
  - module: gpufleet.node.haproxy_pool_member
"""

EXAMPLES = r"""
- name: Read the gate's verdict of this boot
  gpufleet.node.node_readiness_info:
    marker_path: /run/gpufleet/nccl-gate.json
  register: readiness

- name: Judge a node with its server
  gpufleet.node.node_readiness_info:
    marker_path: /run/gpufleet/nccl-gate.json
    health_url: http://127.0.0.1:8000/health
    models_url: http://127.0.0.1:8000/v1/models
    model: meta-llama/Llama-3.3-70B-Instruct
  register: readiness
  failed_when: not readiness.ready
"""

RETURN = r"""
boot_id:
  description: The current boot id.
  returned: always
  type: str
marker:
  description: The marker as written by the gate, or an empty dict when there is none (or it is unreadable).
  returned: always
  type: dict
gpu_health:
  description: The GPU health verdict as written, or an empty dict when there is none (or it is unreadable).
  returned: always
  type: dict
marker_current:
  description: Whether the marker is from this boot and says passed.
  returned: always
  type: bool
health_status:
  description: HTTP status of O(health_url); V(-1) when it did not answer; null when not asked.
  returned: always
  type: int
models:
  description: The model ids O(models_url) lists (empty when not asked or not answered).
  returned: always
  type: list
  elements: str
reasons:
  description: Why the node may not take traffic; empty when it may.
  returned: always
  type: list
  elements: str
  sample: ["no NCCL gate marker at /run/gpufleet/nccl-gate.json: the gate has not run since boot"]
ready:
  description: No reasons.
  returned: always
  type: bool
"""

import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _http
from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness


def _get(url, p, headers=None):
    """(status, body, error): status -1 and the error when nothing usable answered (one bounded
    GET: http/https only, an overall deadline, a size limit)."""
    try:
        status, body = _http.get(
            url,
            headers=headers,
            timeout=p["timeout"],
            max_bytes=p["max_bytes"],
            validate_certs=p["validate_certs"],
            follow_redirects=True,
        )
        return status, body, None
    except _http.HttpError as exc:
        return -1, b"", exc.what


def main():
    module = AnsibleModule(
        argument_spec=dict(
            marker_path=dict(type="path", required=True),
            health_path=dict(type="path"),
            boot_id_path=dict(type="path", default="/proc/sys/kernel/random/boot_id"),
            health_url=dict(type="str"),
            models_url=dict(type="str"),
            model=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            **_http.argument_spec(timeout=5.0, max_bytes=1024 * 1024),
        ),
        required_by={"models_url": "model"},
        supports_check_mode=True,
    )
    p = module.params
    try:
        _http.check_limits(p["timeout"], p["max_bytes"])
        for name in ("health_url", "models_url"):
            if p[name]:
                _http.check_url(p[name])
    except (_http.HttpError, ValueError) as exc:
        module.fail_json(msg=f"{exc}")
    try:
        boot_id = _readiness.read_boot_id(p["boot_id_path"])
    except OSError as exc:
        module.fail_json(msg=f"cannot read the boot id at {p['boot_id_path']}: {exc.strerror or exc}")
    marker, problem = _readiness.read_marker(p["marker_path"])
    reasons = _readiness.marker_reasons(marker, problem, boot_id, p["marker_path"])
    marker_current = not reasons
    health_path = p["health_path"] or _readiness.health_path_for(p["marker_path"])
    health, health_problem = _readiness.read_health(health_path)
    reasons = _readiness.health_reasons(health, health_problem, boot_id, health_path) + reasons

    health_status = None
    if p["health_url"]:
        health_status, _body, error = _get(p["health_url"], p)
        if health_status != 200:
            reasons.append(
                f"the server is not healthy: {p['health_url']} answered "
                f"{health_status if health_status > 0 else error or 'nothing'}"
            )

    models = []
    if p["models_url"]:
        headers = {"Authorization": f"Bearer {p['api_key']}"} if p["api_key"] else {}
        status, body, error = _get(p["models_url"], p, headers)
        try:
            models = [m["id"] for m in json.loads(body)["data"]] if status == 200 else []
        except (ValueError, KeyError, TypeError):
            models = []
        if p["model"] not in models:
            listed = ", ".join(models) or (
                "nothing" if status == 200 else f"nothing: {status if status > 0 else error}"
            )
            reasons.append(f"the server does not list model {p['model']} on /v1/models (it lists: {listed})")

    module.exit_json(
        changed=False,
        boot_id=boot_id,
        marker=marker or {},
        gpu_health=health or {},
        marker_current=marker_current,
        health_status=health_status,
        models=models,
        reasons=reasons,
        ready=not reasons,
    )


if __name__ == "__main__":
    main()
