# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.files on localhost: one task writes templates (the playbook's templates/, the
task's variables, ansible_managed, a per-entry variable), a file as it is, content, a force=false
file, a secret and their directories; the first run changes each file, the second nothing; a
check-mode run writes nothing and its diff names exactly the files that differ; a secret's
contents are never shown."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.harness.playbook import run_playbook

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "files_action.yml"
TOKEN = "s3cr3t-token-value"


def _play(root, *args):
    extra = {"files_root": str(root), "ansible_python_interpreter": sys.executable}
    return run_playbook(PLAYBOOK, *args, local=True, extra_vars=extra, timeout=300)


def _result(run):
    match = re.search(r"FILES_RESULT (\{.*\})'?\s*$", run.stdout.replace("\n        ", " "), re.M)
    assert match, run.explain()
    return json.loads(match.group(1))


def test_first_run_second_run_check_mode_and_secrets(tmp_path):
    etc = tmp_path / "etc/app"
    first = _play(tmp_path, "--diff")
    assert first.rc == 0, first.explain()
    assert first.host()["changed"] == 2
    result = _result(first)["main"]
    files = ["app.conf", "conf.d/a.conf", "raw.txt", "plain.txt", "once.txt", "inline-secret.env"]
    assert [r["dest"] for r in result["results"]] == [f"{etc}/{f}" for f in files]
    assert all(r["changed"] and r["action"] == "created" for r in result["results"])
    assert result["changed_dests"] == [str(etc), f"{etc}/conf.d"] + [f"{etc}/{f}" for f in files]
    assert "invocation" not in result
    # one diff per directory and file, headed by its path on the node
    headers = [d["after_header"] for d in result["diff"]]
    assert headers == [str(etc), f"{etc}/conf.d"] + [f"{etc}/{f}" for f in files]
    assert (etc / "app.conf").read_text() == "# Ansible managed\nname=first\nitem=none\n"
    assert (etc / "conf.d/a.conf").read_text().endswith("item=a\n")
    assert (etc / "raw.txt").read_text() == "raw {{ not templated }}\n"
    assert (etc / "plain.txt").read_text() == "plain first\n"
    modes = {f: (etc / f).stat().st_mode & 0o7777 for f in files + ["secret.env"]}
    # the task's mode (0644) is for plain files: the inline secret, with no mode of its own, is 0600
    private = {"raw.txt": 0o600, "secret.env": 0o600, "inline-secret.env": 0o600}
    assert modes == dict.fromkeys(files + ["secret.env"], 0o644) | private
    assert (etc / "conf.d").stat().st_mode & 0o7777 == 0o750
    # a secret entry: written, its diff says only that it changed; the no_log task shows nothing
    assert (etc / "inline-secret.env").read_text() == f"TOKEN2={TOKEN}\n"
    assert (etc / "secret.env").read_text() == f"TOKEN={TOKEN}\n"
    assert TOKEN not in first.output, first.explain()
    assert "(new contents of a secret file, not shown)" in first.stdout

    second = _play(tmp_path)
    assert second.rc == 0 and second.host()["changed"] == 0, second.explain()

    (etc / "app.conf").write_text("edited\n")
    (etc / "plain.txt").chmod(0o666)
    (etc / "once.txt").write_text("mine\n")  # force: false keeps it
    check = _play(tmp_path, "--check", "--diff")
    assert check.rc == 0 and check.host()["changed"] == 1, check.explain()
    result = _result(check)["main"]
    assert result["changed_dests"] == [f"{etc}/app.conf", f"{etc}/plain.txt"]
    assert [(d["after_header"], d["before"]) for d in result["diff"]] == [
        (f"{etc}/app.conf", "edited\n"),
        (f"{etc}/plain.txt (attributes)", "mode: 0666\n"),
    ]
    assert (etc / "app.conf").read_text() == "edited\n" and (etc / "plain.txt").stat().st_mode & 0o777 == 0o666
    assert (etc / "once.txt").read_text() == "mine\n"


REFUSED = Path(__file__).resolve().parent / "playbooks" / "files_refused.yml"


def _refused(root, bad):
    extra = {"files_root": str(root), "files_bad": bad, "ansible_python_interpreter": sys.executable}
    return run_playbook(REFUSED, local=True, extra_vars=extra, timeout=300)


def test_files_invalid_mode_refused_before_any_write(tmp_path):
    """A mode beyond 07777 on the third file: the task fails naming it, the first two are not
    written (so no change goes unhandled) and the handler does not run."""
    run = _refused(tmp_path, [{"content": "three\n", "dest": f"{tmp_path}/three", "mode": "017777"}])
    assert run.rc != 0, run.explain()
    assert f"{tmp_path}/three: mode '017777' is not an octal mode from '0000' to '07777'" in run.output
    assert "nothing was written" in run.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [], run.explain()
    assert "HANDLER_RAN" not in run.output


def test_files_unknown_owner_refused_before_any_write(tmp_path):
    run = _refused(tmp_path, [{"content": "three\n", "dest": f"{tmp_path}/three", "owner": "no-such-user-x"}])
    assert run.rc != 0 and "owner 'no-such-user-x' does not exist" in run.output, run.explain()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], run.explain()


def test_files_secret_not_in_messages(tmp_path):
    """A secret entry refused on the node (its mode) and one the action refuses (no dest): the
    task fails and the secret's text is nowhere in the output."""
    bad = {"content": f"TOKEN={TOKEN}\n", "dest": f"{tmp_path}/s.env", "secret": True, "mode": "077777"}
    run = _refused(tmp_path, [bad])
    assert run.rc != 0 and "s.env: mode" in run.output, run.explain()
    assert TOKEN not in run.output, run.explain()
    run = _refused(tmp_path, [{"content": f"TOKEN={TOKEN}\n", "secret": True}])
    assert run.rc != 0 and "every entry of files needs a dest (got keys ['content', 'secret'])" in run.output
    assert TOKEN not in run.output, run.explain()
