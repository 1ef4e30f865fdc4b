# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-lb-agent: tells HAProxy whether this node may take traffic (HAProxy's agent-check).

Run once per connection by gpufleet-lb-agent.socket (systemd, Accept=yes; installed by the
gpufleet.node.lb_registration role); the socket is the standard input and output. It answers one
line of HAProxy's agent protocol and nothing else: no boot id, PCI address or figure (those go to
the node's journal, standard error here, and stay in the gate's JSON):

    up                       the NCCL gate's marker is from this boot and says passed
    down #<word>             anything else: no-marker (the gate has not run since boot),
                             stale-marker (an earlier boot's), gate-failed, marker-unreadable,
                             gpu-health-failed, health-unreadable, boot-id-unreadable
    drain up #<word>         the node asked to be drained (--request, e.g. by its worker-recycle
                             timer before a restart); `maint` likewise
    ready up                 the node asked to return, until the request's `until` (epoch s)

`down` takes the server out of rotation whatever its health check says; `up` lets the health
check decide. The administrative words (drain, maint, ready) are said only on the node's own
request (a JSON file under /run written by root: {"state": "drain"|"maint"|"ready", "reason":
WORD, "until": EPOCH}), so operators' drains stay theirs otherwise. The readiness rule is
gpufleet.node's (module_utils ``_readiness``), imported by its collection name from the copy the role
installs beside this file (``ansible_collections/gpufleet/node/plugins/module_utils/...``).

With --allow, a client whose address is not in the list gets no answer (the socket's
IPAddressAllow= already keeps others out where the kernel supports it; this is the second check).

    python3 /usr/local/lib/gpufleet/gpufleet_lb_agent.py --marker PATH [--boot-id PATH]
        [--request PATH] [--allow PREFIX ...]
"""

import argparse
import ipaddress
import json
import os
import re
import socket
import sys
import time

#: The administrative states a node may ask for, and HAProxy's words for them.
REQUESTS = ("drain", "maint", "ready")
_WORD = re.compile(r"[^a-z0-9-]+")
_KEYWORDS = {"localhost": ("127.0.0.0/8", "::1/128"), "any": ("0.0.0.0/0", "::/0")}


def log(message):
    sys.stderr.write("gpufleet-lb-agent: %s\n" % message)
    sys.stderr.flush()


def short_word(text, default):
    """A reason HAProxy may show: lower-case letters, digits and dashes, at most 32."""
    word = _WORD.sub("-", str(text or "").lower()).strip("-")[:32]
    return word or default


def allowed_networks(entries):
    nets = []
    for entry in entries:
        for item in _KEYWORDS.get(entry, (entry,)):
            nets.append(ipaddress.ip_network(item, strict=False))
    return nets


def peer_address():
    """The client's address (None when standard input is not a connected IP socket)."""
    try:
        sock = socket.socket(fileno=os.dup(0))
    except OSError:
        return None
    try:
        address = ipaddress.ip_address(sock.getpeername()[0])
    except (OSError, ValueError, IndexError, TypeError):
        return None
    finally:
        sock.close()
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def read_request(path, now=None):
    """``(state, word)`` the node asked for, or ``(None, None)``: none, unreadable, or a `ready`
    whose time is over."""
    if not path:
        return None, None
    try:
        with open(path) as handle:
            request = json.load(handle)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        log("ignoring the unreadable request %s: %s" % (path, exc))
        return None, None
    state = request.get("state") if isinstance(request, dict) else None
    if state not in REQUESTS:
        log("ignoring the request %s: state must be one of %s" % (path, ", ".join(REQUESTS)))
        return None, None
    until = request.get("until")
    if state == "ready" and not (isinstance(until, (int, float)) and (now or time.time()) < until):
        return None, None
    return state, short_word(request.get("reason"), "requested")


def answer(marker, boot_id, request=None, health=None):
    """``(line, detail)``: the one line for HAProxy, and what the journal gets besides."""
    # the copy of the collection's module_utils the role installs beside this file
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl._readiness import agent_verdict

    word, reasons = agent_verdict(marker, boot_id, health)
    state, why = read_request(request)
    words = [state] if state else []
    words.append("down" if word else "up")
    if word:
        words.append("#" + word)
    elif state in ("drain", "maint"):
        words.append("#" + why)
    detail = "; ".join(reasons)
    if state:
        detail = ("%s; " % detail if detail else "") + "the node asked for %s (%s)" % (state, why)
    return " ".join(words), detail


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marker", required=True, help="the NCCL gate's readiness marker (JSON)")
    parser.add_argument(
        "--boot-id", default="/proc/sys/kernel/random/boot_id", help="where the current boot id is read"
    )
    parser.add_argument("--request", default="", help="the node's own drain/maint/ready request (JSON)")
    parser.add_argument(
        "--allow", nargs="*", default=None, help="addresses or prefixes that get an answer (localhost, any)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    peer = peer_address()
    if args.allow is not None and peer is not None:
        try:
            nets = allowed_networks(args.allow)
        except ValueError as exc:
            log("no answer: bad --allow: %s" % exc)
            return 2
        if not any(peer.version == net.version and peer in net for net in nets):
            log("no answer to %s: not one of the balancer's addresses (%s)" % (peer, " ".join(args.allow)))
            return 0
    line, detail = answer(args.marker, args.boot_id, args.request)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if line != "up":
        log("answered %r to %s: %s" % (line, peer or "?", detail))
    return 0


if __name__ == "__main__":
    sys.exit(main())
