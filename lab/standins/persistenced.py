# SPDX-License-Identifier: GPL-3.0-or-later
"""`nvidia-persistenced` for a lab machine: the driver's persistence daemon, as a stand-in.

Run by the node's `nvidia-persistenced.service` (lab/hwmodel/units.py) on every GPU profile.  The
real daemon holds the GPUs' device files open so the driver stays initialised between jobs; the
lab's GPUs always report persistence mode Enabled (`nvidia-smi -q`, NVML), so the stand-in only
has to be a real, running service: it checks that it runs on a lab machine and stays in the
foreground until stopped (SIGTERM, `systemctl stop`), then exits 0.
"""

from __future__ import annotations

import signal
import sys
import time

from lab.hwmodel import Node


def main(argv=None):
    try:
        node = Node.load()
    except RuntimeError as exc:
        sys.stderr.write("nvidia-persistenced (lab): %s\n" % exc)
        return 1
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    sys.stdout.write("nvidia-persistenced (lab): persistence mode enabled on %d GPUs\n" % len(node.gpus))
    sys.stdout.flush()
    while not stopping:
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
