# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.node.files refuses what it cannot write as asked before writing anything: modes
outside 0-07777, unknown owners and groups, a parent that is a file, a destination that is a
directory; a secret's text is in no message; a secret without its own mode is kept private.
One test per class (plugins/module_utils/common/_files.py, plugins/modules/files.py)."""

from __future__ import annotations

import base64
import os

import pytest

from ansible_collections.gpufleet.node.plugins.module_utils.common import _files
from ansible_collections.gpufleet.node.plugins.modules.files import specs

SECRET = "TOKEN=s3cr3t-value-never-shown"


def _mode(path):
    return os.stat(path).st_mode & 0o7777


def _three(tmp_path, third):
    """Two good files, then ``third``'s change to a third entry."""
    files = [{"dest": str(tmp_path / n), "content": n + "\n"} for n in ("one", "two", "three")]
    files[2].update(third)
    return files


def _nothing_written(tmp_path):
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written"


@pytest.mark.parametrize("mode", [0o17777, -1, "17777", "0o77777", "-644", "rw-r--r--", True, 8**5, "9"])
def test_files_invalid_mode_refused_before_any_write(tmp_path, mode):
    with pytest.raises(_files.FilesError, match=r"three: mode .* is not an octal mode from '0000' to '07777'") as info:
        _files.apply(_three(tmp_path, {"mode": mode}))
    assert "nothing was written" in str(info.value)
    _nothing_written(tmp_path)


def test_files_invalid_directory_mode_refused_before_any_write(tmp_path):
    with pytest.raises(_files.FilesError, match=r"d: mode 65535 is not an octal mode"):
        _files.apply(_three(tmp_path, {}), [{"path": str(tmp_path / "d"), "mode": 0o177777}])
    _nothing_written(tmp_path)


@pytest.mark.parametrize("key,what", [("owner", "owner"), ("group", "group")])
def test_files_unknown_owner_on_a_later_file_refused_before_any_write(tmp_path, key, what):
    with pytest.raises(_files.FilesError, match=r"three: %s 'no-such-account-x' does not exist" % what) as info:
        _files.apply(_three(tmp_path, {key: "no-such-account-x"}))
    assert "nothing was written; 1 entry refused" in str(info.value)
    _nothing_written(tmp_path)


def test_files_every_refused_entry_is_listed(tmp_path):
    files = _three(tmp_path, {"owner": "no-such-account-x"})
    files[0]["mode"] = "99"
    with pytest.raises(_files.FilesError, match="2 entries refused") as info:
        _files.apply(files)
    assert "one: mode" in str(info.value) and "three: owner" in str(info.value)
    _nothing_written(tmp_path)


@pytest.mark.parametrize("below", ["x.conf", "sub/x.conf"])
def test_files_parent_that_is_a_file_refused_before_any_write(tmp_path, below):
    (tmp_path / "plain").write_text("a file\n")
    files = _three(tmp_path, {"dest": str(tmp_path / "plain" / below)})
    with pytest.raises(_files.FilesError, match=r"plain is a file, not a directory.*remove it") as info:
        _files.apply(files)
    assert "nothing was written" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_files_directory_below_a_file_refused_before_any_write(tmp_path):
    (tmp_path / "plain").write_text("a file\n")
    with pytest.raises(_files.FilesError, match=r"plain is a file, not a directory"):
        _files.apply(_three(tmp_path, {}), [{"path": str(tmp_path / "plain" / "d")}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def test_files_in_a_directory_the_task_creates_are_accepted(tmp_path):
    new = tmp_path / "a" / "b"
    result = _files.apply([{"dest": str(new / "x"), "content": "x\n"}], [{"path": str(new), "mode": "0750"}])
    assert result["changed"] and (new / "x").read_text() == "x\n" and _mode(new) == 0o750


def test_files_dest_that_is_a_directory_refused_before_any_write(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(_files.FilesError, match="adir is a directory"):
        _files.apply(_three(tmp_path, {"dest": str(tmp_path / "adir")}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


@pytest.mark.parametrize(
    "change",
    [{"mode": 0o17777}, {"owner": "no-such-account-x"}, {"group": "no-such-account-x"}, {"dest": "relative"}],
)
def test_files_secret_not_in_messages(tmp_path, change):
    files = _three(tmp_path, dict({"content": SECRET, "secret": True}, **change))
    with pytest.raises(_files.FilesError) as info:
        _files.apply(files)
    assert "s3cr3t" not in str(info.value) and "s3cr3t" not in repr(info.value)


def test_files_secret_not_in_messages_of_the_write(tmp_path, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_files._atomic, "write", refuse)
    with pytest.raises(_files.FilesError, match="Permission denied") as info:
        _files.apply([{"dest": str(tmp_path / "s.env"), "content": SECRET, "secret": True}])
    assert "s3cr3t" not in str(info.value)
    assert "already written before this error: nothing" in str(info.value)


def test_files_existing_world_readable_secret_is_tightened(tmp_path):
    path = tmp_path / "s.env"
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    result = _files.apply([{"dest": str(path), "content": SECRET + "\n", "secret": True}], want_diff=True)
    assert result["changed"] and result["results"][0]["action"] == "attributes"
    assert _mode(path) == 0o600 and result["diff"][0]["after"] == "mode: 0600\n"
    path.chmod(0o440)  # group read: lost; the owner's bits are as they were
    _files.apply([{"dest": str(path), "content": "TOKEN=new\n", "secret": True}])
    assert _mode(path) == 0o400 and path.read_text() == "TOKEN=new\n"
    assert not _files.apply([{"dest": str(path), "content": "TOKEN=new\n", "secret": True}])["changed"]


def test_files_secret_does_not_take_the_tasks_mode():
    params = {"owner": None, "group": None, "mode": "0644", "directory_mode": "0755", "directories": []}
    base = {"content": None, "mode": None, "owner": None, "group": None, "force": True}
    params["files"] = [dict(base, dest="/a/plain", secret=False), dict(base, dest="/a/s", secret=True)]
    params["rendered"] = {"/a/plain": base64.b64encode(b"p").decode(), "/a/s": base64.b64encode(b"s").decode()}
    files, _dirs = specs(params)
    assert [f["mode"] for f in files] == ["0644", None]
