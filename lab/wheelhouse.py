# SPDX-License-Identifier: GPL-3.0-or-later
"""The wheelhouse of the nodes' boot validation runtime, which scripts/setup.sh downloads once and
the lab's inventory names (boot_validation_wheelhouse): the wheels of
roles/boot_validation/files/requirements-node.txt for every Python a node's runtime may run on
(ansible-core 2.19's controller range: bookworm's 3.11, Ubuntu 24.04's 3.12, trixie's 3.13), so
that the lab's nodes, whatever their release, need no network.

    <cache>/gpufleet/wheelhouse-<key>   key: the first 16 hex digits of the sha256 of the
                                        requirements file and the Python versions

``python -m lab.wheelhouse`` prints its path and the versions, comma-separated (for setup.sh).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent.parent / "roles/boot_validation/files/requirements-node.txt"
NODE_PYTHONS = ("3.11", "3.12", "3.13")


def path():
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + f"python {' '.join(NODE_PYTHONS)}\n".encode())
    return cache / "gpufleet" / f"wheelhouse-{key.hexdigest()[:16]}"


if __name__ == "__main__":
    print(path(), ",".join(NODE_PYTHONS))
