# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a node's OS family does what the roles ask of it, chosen from its facts: the package
manager that installs (apt, dnf), and how a kernel parameter reaches every boot (Debian family: a
GRUB drop-in that update-grub writes into grub.cfg; RHEL family: grubby on each installed kernel's
boot entry). Plain Python (no Ansible imports), runs on the controller.
"""

from __future__ import annotations

import re

#: What each supported OS family uses (ansible_facts.os_family): its package manager, the route of
#: a kernel parameter, and where its pciutils package puts setpci.
FAMILIES = {
    "Debian": {"pkg_mgr": "apt", "kernel_param": "grub_dropin", "setpci": "/usr/bin/setpci"},
    "RedHat": {"pkg_mgr": "dnf", "kernel_param": "grubby", "setpci": "/usr/sbin/setpci"},
}


class UnsupportedFamily(ValueError):
    """The node's OS family is none the collection has a path for."""


def paths(facts):
    """``{'family', 'pkg_mgr', 'kernel_param', 'setpci'}`` for a node's ``ansible_facts``;
    :class:`UnsupportedFamily` naming what the node is and what is supported otherwise."""
    facts = facts or {}
    family = facts.get("os_family")
    if family not in FAMILIES:
        raise UnsupportedFamily(
            "%s %s (OS family %s) is not a system the collection installs on: it supports the %s families"
            % (
                facts.get("distribution") or "an unknown system",
                facts.get("distribution_version") or "",
                family or "unknown",
                " and ".join(sorted(FAMILIES)),
            )
        )
    return dict(FAMILIES[family], family=family)


def package_manager(facts):
    """The package manager of the node's OS family (``apt``, ``dnf``); '' for another family."""
    return FAMILIES.get((facts or {}).get("os_family"), {}).get("pkg_mgr", "")


# --- the kernel parameter through grubby (RHEL family) --------------------------------------------
_WORD = re.compile(r'(?:"[^"]*"|[^\s"])+')
_ACS = "disable_acs_redir="


def _words(args):
    """The arguments of one boot entry, split as the kernel splits its command line (blanks
    outside double quotes), each as written."""
    return _WORD.findall(args)


def grubby_entries(text):
    """``[{'kernel', 'args': [word, ...]}]`` from ``grubby --info=ALL``: each entry's ``kernel=``
    and ``args=`` lines (values in double quotes), parsed by their labels. Lines of other labels
    are ignored; an entry without ``args`` has none. ValueError for text with no entry."""
    entries = []
    for line in str(text).splitlines():
        label, sep, value = line.strip().partition("=")
        if not sep:
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if label == "index":
            entries.append({"kernel": "", "args": []})
        elif label in ("kernel", "args"):
            if not entries:
                entries.append({"kernel": "", "args": []})
            entries[-1][label] = value if label == "kernel" else _words(value)
    entries = [e for e in entries if e["kernel"]]
    if not entries:
        raise ValueError("grubby --info=ALL listed no boot entry with a kernel")
    return entries


def _pci_word(words, param):
    """The one ``pci=`` word an entry should carry: its other ``pci=`` options kept, the ACS
    option replaced by ``param``'s (grubby replaces an argument by its name, so a second ``pci=``
    word would replace the first)."""
    wanted = param[len("pci=") :]
    others = []
    for word in words:
        for item in word.replace('"', "")[len("pci=") :].split(","):
            if item and not item.startswith(_ACS) and item not in others:
                others.append(item)
    return "pci=" + ",".join(others + [wanted])


def grubby_commands(text, param):
    """The ``grubby`` argv lists that give every boot entry of ``grubby --info=ALL`` (``text``)
    the kernel parameter ``param`` (``pci=disable_acs_redir=<dev>[;<dev>...]``, as pcie_acs
    returns it): each entry's ``pci=`` words removed and one written in double quotes (GRUB's
    script parser ends a command at an unquoted ';'; the kernel drops the quotes). One
    ``--update-kernel=ALL`` command where every entry needs the same change (a node that never had
    it), else one per entry that lacks it. Empty when every entry already carries exactly that."""
    if not str(param).startswith("pci=" + _ACS):
        raise ValueError("%r is not a pci=disable_acs_redir= kernel parameter" % (param,))
    entries = grubby_entries(text)
    changes = []
    for entry in entries:
        pci = [w for w in entry["args"] if w.replace('"', "").startswith("pci=")]
        word = _pci_word(pci, param)
        if [w.replace('"', "") for w in pci] != [word]:
            changes.append((entry["kernel"], pci, word))
    if not changes:
        return []
    if len(changes) == len(entries) and len({(tuple(pci), word) for _kernel, pci, word in changes}) == 1:
        changes = [("ALL", changes[0][1], changes[0][2])]
    commands = []
    for kernel, pci, word in changes:
        argv = ["grubby", "--update-kernel=%s" % kernel]
        if pci:
            argv.append("--remove-args=%s" % " ".join(pci))
        argv.append('--args="%s"' % word)
        commands.append(argv)
    return commands


def kernel_param_plan(facts, param, grubby_info=""):
    """``{'family', 'route', 'commands'}``: how ``param`` reaches every boot of the node. Route
    ``grub_dropin`` (Debian family: the role's drop-in and update-grub; no commands here) or
    ``grubby`` (RHEL family: :func:`grubby_commands` of ``grubby_info``, once it was read)."""
    family = paths(facts)
    route = family["kernel_param"]
    commands = grubby_commands(grubby_info, param) if route == "grubby" and grubby_info else []
    return {"family": family["family"], "route": route, "commands": commands}
