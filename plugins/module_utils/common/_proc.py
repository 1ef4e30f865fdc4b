# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run an external command with a deadline: the one way the collection's modules wait on a child.

Plain Python (no Ansible imports), runs on target Python 3.8+. Ansible's ``run_command`` has no
timeout, so a hung ``nvidia-smi``, ``setpci`` or ``all_reduce_perf`` would hold a play forever.
Here the child starts in a new session (its own process group), so that on expiry the whole group
-- the command and anything it forked -- gets SIGTERM, then SIGKILL 5 s later. ``LC_ALL=C`` is
always set; argv only, never a shell.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import time

#: Where a bare command name is looked for after ``PATH`` (as Ansible's ``get_bin_path`` does).
SBIN_DIRS = ("/sbin", "/usr/sbin", "/usr/local/sbin")

#: ``rc`` is None after a timeout; ``stderr`` is '' when it was merged into ``stdout``.
Result = collections.namedtuple("Result", "rc stdout stderr timed_out seconds")


def run(argv, timeout, environment=None, merge_stderr=False):
    """Run ``argv`` with a deadline of ``timeout`` seconds; returns a :class:`Result`."""
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (environment or {}).items()})
    env["LC_ALL"] = "C"
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    timed_out = False
    out, err = b"", b""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
    rc = None if timed_out else proc.returncode
    return Result(
        rc,
        (out or b"").decode("utf-8", "replace"),
        (err or b"").decode("utf-8", "replace"),
        timed_out,
        time.monotonic() - started,
    )


def describe_timeout(argv, timeout):
    """The failure text for a command that ran past its deadline."""
    return "`%s` did not finish within %s s; its process group was killed" % (" ".join(str(a) for a in argv), timeout)


def find_executable(name, extra_dirs=(), hint=None):
    """``(path, None)`` of the command ``name``, or ``(None, why not)``. A bare name is looked up in
    ``PATH``, the sbin directories and ``extra_dirs``; a path must be an executable file. ``hint``
    (how to install it) ends the reason when a bare name is not found."""
    if os.sep not in name:
        dirs = [os.environ.get("PATH", os.defpath)] + list(SBIN_DIRS) + list(extra_dirs)
        found = shutil.which(name, path=os.pathsep.join(dirs))
        if found:
            return found, None
        why = "%s is not installed (not on PATH, %s)" % (name, ", ".join(extra_dirs or SBIN_DIRS))
        return None, why + (": " + hint if hint else "")
    if os.path.isfile(name) and os.access(name, os.X_OK):
        return name, None
    return None, "%s is not an executable file" % name
