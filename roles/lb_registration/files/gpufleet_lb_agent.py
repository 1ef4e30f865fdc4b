# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet-lb-agent: tells HAProxy whether this node may take traffic (HAProxy's agent-check).

Run once per connection by gpufleet-lb-agent.socket (systemd, Accept=yes; installed by the
gpufleet.node.lb_registration role); the socket is the standard output. It answers one line:

    up                       the NCCL gate's marker is from this boot and says passed
    down #<why>              anything else: no marker (the gate has not run since boot), a marker
                             of an earlier boot, a failed gate, an unreadable marker

`down` takes the server out of rotation whatever its health check says; `up` lets the health
check decide. The agent never touches the administrative state (ready, drain, maint): that stays
with the operators and the registration role. The rule is gpufleet.node's _readiness.py,
installed beside this file.

    python3 /usr/local/lib/gpufleet/gpufleet_lb_agent.py --marker PATH [--boot-id PATH]
"""

import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marker", required=True, help="the NCCL gate's readiness marker (JSON)")
    parser.add_argument(
        "--boot-id", default="/proc/sys/kernel/random/boot_id", help="where the current boot id is read"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _readiness import agent_answer  # installed beside this file

    sys.stdout.write(agent_answer(args.marker, args.boot_id) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
