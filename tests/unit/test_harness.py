# SPDX-License-Identifier: GPL-3.0-or-later
"""The test harness's playbook runner and the vault password it passes per run: a 0600 file of
that run only, gone when the run ends, never an environment variable of the test process."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.harness import playbook


def test_the_vault_password_file_is_private_and_lives_for_the_block():
    with playbook.vault_password_file("s3cret\n") as path:
        assert path.read_text() == "s3cret\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not path.exists() and not path.parent.exists()


def test_a_run_gets_its_own_vault_password_file_and_no_environment_variable(monkeypatch):
    seen = []

    def fake_run(argv, **kw):
        path = Path(argv[argv.index("--vault-password-file") + 1]) if "--vault-password-file" in argv else None
        seen.append((argv, path and (path, path.read_text(), stat.S_IMODE(path.stat().st_mode)), kw["env"]))
        return subprocess.CompletedProcess(argv, 0, "localhost : ok=1 changed=0 unreachable=0 failed=0\n", "")

    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setattr(playbook.subprocess, "run", fake_run)
    run = playbook.run_playbook("site.yml", local=True, vault_password="pw-of-this-run")
    _argv, (path, text, mode), env = seen[0]
    assert (text, mode) == ("pw-of-this-run", 0o600)
    assert not path.exists(), "the password file outlived its run"
    assert "ANSIBLE_VAULT_PASSWORD_FILE" not in env and "ANSIBLE_VAULT_PASSWORD_FILE" not in os.environ
    assert run.recap["localhost"]["ok"] == 1
    # without a password, no file and no option
    playbook.run_playbook("site.yml", local=True)
    assert seen[1][1] is None and "--vault-password-file" not in seen[1][0]
