# SPDX-License-Identifier: GPL-3.0-or-later
"""The harness's playbook runner with a real ansible-playbook: an inventory's vaulted value is read
with the password of that run only, and a watched run hands over its output line by line."""

from __future__ import annotations

from pathlib import Path

from tests.harness.playbook import run_playbook

PASSWORD = "harness-runner-test-password"
SECRET = "harness-runner-secret-value"


def _inventory(tmp_path):
    from ansible.parsing.vault import VaultLib, VaultSecret

    text = VaultLib([("default", VaultSecret(PASSWORD.encode()))]).encrypt(SECRET).decode()
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        "      harness_secret: !vault |\n" + "".join(f"        {line}\n" for line in text.splitlines())
    )
    playbook = tmp_path / "check.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: The vaulted value is the secret\n"
        "      ansible.builtin.assert:\n        that: harness_secret == lookup('env', 'EXPECTED')\n"
        "        quiet: true\n"
    )
    return inventory, playbook


def test_the_vault_password_of_one_run(tmp_path, ansible_env):
    inventory, playbook = _inventory(tmp_path)
    env = dict(ansible_env, EXPECTED=SECRET)
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    lines = []
    run = run_playbook(playbook, inventory=inventory, env=env, vault_password=PASSWORD, watch=lines.append)
    assert run.rc == 0 and run.host("localhost")["failed"] == 0, run.explain()
    assert SECRET not in run.output
    assert "".join(lines) == run.stdout and any(line.startswith("PLAY RECAP") for line in lines), lines
    password_file = Path(run.argv[run.argv.index("--vault-password-file") + 1])
    assert not password_file.exists() and not password_file.parent.exists()
    # the next run without it has no password: the value cannot be read
    run = run_playbook(playbook, inventory=inventory, env=env, merge_stderr=True)
    assert run.rc != 0 and "no vault secrets" in run.output, run.explain()
