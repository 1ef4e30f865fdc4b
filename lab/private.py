# SPDX-License-Identifier: GPL-3.0-or-later
"""Files of the lab that only their owner may read: the vault password, the vaulted secrets, the
serving API key Prometheus sends."""

from __future__ import annotations

import os


def write_private(path, text):
    """Write text to path, mode 0600 (also when the file was there before)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)
        handle.write(text)
