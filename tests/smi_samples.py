# SPDX-License-Identifier: GPL-3.0-or-later
"""The ``nvidia-smi -q`` samples of tests/data/nvidia-smi-q as whole reports.

The samples keep the header and the first GPU block of a report from an 8-GPU machine, so their
``Attached GPUs : 8`` disagrees with the one block kept; ``whole`` replaces that one value with the
number of blocks kept (as the README there allows: one value replaced, nothing written by hand), so
that a test of a healthy GPU reads a consistent report. ``as_posted`` is the file byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "nvidia-smi-q"
_ATTACHED_RE = re.compile(r"^(Attached GPUs\s*:\s*)\d+\s*$", re.M)
_BLOCK_RE = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$", re.M)


def as_posted(name):
    return (DATA / name).read_text()


def whole(text_or_name):
    """The report with ``Attached GPUs`` set to its number of GPU blocks."""
    text = as_posted(text_or_name) if "\n" not in text_or_name else text_or_name
    blocks = len(_BLOCK_RE.findall(text))
    return _ATTACHED_RE.sub(lambda m: "%s%d" % (m.group(1), blocks), text, count=1)
