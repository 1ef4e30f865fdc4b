# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests ``all_reduce_perf``'s command line (``-b -e -f -g -n -w -c``), and one bounded run of it.

Plain Python, no Ansible.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.common import _proc

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)\s*[bB]?\s*$")
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text):
    """Bytes for a size as nccl-tests takes it (``8``, ``128K``, ``512M``, ``8G``; powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size: use bytes or a number with K, M or G (powers of 1024)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def build_argv(binary, min_bytes, max_bytes, step_factor, gpus, iters, warmup_iters, check):
    """The argv of one all_reduce_perf run (one process, ``gpus`` GPUs driven by one thread)."""
    return [
        binary,
        "-b",
        str(parse_size(min_bytes)),
        "-e",
        str(parse_size(max_bytes)),
        "-f",
        str(step_factor),
        "-g",
        str(gpus),
        "-n",
        str(iters),
        "-w",
        str(warmup_iters),
        "-c",
        "1" if check else "0",
    ]


def run(argv, environment=None, timeout=900):
    """Run one all_reduce_perf; returns ``(rc, output, timed_out, seconds)``.

    ``_proc.run`` does the waiting: its own process group, killed on expiry of ``timeout``
    (SIGTERM, then SIGKILL 5 s later); ``rc`` is None after a timeout.  stderr is merged into
    stdout so that the NCCL log lines stay where they were printed.  ``LC_ALL=C`` is always set.
    """
    result = _proc.run(argv, timeout, environment, merge_stderr=True)
    return result.rc, result.stdout, result.timed_out, result.seconds
