# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How the collection asks NVML (nvidia-ml-py's ``pynvml``) for a fact a GPU or driver may not have.

Plain Python, no Ansible; ``nvml`` is the imported ``pynvml`` module (or a stand-in with its names).
"""

from __future__ import annotations


def optional(nvml, name, *args):
    """``nvml.<name>(*args)``, or None where the binding lacks the function or NVML answers an
    error (NotSupported, FunctionNotFound, ...): a missing fact is not a failure of the GPU."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def text(value):
    """NVML strings: bytes from older bindings, str from newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
