# -*- coding: utf-8 -*-
# Copyright: gpufleet.node developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Who gets an answer from the node's HAProxy agent: the one parser of its allow list, used by the
agent itself (copied beside it onto the node) and by the lb_registration role's preflight (filter
``gpufleet.node.lb_agent_allow_problems``), so the role refuses exactly what the agent could not
parse. Plain Python 3.8+ standard library, no Ansible.

An entry is an IP address (``10.0.0.2``, ``fd00::2``), a prefix (``10.0.0.0/24``, ``fd00::/64``;
host bits are masked, as systemd's ``IPAddressAllow=`` does), ``localhost`` (127.0.0.0/8 and
::1/128) or ``any`` (every IPv4 and IPv6 client). The same list is the agent socket's
``IPAddressAllow=``, so nothing is accepted here that systemd reads otherwise: no host names (the
agent compares the client's address, it resolves nothing), no zone index (``fe80::1%eth0``), no
leading zeros in an IPv4 octet (``010.0.0.1``: octal to some parsers, refused by others and by
Python from 3.9.5), no whitespace (the list is joined with spaces), and none of systemd's other
keywords (``link-local``, ``multicast``), which the agent does not know: give their prefixes.
"""

from __future__ import annotations

import ipaddress
import re

#: The keywords an entry may be, and the prefixes each stands for.
KEYWORDS = {"localhost": ("127.0.0.0/8", "::1/128"), "any": ("0.0.0.0/0", "::/0")}
#: systemd's keywords that the agent does not take, and the prefixes to give instead.
_SYSTEMD_ONLY = {"link-local": "169.254.0.0/16 fe80::/64", "multicast": "224.0.0.0/4 ff00::/8"}
_IPV4 = re.compile(r"^(0|[1-9][0-9]{0,2})(\.(0|[1-9][0-9]{0,2})){3}$")
_PREFIX_LEN = re.compile(r"^(0|[1-9][0-9]{0,2})$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?$")
_SPACE = re.compile(r"\s")


class AllowListError(ValueError):
    """An entry of the allow list that is not an address, a prefix, ``localhost`` or ``any``;
    ``entry`` is the entry, the message names it and says why."""

    def __init__(self, entry, why):
        self.entry = entry
        self.why = why
        super().__init__("%s %s" % (_shown(entry), why))


def _shown(entry):
    if entry == []:
        return "the list"
    return "the empty entry" if entry == "" else "entry %r" % (entry,)


def _address(text, entry):
    """The ipaddress object of ``text`` (an entry's address part)."""
    if ":" in text:
        if "%" in text:
            raise AllowListError(entry, "has a zone index (%...): give the address or prefix without it")
        try:
            return ipaddress.IPv6Address(text)
        except ValueError as exc:
            raise AllowListError(entry, "is not an IPv6 address: %s" % exc) from None
    if not _IPV4.match(text):
        # a name whose last label is a number is a mistyped IPv4 address, not a host name
        if _HOSTNAME.match(text) and not text.rstrip(".").rpartition(".")[2].isdigit():
            raise AllowListError(
                entry,
                "is not an IP address or prefix (a host name? the agent compares the client's address and "
                "resolves nothing: give the balancer's IP address as the node sees it)",
            )
        raise AllowListError(
            entry, "is not an IPv4 address (four decimal octets 0-255 without leading zeros, e.g. 10.0.0.2)"
        )
    try:
        return ipaddress.IPv4Address(text)
    except ValueError as exc:
        raise AllowListError(entry, "is not an IPv4 address: %s" % exc) from None


def parse_entry(entry):
    """The networks one entry stands for (a list of ``ipaddress`` networks); AllowListError
    naming the entry when it is none of the forms above."""
    if not isinstance(entry, str):
        raise AllowListError(entry, "is not text (%s): give an IP address or prefix" % type(entry).__name__)
    if entry == "":
        raise AllowListError(entry, "is no address (a balancer host without an IP address as ansible_host?)")
    if _SPACE.search(entry):
        raise AllowListError(entry, "holds whitespace: give one address or prefix per entry")
    if entry in KEYWORDS:
        return [ipaddress.ip_network(item) for item in KEYWORDS[entry]]
    if entry in _SYSTEMD_ONLY:
        raise AllowListError(
            entry, "is a systemd keyword the agent does not know: give its prefixes (%s)" % _SYSTEMD_ONLY[entry]
        )
    text, slash, length = entry.partition("/")
    address = _address(text, entry)
    if not slash:
        return [ipaddress.ip_network(address)]
    if not _PREFIX_LEN.match(length) or int(length) > address.max_prefixlen:
        raise AllowListError(
            entry, "has the prefix length %r: IPv%d takes 0-%d" % (length, address.version, address.max_prefixlen)
        )
    return [ipaddress.ip_network("%s/%s" % (address, length), strict=False)]


def parse(entries):
    """The networks of every entry, in order; AllowListError naming the first bad one (or saying
    that the list is empty: the agent would answer nobody)."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        raise AllowListError(entries, "is not a list of entries")
    networks = []
    for entry in entries:
        networks.extend(parse_entry(entry))
    if not networks:
        raise AllowListError([], "is empty: the agent would answer nobody")
    return networks


def problems(entries):
    """Why each bad entry is refused (``["entry '10.0.0.300' is not an IPv4 address: ..."]``);
    [] when the agent can parse the whole list. An empty list is a problem of its own: the agent
    would answer nobody."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        return ["%r is not a list of entries" % (entries,)]
    found = []
    count = 0
    for entry in entries:
        count += 1
        try:
            parse_entry(entry)
        except AllowListError as exc:
            found.append(str(exc))
    if not count:
        found.append(str(AllowListError([], "is empty: the agent would answer nobody")))
    return found


def allows(networks, address):
    """Whether ``address`` (an ``ipaddress`` address; an IPv4-mapped IPv6 address, as a dual-stack
    socket reports an IPv4 client, counts as its IPv4 address too) is in one of ``networks``."""
    candidates = [address]
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        candidates.append(mapped)
    return any(a.version == net.version and a in net for a in candidates for net in networks)
