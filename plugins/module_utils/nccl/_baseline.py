# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's peer baselines: what the healthy nodes of one design measured, and their
statistic. Plain Python, no Ansible.

* **The store** (``Store``): a directory on the controller, one JSON file per design key
  (``<key>.json``), each holding the latest healthy verdict of each node of that design (at most
  ``window`` nodes, the most recent). One writer at a time (``fcntl.flock`` on ``.lock`` in the
  directory; readers take it shared, on a descriptor opened read-only, so a reader needs no write
  access; where the lock file cannot be opened at all a reader reads without it, which the atomic
  writes make safe), every write atomic (a temporary file in the same directory,
  fsync, rename). A file that does not parse, is not of this format, names another design or
  fails its checksum is CORRUPT: it is reported (``BaselineCorrupt``), never rewritten, so the
  figures in it are not silently lost; move it away or repair it.
* **Which verdicts become peers** (``sample_or_reason``): a verdict that passed, judged by its
  design's own rule (``peer_median`` or ``physics_floor``; one gated against a hand-set fixed
  threshold says nothing about its design), with a finite figure and a finite timestamp. A
  timestamp is the node's, bounded by the controller's clock: one more than
  ``MAX_CLOCK_AHEAD_S`` ahead of it is taken as the controller's time, so a node whose clock ran
  ahead cannot pin its figure. A node's newest verdict replaces its stored figure. Every verdict
  or stored figure that is not kept is reported (``dropped``), with the reason.
* **The statistic** (``statistic``): the median of the peers' latest healthy figures, the judged
  node itself left out, after dropping outliers (further from the median than 3.5 robust standard
  deviations, 1.4826 x the median absolute deviation, and never closer than 2 %).
* **The rule** that turns the statistic into a threshold is the gate's model rule, in
  ``_threshold.py`` (``decide``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import time

from ansible_collections.gpufleet.node.plugins.module_utils.common import _atomic

FORMAT = 1
DEFAULT_WINDOW = 50
#: Outliers: further from the median than this many robust standard deviations ...
OUTLIER_SIGMAS = 3.5
#: ... and than this fraction of the median (a baseline of identical figures has a MAD of 0).
OUTLIER_MIN_RELATIVE = 0.02
MAD_TO_SIGMA = 1.4826
LOCK_NAME = ".lock"
#: The rules by which a verdict judges a node against its own design (``_threshold.decide``).
PEER_RULES = ("peer_median", "physics_floor")
#: How far ahead of the controller's clock a verdict's timestamp may be (clock skew), in seconds.
MAX_CLOCK_AHEAD_S = 300.0
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,199}$")


class BaselineError(Exception):
    """The store cannot be used (a directory that cannot be created or locked, a bad key)."""


class BaselineCorrupt(BaselineError):
    """A design's file is not a baseline this code wrote; it is left as it is."""

    def __init__(self, path, reason):
        super().__init__(
            "the baseline file %s is corrupt (%s): it was left untouched; repair it or move it away "
            "(the design's peers then start a new baseline)" % (path, reason)
        )
        self.path = path
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Verdicts and the statistic
# --------------------------------------------------------------------------------------------


def _finite_positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def sample_or_reason(verdict, now=None):
    """``(sample, None)``: the store entry for one gate verdict; or ``(None, reason)`` where it
    does not count (see the module docstring). ``now``: the controller's clock (default: now)."""
    if not isinstance(verdict, dict):
        return None, "not a verdict (%s)" % type(verdict).__name__
    passed = verdict.get("passed")
    if not (passed is True or str(passed).lower() == "true") or verdict.get("kind") != "ok":
        return None, "did not pass (passed %r, kind %r)" % (passed, verdict.get("kind"))
    rule = verdict.get("rule")
    if rule not in PEER_RULES:
        return None, (
            "judged by rule %r, not by its design's own rule (%s): a figure gated against a hand-set "
            "threshold is not a peer of its design" % (rule, " or ".join(PEER_RULES))
        )
    key = verdict.get("design_key")
    if not key or not verdict.get("host"):
        return None, "no host or design key"
    try:
        gbps = float(verdict.get("judged_busbw_gbps"))
    except (TypeError, ValueError):
        gbps = None
    if isinstance(verdict.get("judged_busbw_gbps"), bool) or not _finite_positive(gbps):
        return None, "judged figure %r is not a finite positive GB/s" % (verdict.get("judged_busbw_gbps"),)
    try:
        timestamp = float(verdict.get("timestamp"))
    except (TypeError, ValueError):
        timestamp = None
    if (
        isinstance(verdict.get("timestamp"), bool)
        or timestamp is None
        or not math.isfinite(timestamp)
        or timestamp <= 0
    ):
        return None, "timestamp %r is not a finite time" % (verdict.get("timestamp"),)
    now = time.time() if now is None else now
    if timestamp > now + MAX_CLOCK_AHEAD_S:
        timestamp = now  # the node's clock ran ahead: the controller's time instead
    return {
        "host": str(verdict["host"]),
        "gbps": round(gbps, 3),
        "timestamp": timestamp,
        "boot_id": verdict.get("boot_id"),
        "design_key": str(key),
    }, None


def healthy_sample(verdict, now=None):
    """The store entry for one gate verdict, or None when it does not count (:func:`sample_or_reason`)."""
    return sample_or_reason(verdict, now)[0]


def median(values):
    values = sorted(values)
    n = len(values)
    if not n:
        return None
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0


def latest_per_host(samples, exclude_host=None, window=DEFAULT_WINDOW):
    """The latest sample of each host (``exclude_host`` left out), most recent first, at most ``window``."""
    latest = {}
    for s in samples:
        if s["host"] == exclude_host:
            continue
        if s["host"] not in latest or s["timestamp"] > latest[s["host"]]["timestamp"]:
            latest[s["host"]] = s
    ordered = sorted(latest.values(), key=lambda s: (-s["timestamp"], s["host"]))
    return ordered[: max(0, int(window))]


def statistic(samples, exclude_host=None, window=DEFAULT_WINDOW):
    """The robust baseline of a design's samples (see the module docstring).

    Returns ``median`` (GB/s, None without samples), ``count`` (nodes behind it), ``hosts``,
    ``outliers`` (``[{host, gbps}]`` dropped). Samples that are not healthy figures are ignored.
    """
    usable = [s for s in samples or [] if isinstance(s, dict) and _finite_positive(s.get("gbps"))]
    peers = latest_per_host(usable, exclude_host, window)
    first = median([s["gbps"] for s in peers])
    if first is None:
        return {"median": None, "count": 0, "hosts": [], "outliers": []}
    mad = median([abs(s["gbps"] - first) for s in peers])
    limit = max(OUTLIER_SIGMAS * MAD_TO_SIGMA * mad, OUTLIER_MIN_RELATIVE * first)
    kept = [s for s in peers if abs(s["gbps"] - first) <= limit]
    dropped = [{"host": s["host"], "gbps": s["gbps"]} for s in peers if abs(s["gbps"] - first) > limit]
    return {
        "median": round(median([s["gbps"] for s in kept]), 2),
        "count": len(kept),
        "hosts": sorted(s["host"] for s in kept),
        "outliers": dropped,
    }


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


def checksum(samples):
    canonical = json.dumps(samples, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate(doc, key, path):
    """The samples of a parsed file, or BaselineCorrupt saying what is wrong."""
    if not isinstance(doc, dict):
        raise BaselineCorrupt(path, "not a JSON object")
    if doc.get("format") != FORMAT:
        raise BaselineCorrupt(path, "format %r, not %d" % (doc.get("format"), FORMAT))
    if doc.get("design_key") != key:
        raise BaselineCorrupt(path, "it names design %r, not %r" % (doc.get("design_key"), key))
    samples = doc.get("samples")
    if not isinstance(samples, list):
        raise BaselineCorrupt(path, "no list of samples")
    for n, s in enumerate(samples):
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("host"), str)
            or not _finite_positive(s.get("gbps"))
            or isinstance(s.get("timestamp"), bool)
            or not isinstance(s.get("timestamp"), (int, float))
            or not math.isfinite(s["timestamp"])
        ):
            raise BaselineCorrupt(path, "sample %d is not {host, gbps > 0, finite timestamp}" % n)
    if doc.get("checksum") != checksum(samples):
        raise BaselineCorrupt(path, "its checksum does not match its samples (edited or damaged)")
    return samples


class Store:
    """A baseline directory (see the module docstring)."""

    def __init__(self, directory):
        self.directory = str(directory)

    def path(self, key):
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise BaselineError("%r is not a design key" % (key,))
        return os.path.join(self.directory, key + ".json")

    def _lock(self, exclusive):
        """The store's lock: exclusive for a writer (which may create the lock file), shared for a
        reader on a read-only descriptor; None for a reader that cannot open it at all (it reads
        without it: every write is an atomic rename)."""
        path = os.path.join(self.directory, LOCK_NAME)
        try:
            if exclusive:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            else:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if not exclusive:
                return None
            raise BaselineError(
                "cannot open the lock of the baseline store %s for writing: %s (recording figures needs write "
                "access to the directory and its .lock)" % (self.directory, exc)
            ) from exc
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        return fd

    @staticmethod
    def _unlock(fd):
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _load(self, key):
        path = self.path(key)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineCorrupt(path, "unreadable: %s" % exc) from exc
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise BaselineCorrupt(path, "not JSON: %s" % exc) from exc
        return validate(doc, key, path)

    def _write(self, key, samples, design=None):
        path = self.path(key)
        doc = {
            "format": FORMAT,
            "design_key": key,
            "design": design,
            "samples": samples,
            "checksum": checksum(samples),
        }
        _atomic.write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o644)

    def keys(self):
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(".json")] for n in names if n.endswith(".json") and _KEY_RE.match(n[: -len(".json")]))

    def read(self):
        """``(designs, corrupt)``: ``{key: samples}`` of every readable design file, and
        ``{key: message}`` of every corrupt one. A missing directory is an empty store."""
        if not os.path.isdir(self.directory):
            return {}, {}
        designs, corrupt = {}, {}
        fd = self._lock(exclusive=False)
        try:
            for key in self.keys():
                try:
                    designs[key] = self._load(key)
                except BaselineCorrupt as exc:
                    corrupt[key] = str(exc)
        finally:
            self._unlock(fd)
        return designs, corrupt

    def update(self, verdicts, window=DEFAULT_WINDOW, designs=None, dry_run=False, now=None):
        """Add the healthy ones of ``verdicts`` (gate verdicts: ``host``, ``design_key``,
        ``passed``, ``kind``, ``judged_busbw_gbps``, ``timestamp``, ``boot_id``).

        Each node keeps its newest sample (a new verdict replaces its stored figure, whatever the
        timestamps); a design keeps its ``window`` most recent nodes. ``designs``: ``{key:
        descriptor}`` written beside the samples for the reader. ``now``: the controller's clock.
        Returns ``{"updated": {key: [hosts]}, "corrupt": {key: message}, "ignored": n,
        "dropped": [{host, design_key, gbps, reason}]}``: every verdict that does not count and
        every figure the window pushes out is in ``dropped``. A corrupt design file is reported
        and left as it is.
        """
        now = time.time() if now is None else now
        entries = {}
        dropped = []
        for verdict in verdicts or []:
            sample, reason = sample_or_reason(verdict, now)
            if sample is None:
                v = verdict if isinstance(verdict, dict) else {}
                dropped.append(
                    {
                        "host": v.get("host"),
                        "design_key": v.get("design_key"),
                        "gbps": v.get("judged_busbw_gbps"),
                        "reason": reason,
                    }
                )
                continue
            key = sample.pop("design_key")
            mine = entries.setdefault(key, {})
            older = mine.get(sample["host"])
            if older is not None:
                if older["timestamp"] > sample["timestamp"]:
                    older, sample = sample, older
                dropped.append(dict(older, design_key=key, reason="a newer verdict of the same host in this update"))
            mine[sample["host"]] = sample
        entries = {key: list(hosts.values()) for key, hosts in entries.items()}
        ignored = sum(1 for d in dropped if "timestamp" not in d)  # the verdicts that did not count
        result = {"updated": {}, "corrupt": {}, "ignored": ignored, "dropped": dropped}
        if not entries:
            return result
        for key in entries:
            self.path(key)  # a bad key fails before anything is written
        if not dry_run:
            try:
                os.makedirs(self.directory, mode=0o755, exist_ok=True)
            except OSError as exc:
                raise BaselineError("cannot create the baseline store %s: %s" % (self.directory, exc)) from exc
        elif not os.path.isdir(self.directory):
            result["updated"] = {key: sorted(s["host"] for s in new) for key, new in entries.items()}
            return result
        fd = self._lock(exclusive=True)
        try:
            for key, new in sorted(entries.items()):
                try:
                    current = self._load(key)
                except BaselineCorrupt as exc:
                    result["corrupt"][key] = str(exc)
                    continue
                hosts = {s["host"] for s in new}
                # stored figures from a clock that ran ahead (before timestamps were bounded)
                kept = [
                    dict(s, timestamp=now) if s["timestamp"] > now + MAX_CLOCK_AHEAD_S else s
                    for s in current
                    if s["host"] not in hosts
                ]
                candidates = latest_per_host(kept + new, window=len(kept) + len(new))
                merged = candidates[: max(0, int(window))]
                for s in candidates[len(merged) :]:
                    dropped.append(
                        dict(s, design_key=key, reason="outside the window of the %d most recent nodes" % window)
                    )
                merged.sort(key=lambda s: (s["timestamp"], s["host"]))
                if merged == sorted(current, key=lambda s: (s["timestamp"], s["host"])):
                    continue
                result["updated"][key] = sorted(hosts & {s["host"] for s in merged})
                if not dry_run:
                    self._write(key, merged, (designs or {}).get(key))
        finally:
            self._unlock(fd)
        return result
