# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Write a role's files on the node in one pass: the core of gpufleet.node.files.

Plain Python (standard library and _atomic only): given directories and files whose text is
already rendered, compare each with what is on the node, write the ones that differ atomically,
set modes and owners, and say per file what changed, with a diff. A secret entry's contents
never appear in what is returned, nor in an error.

Everything is checked before anything is written (:func:`check`): every mode is an octal mode in
0-07777, every owner and group exists, every destination is absolute, is not a directory and has
a parent that is (or will be) a directory. A task that fails there writes nothing.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic

SECRET_BEFORE = "(the contents of a secret file are not shown)\n"
SECRET_AFTER = "(new contents of a secret file, not shown)\n"
#: The largest mode: the permission bits and setuid, setgid and sticky (``chmod``'s range).
MAX_MODE = 0o7777
#: A new secret file's mode, and the bits an existing one loses, where its entry gives no mode.
SECRET_MODE = 0o600
_GROUP_OTHER = 0o077


class FilesError(Exception):
    """A file or directory that cannot be written as asked; the message says which and why."""


def parse_mode(mode):
    """``'0644'``, ``'644'`` or an int (as YAML gives ``0644``) to an int in 0-07777; None stays None."""
    if mode is None or mode == "":
        return None
    if isinstance(mode, bool):
        value = None
    elif isinstance(mode, int):
        value = mode
    else:
        try:
            value = int(str(mode).strip(), 8)
        except ValueError:
            value = None
    if value is None or not 0 <= value <= MAX_MODE:
        raise FilesError(f"mode {mode!r} is not an octal mode from '0000' to '07777' such as '0644'")
    return value


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


def _stat(path, follow=True):
    """``os.stat`` (or ``lstat``) of ``path``, None when nothing is there; a parent that is not a
    directory is a :class:`FilesError` naming it."""
    try:
        return os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise FilesError(f"{path}: a parent of it is not a directory: remove it or choose another path") from None
    except OSError as exc:
        raise FilesError(f"{path}: cannot be examined: {exc.strerror or exc}") from None


def _check_parent(path, made):
    """The nearest existing ancestor of ``path`` is a directory, or ``path``'s parent is one of
    ``made`` (directories this task creates)."""
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        if parent in made:
            return
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            parent = os.path.dirname(parent)
            continue
        except NotADirectoryError:
            parent = os.path.dirname(parent)
            continue
        except OSError as exc:
            raise FilesError(f"{path}: its parent {parent} cannot be examined: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise FilesError(
                f"{path}: {parent} is a file, not a directory, so nothing can be written below it: "
                "remove it or choose another path"
            )
        return


def _check_directory(spec, made):
    """One directory entry validated: ``{'path', 'mode', 'uid', 'gid'}``."""
    path = spec.get("path")
    if not path or not os.path.isabs(str(path)):
        raise FilesError(f"directory path {path!r} is not an absolute path")
    path = os.path.normpath(path)
    try:
        mode = parse_mode(spec.get("mode"))
    except FilesError as exc:
        raise FilesError(f"{path}: {exc}") from None
    out = {"path": path, "mode": mode, "uid": _uid(spec.get("owner")), "gid": _gid(spec.get("group"))}
    _check_parent(path, made)
    st = _stat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise FilesError(f"{path} exists and is not a directory: remove it or choose another path")
    return out


def _check_file(spec, made):
    """One file entry validated: the spec with ``mode`` an int or None and ``uid``, ``gid``."""
    dest = spec.get("dest")
    if not dest or not os.path.isabs(str(dest)):
        raise FilesError(f"dest {dest!r} is not an absolute path")
    if spec.get("content") is None:
        raise FilesError(f"{dest}: no content (src and file are rendered by the action on the controller)")
    try:
        mode = parse_mode(spec.get("mode"))
    except FilesError as exc:
        raise FilesError(f"{dest}: {exc}") from None
    try:
        uid, gid = _uid(spec.get("owner")), _gid(spec.get("group"))
    except FilesError as exc:
        raise FilesError(f"{dest}: {exc}") from None
    _check_parent(dest, made)
    st = _stat(dest, follow=False)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise FilesError(f"{dest} is a directory: a file cannot be written there")
    return dict(spec, mode=mode, uid=uid, gid=gid)


def check(files, directories=()):
    """Every entry validated before anything is written: ``(files, directories)`` as
    :func:`write_file` and :func:`ensure_directory` take them. :class:`FilesError` lists every
    entry that is refused (a secret's contents never in it) and says nothing was written."""
    problems, checked_dirs, checked_files, made = [], [], [], set()
    for spec in directories:
        try:
            checked = _check_directory(spec, made)
        except FilesError as exc:
            problems.append(str(exc))
            continue
        checked_dirs.append(checked)
        made.add(checked["path"])
        parent = os.path.dirname(checked["path"])
        while parent and parent != os.path.dirname(parent) and _stat_quiet(parent) is None:
            made.add(parent)  # os.makedirs creates the missing parents too
            parent = os.path.dirname(parent)
    seen = set()
    for spec in files:
        try:
            checked = _check_file(spec, made)
        except FilesError as exc:
            problems.append(str(exc))
            continue
        if checked["dest"] in seen:
            problems.append(f"{checked['dest']} is given twice")
        seen.add(checked["dest"])
        checked_files.append(checked)
    if problems:
        raise FilesError(
            "nothing was written; %d entr%s refused: %s"
            % (len(problems), "y" if len(problems) == 1 else "ies", "; ".join(problems))
        )
    return checked_files, checked_dirs


def _stat_quiet(path):
    try:
        return os.stat(path)
    except OSError:
        return None


def ensure_directory(spec, check_mode=False, want_diff=False):
    """Create ``spec['path']`` (and its parents) if missing and set its mode and owner.
    Returns a per-directory record and a diff or None."""
    if "uid" not in spec:
        spec = _check_directory(spec, set())
    path = spec["path"]
    mode, uid, gid = spec["mode"], spec["uid"], spec["gid"]
    record = {"path": path, "state": "directory", "changed": False}
    st = _stat(path)
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
    if "uid" not in spec:
        spec = _check_file(spec, set())
    dest, content = spec["dest"], spec["content"]
    secret = bool(spec.get("secret"))
    mode, uid, gid = spec["mode"], spec["uid"], spec["gid"]
    record = {"dest": dest, "changed": False, "secret": secret}
    old, st = _read(dest)
    if st is not None and spec.get("force") is False:
        record["action"] = "kept"
        return record, []
    if secret and mode is None:
        # no mode asked: a new secret is 0600, an existing one loses its group and other bits
        mode = SECRET_MODE if st is None or not stat.S_ISREG(st.st_mode) else stat.S_IMODE(st.st_mode) & ~_GROUP_OTHER
    if mode is not None:
        record["mode"] = "%04o" % mode
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
            _atomic.write(dest, content, keep if mode is None else mode)
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
    """Every entry checked (:func:`check`), then directories first (in order), then files. Returns
    the module's result: ``changed``, ``results`` (one record per file), ``directories``,
    ``changed_dests`` (paths changed, files and directories), ``diff`` (a list, with
    ``want_diff``). An error of the system while writing names what was already written."""
    files, directories = check(files, directories)
    result = {"changed": False, "results": [], "directories": [], "changed_dests": [], "diff": []}
    try:
        _apply(result, files, directories, check_mode, want_diff)
    except FilesError as exc:
        done = result["changed_dests"]
        raise FilesError(
            "%s (already written before this error: %s)" % (exc, ", ".join(done) if done else "nothing")
        ) from None
    result["changed"] = bool(result["changed_dests"])
    if not want_diff:
        del result["diff"]
    return result


def _apply(result, files, directories, check_mode, want_diff):
    for spec in directories:
        try:
            record, diff = ensure_directory(spec, check_mode, want_diff)
        except OSError as exc:
            raise FilesError(f"cannot create {spec['path']}: {exc.strerror or exc}") from None
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
