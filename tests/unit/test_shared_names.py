# SPDX-License-Identifier: GPL-3.0-or-later
"""One home per shared name (roles/_common): every role depends on it, it adds no task to them,
no role, template or playbook falls back from another role's variable to a literal, no role
default or playbook follows another role's variable unless that follow is a reviewed one, the
judging thresholds the modules know are written there only, and the two values the lab reads from
role defaults as numbers and paths stay equal to the home's."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
HOME = ROLES / "_common"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "meta" / "main.yml").is_file() and p != HOME)


def _yaml(path):
    return yaml.safe_load(path.read_text()) or {}


def _defaults(role):
    return _yaml(ROLES / role / "defaults" / "main.yml")


def test_every_role_depends_on_the_home():
    assert {"pcie_p2p", "gpu_health", "nccl_gate", "vllm_server", "lb_registration"} <= set(ROLE_NAMES)
    for role in ROLE_NAMES:
        deps = _yaml(ROLES / role / "meta" / "main.yml").get("dependencies") or []
        assert [d["role"] if isinstance(d, dict) else d for d in deps] == ["gpufleet.node._common"], role


def test_the_home_adds_no_task_to_the_roles_that_depend_on_it():
    """No task file, no handler, and no argument spec for `main` (Ansible prepends a validation
    task to a role whose main entry point has one, even a role without tasks)."""
    assert not (HOME / "tasks").exists() and not (HOME / "handlers").exists()
    specs = _yaml(HOME / "meta" / "argument_specs.yml")["argument_specs"]
    assert "main" not in specs and list(specs) == ["shared"]
    assert set(_defaults("_common")) <= set(specs["shared"]["options"])


# <another role's variable> | default(<a literal>): a value written a second time
_ROLE = "|".join(re.escape(r) for r in ROLE_NAMES)
_LITERAL_FALLBACK = re.compile(
    r"\b(?P<var>(?P<role>%s)_[a-z0-9_]+)\s*\|\s*default\(\s*(?P<lit>['\"\[{0-9-]|true\b|false\b|none\b)" % _ROLE,
    re.I,
)
# Reviewed: not a value of the other role's, so not written twice.
_ALLOWED = {
    # the inventory's own value (hostvars hold no role default); none named: the servers' units only
    ("playbooks/validate.yml", "nccl_gate_stop_services"),
    # the cycle's own choice where lb_registration's file is not known: the runtime state only
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_config_file"),
    # the fleet key's former name, read from the inventory only (hostvars hold no role default):
    # the home is its one reader, every role's key derives from the home
    ("roles/_common/defaults/main.yml", "vllm_server_api_key"),
}


def _sources():
    for base in (ROLES, REPO / "playbooks"):
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.endswith((".yml", ".yaml", ".j2")):
                    yield Path(dirpath) / name


def _literal_fallbacks(path, text):
    rel = str(path.relative_to(REPO))
    own = rel.split("/")[1] if rel.startswith("roles/") else None
    for m in _LITERAL_FALLBACK.finditer(text):
        if m["role"] != own and (rel, m["var"]) not in _ALLOWED:
            yield "%s:%d: %s" % (rel, text.count("\n", 0, m.start()) + 1, m.group(0))


def test_no_role_falls_back_from_another_roles_variable_to_a_literal():
    found = [hit for path in _sources() for hit in _literal_fallbacks(path, path.read_text(encoding="utf-8"))]
    assert found == [], "\n".join(found)


def test_the_check_can_fail():
    hits = list(_literal_fallbacks(ROLES / "lb_registration" / "x.yml", 'p: "{{ vllm_server_port | default(8000) }}"'))
    assert hits == ["roles/lb_registration/x.yml:1: vllm_server_port | default(8"]
    assert not list(_literal_fallbacks(ROLES / "vllm_server" / "x.yml", "{{ vllm_server_x | default('') }}"))
    assert not list(
        _literal_fallbacks(
            ROLES / "lb_registration" / "x.yml", "{{ vllm_server_port | default(gpufleet_serving_port) }}"
        )
    )


# <another role's variable> | default(...): a role following another role's setting, whatever
# it falls back to.
_FOLLOW = re.compile(r"\b(?P<var>(?P<role>%s)_[a-z0-9_]+)\s*\|\s*default\(" % _ROLE)
# Reviewed: a role working beside the other on the same node follows that role's setting, so
# both move where the inventory moves it; or the monitoring host reads a setting the inventory
# gives the nodes' roles. Not reviewed, so refused: a role following a role that does not run
# where it runs for a value the home owns (the serving key's vllm_server_api_key on a llama.cpp
# node or the monitoring host: gpufleet_serving_api_key is that key).
_REVIEWED_FOLLOWS = {
    # the gate's marker on the node: its verdict beside it, the registration reads it
    ("roles/gpu_health/defaults/main.yml", "nccl_gate_marker_path"),
    ("roles/lb_registration/defaults/main.yml", "nccl_gate_marker_path"),
    # the recycle drains the node through the registration's own agent and pool
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_agent_port"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_agent_request_path"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_backend"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_server_name"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_balancer"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_socket"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_address"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_config_file"),
    # ... and waits for the pool's decider only where that agent holds a recycle for it
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_budgeted"),
    ("roles/worker_recycle/defaults/main.yml", "lb_registration_budgeted_words"),
    # the pool the nodes register in and the recycle judge's slope, which the alerts follow
    ("roles/monitoring/defaults/main.yml", "lb_registration_backend"),
    ("roles/monitoring/defaults/main.yml", "worker_recycle_rss_slope_mib_per_min"),
    # the inventory's own value (hostvars hold no role default)
    ("playbooks/validate.yml", "nccl_gate_stop_services"),
    # the fleet key's former name in the home (see _ALLOWED)
    ("roles/_common/defaults/main.yml", "vllm_server_api_key"),
}


def _strings(node, where=""):
    """(where, text) of every string, key or value, of a parsed YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key, where)
            yield from _strings(value, "%s.%s" % (where, key) if where else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _strings(item, "%s[%d]" % (where, i))
    elif isinstance(node, str):
        yield where, node


def _defaults_and_playbooks():
    yield from sorted(ROLES.glob("*/defaults/main.yml"))
    yield from sorted(p for p in (REPO / "playbooks").rglob("*") if p.suffix in (".yml", ".yaml"))


def _follows(rel, document):
    """`<rel>: <where>: <match>` of every follow of another role's variable in a parsed document,
    with the (file, variable) pair it is reviewed under."""
    own = rel.split("/")[1] if rel.startswith("roles/") else None
    for where, text in _strings(document):
        for m in _FOLLOW.finditer(text):
            if m["role"] != own:
                yield (rel, m["var"]), "%s: %s: %s" % (rel, where, m.group(0))


def test_no_role_default_or_playbook_follows_another_roles_variable_unreviewed():
    found = [hit for path in _defaults_and_playbooks() for hit in _follows(str(path.relative_to(REPO)), _yaml(path))]
    unreviewed = [text for pair, text in found if pair not in _REVIEWED_FOLLOWS]
    assert unreviewed == [], "\n".join(unreviewed)
    # a reviewed follow that went is struck off, so the list names only what is there
    assert _REVIEWED_FOLLOWS <= {pair for pair, _text in found}


def test_the_follow_check_can_fail():
    rel = "roles/monitoring/defaults/main.yml"
    old = {"monitoring_serving_api_key": "{{ vllm_server_api_key | default(gpufleet_serving_api_key) }}"}
    assert list(_follows(rel, old)) == [
        (
            (rel, "vllm_server_api_key"),
            "roles/monitoring/defaults/main.yml: monitoring_serving_api_key: vllm_server_api_key | default(",
        )
    ]
    play = [{"tasks": [{"when": "llamacpp_server_port | default(8000) | int > 0"}]}]
    assert [text for _pair, text in _follows("playbooks/x.yml", play)] == [
        "playbooks/x.yml: [0].tasks[0].when: llamacpp_server_port | default("
    ]
    assert not list(_follows(rel, {"monitoring_x": "{{ monitoring_y | default(gpufleet_serving_api_key) }}"}))
    assert not list(_follows(rel, {"monitoring_serving_api_key": "{{ gpufleet_serving_api_key }}"}))


@pytest.mark.parametrize(
    ("role", "names"),
    [
        (
            "nccl_gate",
            [
                "nccl_gate_threshold_fraction",
                "nccl_gate_baseline_fraction",
                "nccl_gate_baseline_min_samples",
                "nccl_gate_baseline_window",
            ],
        ),
    ],
)
def test_thresholds_the_module_knows_default_to_the_modules(role, names):
    """null: the task leaves the option out and the module's default (written once, in the module)
    decides; the argument spec states no number either."""
    defaults = _defaults(role)
    specs = _yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    tasks = "".join(p.read_text() for p in (ROLES / role / "tasks").glob("*.yml"))
    for name in names:
        assert defaults[name] is None, name
        assert all("default" not in (s.get("options") or {}).get(name, {}) for s in specs.values()), name
        assert "{{ %s if %s is not none else omit }}" % (name, name) in tasks, name


def test_the_recycle_judge_defaults_to_its_own():
    defaults = _defaults("worker_recycle")
    assert _yaml(ROLES / "worker_recycle" / "vars" / "main.yml")["__worker_recycle_judge"] == (
        "{{ 'recycle' | gpufleet.node.judging_defaults }}"
    )
    for key in ("window", "min_samples", "rss_slope_mib_per_min", "rss_rising_fraction", "ttft_rise_ratio"):
        assert defaults["worker_recycle_" + key] == "{{ __worker_recycle_judge.%s }}" % key


def test_values_the_lab_reads_from_role_defaults_equal_the_homes():
    """lab/prometheus.py reads nccl_gate_metrics_path's directory (node_exporter's textfile
    directory in a lab node) and monitoring_vllm_port (its scrape configuration) as values, so
    these two are written out; they must stay what the home says."""
    home = _defaults("_common")
    assert os.path.dirname(_defaults("nccl_gate")["nccl_gate_metrics_path"]) == home["gpufleet_textfile_dir"]
    assert _defaults("monitoring")["monitoring_vllm_port"] == home["gpufleet_serving_port"]
