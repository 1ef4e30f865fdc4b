# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: mitogen_prefork
type: aggregate
short_description: Does once, before Ansible forks its task workers, what each worker would redo
version_added: 0.1.0
description:
  - Under Mitogen's strategy, every task that runs a collection's module lists all installed
    collections (C(ansible_mitogen.planner._load_collections) calls
    C(ansible.collections.list.list_collection_dirs)) in its freshly forked worker process; it
    imports Galaxy's collection code and every collection package, each of which parses its
    C(meta/runtime.yml). With the C(ansible) package's ~90 collections that is about 0.2 s of
    controller CPU per task and host on a 2-core machine, the largest single cost of a task.
  - The first lookup of any of this collection's filters in a worker loads every filter plugin
    file of the collection (Ansible cannot tell which file holds a filter without loading them),
    with the module_utils they import, about 0.2 s per task that uses one of them, under either
    strategy.
  - This callback does both once in the controller's main process when the playbook starts; the
    workers, forked from it, inherit the imported modules, scan from memory (about 0.01 s) and find
    the filters loaded. Nothing is printed and nothing else changes.
author:
  - gpufleet.node developers (@gpufleet)
requirements:
  - enable it, for example with C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.node.mitogen_prefork) (the
    repository's C(ansible.cfg) does)
"""

from ansible.collections.list import list_collection_dirs
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.node.mitogen_prefork"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        list(list_collection_dirs())  # a generator: the scan happens as it is consumed
        filter_loader.get("gpufleet.node.env_value")  # loads all of the collection's filter files
