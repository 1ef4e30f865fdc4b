# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""nccl-tests ``all_reduce_perf``: its command line, its output, and what a healthy node achieves.

Plain Python, no Ansible: the module ``nccl_allreduce`` is a thin shell around this file.

Three pieces of field knowledge live here:

* ``build_argv`` -- the flags of ``all_reduce_perf`` (``-b -e -f -g -n -w -c``).
* ``parse`` -- its output, read by the column header it prints rather than by fixed positions:
  the ``#wrong`` column (nccl-tests 2.13+) or the older ``error`` column, with or without a
  ``root`` column (older still: without ``redop``), ``N/A`` where validation is off (``-c 0``),
  wide times printed without decimals, NCCL ``INFO``/``WARN`` lines and loader warnings
  interleaved anywhere, and the prefixes launchers put in front of each line (Open MPI
  ``--tag-output`` ``[1,0]<stdout>:``, Slurm ``srun -l`` ``0:``, ``[0]``).  The footers
  ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X`` are read too; a
  missing footer means the output was cut short.
* ``expected_busbw`` -- the ``auto`` threshold model: from the GPU topology facts, the all-reduce
  bus bandwidth a HEALTHY node of this design reaches (see ``MODEL_DOC``).

``judge`` puts them together and fails closed: anything it cannot vouch for is a failure with a
reason that names what was measured, what was expected, and the likely cause.
"""

from __future__ import annotations

import itertools
import math
import re

from ansible_collections.gpufleet.node.plugins.module_utils import _proc
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path

# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

# Launcher prefixes, removed before anything else looks at a line.
_PREFIXES = (
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:"),  # Open MPI --tag-output
    re.compile(r"^\s*\d+: "),  # Slurm srun -l / --label
    re.compile(r"^\[\d+\] "),  # mpirun -prepend-rank style "[0] "
)
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)\b")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+]?(?:nan|inf)\w*|[-+0-9.eE]+)", re.IGNORECASE)
_PARAMS_RE = re.compile(
    r"^#?\s*nThread\s+(?P<nthread>\d+)\s+nGpus\s+(?P<ngpus>\d+)\s+minBytes\s+(?P<min>\d+)\s+"
    r"maxBytes\s+(?P<max>\d+)\s+step:\s*(?P<step>\d+)\((?P<steptype>factor|bytes)\)"
    r"\s+warmup iters:\s*(?P<warmup>\d+)\s+iters:\s*(?P<iters>\d+)"
    r"(?:\s+agg iters:\s*\d+)?\s+validation:\s*(?P<validation>\d+)"
)
_DEVICE_RE = re.compile(
    r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+\d+)?\s+on\s+(?P<host>\S+)\s+device\s+"
    r"(?P<device>\d+)\s+\[(?P<bus>[0-9a-fA-Fx:]+)\]\s+(?P<name>.+?)\s*$"
)
_VERSION_RE = re.compile(r"^#\s*nccl-tests version\s+(\S+)")

# Column names as nccl-tests prints them, by the key they get in a row.
_PREAMBLE_KEYS = {
    "size": "size",
    "bytes": "size",
    "count": "count",
    "n": "count",
    "type": "type",
    "redop": "redop",
    "op": "redop",
    "root": "root",
}
_WRONG_NAMES = ("#wrong", "error", "res")


class ParseError(ValueError):
    """The output has no all_reduce_perf table that can be read."""


def strip_prefix(line):
    for rx in _PREFIXES:
        m = rx.match(line)
        if m:
            return line[m.end() :]
    return line


def _layout(tokens):
    """Column layout from the tokens of the header line (``#`` removed).

    Returns ``(preamble_keys, wrong_name)``: the keys of the leading columns in order, and the
    name of the correctness column; the rest is two groups of ``time algbw busbw <wrong>``
    (out-of-place, then in-place).
    """
    lowered = [t.lower() for t in tokens]
    try:
        first_time = lowered.index("time")
    except ValueError:
        return None
    preamble = lowered[:first_time]
    group = lowered[first_time:]
    if len(group) != 8 or group[0:3] != ["time", "algbw", "busbw"] or group[4:7] != ["time", "algbw", "busbw"]:
        return None
    if group[3] not in _WRONG_NAMES or group[7] != group[3]:
        return None
    if not preamble or any(t not in _PREAMBLE_KEYS for t in preamble):
        return None
    keys = [_PREAMBLE_KEYS[t] for t in preamble]
    if "size" not in keys or "count" not in keys:
        return None
    return keys, group[3]


def _wrong(text, name):
    """(wrong_count, error_value) for one correctness cell; None where it was not checked."""
    if text.upper() == "N/A":
        return None, None
    if name == "#wrong":
        if not re.match(r"^\d+$", text):
            raise ValueError(text)
        return int(text), None
    # Old nccl-tests: the maximum error as a float; out-of-bounds counts only in the footer.
    return None, float(text)


def _row(tokens, keys, wrong_name):
    if len(tokens) != len(keys) + 8:
        return None
    row = {"size": None, "count": None, "type": None, "redop": None, "root": None}
    try:
        for key, tok in zip(keys, tokens):
            if key in ("size", "count"):
                if not tok.isdigit():
                    return None
                row[key] = int(tok)
            elif key == "root":
                row[key] = int(tok)
            else:
                if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", tok):
                    return None
                row[key] = tok
        rest = tokens[len(keys) :]
        for place, offset in (("oop", 0), ("ip", 4)):
            row["time_" + place] = float(rest[offset])
            row["algbw_" + place] = float(rest[offset + 1])
            row["busbw_" + place] = float(rest[offset + 2])
            wrong, error = _wrong(rest[offset + 3], wrong_name)
            row["wrong_" + place] = wrong
            if wrong_name != "#wrong":
                row["error_" + place] = error
    except ValueError:
        return None
    return row


def parse(text):
    """Read an all_reduce_perf output.

    Returns a dict: ``rows`` (see the module's RETURN), ``columns`` (``new`` with ``#wrong``,
    ``old`` with ``error``), ``has_root``, ``out_of_bounds`` (int or None), ``oob_status``
    (``OK``/``FAILED``/None), ``avg_busbw_gbps`` (float or None), ``footer`` (both footers
    seen), ``params`` (the ``# nThread ...`` line), ``devices``, ``version``, ``noise_lines``
    (lines that were neither table nor known header: NCCL logs, warnings), ``failures`` (lines
    where nccl-tests reported a test failure).
    """
    out = {
        "rows": [],
        "columns": None,
        "has_root": None,
        "header_found": False,
        "out_of_bounds": None,
        "oob_status": None,
        "avg_busbw_gbps": None,
        "footer": False,
        "params": None,
        "devices": [],
        "version": None,
        "noise_lines": 0,
        "failures": [],
    }
    layout = None
    for raw in text.splitlines():
        line = strip_prefix(raw.rstrip("\r\n"))
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").split()
            candidate = _layout(body) if body else None
            if candidate:
                layout = candidate
                out["header_found"] = True
                out["columns"] = "new" if candidate[1] == "#wrong" else "old"
                out["has_root"] = "root" in candidate[0]
                continue
            m = _OOB_RE.match(stripped)
            if m:
                out["out_of_bounds"], out["oob_status"] = int(m.group(1)), m.group(2)
                continue
            m = _AVG_RE.match(stripped)
            if m:
                out["avg_busbw_gbps"] = _number(m.group(1))
                continue
            m = _DEVICE_RE.match(stripped)
            if m:
                out["devices"].append(
                    {
                        "rank": int(m.group("rank")),
                        "host": m.group("host"),
                        "device": int(m.group("device")),
                        "bus_id": m.group("bus"),
                        "name": m.group("name"),
                    }
                )
                continue
            m = _PARAMS_RE.match(stripped)
            if m:
                out["params"] = _params(m)
                continue
            m = _VERSION_RE.match(stripped)
            if m:
                out["version"] = m.group(1)
            continue
        m = _PARAMS_RE.match(stripped)  # very old versions print it without '#'
        if m:
            out["params"] = _params(m)
            continue
        if layout:
            row = _row(stripped.split(), *layout)
            if row is not None:
                out["rows"].append(row)
                continue
        if "Test failure" in stripped or "Test NCCL failure" in stripped or "Test CUDA failure" in stripped:
            out["failures"].append(stripped)
        out["noise_lines"] += 1
    out["footer"] = out["oob_status"] is not None and out["avg_busbw_gbps"] is not None
    return out


def _number(text):
    """A printed figure as a float; NaN where it is not one (C's printf writes ``-nan`` too)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _params(m):
    return {
        "nthread": int(m.group("nthread")),
        "ngpus": int(m.group("ngpus")),
        "min_bytes": int(m.group("min")),
        "max_bytes": int(m.group("max")),
        "step": int(m.group("step")),
        "step_type": m.group("steptype"),
        "warmup_iters": int(m.group("warmup")),
        "iters": int(m.group("iters")),
        "validation": int(m.group("validation")),
    }


def judged_busbw(rows, judge_sizes):
    """Bus bandwidth judged on the ``judge_sizes`` largest message sizes.

    The lowest of the out-of-place and in-place bus bandwidths over those sizes: the gate
    vouches for what the node does at every large size, never for an average that small sizes
    drag down (``# Avg bus bandwidth`` is the mean over all sizes).
    Returns ``(value, judged_rows)``; the value is NaN when any of those figures is not finite
    (``min`` with a NaN depends on the order, so it is never left to decide).
    """
    sizes = sorted({r["size"] for r in rows}, reverse=True)[: max(1, judge_sizes)]
    judged = [r for r in rows if r["size"] in sizes]
    figures = [r[k] for r in judged for k in ("busbw_oop", "busbw_ip")]
    value = min(figures) if all(math.isfinite(f) for f in figures) else math.nan
    return value, judged


# --------------------------------------------------------------------------------------------
# The auto threshold model
# --------------------------------------------------------------------------------------------

MODEL_DOC = """\
The expected bus bandwidth is that of the weakest hop of the best ring NCCL can build through
the GPUs, each hop valued for the node's DESIGN (the maximum PCIe generation and width of the
two GPUs' links, the NVLink count), never for how the links trained today: a link trained down
or a bridge redirecting peer traffic must fail the gate, not lower its bar.
PCIe hop = raw link rate per direction (GT/s x lanes x encoding / 8: Gen3 x16 15.75 GB/s, Gen4
x16 31.5 GB/s, Gen5 x16 63 GB/s) x a path efficiency by the nvidia-smi topology class:
PIX/PXB 0.80, PHB 0.78, NODE 0.60, SYS 0.50.  NVLink hop = NV count x 25 GB/s per link per
direction (50 GB/s from NVLink 5, Blackwell) x 0.80, and x 1.0 through the NVSwitches of a
Hopper system (NVLink SHARP: 8x H100 = 450 GB/s).  The physics floor is that figure x
threshold_fraction (default 0.85); once min_samples healthy peers of the same design are in
the baseline store, the threshold is max(physics floor, baseline_fraction (0.96) x their median).
Sources of the figures: PCIe Gen4 x16 measures about 25 GB/s at best against 31.5 raw
(0.80); 4x RTX 4090 reach 22-26 GB/s bus bandwidth with P2P and about 18 through host memory;
ACS redirect roughly halves bus bandwidth (NVIDIA/nccl issue 700); 8-GPU NVLink all-reduce
reaches about 230 GB/s on A100 (12 links: 240 here) and 440-480 GB/s on H100/H200 with NVLS
(nccl-tests issue 272: 475 on 8x H200; 18 links: 450 here); Azure's per-SKU floors (228 for
8x A100, 460 for 8x H100 at 8-16 GB) sit a few percent under healthy figures (FACTS.md,
nccl-tests section)."""

# The figures (PCIe rates, path-class efficiencies, NVLink rates) and the valuation of one hop
# live with the path vocabulary in pcie/_path.py; the gate's ring model is here.


def _gpu_key(gpu):
    return "GPU%d" % gpu["index"]


def _pcie(gpu):
    p = gpu.get("pcie") or {}
    return p


def _link_class(topology, gi, gj):
    links = topology.get("links") or {}
    cls = (links.get(_gpu_key(gi)) or {}).get(_gpu_key(gj)) or (links.get(_gpu_key(gj)) or {}).get(_gpu_key(gi))
    return None if cls is None else str(cls).upper()


def nvswitch_system(topology):
    """Whether every GPU of the facts reaches every other over NVLink through NVSwitches (an HGX
    baseboard): all pairs NV#, more of them than one GPU's links could bond directly."""
    gpus = sorted(topology.get("gpus") or [], key=lambda g: g["index"])
    counts = []
    for gi, gj in itertools.combinations(gpus, 2):
        count = _path.nvlink_count(_link_class(topology, gi, gj))
        if count is None:
            return False
        counts.append(count)
    return _path.nvswitch_fabric(counts, len(gpus) - 1)


def _hop(topology, gi, gj, switched=False):
    """(class, expected GB/s, basis) for one ring hop between two GPU fact entries."""
    cls = _link_class(topology, gi, gj)
    if cls is None:
        raise ValueError(f"the topology facts have no link type between {_gpu_key(gi)} and {_gpu_key(gj)}")
    gen = width = None
    if _path.nvlink_count(cls) is None:
        if cls not in _path.PATH_EFFICIENCY:
            raise ValueError(f"unknown link type {cls!r} between {_gpu_key(gi)} and {_gpu_key(gj)}")
        pi, pj = _pcie(gi), _pcie(gj)
        try:
            gen = min(int(pi["gen_max"]), int(pj["gen_max"]))
            width = min(int(pi["width_max"]), int(pj["width_max"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"the topology facts lack pcie.gen_max/width_max for {_gpu_key(gi)} or {_gpu_key(gj)}"
            ) from None
    names = str(gi.get("name", "")) + " " + str(gj.get("name", ""))
    gbps, basis = _path.hop_gbps(cls, gen, width, names, switched)
    return cls, gbps, basis


def select_gpus(topology, count=None, visible=None):
    """The GPU fact entries a run uses: CUDA_VISIBLE_DEVICES order if given, then the first ``count``."""
    gpus = sorted(topology.get("gpus") or [], key=lambda g: g["index"])
    if visible:
        by_index = {g["index"]: g for g in gpus}
        picked = []
        for item in visible:
            if item not in by_index:
                raise ValueError(f"CUDA_VISIBLE_DEVICES names GPU {item}, which the topology facts do not have")
            picked.append(by_index[item])
        gpus = picked
    if count is not None:
        if count > len(gpus):
            raise ValueError(f"{count} GPUs requested but the topology facts list {len(gpus)}")
        gpus = gpus[:count]
    return gpus


def expected_busbw(topology, count=None, visible=None):
    """What a healthy node of this design reaches, from ``ansible_facts.gpu_topology``.

    Returns a dict: ``expected_gbps``, ``worst_link`` (class), ``worst_pair`` ([i, j]),
    ``ring`` (GPU indices in the best ring order), ``basis`` (how the weakest hop was valued).
    """
    gpus = select_gpus(topology, count, visible)
    if len(gpus) < 2:
        raise ValueError("an all-reduce gate needs at least 2 GPUs (bus bandwidth of 1 rank is 0)")
    hops = {}
    switched = nvswitch_system(topology)
    for a, b in itertools.combinations(range(len(gpus)), 2):
        hops[(a, b)] = hops[(b, a)] = _hop(topology, gpus[a], gpus[b], switched)
    best = None
    # The ring NCCL would pick: the order whose weakest hop is strongest (n <= 8: 5040 orders).
    for perm in itertools.permutations(range(1, len(gpus))):
        order = (0,) + perm
        if len(order) > 2 and order[1] > order[-1]:
            continue  # a ring and its reverse are the same ring
        weakest = min((hops[(order[k], order[(k + 1) % len(order)])][1], k) for k in range(len(order)))
        if best is None or weakest[0] > best[0][0] + 1e-9:
            best = (weakest, order)
    (gbps, k), order = best
    a, b = order[k], order[(k + 1) % len(order)]
    cls, basis = hops[(a, b)][0], hops[(a, b)][2]
    return {
        "expected_gbps": round(gbps, 2),
        "worst_link": cls,
        "worst_pair": [gpus[a]["index"], gpus[b]["index"]],
        "ring": [gpus[i]["index"] for i in order],
        "basis": basis,
    }


def diagnose(topology, environment=None, measured=None, expected=None, peer_median=None):
    """Likely causes of a low bus bandwidth, most specific first, from the facts and the NCCL env.

    The facts describe the node when they were gathered: a link's trained width rarely changes
    at run time, but ACS may have been cleared since, so that cause is worded as what the facts
    showed.
    """
    causes = []
    topology = topology or {}
    for g in sorted(topology.get("gpus") or [], key=lambda x: x.get("index", 0)):
        p = _pcie(g)
        try:
            wc, wm = int(p["width_current"]), int(p["width_max"])
        except (KeyError, TypeError, ValueError):
            continue
        if wc < wm:
            port = f" below port {g['upstream_port']}" if g.get("upstream_port") else ""
            causes.append(
                "GPU%s (%s) trained to x%d of x%d%s: a link trained down (reseat the card, check "
                "the riser/slot and AER errors)" % (g.get("index"), g.get("pci_bus_id", "?"), wc, wm, port)
            )
    by_name = {}
    for g in topology.get("gpus") or []:
        if isinstance(g.get("nvlinks"), int):
            by_name.setdefault(g.get("name"), []).append(g)
    for same in by_name.values():
        most = max(g["nvlinks"] for g in same)
        for g in sorted(same, key=lambda x: x.get("index", 0)):
            if g["nvlinks"] < most:
                causes.append(
                    "GPU%s (%s) has %d NVLinks active where its peers of the same model have %d: an "
                    "NVLink down costs its share of the bandwidth (nvidia-smi nvlink -s; reseat or "
                    "replace the GPU or baseboard)" % (g.get("index"), g.get("pci_bus_id", "?"), g["nvlinks"], most)
                )
    links = topology.get("links") or {}
    p2p_read = (topology.get("p2p") or {}).get("read") or {}
    redirecting = ((topology.get("pci_tree") or {}).get("redirecting")) or {}
    blocked, bridges = [], set()
    for a, row in sorted(p2p_read.items()):
        for b, status in sorted(row.items()):
            if a < b and status not in ("OK", "X") and _path.nvlink_count((links.get(a) or {}).get(b)) is None:
                blocked.append(f"{a}-{b} {status}")
                bridges.update((redirecting.get(a) or {}).get(b) or [])
    if blocked:
        where = f" (redirecting bridges: {', '.join(sorted(bridges))})" if bridges else ""
        causes.append(
            "the topology facts showed peer-to-peer reads not OK between "
            + ", ".join(blocked)
            + where
            + ": ACS redirect on a bridge between the GPUs, unless it was cleared since "
            "(gpufleet.node.pcie_acs), or P2P disabled"
        )
    env = environment or {}
    if str(env.get("NCCL_P2P_DISABLE", "0")) not in ("0", ""):
        causes.append("NCCL_P2P_DISABLE is set: NCCL copies through host memory")
    if env.get("NCCL_P2P_LEVEL"):
        causes.append(f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} may keep NCCL off peer-to-peer on this path")
    if not causes and measured is not None and peer_median:
        causes.append(
            "%.1f %% under the median of this design's healthy peers, with nothing in the facts to "
            "explain it: a degraded NVLink or riser, a GPU held back by its clocks (nvidia-smi -q -d "
            "PERFORMANCE), or a busy GPU" % (100.0 * (1.0 - measured / peer_median))
        )
    if not causes and measured is not None and expected:
        ratio = measured / expected
        if 0.3 <= ratio <= 0.65:
            causes.append(
                "about half the expected bandwidth: typical of ACS P2P redirect sending peer "
                "traffic through the root complex, or of a link trained down"
            )
        else:
            causes.append(
                "check ACS on the bridges between the GPUs, the links' trained width/speed, and that the GPUs are idle"
            )
    return causes


# --------------------------------------------------------------------------------------------
# Verdict
# --------------------------------------------------------------------------------------------


def non_finite(parsed):
    """The figures of a parsed run that are not finite numbers, as ``'busbw_ip nan at 4294967296 B'``.

    nccl-tests prints ``nan``/``inf`` (and C's ``-nan``) when a timer or a kernel failed; every
    comparison with NaN is false, so such a figure must fail the gate, never pass it."""
    bad = []
    for row in parsed["rows"]:
        for key in ("time_oop", "algbw_oop", "busbw_oop", "error_oop", "time_ip", "algbw_ip", "busbw_ip", "error_ip"):
            value = row.get(key)
            if value is not None and not math.isfinite(value):
                bad.append(f"{key} {value} at {row['size']} B")
    avg = parsed.get("avg_busbw_gbps")
    if avg is not None and not math.isfinite(avg):
        bad.append(f"'# Avg bus bandwidth : {avg}'")
    return bad


def unvalidated(rows):
    """Sizes whose correctness cell reads ``N/A`` (nothing was checked) in either place."""
    return [
        r["size"]
        for r in rows
        if any(r.get("wrong_" + p) is None and r.get("error_" + p) is None for p in ("oop", "ip"))
    ]


def json_safe(value):
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def judge(
    parsed,
    threshold_gbps,
    judge_sizes=2,
    rc=0,
    timed_out=False,
    timeout=None,
    expected_gbps=None,
    causes=None,
    check=None,
    rule_text=None,
):
    """Fail-closed verdict on one parsed run.

    Returns a dict: ``passed`` (bool), ``reason`` (one sentence, measured against expected and
    the likely cause), ``kind`` (``ok``, ``timeout``, ``exit``, ``wrong``, ``out_of_bounds``,
    ``no_rows``, ``truncated``, ``non_finite``, ``unvalidated``, ``low_bandwidth``),
    ``judged_busbw_gbps`` (None unless a finite figure), ``judged_rows``.
    Correctness and completeness come before bandwidth: a fast wrong answer is still wrong, a
    NaN or infinite figure was not measured, and with ``check`` (data checking asked, ``-c 1``;
    None: as the ``# nThread ... validation:`` line says) a ``#wrong`` of ``N/A`` means nothing
    was validated.  A threshold that is not a finite positive number is a ValueError.
    """
    if (
        isinstance(threshold_gbps, bool)
        or not isinstance(threshold_gbps, (int, float))
        or not math.isfinite(threshold_gbps)
        or threshold_gbps <= 0
    ):
        raise ValueError(f"the threshold must be a finite number of GB/s above 0, got {threshold_gbps!r}")
    rows = parsed["rows"]
    verdict = {"passed": False, "judged_busbw_gbps": None, "judged_rows": [], "kind": None, "reason": None}
    if rows:
        value, verdict["judged_rows"] = judged_busbw(rows, judge_sizes)
        verdict["judged_busbw_gbps"] = value if math.isfinite(value) else None
    last = f" (last size measured: {rows[-1]['size']} B)" if rows else ""
    if timed_out:
        verdict["kind"] = "timeout"
        verdict["reason"] = (
            f"all_reduce_perf did not finish within {timeout} s and its process group was "
            f"killed{last}: a hang like this is typical of peer traffic that cannot flow "
            "(ACS redirect on AMD root ports, a dead NVLink, a wedged GPU)"
        )
        return verdict
    wrong = [
        (r["size"], r["wrong_oop"], r["wrong_ip"])
        for r in rows
        if (r["wrong_oop"] or 0) > 0 or (r["wrong_ip"] or 0) > 0
    ]
    if wrong:
        size, w_oop, w_ip = wrong[0]
        verdict["kind"] = "wrong"
        verdict["reason"] = (
            f"all-reduce returned wrong results: #wrong {w_oop} out-of-place and {w_ip} in-place "
            f"at {size} B ({len(wrong)} size(s) affected): data corruption on the peer path "
            "(faulty GPU, link or switch, or an NCCL/driver bug); never serve from this node"
        )
        return verdict
    if parsed["oob_status"] == "FAILED" or (parsed["out_of_bounds"] or 0) > 0:
        verdict["kind"] = "out_of_bounds"
        verdict["reason"] = (
            f"nccl-tests reported '# Out of bounds values : {parsed['out_of_bounds']} "
            f"{parsed['oob_status']}': results outside tolerance, data corruption on the peer path"
        )
        return verdict
    if rc != 0:
        detail = f"; it said: {parsed['failures'][0]}" if parsed["failures"] else ""
        how = f"was killed by signal {-rc}" if rc is not None and rc < 0 else f"exited with status {rc}"
        verdict["kind"] = "exit"
        verdict["reason"] = f"all_reduce_perf {how}{last}{detail}: the run failed, so nothing it printed is vouched for"
        return verdict
    if not rows:
        verdict["kind"] = "no_rows"
        verdict["reason"] = (
            "all_reduce_perf printed no data rows"
            + ("" if parsed["header_found"] else " (and no column header)")
            + ": the test did not run (no GPUs visible, an NCCL init failure, or an unknown output format)"
        )
        return verdict
    if not parsed["footer"]:
        verdict["kind"] = "truncated"
        verdict["reason"] = (
            f"the output stops without the '# Out of bounds values' / '# Avg bus bandwidth' "
            f"footers{last}: the run was cut short (crash, kill, or a lost pipe)"
        )
        return verdict
    bad = non_finite(parsed)
    if bad:
        verdict["kind"] = "non_finite"
        verdict["reason"] = (
            f"all_reduce_perf printed {len(bad)} figure(s) that are not finite numbers "
            f"({'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}): a NaN or infinite "
            "bandwidth was not measured (a failed kernel or timer, or a corrupt output), so "
            "nothing is vouched for; run all_reduce_perf by hand and look at its errors"
        )
        return verdict
    if check is None:
        check = bool((parsed.get("params") or {}).get("validation"))
    unchecked = unvalidated(rows) if check else []
    if unchecked:
        verdict["kind"] = "unvalidated"
        verdict["reason"] = (
            f"data checking was asked (-c 1) but the {'#wrong' if parsed['columns'] == 'new' else 'error'} "
            f"column reads N/A at {len(unchecked)} size(s) (first {unchecked[0]} B): nothing was "
            "validated, so the results are not vouched for; use an all_reduce_perf that "
            "honours -c (not a wrapper that drops it)"
        )
        return verdict
    measured = verdict["judged_busbw_gbps"]
    sizes = sorted({r["size"] for r in verdict["judged_rows"]})
    if not measured >= threshold_gbps:
        verdict["kind"] = "low_bandwidth"
        why = "; ".join(causes or []) or "no likely cause found in the facts"
        if rule_text:
            model = f": under {rule_text}"
        else:
            model = f" (a healthy node of this design reaches {expected_gbps:.2f})" if expected_gbps else ""
        verdict["reason"] = (
            f"bus bandwidth {measured:.2f} GB/s at sizes {sizes} B is under the threshold "
            f"{threshold_gbps:.2f} GB/s{model}; likely cause: {why}"
        )
        return verdict
    verdict["passed"] = True
    verdict["kind"] = "ok"
    verdict["reason"] = (
        f"bus bandwidth {measured:.2f} GB/s at sizes {sizes} B meets the threshold {threshold_gbps:.2f} GB/s"
        + (f": {rule_text}" if rule_text else "")
    )
    return verdict
