# SPDX-License-Identifier: GPL-3.0-or-later
"""What the lab's daemon stand-ins (nvidia-persistenced, nv-fabricmanager) share: load the node's
hardware model, and stay in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import sys
import time

from lab.hwmodel import Node


def load_node(prog):
    """The node's hardware model, or None after saying on stderr why it cannot be loaded."""
    try:
        return Node.load()
    except RuntimeError as exc:
        sys.stderr.write("%s (lab): %s\n" % (prog, exc))
        return None


def stop_flag():
    """A list that turns non-empty on SIGTERM or SIGINT (handlers installed now)."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    return stopping


def serve(stopping, banner):
    """Write ``banner`` to stdout, then wait until ``stopping`` turns non-empty."""
    sys.stdout.write(banner)
    sys.stdout.flush()
    while not stopping:
        time.sleep(0.5)
