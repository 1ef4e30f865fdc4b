# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a process running as root replaces a file: the one way the node-side agents write.

Standard library only, importable on its own (the worker-recycle agent and the GPU health
watcher run it from copies the roles install beside them).
"""

from __future__ import annotations

import os
import tempfile


def write(path, text, mode=0o644):
    """Replace ``path`` with ``text``. The new file is made by ``mkstemp`` in the same directory
    (a fresh random name opened O_EXCL, so a symlink planted there is never followed), its mode
    set on the open descriptor, flushed to disk and renamed over ``path`` (a symlink at ``path``
    is replaced, not written through); then the directory is synced. A reader sees the old file
    or the new one, never part of one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
