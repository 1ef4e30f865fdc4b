# SPDX-License-Identifier: GPL-3.0-or-later
"""Boot validation's node-local inventory, read as the node's own run reads it."""

from __future__ import annotations

import yaml


class _NodeInventoryLoader(yaml.SafeLoader):
    """YAML's safe loader, reading a mapping tagged ``!unsafe`` (ansible-core takes everything
    under it as data, never a template) as :class:`Unsafe`, so that a test sees what was tagged."""


class Unsafe(dict):
    """A mapping a node-local inventory wrote ``!unsafe``."""


def _construct_unsafe(loader, node):
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, "!unsafe on a %s" % node.id, node.start_mark)
    return Unsafe(loader.construct_mapping(node, deep=True))


_NodeInventoryLoader.add_constructor("!unsafe", _construct_unsafe)


def node_inventory(text):
    """``(hosts, group_vars)`` of boot validation's node-local inventory (``all.children.gpu_nodes``)."""
    group = yaml.load(text, Loader=_NodeInventoryLoader)["all"]["children"]["gpu_nodes"]
    return group["hosts"], group.get("vars", {})


def node_inventory_hosts(text):
    """``{host: vars}`` of boot validation's node-local inventory."""
    return node_inventory(text)[0]


def node_inventory_vars(text, host):
    """What the node's own run gets as ``host``'s variables: the group's, then the host's."""
    hosts, group_vars = node_inventory(text)
    return {**group_vars, **hosts[host]}
