# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.service_state: systemd_service's result, with a unit that is not installed judged
in one place (nothing to stop or disable; in check mode, a unit to start or enable is a change)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleError

from ansible_collections.gpufleet.node.plugins.action import service_state
from ansible_collections.gpufleet.node.plugins.action.service_state import judge, module_args

# systemd_service's own message for a unit systemd cannot find (module_utils.service.fail_if_missing)
MISSING = {
    "failed": True,
    "msg": "Could not find the requested service vllm.service: host",
    "invocation": {"module_args": {"name": "vllm.service"}},
}


def test_module_args_are_systemd_services_own():
    assert module_args({"name": "vllm.service", "state": "started", "enabled": None, "daemon_reload": True}) == {
        "name": "vllm.service",
        "state": "started",
        "daemon_reload": True,
    }
    assert module_args({"name": None, "daemon_reload": True}) == {"daemon_reload": True}
    assert module_args({"name": None, "daemon_reload": False}) is None  # nothing to ask the node


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("args", [{"state": "stopped"}, {"enabled": False}, {"state": "stopped", "enabled": False}])
def test_a_unit_not_installed_has_nothing_to_stop_or_disable(args, check_mode):
    out = judge(dict(args, name="vllm.service"), dict(MISSING), check_mode)
    assert out["changed"] is False and out["found"] is False and "failed" not in out
    assert out["msg"] == "vllm.service is not installed: nothing to stop or disable"
    assert out["invocation"] == MISSING["invocation"]


@pytest.mark.parametrize(
    "args, verbs",
    [
        ({"state": "started"}, "start"),
        ({"enabled": True}, "enable"),
        ({"enabled": True, "state": "restarted"}, "enable and start"),
    ],
)
def test_in_check_mode_a_unit_to_start_or_enable_that_is_not_written_yet_is_a_change(args, verbs):
    out = judge(dict(args, name="vllm.service"), dict(MISSING), True)
    assert out["changed"] is True and out["found"] is False and "failed" not in out
    assert f"a run would {verbs} it once its unit is written" in out["msg"]


def test_otherwise_a_unit_to_start_that_is_not_installed_fails_saying_what_to_do():
    out = judge({"name": "vllm.service", "state": "started", "enabled": True}, dict(MISSING), False)
    assert out["failed"] is True and out["found"] is False
    assert out["msg"].startswith(
        "Could not find the requested service vllm.service: host: vllm.service is not installed"
    )
    assert "Write its unit file" in out["msg"] and "start" in out["msg"]


def test_other_results_pass_through():
    ok = {"changed": True, "name": "vllm.service", "state": "started", "status": {"LoadState": "loaded"}}
    assert judge({"name": "vllm.service", "state": "started"}, dict(ok), False) == dict(ok, found=True)
    other = {"failed": True, "msg": "Unable to start service vllm.service: boom"}
    assert judge({"name": "vllm.service", "state": "started"}, dict(other), True) == other
    assert judge({"name": None, "daemon_reload": True}, {"changed": False}, False) == {"changed": False}


class _Action(service_state.ActionModule):
    """The action with its module run replaced: records what it would run on the node."""

    def __init__(self, args, check_mode, answer):
        self._task = SimpleNamespace(
            args=args, check_mode=check_mode, async_val=0, action="gpufleet.node.service_state"
        )
        self._answer, self.ran = answer, []

    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **_):
        self.ran.append((module_name, module_args))
        return dict(self._answer)


@pytest.fixture
def base_run(monkeypatch):
    monkeypatch.setattr(service_state.ActionBase, "run", lambda self, tmp=None, task_vars=None: {})


def test_run_asks_systemd_service_once_and_judges_its_answer(base_run):
    action = _Action({"name": "vllm.service", "state": "started", "daemon_reload": True}, True, MISSING)
    out = action.run(task_vars={})
    assert action.ran == [
        ("ansible.legacy.systemd_service", {"name": "vllm.service", "state": "started", "daemon_reload": True})
    ]
    assert out["changed"] is True and out["found"] is False


def test_run_without_a_unit_or_a_reload_runs_nothing(base_run):
    action = _Action({"daemon_reload": False}, False, {})
    out = action.run(task_vars={})
    assert action.ran == [] and out["changed"] is False


def test_run_refuses_a_state_without_a_unit(base_run):
    action = _Action({"state": "started"}, False, {})
    with pytest.raises(AnsibleError, match="required by .state.: name"):
        action.run(task_vars={})
