# SPDX-License-Identifier: GPL-3.0-or-later
"""lb/_allow: the one parser of the HAProxy agent's allow list (the agent's --allow and the
lb_registration role's preflight, through the filter gpufleet.node.lb_agent_allow_problems). One
test per class of entry: what it stands for, or the message that names it and says why."""

from __future__ import annotations

import ipaddress
import re

import pytest

from ansible_collections.gpufleet.node.plugins.filter.lb_agent import lb_agent_allow_problems
from ansible_collections.gpufleet.node.plugins.module_utils.lb import _allow


def networks(entry):
    return [str(n) for n in _allow.parse_entry(entry)]


def refused(entry):
    """The message of a refused entry, which names it (and the filter's, which is the same)."""
    with pytest.raises(_allow.AllowListError) as caught:
        _allow.parse_entry(entry)
    message = str(caught.value)
    assert caught.value.entry == entry
    assert lb_agent_allow_problems(["10.0.0.2", entry, "any"]) == [message]
    with pytest.raises(_allow.AllowListError, match="^" + re.escape(message) + "$"):
        _allow.parse(["10.0.0.2", entry])
    return message


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("10.0.0.2", ["10.0.0.2/32"]),
        ("0.0.0.0", ["0.0.0.0/32"]),
        ("255.255.255.255", ["255.255.255.255/32"]),
        ("10.0.0.0/24", ["10.0.0.0/24"]),
        ("10.0.0.7/8", ["10.0.0.0/8"]),  # host bits masked, as systemd's IPAddressAllow= does
        ("192.168.1.1/32", ["192.168.1.1/32"]),
        ("10.0.0.0/0", ["0.0.0.0/0"]),
    ],
)
def test_ipv4_addresses_and_prefixes(entry, expected):
    assert networks(entry) == expected


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("fd00::2", ["fd00::2/128"]),
        ("::1", ["::1/128"]),
        ("FD00:0:0:0:0:0:0:2", ["fd00::2/128"]),
        ("fd00::/64", ["fd00::/64"]),
        ("fd00::5/64", ["fd00::/64"]),
        ("2001:db8::/128", ["2001:db8::/128"]),
        ("::ffff:10.0.0.2", ["::ffff:a00:2/128"]),
    ],
)
def test_ipv6_addresses_and_prefixes(entry, expected):
    assert networks(entry) == expected


def test_keywords_any_and_localhost():
    assert networks("any") == ["0.0.0.0/0", "::/0"]
    assert networks("localhost") == ["127.0.0.0/8", "::1/128"]
    assert _allow.problems(["any"]) == [] and _allow.problems(["localhost", "10.0.0.0/8", "fd00::/8"]) == []


@pytest.mark.parametrize("entry", ["10.0.0.300", "300.1.1.1/8", "256.0.0.0", "10.0.999.1/24"])
def test_octet_over_255(entry):
    assert "is not an IPv4 address" in refused(entry) and "> 255" in refused(entry)


@pytest.mark.parametrize(
    "entry, version, top",
    [
        ("10.0.0.0/33", 4, 32),
        ("10.0.0.0/320", 4, 32),
        ("fd00::/129", 6, 128),
        ("10.0.0.0/", 4, 32),
        ("10.0.0.0/-1", 4, 32),
        ("10.0.0.0/+8", 4, 32),
        ("10.0.0.0/08", 4, 32),
        ("10.0.0.0/8/8", 4, 32),
        ("10.0.0.0/255.0.0.0", 4, 32),  # a netmask, not a length
    ],
)
def test_prefix_length_out_of_range(entry, version, top):
    assert f"IPv{version} takes 0-{top}" in refused(entry)


@pytest.mark.parametrize("entry", ["lb1.example.com", "balancer", "lb1", "Any", "LOCALHOST", "lb1.example.com/24"])
def test_host_names(entry):
    assert "a host name?" in refused(entry)


@pytest.mark.parametrize("entry", ["link-local", "multicast"])
def test_systemd_keywords_the_agent_does_not_know(entry):
    message = refused(entry)
    assert "systemd keyword" in message
    # the prefixes it names are entries the agent takes
    given = message.rsplit("(", 1)[1].rstrip(")").split()
    assert given and _allow.problems(given) == []


@pytest.mark.parametrize("entry", ["010.0.0.1", "10.0.0.01", "10.00.0.1/8"])
def test_leading_zeros(entry):
    assert "without leading zeros" in refused(entry)


@pytest.mark.parametrize(
    "entry",
    ["10.0.0", "10.0.0.1.5", "1e1.0.0.1", "10..0.1", "10.0.0.1.", "0x0a.0.0.1", "::g", "1:2:3:4:5:6:7:8:9", "fd00:::1"],
)
def test_malformed_addresses(entry):
    assert "is not an IPv" in refused(entry)


@pytest.mark.parametrize("entry", ["fe80::1%eth0", "fe80::%2/64"])
def test_zone_index(entry):
    assert "zone index" in refused(entry)


@pytest.mark.parametrize("entry", [" 10.0.0.2", "10.0.0.2 ", "10.0.0.2 10.0.0.3", "10.0.0.2\n", "any\t"])
def test_whitespace(entry):
    assert "whitespace" in refused(entry)


def test_empty_entry_and_empty_list():
    assert refused("") == "the empty entry is no address (a balancer host without an IP address as ansible_host?)"
    assert _allow.problems([]) == ["the list is empty: the agent would answer nobody"]
    with pytest.raises(_allow.AllowListError, match="the list is empty"):
        _allow.parse([])


@pytest.mark.parametrize("entry", [10, None, True, ["10.0.0.2"], {"address": "10.0.0.2"}])
def test_entries_that_are_not_text(entry):
    assert "is not text" in refused(entry)


@pytest.mark.parametrize("entries", ["10.0.0.2", b"any", 10, None])
def test_a_list_that_is_no_list(entries):
    assert _allow.problems(entries) == ["%r is not a list of entries" % (entries,)]
    with pytest.raises(_allow.AllowListError, match="is not a list of entries"):
        _allow.parse(entries)


def test_every_bad_entry_is_named_in_order():
    assert [p.split(" ", 2)[1] for p in _allow.problems(["link-local", "10.0.0.2", "10.0.0.300", "lb1"])] == [
        "'link-local'",
        "'10.0.0.300'",
        "'lb1'",
    ]


@pytest.mark.parametrize(
    "address, allowed",
    [
        ("10.0.0.9", True),
        ("10.0.1.9", False),
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:10.0.0.9", True),  # an IPv4 client of a dual-stack socket
        ("::ffff:10.0.1.9", False),
        ("fd00::9", True),
        ("fd01::9", False),
    ],
)
def test_allows_compares_the_clients_address(address, allowed):
    nets = _allow.parse(["10.0.0.0/24", "localhost", "fd00::/64"])
    assert _allow.allows(nets, ipaddress.ip_address(address)) is allowed
