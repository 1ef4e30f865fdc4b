# SPDX-License-Identifier: GPL-3.0-or-later
"""`nvidia-persistenced` for a lab machine: the driver's persistence daemon, as a stand-in.

Run by the node's `nvidia-persistenced.service` (lab/hwmodel/units.py) on every GPU profile.  The
real daemon holds the GPUs' device files open so the driver stays initialised between jobs; the
lab's GPUs always report persistence mode Enabled (`nvidia-smi -q`, NVML), so the stand-in only
has to be a real, running service: it checks that it runs on a lab machine and stays in the
foreground until stopped (SIGTERM, `systemctl stop`), then exits 0.
"""

from __future__ import annotations

import sys

from lab.standins._daemon import load_node, serve, stop_flag


def main(argv=None):
    node = load_node("nvidia-persistenced")
    if node is None:
        return 1
    stopping = stop_flag()
    serve(stopping, "nvidia-persistenced (lab): persistence mode enabled on %d GPUs\n" % len(node.gpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
