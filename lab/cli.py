# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m lab <verb>`: bring the simulated fleet up, look at it, reboot nodes, take it down."""

from __future__ import annotations

import argparse
import json
import sys

from .fleet import BOOT_TIMEOUT, DEFAULT_INVENTORY, DEFAULT_PROFILES, STATE_ENV, Fleet
from .preflight import LabError
from .rootfs import HOST_RELEASE, RELEASES


def _profiles(text):
    return [p.strip() for p in text.split(",") if p.strip()]


def parser():
    p = argparse.ArgumentParser(
        prog="python -m lab",
        description="The gpufleet lab: simulated GPU nodes (systemd, sshd, a sysfs PCI tree and "
        "stand-ins per node) and a real HAProxy, for the playbooks to run against.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help=f"where the lab keeps everything (default ${STATE_ENV} or <repo>/.lab-state)",
    )
    p.add_argument("--state-dir", metavar="DIR", default=None, help=argparse.SUPPRESS)
    real_sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    class _Sub:  # every verb takes --state-dir too
        @staticmethod
        def add_parser(name, **kw):
            return real_sub.add_parser(name, parents=[common], **kw)

    sub = _Sub()
    up = sub.add_parser("up", help="bring the fleet and the balancer up, write the inventory")
    up.add_argument(
        "--nodes", type=int, metavar="N", help="how many nodes (cycling the profile list; default: one per profile)"
    )
    up.add_argument(
        "--profiles", type=_profiles, metavar="P1,P2,...", help=f"node profiles (default {','.join(DEFAULT_PROFILES)})"
    )
    up.add_argument(
        "--os",
        type=_profiles,
        metavar="R1,R2,...",
        help=f"the nodes' Debian releases, in turn (of {', '.join(RELEASES)}; default {HOST_RELEASE}, the "
        "controller's own root); another release's root filesystem is built by debootstrap once and cached",
    )
    up.add_argument("--inventory", metavar="FILE", help="write the inventory here instead")
    up.add_argument(
        "--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for the nodes to finish booting"
    )
    sub.add_parser("down", help="stop everything and remove what `up` made")
    rb = sub.add_parser("reboot", help="power-cycle nodes (together): firmware defaults, empty /run, boot")
    rb.add_argument("nodes", nargs="+", metavar="node")
    ft = sub.add_parser("fault", help="inject a fault into a node's hardware model (at once), or `clear` them all")
    ft.add_argument("node")
    ft.add_argument(
        "kind",
        metavar="KIND",
        help="xid CODE, sxid CODE, remap-pending, ecc-uncorrectable, fabric-manager-stop, nvlink-down, "
        "hw-slowdown, link-degrade, aer, peermem-unload, driver-not-loaded, library-mismatch, no-devices, "
        "gpu-lost, allreduce-wrong|hang|truncate|crash|slow, engine-wedge, copy-engine-slow, dcgm-memory, dcgm-pcie, clear",
    )
    ft.add_argument("code", nargs="?", type=int, help="the Xid or SXid code (xid and sxid only)")
    ft.add_argument(
        "--gpu",
        type=int,
        default=0,
        metavar="N",
        help="model GPU index (default 0); for sxid, N picks the NVSwitch (N modulo 4)",
    )
    st = sub.add_parser("stop", help="power a node off (until `start`)")
    st.add_argument("node")
    sa = sub.add_parser("start", help="power a stopped node on")
    sa.add_argument("node")
    bal = sub.add_parser(
        "balancer",
        help="stop, start or restart the lab's HAProxy (and the pool's decider with it), or the decider alone",
    )
    bal.add_argument("action", choices=("stop", "start", "restart", "restart-decider"))
    status = sub.add_parser("status", help="nodes and balancer")
    status.add_argument("--json", action="store_true", help="machine-readable")
    inv = sub.add_parser(
        "inventory", help=f"write the Ansible inventory ({DEFAULT_INVENTORY.relative_to(DEFAULT_INVENTORY.parents[2])})"
    )
    inv.add_argument("--output", metavar="FILE", help="write it here instead")
    rep = sub.add_parser(
        "report",
        help="per node: gate verdict and pool membership against what a correct run must leave; exit 1 on any mismatch",
    )
    rep.add_argument("--json", action="store_true", help="machine-readable")
    al = sub.add_parser(
        "alerts", help="the alerts of the lab's Prometheus (pending and firing); --wait for one to fire"
    )
    al.add_argument("--json", action="store_true", help="machine-readable")
    al.add_argument("--wait", metavar="ALERT", help="wait until this alert fires (for every --node given)")
    al.add_argument(
        "--node", action="append", default=[], metavar="NODE", help="with --wait: the node it must fire for"
    )
    al.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits (default 120)")
    return p


def _print_status(st):
    if not st["nodes"]:
        print(f"lab: down (state directory {st['state_dir']})")
        return
    print(f"lab at {st['state_dir']} (subnet {st['subnet']})")
    print(f"  {'NODE':<8} {'ADDRESS':<15} {'PROFILE':<18} {'OS':<26} {'STATE':<12} REGISTER")
    for n in st["nodes"]:
        os_name = f"{n['os']} (Python {n['python'] or '?'})"
        print(
            f"  {n['name']:<8} {n['address']:<15} {n['profile']:<18} {os_name:<26} {n['state']:<12} "
            f"{'yes' if n['expect_registered'] else 'no (must stay out)'}"
        )
    b = st["balancer"]
    print(
        f"  balancer: HAProxy {b['state']}, frontend {b['frontend']}, backend {b['backend']}, "
        f"runtime socket {b['runtime_socket']}"
    )
    prom = st.get("prometheus")
    if prom:
        print(f"  prometheus: {prom['state']}, {prom['url']} (rules {prom['rules']})")


def _alerts(fleet, args):
    """`lab alerts`: print the alerts; with --wait, first wait until ALERT fires for every --node."""
    import time

    prom = fleet.prometheus()
    if not prom:
        raise LabError(
            f"no lab with a Prometheus at {fleet.state}: run `python -m lab up` (a lab brought up by an older "
            "checkout has none: `python -m lab down` first)"
        )
    deadline = time.monotonic() + args.timeout
    while True:
        alerts = prom.alerts()
        if not args.wait:
            break
        firing = {
            a["labels"].get("node")
            for a in alerts
            if a["labels"].get("alertname") == args.wait and a["state"] == "firing"
        }
        missing = [n for n in args.node if n not in firing] if args.node else ([] if firing else [args.wait])
        if not missing:
            break
        if time.monotonic() > deadline:
            raise LabError(
                f"{args.wait} is not firing for {', '.join(missing)} after {args.timeout:.0f} s; "
                f"see {prom.url}/alerts and `python -m lab alerts`"
            )
        time.sleep(1)
    if args.json:
        json.dump(alerts, sys.stdout, indent=1)
        print()
        return
    print(f"alerts of the lab's Prometheus {prom.url}/alerts:")
    if not alerts:
        print("  none")
    for a in sorted(alerts, key=lambda a: (a["labels"].get("alertname", ""), a["labels"].get("node", ""))):
        labels = a["labels"]
        print(
            f"  {a['state'].upper():<8} {labels.get('alertname', '?'):<32} node={labels.get('node', '-'):<8} "
            f"severity={labels.get('severity', '-')} since {a.get('activeAt', '?')[:19]}Z: "
            f"{a.get('annotations', {}).get('summary', '')}"
        )


def main(argv=None):
    args = parser().parse_args(argv)
    fleet = Fleet(args.state_dir)
    try:
        if args.verb == "up":
            fleet.up(
                nodes=args.nodes,
                profiles=args.profiles,
                inventory=args.inventory,
                timeout=args.timeout,
                releases=args.os,
            )
        elif args.verb == "down":
            fleet.down()
        elif args.verb == "reboot":
            fleet.reboot(*args.nodes)
        elif args.verb == "fault":
            from . import faults

            faults.inject(fleet, args.node, args.kind, args.code, args.gpu)
        elif args.verb == "stop":
            fleet.stop_node(args.node)
        elif args.verb == "start":
            fleet.start_node(args.node)
        elif args.verb == "balancer":
            fleet.balancer_ctl(args.action)
        elif args.verb == "alerts":
            _alerts(fleet, args)
        elif args.verb == "status":
            st = fleet.status()
            if args.json:
                json.dump(st, sys.stdout, indent=1)
                print()
            else:
                _print_status(st)
        elif args.verb == "inventory":
            print(fleet.write_inventory(args.output))
        elif args.verb == "report":
            from . import report

            rows, pool_error = report.gather(fleet)
            if args.json:
                json.dump({"nodes": rows, "balancer_error": pool_error}, sys.stdout, indent=1)
                print()
            else:
                print(report.render(rows, pool_error))
            return 0 if all(r["ok"] for r in rows) and not pool_error else 1
    except LabError as exc:
        print(f"lab {args.verb}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"lab {args.verb}: interrupted; run `python -m lab down` to clean up", file=sys.stderr)
        return 130
    return 0
