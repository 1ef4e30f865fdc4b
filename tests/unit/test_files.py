# SPDX-License-Identifier: GPL-3.0-or-later
"""The core of gpufleet.node.files (_files.apply) and the module's parameters (specs): per file
changed or not, atomic writes with the mode asked for, check mode writes nothing, one diff per
changed file, attributes alone, force=false, secrets never in a diff, a link replaced, not
followed, and errors that name the file."""

from __future__ import annotations

import base64
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.common import _files
from ansible_collections.gpufleet.node.plugins.modules.files import ARGUMENT_SPEC, specs


def _mode(path):
    return os.stat(path).st_mode & 0o7777


def test_first_apply_writes_each_file_then_nothing_changes(tmp_path):
    d = tmp_path / "etc/app"
    files = [
        {"dest": str(d / "a.conf"), "content": "A\n", "mode": "0644"},
        {"dest": str(d / "b.conf"), "content": "B\n", "mode": 0o640},
    ]
    dirs = [{"path": str(d), "mode": "0755"}]
    result = _files.apply(files, dirs, want_diff=True)
    assert result["changed"] and result["changed_dests"] == [str(d), str(d / "a.conf"), str(d / "b.conf")]
    assert [(r["action"], r["mode"]) for r in result["results"]] == [("created", "0644"), ("created", "0640")]
    assert [x["after_header"] for x in result["diff"]] == [str(d), str(d / "a.conf"), str(d / "b.conf")]
    assert (d / "a.conf").read_text() == "A\n" and _mode(d / "b.conf") == 0o640 and _mode(d) == 0o755
    assert not [p for p in os.listdir(d) if p.endswith(".tmp")]
    again = _files.apply(files, dirs, want_diff=True)
    assert not again["changed"] and again["changed_dests"] == [] and again["diff"] == []
    assert [r["changed"] for r in again["results"]] == [False, False]


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path):
    (tmp_path / "old.conf").write_text("old\n")
    files = [
        {"dest": str(tmp_path / "old.conf"), "content": "new\n"},
        {"dest": str(tmp_path / "sub/new.conf"), "content": "x\n"},
    ]
    result = _files.apply(files, [{"path": str(tmp_path / "sub")}], check_mode=True, want_diff=True)
    assert result["changed_dests"] == [
        str(tmp_path / "sub"),
        str(tmp_path / "old.conf"),
        str(tmp_path / "sub/new.conf"),
    ]
    assert result["diff"][1] == {
        "before_header": str(tmp_path / "old.conf"),
        "after_header": str(tmp_path / "old.conf"),
        "before": "old\n",
        "after": "new\n",
    }
    assert (tmp_path / "old.conf").read_text() == "old\n" and not (tmp_path / "sub").exists()


def test_mode_alone_is_a_change_of_attributes(tmp_path):
    path = tmp_path / "f"
    path.write_text("same\n")
    path.chmod(0o666)
    result = _files.apply([{"dest": str(path), "content": "same\n", "mode": "0644"}], want_diff=True)
    assert result["results"][0]["action"] == "attributes"
    assert result["diff"] == [
        {
            "before_header": f"{path} (attributes)",
            "after_header": f"{path} (attributes)",
            "before": "mode: 0666\n",
            "after": "mode: 0644\n",
        }
    ]
    assert _mode(path) == 0o644
    # without a mode an existing file keeps its own
    path.chmod(0o600)
    assert not _files.apply([{"dest": str(path), "content": "same\n"}])["changed"]
    _files.apply([{"dest": str(path), "content": "other\n"}])
    assert _mode(path) == 0o600 and path.read_text() == "other\n"
    # contents and mode both differ: both in the diff
    result = _files.apply([{"dest": str(path), "content": "third\n", "mode": "0644"}], want_diff=True)
    assert [(d["after_header"], d["after"]) for d in result["diff"]] == [
        (str(path), "third\n"),
        (f"{path} (attributes)", "mode: 0644\n"),
    ]
    assert _mode(path) == 0o644


def test_force_false_keeps_an_existing_file(tmp_path):
    path = tmp_path / "f"
    path.write_text("mine\n")
    result = _files.apply([{"dest": str(path), "content": "", "force": False, "mode": "0600"}])
    assert not result["changed"] and result["results"][0]["action"] == "kept" and path.read_text() == "mine\n"
    new = tmp_path / "g"
    assert _files.apply([{"dest": str(new), "content": "", "force": False}])["changed"] and new.read_text() == ""


def test_a_secret_is_never_in_the_diff_and_is_0600_by_default(tmp_path):
    path = tmp_path / "secret.env"
    result = _files.apply([{"dest": str(path), "content": "TOKEN=abc\n", "secret": True}], want_diff=True)
    assert "abc" not in repr(result) and result["diff"][0]["after"] == _files.SECRET_AFTER
    assert _mode(path) == 0o600 and path.read_text() == "TOKEN=abc\n"
    result = _files.apply([{"dest": str(path), "content": "TOKEN=def\n", "secret": True}], want_diff=True)
    assert "abc" not in repr(result) and "def" not in repr(result)
    assert result["diff"][0]["before"] == _files.SECRET_BEFORE


def test_a_link_at_dest_is_replaced_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert _files.apply([{"dest": str(link), "content": "new\n"}])["changed"]
    assert not link.is_symlink() and link.read_text() == "new\n" and target.read_text() == "keep\n"


def test_errors_name_the_file_and_what_to_do(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(_files.FilesError, match=r"file exists and is not a directory"):
        _files.apply([], [{"path": str(tmp_path / "file")}])
    with pytest.raises(_files.FilesError, match="is a directory"):
        _files.apply([{"dest": str(tmp_path), "content": ""}])
    with pytest.raises(_files.FilesError, match="not an absolute path"):
        _files.apply([{"dest": "rel", "content": ""}])
    with pytest.raises(_files.FilesError, match="owner 'no-such-user-x' does not exist"):
        _files.apply([{"dest": str(tmp_path / "o"), "content": "", "owner": "no-such-user-x"}])
    with pytest.raises(_files.FilesError, match="octal mode"):
        _files.parse_mode("rw-r--r--")


def test_specs_apply_the_defaults_and_decode_the_rendered_text():
    params = {"owner": "root", "group": None, "mode": "0644", "directory_mode": "0755"}
    params["directories"] = ["/a", {"path": "/b", "mode": "0700", "owner": "nobody"}]
    params["files"] = [
        {"dest": "/a/x", "content": None, "mode": None, "owner": None, "group": None, "force": True, "secret": False},
        {
            "dest": "/a/s",
            "content": None,
            "mode": "0600",
            "owner": "vllm",
            "group": "root",
            "force": True,
            "secret": True,
        },
    ]
    params["rendered"] = {"/a/x": base64.b64encode(b"x").decode(), "/a/s": base64.b64encode(b"s").decode()}
    files, dirs = specs(params)
    assert dirs == [
        {"path": "/a", "mode": "0755", "owner": "root", "group": None},
        {"path": "/b", "mode": "0700", "owner": "nobody", "group": None},
    ]
    assert [(f["content"], f["mode"], f["owner"], f["secret"]) for f in files] == [
        ("x", "0644", "root", False),
        ("s", "0600", "vllm", True),
    ]
    # no file's text in the node's journal (AnsibleModule logs its arguments)
    assert ARGUMENT_SPEC["rendered"]["no_log"] is True


# --- the filter that builds a files list from paths (the node's Ansible has no community.general) ---


def test_file_entries_from_one_list_and_from_pairs():
    from ansible_collections.gpufleet.node.plugins.filter.file_entries import file_entries

    assert file_entries(["/a.d/x.conf", "/b.d/x.conf"], "dest", src="x.j2") == [
        {"dest": "/a.d/x.conf", "src": "x.j2"},
        {"dest": "/b.d/x.conf", "src": "x.j2"},
    ]
    assert file_entries(zip(["s1", "s2"], ["d1", "d2"], strict=True), ["file", "dest"]) == [
        {"file": "s1", "dest": "d1"},
        {"file": "s2", "dest": "d2"},
    ]
    with pytest.raises(AnsibleFilterError, match=r"has 1 value\(s\) for the 2 key\(s\)"):
        file_entries([["only"]], ["file", "dest"])
