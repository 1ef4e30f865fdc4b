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

#: The command (argv, the package names follow) that prints one line ``installed`` for each
#: installed package named, in order, by package manager: dpkg's status field (``${db:Status-Status}``:
#: installed, config-files, not-installed, ...; an unknown name exits 1) and rpm's query format (a
#: missing package prints "package NAME is not installed" and exits 1). Running it costs a fraction
#: of a package-manager run (apt's module opens the whole cache: about 3.5 s of CPU a task).
QUERIES = {
    "apt": ["dpkg-query", "--show", "--showformat=${db:Status-Status}\\n"],
    "dnf": ["rpm", "--query", "--queryformat=installed\\n"],
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


#: The distribution packages of what the roles install, by OS family, from the repositories a fresh
#: install has enabled (Debian: main; Ubuntu: main and universe; RHEL: BaseOS and AppStream). None:
#: that family's base repositories have none, and the second field says where one is (a repository
#: the operator enables, and the name it has there). Sources, each package's page:
#: packages.debian.org/<name> (bullseye, bookworm, trixie), packages.ubuntu.com/{jammy,noble}/<name>
#: (prometheus-node-exporter is in universe), packages.fedoraproject.org/pkgs/node-exporter/node-exporter
#: and .../pkgs/python-prometheus_client/python3-prometheus_client (both in EPEL 9, not in RHEL 9).
PACKAGES = {
    "pciutils": {"Debian": (["pciutils"], ""), "RedHat": (["pciutils"], "")},
    "node_exporter": {
        "Debian": (["prometheus-node-exporter"], ""),
        "RedHat": (None, "EPEL 9 has it as node-exporter"),
    },
    "prometheus_client": {
        "Debian": (["python3-prometheus-client"], ""),
        "RedHat": (None, "EPEL 9 has it as python3-prometheus_client"),
    },
    "prometheus": {"Debian": (["prometheus"], ""), "RedHat": (None, "")},
}


def _system(facts):
    return "%s %s (OS family %s)" % (
        facts.get("distribution") or "an unknown system",
        facts.get("distribution_version") or "",
        facts.get("os_family") or "unknown",
    )


def package_plan(facts, what, override=None, variable="", advice=""):
    """``{'family', 'pkg_mgr', 'packages', 'refused', 'query'}``: the packages that install ``what`` (a key of
    :data:`PACKAGES`) on the node, with the package manager of its OS family. ``override`` (the
    role's variable ``variable``: a name or a list of names), when given, is installed instead of
    the table's. ``refused`` is '' or why nothing can be installed (a family without the package in
    its base repositories, or without a path at all), naming the system and ``variable``, followed
    by ``advice`` (the role's other way out, as written): the role fails with it before it
    installs anything. KeyError for a ``what`` the table lacks."""
    facts = facts or {}
    table = PACKAGES[what]
    family = facts.get("os_family")
    if family not in FAMILIES:
        return {
            "family": family or "",
            "pkg_mgr": "",
            "packages": [],
            "query": [],
            "refused": "%s is not a system the collection installs %s on: it supports the %s families"
            % (_system(facts), what, " and ".join(sorted(FAMILIES))),
        }
    plan = {"family": family, "pkg_mgr": FAMILIES[family]["pkg_mgr"], "packages": [], "refused": "", "query": []}
    if isinstance(override, str):
        override = [override] if override else []
    if override:
        plan["packages"] = [str(name) for name in override]
        plan["query"] = QUERIES[plan["pkg_mgr"]] + plan["packages"]
        return plan
    names, elsewhere = table[family]
    if names is None:
        plan["refused"] = (
            "%s has no package for %s in its base repositories%s: set %s to the package(s) that provide it from a repository the node has%s"
            % (
                _system(facts),
                what,
                " (%s)" % elsewhere if elsewhere else "",
                variable or "the role's package variable",
                advice,
            )
        )
        return plan
    plan["packages"] = list(names)
    plan["query"] = QUERIES[plan["pkg_mgr"]] + plan["packages"]
    return plan


def packages_missing(plan, rc, stdout):
    """True unless the plan's ``query`` (run on the node: exit status ``rc``, standard output
    ``stdout``) says every one of its packages is installed: one ``installed`` line per package and
    exit status 0. A query that could not run (no such command: rc None or 127) says nothing is
    installed, so the package manager runs and reports what is wrong."""
    if not plan.get("packages"):
        return False
    lines = [line.strip() for line in str(stdout or "").splitlines() if line.strip()]
    return rc != 0 or lines != ["installed"] * len(plan["packages"])


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


def _after(words, param):
    """An entry's arguments as the commands of :func:`grubby_commands` leave them: its ``pci=``
    words removed, the one word of :func:`_pci_word` added at the end, in double quotes."""
    pci = [w for w in words if w.replace('"', "").startswith("pci=")]
    return [w for w in words if w not in pci] + ['"%s"' % _pci_word(pci, param)]


def grubby_diff(text, param):
    """``{'before', 'after'}``: each boot entry of ``grubby --info=ALL`` as ``kernel=`` and
    ``args=`` lines, as it is and as :func:`grubby_commands` leaves it (an entry that carries the
    parameter already, the same in both): the diff check mode shows."""
    before, after = [], []
    for entry in grubby_entries(text):
        pci = [w.replace('"', "") for w in entry["args"] if w.replace('"', "").startswith("pci=")]
        new = entry["args"] if pci == [_pci_word(pci, param)] else _after(entry["args"], param)
        for lines, words in ((before, entry["args"]), (after, new)):
            lines += ['kernel="%s"' % entry["kernel"], 'args="%s"' % " ".join(words)]
    return {"before": "\n".join(before) + "\n", "after": "\n".join(after) + "\n"}


def kernel_param_plan(facts, param, grubby_info=""):
    """``{'family', 'route', 'commands', 'diff'}``: how ``param`` reaches every boot of the node.
    Route ``grub_dropin`` (Debian family: the role's drop-in and update-grub; no commands here) or
    ``grubby`` (RHEL family: :func:`grubby_commands` of ``grubby_info``, once it was read, and
    :func:`grubby_diff` of the boot entries they change; before that, none and ``{}``)."""
    family = paths(facts)
    route = family["kernel_param"]
    commands, diff = [], {}
    if route == "grubby" and grubby_info:
        commands = grubby_commands(grubby_info, param)
        diff = grubby_diff(grubby_info, param)
    return {"family": family["family"], "route": route, "commands": commands, "diff": diff}
