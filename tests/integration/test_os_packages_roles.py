# SPDX-License-Identifier: GPL-3.0-or-later
"""The packages roles monitoring (node_exporter, Prometheus) and worker_recycle install, chosen from
the node's OS family (filter os_packages) on the real facts of tests/data/ansible-facts/, given as
the run's ansible_facts: a RHEL 9 node is refused before anything is installed or written, with a
message naming the node, its system and the variable to set; a Debian node installs with apt.
(tests/unit/test_os_family.py tests the table on every release.)"""

from __future__ import annotations

import sys

import yaml

from tests.harness.playbook import run_playbook
from tests.integration.test_ops_role import PLAYBOOK as RECYCLE_PLAYBOOK
from tests.integration.test_ops_role import variables as recycle_variables
from tests.unit.test_node_python import facts

NODE_PLAYBOOK = """\
- name: The GPU node's half of monitoring
  hosts: gpu_nodes
  gather_facts: false
  roles:
    - role: gpufleet.node.monitoring
"""


def _failure(run, host):
    """The one failure's text on host, its lines joined (the callback wraps long messages)."""
    (failure,) = run.host_failures(host)
    return " ".join(failure.split())


def _tasks(run, host):
    """{task name (its role's name left off): result} of a JSON-callback run on host."""
    return {
        t["task"]["name"].split(" : ", 1)[-1]: t["hosts"][host]
        for play in run.json["plays"]
        for t in play["tasks"]
        if host in t["hosts"]
    }


def test_worker_recycle_refuses_a_rhel_node_before_it_installs_anything(ansible_env, tmp_path):
    extra = recycle_variables(tmp_path, worker_recycle_install_packages=True, ansible_facts=facts("rhel-9"))
    run = run_playbook(RECYCLE_PLAYBOOK, local=True, inventory="node7,", extra_vars=extra, env=ansible_env, timeout=300)
    assert run.returncode != 0, run.explain()
    failure = _failure(run, "node7")
    assert (
        "node7: RedHat 9.8 (OS family RedHat) has no package for prometheus_client in its base repositories" in failure
    )
    assert "(EPEL 9 has it as python3-prometheus_client): set worker_recycle_packages to the package(s)" in failure
    assert "or worker_recycle_install_packages=false" in failure
    assert not (tmp_path / "host").exists()  # nothing of the agent written


def test_worker_recycle_installs_the_debian_package_with_apt_where_missing(ansible_env, tmp_path):
    # apt runs with the system's Python, which has python3-apt (the venv's has not)
    extra = recycle_variables(
        tmp_path,
        worker_recycle_install_packages=True,
        ansible_facts=facts("debian-12"),
        ansible_python_interpreter="/usr/bin/python3",
    )
    run = run_playbook(
        RECYCLE_PLAYBOOK,
        "--check",
        local=True,
        inventory="node7,",
        extra_vars=extra,
        env=ansible_env,
        timeout=300,
        json_callback=True,
    )
    assert run.returncode == 0, run.explain()
    tasks = _tasks(run, "node7")
    # python3-prometheus-client is installed here (setup.sh): the query says so, and apt, whose
    # module opens the whole package cache, does not run (the lab's release nodes, which lack it,
    # install it: tests/fleet/test_fleet_9_releases.py)
    query = tasks["Look for the Prometheus text parser's package"]
    assert query["rc"] == 0 and query["stdout_lines"] == ["installed"], query
    assert query["cmd"][:2] == ["dpkg-query", "--show"] and query["cmd"][-1] == "python3-prometheus-client"
    assert tasks["Install the Prometheus text parser the agent uses (apt)"].get("skipped") is True
    assert tasks["Install the Prometheus text parser the agent uses (dnf)"].get("skipped") is True
    assert tasks["Refuse a node without a package of the Prometheus text parser"].get("skipped") is True
    assert tasks["Read the node's OS family"].get("skipped") is True  # the facts were there


def _node(tmp_path, release, **kw):
    inventory = {"all": {"children": {"gpu_nodes": {"hosts": {"gpu-9": {"ansible_connection": "local"}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(NODE_PLAYBOOK)
    extra = {
        "ansible_python_interpreter": sys.executable,
        "ansible_facts": facts(release),
        "monitoring_textfile_dir": str(tmp_path / "textfile"),
        "monitoring_node_exporter_args_file": str(tmp_path / "default" / "prometheus-node-exporter"),
    }
    extra.update(kw)
    return tmp_path / "play.yml", tmp_path / "hosts.yml", extra


def test_monitoring_refuses_a_rhel_node_before_it_installs_or_writes_anything(ansible_env, tmp_path):
    play, inventory, extra = _node(tmp_path, "rhel-9")
    run = run_playbook(play, inventory=inventory, extra_vars=extra, env=ansible_env, timeout=300)
    assert run.returncode != 0, run.explain()
    failure = _failure(run, "gpu-9")
    assert "gpu-9: RedHat 9.8 (OS family RedHat) has no package for node_exporter in its base repositories" in failure
    assert "(EPEL 9 has it as node-exporter): set monitoring_node_exporter_package to the package(s)" in failure
    assert "monitoring_node_exporter_unit and monitoring_node_exporter_args_file" in failure
    assert "or monitoring_node_exporter_manage=false where an exporter is there" in failure
    assert not (tmp_path / "textfile").exists() and not (tmp_path / "default").exists()


def test_monitoring_without_node_exporter_asks_nothing_of_the_family(ansible_env, tmp_path):
    """An exporter that is there already: no package, so no refusal on RHEL; only the directory."""
    play, inventory, extra = _node(tmp_path, "rhel-9", monitoring_node_exporter_manage=False)
    run = run_playbook(play, inventory=inventory, extra_vars=extra, env=ansible_env, timeout=300)
    assert run.returncode == 0, run.explain()
    assert (tmp_path / "textfile").is_dir() and not (tmp_path / "default").exists()
