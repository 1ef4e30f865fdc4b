#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_pool_member
short_description: Add, drain or remove a server of an HAProxy backend at runtime, and in its config
version_added: 0.1.0
description:
  - Puts one server of an HAProxy backend in the wanted state through the runtime API (the admin
    stats socket), with HAProxy's dynamic servers (C(add server), C(enable health),
    C(set server ... state ready|drain|maint), C(del server)), so that no reload
    drops connections.
  - With O(config_file), also keeps the server's line in the backend section of the
    configuration file, so that a restart of the balancer keeps the pool.
  - Nothing is left half-done. If a server added by this run cannot be put in service, it is
    deleted again and the task fails. A removal first drains the server, then forces it to
    maintenance, and deletes it once it holds no connections, waiting up to O(drain_timeout).
  - With O(up_timeout), success means HAProxy's own view - its health check and agent check -
    says the server is UP; a server that does not come up is drained and the task fails with
    what the balancer saw.
  - Every value is checked before anything is sent or written - names, addresses (an IP address
    or a host name) and times (HAProxy's time format) - because the runtime API runs what
    follows a C(;) or a newline as another command. A new configuration file is checked with
    C(haproxy -c) (when the C(haproxy) binary is on the balancer) before it replaces the old one.
  - community.general.haproxy changes the state of servers that are already in the
    configuration; this module also adds and deletes them.
author:
  - gpufleet.node developers (@gpufleet)
options:
  socket:
    description: Path of HAProxy's admin runtime socket (C(stats socket PATH level admin)).
    type: path
    required: true
  backend:
    description: Backend the server belongs to.
    type: str
    required: true
  name:
    description: Server name in the backend; letters, digits and the characters C(.), C(_), C(:) and C(-).
    type: str
    required: true
  address:
    description:
      - Address of the server, an IP address or a host name. Required with O(state=present).
    type: str
  port:
    description:
      - Port of the server. Required with O(state=present) and O(state=drained).
      - With O(keep_port=true) and O(state=drained), used only for a server that is not in the
        backend yet.
    type: int
  budgeted:
    description:
      - With O(state=drained), where the pool has a decider (role gpufleet.node.pool_decider), a
        server in rotation whose agent (O(agent_port)) answers C(up) with the reason C(hold-WORD)
        now is left as it is, for the decider to drain within the pool's removal budget;
        RV(held_for_decider) names the word. Any other answer (C(down), none within O(timeout)) and a server not in rotation
        are drained.
      - So that a run that fails many nodes at once (a false alarm, a rule change) cannot empty
        the pool.
    type: bool
    default: false
  keep_port:
    description:
      - With O(state=drained), a server already in the backend keeps its port (in the runtime and
        in O(config_file)), whatever O(port) says. For a run that drains a node before it knows
        the port its server listens on (a step before the serving role failed), so that a custom
        port is not replaced by a default.
    type: bool
    default: false
  check:
    description: Enable HAProxy's health checks (the backend's C(option httpchk)) for the server.
    type: bool
    default: true
  agent_port:
    description:
      - Port of the node's HAProxy agent (C(agent-check)), which tells the balancer whether the
        node may take traffic. The agent of role gpufleet.node.lb_registration answers C(up) only
        while the node's NCCL gate marker of the current boot says passed, C(down) otherwise.
      - A server whose agent settings differ is updated at runtime; one that has no agent check
        (or has one that is no longer wanted) is drained, deleted and added again.
      - Omitted, the server has no agent check.
    type: int
  agent_address:
    description: Address of the agent, an IP address or a host name. Default O(address).
    type: str
  agent_interval:
    description:
      - How often HAProxy asks the agent, in HAProxy's time format, digits with an optional unit
        C(us), C(ms), C(s), C(m), C(h) or C(d) (e.g. V(2s), V(500ms)).
    type: str
    default: 2s
  state:
    description:
      - V(present) - in the backend and ready for traffic.
      - V(drained) - in the backend, no new sessions (existing ones finish).
      - V(absent) - not in the backend.
    type: str
    choices: [present, drained, absent]
    default: present
  config_file:
    description:
      - HAProxy configuration file whose backend section holds the server's C(server) line
        (added or updated with O(state=present) or O(state=drained), removed with
        O(state=absent)). Not touched when omitted.
    type: path
  drain_timeout:
    description: Seconds to wait for a removed server's connections to end before failing.
    type: int
    default: 30
  up_timeout:
    description:
      - With O(state=present), seconds to wait until HAProxy reports the server UP through its own
        health check and agent check (each having run at least once), read from C(show stat).
      - A server that is not UP by then is drained, the configuration file is left as it was, and
        the task fails naming the balancer's view (status, check and agent results).
      - V(0) does not wait. Not waited for in check mode.
    type: float
    default: 0
  haproxy_path:
    description:
      - The C(haproxy) binary that checks a new configuration file (C(haproxy -c -f)) before it
        replaces the old one. Looked up in E(PATH) and C(/usr/sbin) when omitted; when there is no
        binary, the file is written unchecked.
    type: path
  timeout:
    description: Seconds to wait for each answer of the runtime API.
    type: float
    default: 5.0
attributes:
  check_mode:
    support: full
    description: Reads the backend and the file and reports what would change.
  diff_mode:
    support: full
    description: The server's state before and after, and the config file's text.
  platform:
    support: full
    platforms: posix
    description: Runs where the runtime socket is (delegate to the balancer).
"""

EXAMPLES = r"""
- name: Put node1 in the vLLM pool
  gpufleet.node.haproxy_pool_member:
    socket: /run/haproxy/admin.sock
    backend: vllm_pool
    name: node1
    address: 10.0.0.11
    port: 8000
    config_file: /etc/haproxy/haproxy.cfg
  delegate_to: lb1

- name: Take node1 out
  gpufleet.node.haproxy_pool_member:
    socket: /run/haproxy/admin.sock
    backend: vllm_pool
    name: node1
    state: absent
    config_file: /etc/haproxy/haproxy.cfg
  delegate_to: lb1
"""

RETURN = r"""
before:
  description: The server as HAProxy had it, or null when it was not in the backend.
  returned: always
  type: dict
  sample: {"name": "node1", "address": "10.0.0.11", "port": 8000, "state": "ready", "op_state": "running"}
  contains:
    name:
      description: Server name.
      type: str
    address:
      description: Server address.
      type: str
    port:
      description: Server port.
      type: int
    state:
      description: Administrative state, V(ready), V(drain) or V(maint).
      type: str
    op_state:
      description: Operational state (V(running), V(stopped), ...), from the health checks.
      type: str
    admin_state:
      description: HAProxy's raw srv_admin_state flags.
      type: int
    agent_address:
      description: Address of the server's agent, or null without an agent check.
      type: str
    agent_port:
      description: Port of the server's agent; V(0) without an agent check.
      type: int
after:
  description: The server as HAProxy has it now (in check mode, as it would), or null when absent.
  returned: always
  type: dict
commands:
  description: The runtime API commands sent (in check mode, that would be sent).
  returned: always
  type: list
  elements: str
  sample: ["add server vllm_pool/node1 10.0.0.11:8000 check", "enable health vllm_pool/node1", "enable server vllm_pool/node1"]
config_changed:
  description: Whether the configuration file was (or would be) rewritten.
  returned: always
  type: bool
held_for_decider:
  description:
    - With O(budgeted), the word of the fault for which the server's agent holds it for the pool's
      decider (the server was left in rotation); null where the drain was made (or not asked).
  returned: always
  type: str
  sample: gpu-health-failed
balancer_view:
  description: What HAProxy's checks said of the server when O(up_timeout) was waited for.
  returned: when O(up_timeout) was waited for
  type: dict
  sample: {"status": "DOWN", "check_status": "L4CON", "check_desc": "Layer4 connection problem",
           "last_chk": "Connection refused", "agent_status": "L7OK", "agent_desc": "Layer7 check passed",
           "last_agt": "up"}
  contains:
    status:
      description: HAProxy's status of the server (V(UP), V(DOWN), V(DOWN (agent\)), V(DRAIN), V(no check), ...).
      type: str
    check_status:
      description: Result of the last health check (V(L7OK), V(L4CON), V(L7STS), V(INI) before the first, ...).
      type: str
    check_desc:
      description: The health check result in words.
      type: str
    last_chk:
      description: What the last health check saw.
      type: str
    agent_status:
      description: Result of the last agent check; empty without an agent check.
      type: str
    agent_desc:
      description: The agent check result in words.
      type: str
    last_agt:
      description: What the agent last answered.
      type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.lb import _pool_member


def _config_check(module):
    """HAProxy's own check of a staged config file (`haproxy -c -f`), when the binary is there
    (O(haproxy_path), else PATH): None when it accepts the file, else the failure."""

    def check(path, tmp):
        haproxy = module.params["haproxy_path"] or module.get_bin_path(
            "haproxy", opt_dirs=["/usr/sbin", "/usr/local/sbin"]
        )
        if not haproxy:
            return None
        rc, out, err = module.run_command([haproxy, "-c", "-f", tmp], environ_update={"LC_ALL": "C"})
        if rc == 0:
            return None
        return dict(
            rc=rc,
            stdout=out,
            stderr=err,
            msg=(
                f"nothing changed: HAProxy refuses the configuration {path} would become (`{haproxy} -c -f`), "
                f"so neither the file nor the running pool was touched; fix the file: "
                f"{(err or out).strip()[-2000:]}"
            ),
        )

    return check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", required=True),
            backend=dict(type="str", required=True),
            name=dict(type="str", required=True),
            address=dict(type="str"),
            port=dict(type="int"),
            keep_port=dict(type="bool", default=False),
            budgeted=dict(type="bool", default=False),
            check=dict(type="bool", default=True),
            agent_port=dict(type="int"),
            agent_address=dict(type="str"),
            agent_interval=dict(type="str", default="2s"),
            state=dict(type="str", choices=["present", "drained", "absent"], default="present"),
            config_file=dict(type="path"),
            drain_timeout=dict(type="int", default=30),
            up_timeout=dict(type="float", default=0),
            haproxy_path=dict(type="path"),
            timeout=dict(type="float", default=5.0),
        ),
        required_if=[("state", "present", ("address", "port")), ("state", "drained", ("address", "port"))],
        supports_check_mode=True,
    )
    try:
        result = _pool_member.reconcile(module.params, module.check_mode, module._diff, _config_check(module))
    except _pool_member.MemberError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
