# SPDX-License-Identifier: GPL-3.0-or-later
"""The gpufleet.node.drift callback on a check-mode run: each changed task recorded once (a loop,
once per item) with the file it manages, never the temporary copy a template's diff names; a
failure of a task tagged drift_known_state recorded as out of service; nothing without a token."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.harness.playbook import ansible_environment, run_playbook

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "drift_callback.yml"


def _run(tmp_path, token=True):
    root, record = tmp_path / "root", tmp_path / "drift"
    (root / "etc").mkdir(parents=True)
    record.mkdir()
    (root / "env.j2").write_text("A=1\n")
    (root / "etc/gpu-runtime.env").write_text("A=0\n")
    (root / "etc/same.env").write_text("A=1\n")
    (root / "etc/same.env").chmod(0o644)
    (root / "etc").chmod(0o755)
    if token:
        (record / "token").write_text("0123abcd\n")
    run = run_playbook(
        PLAYBOOK,
        "--check",
        "--diff",
        local=True,
        extra_vars={"root": str(root), "ansible_python_interpreter": sys.executable},
        env=ansible_environment(GPUFLEET_DRIFT_DIR=record),
    )
    return root, record, run


def test_records_the_managed_file_of_every_changed_task_once(tmp_path):
    root, record, run = _run(tmp_path)
    assert run.rc != 0, run.explain()  # the out-of-service task fails the host
    doc = json.loads((record / "record.json").read_text())
    assert doc["token"] == "0123abcd" and doc["check_mode"] is True
    rows = [(i["kind"], i["task"], i["detail"]) for i in doc["hosts"]["localhost"]]
    etc = root / "etc"
    assert rows == [
        ("changed", "Write a file that exists with other content", f"dest: {etc}/gpu-runtime.env"),
        ("changed", "Write a file that does not exist yet", f"dest: {etc}/new.env"),
        ("changed", "Write drop-ins", f"dest: {etc}/a.conf"),
        ("changed", "Write drop-ins", f"dest: {etc}/b.conf"),
        ("changed", "Write a file with content", f"dest: {etc}/content.txt"),
        # gpufleet.node.files: each changed file by its path, not the unchanged one
        ("changed", "Write files in one module run", f"dest: {etc}/gpu-runtime.env"),
        ("changed", "Write files in one module run", f"dest: {etc}/files-new.txt"),
        ("changed", "Write a secret file", f"dest: {etc}/secret.env"),
        ("out_of_service", "A node out of service for a reason of this boot", "the gate failed in this boot"),
    ], run.explain()
    assert not (etc / "new.env").exists() and not (etc / "files-new.txt").exists()
    assert (etc / "gpu-runtime.env").read_text() == "A=0\n"


def test_without_a_token_nothing_is_recorded(tmp_path):
    _, record, run = _run(tmp_path, token=False)
    assert "Write drop-ins" in run.output, run.explain()
    assert list(record.iterdir()) == []
