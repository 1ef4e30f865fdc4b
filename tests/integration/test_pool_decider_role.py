# SPDX-License-Identifier: GPL-3.0-or-later
"""Role pool_decider on this machine (no systemd as PID 1: pool_decider_service none, as the lab's
balancer): the decider, the collection code it imports and its configuration are written, the
restart command runs when they changed and only then, a second run changes nothing, check mode
writes nothing, and bad settings are refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness.playbook import run_playbook

PLAYBOOK = """\
- name: The balancer
  hosts: localhost
  gather_facts: false
  roles:
    - role: gpufleet.node.pool_decider
"""


def setup(tmp_path, **over):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    restarts = tmp_path / "restarts"
    extra = {
        "pool_decider_service": "none",
        "pool_decider_install_packages": False,
        "pool_decider_python": sys.executable,
        "pool_decider_lib_dir": str(tmp_path / "lib"),
        "pool_decider_config_file": str(tmp_path / "etc" / "pool-decider.json"),
        "pool_decider_state_file": str(tmp_path / "state" / "pool-decider.json"),
        "pool_decider_socket": str(tmp_path / "haproxy.sock"),
        "pool_decider_window": 30,
        # the runner's restart, recorded (an argv: no shell)
        "pool_decider_restart_command": [
            sys.executable,
            "-c",
            "import sys; open(sys.argv[1], 'a').write('restart\\n')",
            str(restarts),
        ],
    }
    extra.update(over)
    return extra, restarts


def play(ansible_env, tmp_path, extra, *args):
    return run_playbook(tmp_path / "play.yml", *args, local=True, extra_vars=[extra], env=ansible_env, timeout=300)


def test_install_restart_on_change_only_and_idempotence(ansible_env, tmp_path):
    extra, restarts = setup(tmp_path)
    run = play(ansible_env, tmp_path, extra)
    assert run.returncode == 0, run.explain()
    config = json.loads((tmp_path / "etc" / "pool-decider.json").read_text())
    assert {k: v for k, v in config.items() if k != "_comment"} == {
        "backend": "vllm_pool",
        "socket": str(tmp_path / "haproxy.sock"),
        "state_file": str(tmp_path / "state" / "pool-decider.json"),
        "agent_timeout": 2.0,
        "metrics_address": "",
        "metrics_port": 9778,
        "window": 30.0,
    }
    tree = tmp_path / "lib" / "ansible_collections/gpufleet/node/plugins/module_utils"
    assert {p.relative_to(tree).as_posix() for p in tree.rglob("*.py")} >= {
        "lb/_budget.py",
        "lb/_haproxy.py",
        "common/_atomic.py",
    }
    assert restarts.read_text() == "restart\n"
    # the installed decider runs from its lib dir with that configuration (one poll: no HAProxy)
    proc = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "lib" / "gpufleet_pool_decider.py"),
            "--config",
            config_path(tmp_path),
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "cannot read backend vllm_pool" in proc.stderr, proc.stderr
    assert "at most 0.25 of its servers drained within 30 s" in proc.stderr, proc.stderr

    again = play(ansible_env, tmp_path, extra)
    assert again.returncode == 0 and again.recap["localhost"]["changed"] == 0, again.explain()
    assert restarts.read_text() == "restart\n"

    # a changed setting: check mode says so and writes nothing, nor restarts
    moved = dict(extra, pool_decider_fraction=0.5)
    check = play(ansible_env, tmp_path, moved, "--check", "--diff")
    assert check.returncode == 0 and check.recap["localhost"]["changed"] >= 1, check.explain()
    assert "fraction" not in json.loads((tmp_path / "etc" / "pool-decider.json").read_text())
    assert restarts.read_text() == "restart\n"
    run = play(ansible_env, tmp_path, moved)
    assert run.returncode == 0, run.explain()
    assert json.loads((tmp_path / "etc" / "pool-decider.json").read_text())["fraction"] == 0.5
    assert restarts.read_text() == "restart\nrestart\n"


def config_path(tmp_path):
    return str(tmp_path / "etc" / "pool-decider.json")


def test_bad_settings_are_refused_before_anything_is_written(ansible_env, tmp_path):
    for bad, word in (
        ({"pool_decider_service": "upstart"}, "value of pool_decider_service must be one of: systemd, none"),
        ({"pool_decider_fraction": 1.5}, "pool_decider_fraction from 0 to 1"),
        ({"pool_decider_state_file": "relative.json"}, "absolute paths"),
    ):
        extra, restarts = setup(tmp_path, **bad)
        run = play(ansible_env, tmp_path, extra)
        assert run.returncode != 0 and word in run.stdout, (bad, run.explain())
        assert not (tmp_path / "etc").exists() and not restarts.exists(), bad


def test_the_systemd_unit_runs_the_installed_decider(ansible_env, tmp_path):
    """With systemd (the default), the unit; rendered in check mode only here, where systemd is not
    PID 1: the run stops at the service task, after the files (unwritten)."""
    extra, _restarts = setup(
        tmp_path, pool_decider_service="systemd", pool_decider_systemd_dir=str(tmp_path / "systemd")
    )
    run = play(ansible_env, tmp_path, extra, "--check", "--diff")
    text = run.stdout
    assert (
        run.recap["localhost"]["failed"] == 1
        and "TASK [gpufleet.node.pool_decider : Run the decider (systemd)]" in text
    )
    assert "not been booted with systemd" in text, run.explain()
    assert "gpufleet-pool-decider.service" in text, run.explain()
    unit = [line for line in text.splitlines() if "ExecStart=" in line]
    assert (
        unit and f"{sys.executable} {tmp_path}/lib/gpufleet_pool_decider.py --config {config_path(tmp_path)}" in unit[0]
    ), unit
    assert not (tmp_path / "systemd").exists()
