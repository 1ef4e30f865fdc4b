# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action of gpufleet.node.files: render every file of the task on the controller (templates as
ansible.builtin.template renders them), then write them all on the node in one module run (see
the module's documentation)."""

from __future__ import annotations

import base64
import json
import os

from ansible._internal._templating import _template_vars
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

SOURCES = ("src", "file", "content")
ENTRY_KEYS = frozenset(SOURCES + ("dest", "mode", "owner", "group", "force", "secret", "vars"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("files", "directories", "owner", "group", "mode", "directory_mode"))
    # Every file's text travels in the module's `rendered` argument, base64 and no_log: the node's
    # journal (AnsibleModule logs its arguments) never holds a file's text, a secret's included,
    # and the module's masking of no_log values never touches the diff.

    def _template_searchpath(self, task_vars, source):
        searchpath = list(task_vars.get("ansible_search_path", []))
        searchpath.extend([self._loader._basedir, os.path.dirname(source)])
        out = []
        for path in searchpath:
            out.extend([os.path.join(path, "templates"), path])
        return out

    def _render(self, entry, task_vars):
        """The text of one entry: a template rendered as ansible.builtin.template renders it, a
        file of the role as it is, or the content given."""
        dest = entry["dest"]
        if "content" in entry:
            content = entry["content"]
            if isinstance(content, (dict, list)):  # as ansible.builtin.copy writes one
                return json.dumps(content)
            return "" if content is None else str(content)
        kind = "src" if "src" in entry else "file"
        try:
            source = self._find_needle("templates" if kind == "src" else "files", entry[kind])
        except AnsibleError as exc:
            raise AnsibleActionFail(f"gpufleet.node.files: {dest}: {exc}") from None
        if kind == "file":
            with open(source, "rb") as handle:
                data = handle.read()
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise AnsibleActionFail(
                    f"gpufleet.node.files: {source} is not UTF-8 text; use ansible.builtin.copy"
                ) from None
        temp_vars = task_vars.copy()
        temp_vars.update(
            _template_vars.generate_ansible_template_vars(
                path=entry["src"],
                fullpath=source,
                dest_path=dest,
                include_ansible_managed="ansible_managed" not in temp_vars,
            )
        )
        temp_vars.update(entry.get("vars") or {})
        templar = self._templar.copy_with_new_env(
            searchpath=self._template_searchpath(task_vars, source), available_variables=temp_vars
        )
        text = templar.template(
            trust_as_template(self._loader.get_text_file_contents(source)), escape_backslashes=False
        )
        return "" if text is None else text

    def _render_entry(self, entry, task_vars):
        """:meth:`_render`; for a secret entry an error says which entry failed, never its text
        (a template error quotes the template)."""
        if not entry.get("secret"):
            return self._render(entry, task_vars)
        try:
            return self._render(entry, task_vars)
        except Exception as exc:
            raise AnsibleActionFail(
                f"gpufleet.node.files: {entry['dest']}: the secret entry could not be rendered "
                f"({type(exc).__name__}; its text is not shown): render it without secret: true "
                "in a run with no_log off to see the error"
            ) from None

    def _entries(self, task_vars):
        files = self._task.args.get("files") or []
        if not isinstance(files, list):
            raise AnsibleActionFail("gpufleet.node.files: files must be a list of dictionaries")
        out, rendered = [], {}
        for entry in files:
            if not isinstance(entry, dict) or not entry.get("dest"):
                # the entry's keys only: its values may be a secret's text
                got = f"keys {sorted(entry)}" if isinstance(entry, dict) else f"a {type(entry).__name__}"
                raise AnsibleActionFail(f"gpufleet.node.files: every entry of files needs a dest (got {got})")
            unknown = sorted(set(entry) - ENTRY_KEYS)
            sources = [key for key in SOURCES if key in entry]
            if unknown or len(sources) != 1:
                raise AnsibleActionFail(
                    f"gpufleet.node.files: {entry['dest']}: "
                    + (f"unknown keys {unknown}" if unknown else "give exactly one of src, file, content")
                )
            if entry["dest"] in rendered:
                raise AnsibleActionFail(f"gpufleet.node.files: {entry['dest']} is given twice")
            rendered[entry["dest"]] = base64.b64encode(self._render_entry(entry, task_vars).encode("utf-8")).decode(
                "ascii"
            )
            out.append(
                {key: entry[key] for key in ("dest", "mode", "owner", "group", "force", "secret") if key in entry}
            )
        return out, rendered

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        try:
            module_args = {key: value for key, value in self._task.args.items() if key != "files"}
            module_args["files"], module_args["rendered"] = self._entries(task_vars)
            res = self._execute_module(module_name="gpufleet.node.files", module_args=module_args, task_vars=task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        # the invocation would repeat every file's text; the results and the diff say what changed
        res.pop("invocation", None)
        result.update(res)
        return result
