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
                             gpu-health-failed, health-unreadable, boot-id-unreadable,
                             engine-wedged, engine-down (the serving probe's verdict, with
                             --probe), probe-missing, probe-stale, probe-unreadable (no record of
                             this boot, an old one: the prober stopped, or one that cannot be
                             read),
                             allow-list-invalid (its --allow cannot be parsed: it cannot
                             tell whom to answer, so everyone who reaches it hears down),
                             agent-error (anything else that kept it from judging: a bad
                             command line, a missing module_utils copy, a bug)
    up #hold-<word>          with --budgeted WORD ...: the first reason's word is one the pool's
                             decider judges (gpu-health-failed, gate-failed by default) while the
                             engine still serves: HAProxy keeps the server, and the decider on the
                             balancer (gpufleet-pool-decider) drains it within the pool's budget.
                             Every other word stays `down`, and so does a budgeted one where
                             anything else keeps the node out too (its engine does not serve, its
                             marker is not of this boot)
    drain up #<word>         the node asked to be drained (--request, e.g. by its worker-recycle
                             timer before a restart); `maint` likewise. With --budgeted, a
                             `drain` whose reason is one of those words (`recycle` by default)
                             while nothing else keeps the node out is `up #hold-<word>`
                             instead: the decider drains it within the pool's budget
    ready up                 the node asked to return, until the request's `until` (epoch s)

`down` takes the server out of rotation whatever its health check says; `up` lets the health
check decide. The administrative words (drain, maint, ready) are said only on the node's own
request (a JSON file under /run written by root: {"state": "drain"|"maint"|"ready", "reason":
WORD, "until": EPOCH}), so operators' drains stay theirs otherwise. The readiness rule is
gpufleet.node's (module_utils ``_readiness``), imported by its collection name from the copy the role
installs beside this file (``ansible_collections/gpufleet/node/plugins/module_utils/...``).

It never exits without an answer to a client it may answer: whatever keeps it from judging
answers `down` with a word, and the reason (with the traceback of a bug) goes to the journal. A
silent agent is one HAProxy ignores, and the server would stay UP whatever the gate says.

With --allow, a client whose address is not in the list gets no answer (the socket's
IPAddressAllow= already keeps others out where the kernel supports it; this is the second check).
The list is parsed by the collection's one parser (module_utils ``lb/_allow``), the one the role's
preflight refuses a bad entry with.

With --probe (where the role installed the node's serving prober), the prober's record must
also say the engine serves (``serving`` or ``busy``) and be at most a bound derived from
--probe-interval and --probe-timeout old (module_utils ``serving/_probe``).

With --budgeted WORD ... (where the pool has a decider: role lb_registration passes it when the
balancer runs one, gpufleet_pool_budget), a fault of those words is the decider's to act on: a
false alarm on every node at once then cannot empty the pool (module_utils ``lb/_budget``).

    python3 /usr/local/lib/gpufleet/gpufleet_lb_agent.py --marker PATH [--boot-id PATH]
        [--request PATH] [--allow PREFIX ...] [--probe PATH --probe-interval S --probe-timeout S]
        [--budgeted WORD ...]
"""

import argparse
import ipaddress
import json
import os
import re
import socket
import sys
import time
import traceback

#: The administrative states a node may ask for, and HAProxy's words for them.
REQUESTS = ("drain", "maint", "ready")
_WORD = re.compile(r"[^a-z0-9-]+")


def log(message):
    sys.stderr.write("gpufleet-lb-agent: %s\n" % message)
    sys.stderr.flush()


def short_word(text, default):
    """A reason HAProxy may show: lower-case letters, digits and dashes, at most 32."""
    word = _WORD.sub("-", str(text or "").lower()).strip("-")[:32]
    return word or default


class UsageError(Exception):
    """A command line the agent cannot run with (argparse would exit without an answer)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def peer_address():
    """The client's address (None when standard input is not a connected IP socket)."""
    try:
        sock = socket.socket(fileno=os.dup(0))
    except OSError:
        return None
    try:
        # an IPv6 link-local peer comes with its zone ("fe80::1%eth0"), which Python 3.8 refuses
        address = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
    except (OSError, ValueError, IndexError, TypeError, AttributeError):
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


def answer(marker, boot_id, request=None, health=None, probe=None, probe_interval=5.0, probe_timeout=10.0, budgeted=()):
    """``(line, detail)``: the one line for HAProxy, and what the journal gets besides."""
    # the copy of the collection's module_utils the role installs beside this file
    from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

    probed = {}
    if probe:
        from ansible_collections.gpufleet.node.plugins.module_utils.serving._probe_record import max_age

        probed = {"probe_path": probe, "probe_max_age": max_age(probe_interval, probe_timeout)}
    if budgeted:
        # every part that keeps the node out: held only where each is one the decider judges
        parts, reasons = _readiness.agent_words(marker, boot_id, health, **probed)
        word = parts[0] if parts else None
        hold = word if parts and all(w in budgeted for w in parts) else None
    else:
        (word, reasons), hold = _readiness.agent_verdict(marker, boot_id, health, **probed), None
    state, why = read_request(request)
    if budgeted and state == "drain" and why in budgeted and not (word and not hold):
        # the node's own drain (worker_recycle) is a removal like a fault's: the decider's, within
        # the budget, so that every node recycling at once cannot empty the pool
        hold, state = hold or why, None
        reasons = [*reasons, "the node asked to be drained (%s)" % why]
    words = [state] if state else []
    words.append("down" if word and not hold else "up")
    if hold:
        words.append("#hold-" + hold)
        reasons = [*reasons, "held in rotation for the pool's decider (its budget decides the removal)"]
    elif word:
        words.append("#" + word)
    elif state in ("drain", "maint"):
        words.append("#" + why)
    detail = "; ".join(reasons)
    if state:
        detail = ("%s; " % detail if detail else "") + "the node asked for %s (%s)" % (state, why)
    return " ".join(words), detail


def say(line, peer, detail):
    """Answer ``line``; log it with ``detail`` unless it is ``up``."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if line != "up":
        log("answered %r to %s: %s" % (line, peer or "?", detail))


def main(argv=None):
    """Answer the connection on standard input: 0 when answered (or refused to a client outside
    --allow), 1 when it had to answer ``down`` because it could not judge."""
    peer = None
    try:
        peer = peer_address()
        return serve(argv, peer)
    except Exception as exc:  # a malformed record, a missing module_utils copy, a bug: down, never silence
        say("down #agent-error", peer, "cannot judge: %s: %s" % (type(exc).__name__, exc))
        log(traceback.format_exc().rstrip())
        return 1


def serve(argv, peer):
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--marker", required=True, help="the NCCL gate's readiness marker (JSON)")
    parser.add_argument(
        "--boot-id", default="/proc/sys/kernel/random/boot_id", help="where the current boot id is read"
    )
    parser.add_argument("--request", default="", help="the node's own drain/maint/ready request (JSON)")
    parser.add_argument(
        "--allow", nargs="*", default=None, help="addresses or prefixes that get an answer (localhost, any)"
    )
    parser.add_argument("--probe", default="", help="the serving probe's record (JSON); empty: not judged")
    parser.add_argument("--probe-interval", type=float, default=5.0, help="the prober's interval (s)")
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="the prober's deadline (s)")
    parser.add_argument(
        "--budgeted",
        nargs="*",
        default=[],
        help="words whose removal the pool's decider judges: answered `up #hold-WORD` while the engine serves",
    )
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        say("down #agent-error", peer, "cannot judge: bad command line (%s); see the unit's ExecStart=" % exc)
        return 1
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # the copy of the collection's module_utils the role installs beside this file
    from ansible_collections.gpufleet.node.plugins.module_utils.lb import _allow

    if args.allow is not None and peer is not None:
        try:
            nets = _allow.parse(args.allow)
        except ValueError as exc:
            # whom to answer is unknown: the balancer may be among the entries lost, and a silent
            # agent would leave the server UP; the socket's own filter still applies
            say("down #allow-list-invalid", peer, "cannot tell whom to answer: --allow %s" % exc)
            return 1
        if not _allow.allows(nets, peer):
            log("no answer to %s: not one of the balancer's addresses (%s)" % (peer, " ".join(args.allow)))
            return 0
    line, detail = answer(
        args.marker,
        args.boot_id,
        args.request,
        probe=args.probe,
        probe_interval=args.probe_interval,
        probe_timeout=args.probe_timeout,
        budgeted=[short_word(w, "") for w in args.budgeted],
    )
    say(line, peer, detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
