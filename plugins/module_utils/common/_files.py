# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write a role's files on the node in one pass: the core of gpufleet.node.files.

Plain Python (standard library and _atomic only): given directories and files whose text is
already rendered, compare each with what is on the node, write the ones that differ atomically,
set modes and owners, and say per file what changed, with a diff. A secret entry's contents
never appear in what is returned.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic

SECRET_BEFORE = "(the contents of a secret file are not shown)\n"
SECRET_AFTER = "(new contents of a secret file, not shown)\n"


class FilesError(Exception):
    """A file or directory that cannot be written as asked; the message says which and why."""


def parse_mode(mode):
    """``'0644'``, ``'644'`` or an int (as YAML gives ``0644``) to an int; None stays None."""
    if mode is None or mode == "":
        return None
    if isinstance(mode, int):
        return mode
    try:
        return int(str(mode), 8)
    except ValueError:
        raise FilesError(f"mode {mode!r} is not an octal mode such as '0644'") from None


def _account_id(name, lookup, what, kind):
    """The numeric id of ``name`` (a name or digits) by ``lookup``; -1 (leave as is) when unset."""
    if name is None or name == "":
        return -1
    if str(name).isdigit():
        return int(name)
    try:
        return lookup(name)
    except KeyError:
        raise FilesError(f"{what} {name!r} does not exist on this host: create the {kind} first") from None


def _uid(owner):
    return _account_id(owner, lambda name: pwd.getpwnam(name).pw_uid, "owner", "user")


def _gid(group):
    return _account_id(group, lambda name: grp.getgrnam(name).gr_gid, "group", "group")


def _attrs(st):
    return {"mode": "%04o" % stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}


def _wanted_attrs(current, mode, uid, gid):
    """The attributes that differ from the wanted ones: {name: (before, after)}."""
    out = {}
    if mode is not None and current["mode"] != "%04o" % mode:
        out["mode"] = (current["mode"], "%04o" % mode)
    if uid != -1 and current["uid"] != uid:
        out["owner"] = (current["uid"], uid)
    if gid != -1 and current["gid"] != gid:
        out["group"] = (current["gid"], gid)
    return out


def _attr_text(attrs, side):
    return "".join(f"{name}: {values[side]}\n" for name, values in sorted(attrs.items()))


def _attr_diff(path, attrs):
    """The diff of the attributes that differ (``_wanted_attrs``) of a file or directory."""
    header = path + " (attributes)"
    return {
        "before_header": header,
        "after_header": header,
        "before": _attr_text(attrs, 0),
        "after": _attr_text(attrs, 1),
    }


def _set_attrs(path, attrs, mode, uid, gid):
    """Set the attributes that differ (``_wanted_attrs``) on ``path``."""
    if "mode" in attrs:
        os.chmod(path, mode)
    if "owner" in attrs or "group" in attrs:
        os.chown(path, uid, gid)


def ensure_directory(spec, check_mode=False, want_diff=False):
    """Create ``spec['path']`` (and its parents) if missing and set its mode and owner.
    Returns a per-directory record and a diff or None."""
    path = spec["path"]
    mode = parse_mode(spec.get("mode"))
    uid, gid = _uid(spec.get("owner")), _gid(spec.get("group"))
    record = {"path": path, "state": "directory", "changed": False}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise FilesError(f"{path} exists and is not a directory: remove it or choose another path")
    if st is None:
        record.update(changed=True, action="created")
        diff = {
            "before_header": path,
            "after_header": path,
            "before": {"path": path, "state": "absent"},
            "after": {"path": path, "state": "directory"},
        }
        if not check_mode:
            os.makedirs(path, mode=0o755 if mode is None else mode, exist_ok=True)
            os.chmod(path, 0o755 if mode is None else mode)
            os.chown(path, uid, gid)
        return record, (diff if want_diff else None)
    attrs = _wanted_attrs(_attrs(st), mode, uid, gid)
    if not attrs:
        return record, None
    record.update(changed=True, action="attributes")
    if not check_mode:
        _set_attrs(path, attrs, mode, uid, gid)
    return record, (_attr_diff(path, attrs) if want_diff else None)


def _read(path):
    """The bytes at ``path`` and its stat, or (None, None) when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise FilesError(f"{path} is a directory: a file cannot be written there")
        return b"", st  # a link or special file is replaced, never written through
    with open(path, "rb") as handle:
        return handle.read(), st


def write_file(spec, check_mode=False, want_diff=False):
    """Make ``spec['dest']`` hold ``spec['content']`` (text) with the mode and owner asked for.
    ``force: false`` leaves an existing file as it is. ``secret: true`` keeps the contents out of
    the diff. Returns a per-file record and its diffs (the contents, then the mode and owner
    where they differ)."""
    dest = spec["dest"]
    if not os.path.isabs(dest):
        raise FilesError(f"dest {dest!r} is not an absolute path")
    content = spec.get("content")
    if content is None:
        raise FilesError(f"{dest}: no content (src and file are rendered by the action on the controller)")
    secret = bool(spec.get("secret"))
    mode = parse_mode(spec.get("mode"))
    uid, gid = _uid(spec.get("owner")), _gid(spec.get("group"))
    record = {"dest": dest, "changed": False, "secret": secret}
    if mode is not None:
        record["mode"] = "%04o" % mode
    old, st = _read(dest)
    if st is not None and spec.get("force") is False:
        record["action"] = "kept"
        return record, []
    new = content.encode("utf-8")
    attrs = {} if st is None or not stat.S_ISREG(st.st_mode) else _wanted_attrs(_attrs(st), mode, uid, gid)
    if st is None:
        action = "created"
    elif old != new or not stat.S_ISREG(st.st_mode):
        action = "updated"
    else:
        action = "attributes" if attrs else None
    if action is None:
        return record, []
    record.update(changed=True, action=action)
    if not check_mode:
        if action == "attributes":
            _set_attrs(dest, attrs, mode, uid, gid)
        else:
            # a new file is made with the wanted mode from its first byte (0600 for a secret)
            keep = 0o644 if st is None else stat.S_IMODE(st.st_mode)
            _atomic.write(dest, content, 0o600 if secret and mode is None else (keep if mode is None else mode))
            if uid != -1 or gid != -1:
                os.chown(dest, uid, gid)
    if not want_diff:
        return record, []
    diffs = []
    if action != "attributes":
        if secret:
            before, after = ("" if st is None else SECRET_BEFORE), SECRET_AFTER
        else:
            before, after = ("" if st is None else old.decode("utf-8", "replace")), content
        diffs.append({"before_header": dest, "after_header": dest, "before": before, "after": after})
    if attrs:
        diffs.append(_attr_diff(dest, attrs))
    return record, diffs


def apply(files, directories=(), check_mode=False, want_diff=False):
    """Directories first (in order), then files. Returns the module's result: ``changed``,
    ``results`` (one record per file), ``directories``, ``changed_dests`` (paths changed, files
    and directories), ``diff`` (a list, with ``want_diff``)."""
    result = {"changed": False, "results": [], "directories": [], "changed_dests": [], "diff": []}
    for spec in directories:
        record, diff = ensure_directory(spec, check_mode, want_diff)
        result["directories"].append(record)
        if record["changed"]:
            result["changed_dests"].append(record["path"])
        if diff:
            result["diff"].append(diff)
    for spec in files:
        try:
            record, diffs = write_file(spec, check_mode, want_diff)
        except OSError as exc:
            raise FilesError(f"cannot write {spec.get('dest')}: {exc.strerror or exc}") from None
        result["results"].append(record)
        if record["changed"]:
            result["changed_dests"].append(record["dest"])
        result["diff"].extend(diffs)
    result["changed"] = bool(result["changed_dests"])
    if not want_diff:
        del result["diff"]
    return result
