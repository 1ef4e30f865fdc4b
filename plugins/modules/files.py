#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: files
short_description: Write a role's files and their directories in one module run, with a diff per file
version_added: 0.1.0
description:
  - The way the collection's roles write their files. Every template (O(files[].src)), file of the
    role (O(files[].file)) or text (O(files[].content)) of the task is rendered on the controller,
    as M(ansible.builtin.template) renders it (the role's C(templates/) path, the task's variables,
    C(ansible_managed)), and all of them, with the directories to create, are sent to the node in
    one module run, instead of a M(ansible.builtin.file) task per directory and a stat and a copy
    per file.
  - On the node each file is compared with what is there; only a file whose contents, mode or owner
    differ is replaced, atomically (a new file in the same directory renamed over the old one).
  - The result says per file whether it changed (RV(results), RV(changed_dests)) and, with
    C(--diff), has one diff per changed file or directory (RV(diff)); the task is changed when any
    file or directory is. A handler notified by the task therefore runs when any of its files changed.
  - A O(files[].secret) entry's contents never appear in the result or the diff (its diff says
    only that it changed), nor in an error message. Set C(no_log) on the task too. The text of
    every file travels to the node in O(rendered), which is C(no_log), so the node's journal holds none of it.
  - Every entry is checked before anything is written (modes, owners and groups, destinations and
    their parents); a task that fails there writes nothing, so a handler it notifies never misses a
    change.
  - This is an action plugin; the module does the writes on the node.
author:
  - gpufleet.node developers (@gpufleet)
options:
  files:
    description:
      - The files, written in this order after the directories.
      - Each needs O(files[].dest) and one of O(files[].src), O(files[].file), O(files[].content).
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file on the node.
        type: path
        required: true
      src:
        description:
          - A template, found as M(ansible.builtin.template) finds it (the role's C(templates/) first),
            rendered on the controller with the task's variables.
        type: path
      file:
        description:
          - A file sent as it is, not templated, found as M(ansible.builtin.copy) finds its O(ansible.builtin.copy#module:src)
            (the role's C(files/) first). Text (UTF-8) only.
        type: path
      content:
        description: The file's text, as it is.
        type: str
      vars:
        description: Variables added to the task's for rendering this entry's O(files[].src).
        type: dict
      mode:
        description:
          - The file's mode, an octal mode from V('0000') to V('07777'), for example V('0644'). Default
            O(mode), except for a O(files[].secret) entry. Without either, an existing file keeps its
            mode and a new one is V('0644'); a secret without its own mode is V('0600') when new and,
            when it exists, loses its group and other permission bits.
        type: raw
      owner:
        description: The file's owner (name or uid). Default O(owner); without either it is left as it is.
        type: str
      group:
        description: The file's group (name or gid). Default O(group); without either it is left as it is.
        type: str
      force:
        description:
          - V(false) leaves a file that exists as it is (contents, mode and owner), as
            M(ansible.builtin.copy)'s O(ansible.builtin.copy#module:force=false) does.
        type: bool
        default: true
      secret:
        description:
          - Keep the contents out of the result and the diff; the diff says only that the file changed.
        type: bool
        default: false
  rendered:
    description:
      - Set by the action, not in a task; the text of each file (base64, by O(files[].dest)),
        rendered from O(files[].src), O(files[].file) or O(files[].content). It is C(no_log), so
        the node's journal, where the module logs its arguments, never holds a file's text.
    type: dict
    default: {}
  directories:
    description:
      - The directories to create (with their parents) before the files, each a path or a
        dictionary with C(path), and optionally C(mode) (default O(directory_mode)), C(owner) and
        C(group) (default O(owner) and O(group)). An existing directory gets the mode and owner asked for.
    type: list
    elements: raw
    default: []
  owner:
    description: The default owner of the files and directories.
    type: str
  group:
    description: The default group of the files and directories.
    type: str
  mode:
    description: The default mode of the files (not of O(files[].secret) ones).
    type: raw
  directory_mode:
    description: The default mode of the directories.
    type: raw
    default: '0755'
attributes:
  action:
    support: full
    description: The action plugin renders the files on the controller; the module writes them on the node.
  async:
    support: none
    description: Not supported.
  check_mode:
    support: full
    description: Nothing is written in check mode; the result and the diff say what would change.
  diff_mode:
    support: full
    description: One diff per changed file or directory (a secret file's contents are not shown).
  platform:
    support: full
    platforms: posix
    description: Any POSIX node.
seealso:
  - module: ansible.builtin.template
  - module: ansible.builtin.copy
notes:
  - A template is rendered once per entry, with the task's variables; use O(files[].vars) for values
    that differ between entries (as a loop's C(item) would).
"""

EXAMPLES = r"""
- name: Write the agent, its units and their directories
  gpufleet.node.files:
    owner: root
    group: root
    mode: '0644'
    directories: [/usr/local/lib/gpufleet, /etc/systemd/system]
    files:
      - {file: gpufleet_lb_agent.py, dest: /usr/local/lib/gpufleet/gpufleet_lb_agent.py}
      - {src: etc/systemd/system/gpufleet-lb-agent.socket.j2, dest: /etc/systemd/system/gpufleet-lb-agent.socket}
  register: agent_files

- name: Load the changed units
  gpufleet.node.service_state:
    daemon_reload: "{{ agent_files is changed }}"

- name: Write the secrets file
  gpufleet.node.files:
    files:
      - {src: etc/vllm/secrets.env.j2, dest: /etc/vllm/secrets.env, mode: '0600', owner: vllm, secret: true}
  no_log: true
"""

RETURN = r"""
results:
  description: One record per file, in the order of O(files).
  returned: always
  type: list
  elements: dict
  contains:
    dest:
      description: The file.
      type: str
    changed:
      description: Whether the file was (in check mode, would be) written or its mode or owner set.
      type: bool
    action:
      description: V(created), V(updated), V(attributes) (mode or owner only) or V(kept) (O(files[].force=false)); absent when unchanged.
      type: str
    secret:
      description: Whether the file is a secret one.
      type: bool
  sample: [{dest: /etc/gpufleet/gpu-runtime.env, changed: true, action: updated, mode: '0644', secret: false}]
directories:
  description: One record per directory (C(path), C(changed), C(action)).
  returned: always
  type: list
  elements: dict
changed_dests:
  description: The files and directories that changed (would change, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/etc/gpufleet/gpu-runtime.env]
diff:
  description: With C(--diff), one diff per changed file or directory (headers are the paths on the node).
  returned: with --diff
  type: list
  elements: dict
"""

import base64

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.node.plugins.module_utils.common import _files

FILE_OPTIONS = {
    "dest": {"type": "path", "required": True},
    "src": {"type": "path"},
    "file": {"type": "path"},
    "content": {"type": "str", "no_log": True},
    "vars": {"type": "dict"},
    "mode": {"type": "raw"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "force": {"type": "bool", "default": True},
    "secret": {"type": "bool", "default": False},
}

ARGUMENT_SPEC = {
    "files": {"type": "list", "elements": "dict", "default": [], "options": FILE_OPTIONS},
    "rendered": {"type": "dict", "default": {}, "no_log": True},
    "directories": {"type": "list", "elements": "raw", "default": []},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "raw"},
    "directory_mode": {"type": "raw", "default": "0755"},
}


def specs(params):
    """The module's parameters as _files takes them: defaults applied, secrets in place."""
    directories = []
    for entry in params["directories"]:
        entry = {"path": entry} if isinstance(entry, str) else dict(entry)
        if not entry.get("path"):
            raise _files.FilesError(f"directory entry {entry!r} has no path")
        entry.setdefault("mode", params["directory_mode"])
        for key in ("owner", "group"):
            if entry.get(key) is None:
                entry[key] = params[key]
        directories.append(entry)
    files = []
    for entry in params["files"]:
        spec = {key: entry.get(key) for key in ("dest", "mode", "owner", "group", "force", "secret")}
        for key in ("mode", "owner", "group"):
            # the task's mode is for plain files: a secret without its own mode is kept private
            if spec[key] is None and not (key == "mode" and spec["secret"]):
                spec[key] = params[key]
        text = params["rendered"].get(entry["dest"])
        spec["content"] = entry.get("content") if text is None else base64.b64decode(text).decode("utf-8")
        files.append(spec)
    return files, directories


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        files, directories = specs(module.params)
        result = _files.apply(files, directories, check_mode=module.check_mode, want_diff=module._diff)
    except _files.FilesError as exc:
        module.fail_json(msg=f"gpufleet.node.files: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
