# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""Entries of ``gpufleet.node.files``'s ``files`` list from lists of paths, with the node's own
Ansible alone (a node's boot validation has no community.general):

    files: "{{ dirs | map('regex_replace', '$', '/x.conf') | gpufleet.node.file_entries('dest', src='x.conf.j2') }}"
    files: "{{ sources | zip(dests) | gpufleet.node.file_entries(['file', 'dest']) }}"
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def file_entries(items, keys, **fixed):
    """One dict per item: ``{keys: item}`` when ``keys`` is one name, ``dict(zip(keys, item))``
    when it is a list (items of as many values, e.g. from ``zip``); ``fixed`` is added to each."""
    names = [keys] if isinstance(keys, str) else list(keys)
    entries = []
    for item in items:
        values = [item] if isinstance(keys, str) else list(item)
        if len(values) != len(names):
            raise AnsibleFilterError(
                "file_entries: %r has %d value(s) for the %d key(s) %s" % (item, len(values), len(names), names)
            )
        entries.append({**dict(zip(names, values, strict=True)), **fixed})
    return entries


class FilterModule:
    def filters(self):
        return {"file_entries": file_entries}
