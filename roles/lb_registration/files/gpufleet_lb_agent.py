# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-lb-agent: tells HAProxy whether this node may take traffic (HAProxy's agent-check).

Run once per connection by gpufleet-lb-agent.socket (systemd, Accept=yes; installed by the
gpufleet.node.lb_registration role); the socket is the standard output. It answers one line:

    up                       the NCCL gate's marker is from this boot and says passed
    down #<why>              anything else: no marker (the gate has not run since boot), a marker
                             of an earlier boot, a failed gate, an unreadable marker

`down` takes the server out of rotation whatever its health check says; `up` lets the health
check decide. HAProxy wants a space before the `#` of the description (`down#why` is read as an
unknown word and ignored). The agent never touches the administrative state (ready, drain,
maint): that stays with the operators and the registration role.

    python3 /usr/local/lib/gpufleet/gpufleet_lb_agent.py --marker PATH [--boot-id PATH]
"""
import argparse
import json
import sys


def verdict(marker_path, boot_id_path):
    """The agent's answer, without the line end."""
    try:
        with open(boot_id_path) as f:
            boot_id = f.read().strip()
    except OSError as exc:
        return f"down #cannot read the boot id at {boot_id_path}: {exc.strerror}"
    try:
        with open(marker_path) as f:
            marker = json.load(f)
    except FileNotFoundError:
        return f"down #no NCCL gate marker at {marker_path}: the gate has not run since boot"
    except (OSError, ValueError) as exc:
        return f"down #unreadable NCCL gate marker at {marker_path}: {exc}"
    if not isinstance(marker, dict):
        return f"down #unreadable NCCL gate marker at {marker_path}: not a JSON object"
    if marker.get("boot_id") != boot_id:
        return f"down #the NCCL gate marker is from another boot ({marker.get('boot_id')})"
    if marker.get("passed") is not True:
        return f"down #the NCCL gate failed: {marker.get('reason') or 'no reason recorded'}"
    return "up"


def one_line(text, limit=200):
    """HAProxy reads one line; the description goes to its stats page and logs."""
    return " ".join(str(text).split())[:limit]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marker", required=True, help="the NCCL gate's readiness marker (JSON)")
    parser.add_argument("--boot-id", default="/proc/sys/kernel/random/boot_id",
                        help="where the current boot id is read")
    args = parser.parse_args(argv)
    sys.stdout.write(one_line(verdict(args.marker, args.boot_id)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
