# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health checks: the failures that pass an all-reduce gate, judged.

Plain Python (no Ansible imports), runs on target Python 3.8+. ``run_checks`` turns the facts (per
GPU from ``_collect``, kernel events from ``_kernel_log``, the PCI tree from ``_pci_facts``) into
checks, in a fixed order, each ``{name, status (pass|warn|fail), gpus, reason, action}``
(``_verdict``), with the thresholds of ``_thresholds``. The sources of the thresholds and of the
XID table are cited there and where each is used.
"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvsmi
from ansible_collections.gpufleet.node.plugins.module_utils.health import _kernel_log, _thresholds
from ansible_collections.gpufleet.node.plugins.module_utils.health._verdict import (
    CONFIGURE,
    FAIL,
    INSPECT,
    NONE,
    PASS,
    REBOOT,
    RESET_GPU,
    WARN,
    check,
    judged,
    worst,
)


def _gpu_of_bdf(bdf, bus_ids):
    """The GPU bus id (``0000:3b:00.0``) an Xid's ``0000:3b:00`` names, else the bdf as printed."""
    for bus_id in bus_ids:
        if bus_id and bus_id.startswith(bdf if "." in bdf else bdf + "."):
            return bus_id
    try:
        return _nvsmi.normalize_bus_id(bdf if "." in bdf else bdf + ".0") or bdf
    except ValueError:
        return bdf


def check_xid(xids, bus_ids, log_error=None):
    if log_error:
        return check("xid", WARN, [], "the kernel log could not be read, so XIDs are unknown: %s" % log_error, INSPECT)
    verdicts, parts, gpus = [], [], []
    seen = {}
    for event in xids:
        status, action, meaning = _kernel_log.xid_verdict(event)
        gpu = _gpu_of_bdf(event["bdf"], bus_ids)
        key = (gpu, event["code"] if event["code"] is not None else event.get("message"))
        if key in seen:
            seen[key][1] += 1
            continue
        seen[key] = [status, 1, meaning, action, event["code"]]
        verdicts.append((status, action))
        if status != PASS:
            gpus.append(gpu)
    for (gpu, _key), (status, count, meaning, _action, code) in seen.items():
        times = ", %d times" % count if count > 1 else ""
        if code is None:
            parts.append("unparseable Xid line on %s (%s, %s%s)" % (gpu, meaning, status, times))
        else:
            parts.append("XID %d on %s (%s, %s%s)" % (code, gpu, meaning, status, times))
    status, action = worst(verdicts)
    if not xids:
        return check("xid", PASS, [], "no NVRM Xid in this boot's kernel log")
    return check("xid", status, gpus, "; ".join(parts), action)


def check_sxid(sxids, fatal_codes=()):
    if not sxids:
        return check("sxid", PASS, [], "no NVSwitch SXid in this boot's kernel log")
    groups = {}
    for event in sxids:
        key = (event["bdf"], event["code"] if event["code"] is not None else event.get("message"))
        groups.setdefault(key, []).append(event)
    verdicts, parts = [], []
    for (bdf, _key), events in sorted(groups.items(), key=lambda item: (item[0][0], str(item[0][1]))):
        verdict = worst([_kernel_log.sxid_verdict(e, fatal_codes)[:2] for e in events])
        verdicts.append(verdict)
        code = events[0]["code"]
        if code is None:
            meaning = _kernel_log.sxid_verdict(events[0], fatal_codes)[2]
            parts.append("%s on NVSwitch %s (%s, %d line(s))" % (meaning, bdf, verdict[0], len(events)))
        else:
            parts.append("SXid %d on NVSwitch %s (%s, %d line(s))" % (code, bdf, verdict[0], len(events)))
    status, action = worst(verdicts)
    return check("sxid", status, [], "; ".join(parts), action)


def check_row_remap(gpus):
    pending = [g["bus_id"] for g in gpus if (g.get("remapped_rows") or {}).get("pending")]
    failed = [g["bus_id"] for g in gpus if (g.get("remapped_rows") or {}).get("failure")]
    if failed:
        return check(
            "row_remap",
            FAIL,
            failed + pending,
            "row remapping failed on %s: the GPU memory has run out of spare rows" % ", ".join(failed),
            INSPECT,
        )
    if pending:
        return check(
            "row_remap",
            FAIL,
            pending,
            "row remapping pending on %s: takes effect only after a GPU reset or reboot" % ", ".join(pending),
            RESET_GPU,
        )
    supported = [g for g in gpus if g.get("remapped_rows") is not None]
    return check(
        "row_remap",
        PASS,
        [],
        "no pending or failed row remapping (%d of %d GPU(s) report it)" % (len(supported), len(gpus)),
    )


def check_ecc(gpus, limit):
    bad = [
        (g["bus_id"], g["ecc"]["volatile_uncorrectable"])
        for g in gpus
        if g.get("ecc")
        and g["ecc"].get("volatile_uncorrectable") is not None
        and g["ecc"]["volatile_uncorrectable"] > limit
    ]
    if bad:
        return check(
            "ecc",
            FAIL,
            [b for b, _n in bad],
            "volatile uncorrectable ECC errors above %d: %s" % (limit, ", ".join("%s: %d" % b for b in bad)),
            RESET_GPU,
        )
    return check("ecc", PASS, [], "no volatile uncorrectable ECC error above %d" % limit)


def check_retired_pages(gpus, limit):
    pending, over = [], []
    for gpu in gpus:
        pages = gpu.get("retired_pages") or {}
        if pages.get("pending"):
            pending.append(gpu["bus_id"])
        total = (pages.get("single_bit_ecc") or 0) + (pages.get("double_bit_ecc") or 0)
        if total >= limit > 0:
            over.append((gpu["bus_id"], total))
    if over:
        return check(
            "retired_pages",
            FAIL,
            [b for b, _n in over] + pending,
            "%s retired page(s), DCGM's limit is %d: replace the GPU" % (", ".join("%s: %d" % o for o in over), limit),
            INSPECT,
        )
    if pending:
        return check(
            "retired_pages",
            FAIL,
            pending,
            "page retirement pending on %s: takes effect after a GPU reset or reboot" % ", ".join(pending),
            RESET_GPU,
        )
    return check("retired_pages", PASS, [], "no pending page retirement, retired pages below %d" % limit)


def nvswitch_system(gpus, pci):
    """Whether the node has NVSwitches (needs the fabric manager): a GPU reports a fabric state
    (NVML fabric info / ``-q`` "Fabric" with a state), or the PCI tree holds NVSwitches."""
    return any(g.get("fabric") for g in gpus) or bool(pci.get("nvswitches"))


def check_fabric(gpus, pci, mode, fm_state):
    if mode == "not_required":
        return check("fabric_manager", PASS, [], "not judged (fabric_manager=not_required)")
    needed = mode == "required" or nvswitch_system(gpus, pci)
    if not needed:
        return check("fabric_manager", PASS, [], "no NVSwitch: the fabric manager is not needed")
    problems, bad = [], []
    if fm_state != "active":
        problems.append(
            "nvidia-fabricmanager is %s (systemctl is-active), not active: start and enable it; "
            'CUDA reports "system not yet initialized" (error 802) without it' % (fm_state or "unknown")
        )
    for gpu in gpus:
        fabric = gpu.get("fabric")
        if fabric is None or fabric.get("state") != "completed" or fabric.get("status") != "success":
            bad.append(gpu["bus_id"])
    if bad:
        problems.append(
            "GPU fabric state not completed/success on %s (%s)"
            % (
                ", ".join(bad),
                ", ".join(
                    sorted(
                        {
                            "%s/%s" % ((g.get("fabric") or {}).get("state"), (g.get("fabric") or {}).get("status"))
                            for g in gpus
                            if g["bus_id"] in bad
                        }
                    )
                ),
            )
        )
    if problems:
        action = CONFIGURE if fm_state != "active" else RESET_GPU
        return check("fabric_manager", FAIL, bad, "; ".join(problems), action)
    return check("fabric_manager", PASS, [], "nvidia-fabricmanager active, fabric completed/success on every GPU")


def check_nvlink(gpus, thresholds, expected_speed=None):
    """The links' state, speed and error counters. On an NVLink design - another GPU of the node
    has links, or the GPU reports an NVSwitch fabric state - a GPU without any link read (no link
    line in ``nvidia-smi nvlink -s``, no link state from NVML) fails: its links are unread, not
    absent."""
    nvlink_gpus = [g for g in gpus if g.get("nvlinks")]
    unread = [g["bus_id"] for g in gpus if not g.get("nvlinks") and (nvlink_gpus or g.get("fabric"))]
    if unread:
        why = (
            "GPU(s) %s of this node do" % ", ".join(g["bus_id"] for g in nvlink_gpus)
            if nvlink_gpus
            else "they report an NVSwitch fabric state"
        )
        return check(
            "nvlink",
            FAIL,
            unread,
            "no NVLink state read for GPU(s) %s although %s (an NVLink design): `nvidia-smi nvlink -s` "
            "prints no link line for them, or NVML reads no link; reset the GPU or reboot, and inspect "
            "the GPU if its links stay unread" % (", ".join(unread), why),
            RESET_GPU,
        )
    if not nvlink_gpus:
        return check("nvlink", PASS, [], "no NVLink GPU")
    speeds = [link["speed_gbps"] for g in nvlink_gpus for link in g["nvlinks"] if link.get("speed_gbps")]
    expected = expected_speed or (max(speeds) if speeds else None)
    fails, warns, failed_gpus, warned_gpus = [], [], [], []
    counts = {len(g["nvlinks"]) for g in nvlink_gpus}
    for gpu in nvlink_gpus:
        down = [link["link"] for link in gpu["nvlinks"] if not link["active"]]
        slow = [
            link["link"]
            for link in gpu["nvlinks"]
            if link["active"] and expected and link.get("speed_gbps") and link["speed_gbps"] < expected * 0.99
        ]
        if down:
            fails.append("%s link(s) %s inactive" % (gpu["bus_id"], ",".join(map(str, down))))
            failed_gpus.append(gpu["bus_id"])
        if slow:
            fails.append("%s link(s) %s below %s GB/s" % (gpu["bus_id"], ",".join(map(str, slow)), expected))
            failed_gpus.append(gpu["bus_id"])
        for key, limit_key in (
            ("crc_errors", "nvlink_crc_errors_max"),
            ("replay_errors", "nvlink_replay_errors_max"),
            ("recovery_errors", "nvlink_recovery_errors_max"),
        ):
            over = [
                (link["link"], link[key])
                for link in gpu["nvlinks"]
                if link.get(key) is not None and link[key] > thresholds[limit_key]
            ]
            if over:
                warns.append(
                    "%s %s above %d on link(s) %s"
                    % (
                        gpu["bus_id"],
                        key.replace("_", " "),
                        thresholds[limit_key],
                        ", ".join("%d (%d)" % o for o in over),
                    )
                )
                warned_gpus.append(gpu["bus_id"])
    if len(counts) > 1:
        fails.append("GPUs report different NVLink counts (%s)" % ", ".join(str(c) for c in sorted(counts)))
    return judged(
        "nvlink",
        fails,
        failed_gpus,
        warns,
        warned_gpus,
        RESET_GPU,
        "every NVLink of %d GPU(s) active%s" % (len(nvlink_gpus), " at %s GB/s" % expected if expected else ""),
    )


def check_clocks(gpus, fail_reasons=_thresholds.CLOCK_REASONS_FAIL, warn_reasons=_thresholds.CLOCK_REASONS_WARN):
    fails, warns = [], []
    for gpu in gpus:
        active = gpu.get("clocks_event_reasons") or []
        bad = [r for r in active if r in fail_reasons]
        meh = [r for r in active if r in warn_reasons]
        if bad:
            fails.append((gpu["bus_id"], bad))
        if meh:
            warns.append((gpu["bus_id"], meh))
    if fails:
        return check(
            "clocks",
            FAIL,
            [b for b, _r in fails],
            "hardware clock slowdown active: %s; check cooling, power supply and the power brake signal"
            % "; ".join("%s %s" % (b, ",".join(r)) for b, r in fails),
            INSPECT,
        )
    if warns:
        return check(
            "clocks",
            WARN,
            [b for b, _r in warns],
            "software thermal slowdown: %s" % "; ".join("%s %s" % (b, ",".join(r)) for b, r in warns),
            NONE,
        )
    return check("clocks", PASS, [], "no hardware slowdown (a software power cap is not a fault)")


def _link_max(gpu, pci):
    """The GPU's link maxima, capped by its upstream port's (a Gen5 GPU in a Gen4 slot)."""
    pcie = gpu.get("pcie") or {}
    gen_max, width_max = pcie.get("gen_max"), pcie.get("width_max")
    info = pci.get("gpus", {}).get(gpu["bus_id"])
    port = info["chain"][-1] if info and info["chain"] else None
    port_link = pci.get("bridges", {}).get(port, {}).get("link") if port else None
    if port_link:
        if gen_max is not None and port_link.get("gen_max"):
            gen_max = min(gen_max, port_link["gen_max"])
        if width_max is not None and port_link.get("width_max"):
            width_max = min(width_max, port_link["width_max"])
    return gen_max, width_max, port


def check_pcie(gpus, pci, busy, thresholds):
    fails, warns, failed, warned = [], [], [], []
    for gpu in gpus:
        pcie = gpu.get("pcie") or {}
        gen_max, width_max, port = _link_max(gpu, pci)
        where = " below port %s" % port if port else ""
        gen_low = pcie.get("gen_current") is not None and gen_max is not None and pcie["gen_current"] < gen_max
        width_low = (
            pcie.get("width_current") is not None and width_max is not None and pcie["width_current"] < width_max
        )
        text = "%s at Gen%s x%s%s, can do Gen%s x%s" % (
            gpu["bus_id"],
            pcie.get("gen_current"),
            pcie.get("width_current"),
            where,
            gen_max,
            width_max,
        )
        if busy and (gen_low or width_low):
            fails.append(text)
            failed.append(gpu["bus_id"])
        elif width_low:
            # The generation drops while a GPU idles; the width does not, so it is suspect even idle.
            warns.append(text + " (idle; judged under load with busy=true)")
            warned.append(gpu["bus_id"])
        replays = pcie.get("replays")
        limit = thresholds.get("pcie_replays_max")
        if replays is not None and limit is not None and replays > limit:
            warns.append("%s %d PCIe replays since reset (above %d)" % (gpu["bus_id"], replays, limit))
            warned.append(gpu["bus_id"])
    return judged(
        "pcie_link",
        fails,
        failed,
        warns,
        warned,
        INSPECT,
        "every GPU link at its maximum generation and width under load"
        if busy
        else "link widths at their maximum; generations not judged while idle (busy=false)",
        fail_prefix="PCIe link below its maximum under load: ",
    )


def check_aer(gpus, pci, limit):
    if pci.get("error"):
        return check("pcie_aer", PASS, [], "not judged: the PCI tree cannot be read (%s)" % pci["error"])
    fails, warns, failed, warned = [], [], [], []
    devices = []
    for gpu in gpus:
        info = pci.get("gpus", {}).get(gpu["bus_id"])
        if info is None:
            continue
        devices.append((gpu["bus_id"], gpu["bus_id"], info["aer"]))
        for bridge in info["chain"]:
            if bridge in pci.get("bridges", {}):
                devices.append((bridge, gpu["bus_id"], pci["bridges"][bridge]["aer"]))
    seen = set()
    reported = 0
    for bdf, gpu, aer in devices:
        if bdf in seen:
            continue
        seen.add(bdf)
        if any(v is not None for v in aer.values()):
            reported += 1
        if (aer.get("fatal") or 0) > 0 or (aer.get("nonfatal") or 0) > 0:
            fails.append(
                "%s: %s fatal, %s non-fatal AER error(s)%s"
                % (
                    bdf,
                    aer.get("fatal") or 0,
                    aer.get("nonfatal") or 0,
                    "" if bdf == gpu else " (on the path of %s)" % gpu,
                )
            )
            failed.append(gpu)
        if (aer.get("correctable") or 0) > limit:
            warns.append(
                "%s: %d correctable AER errors (above %d)%s"
                % (bdf, aer["correctable"], limit, "" if bdf == gpu else " (on the path of %s)" % gpu)
            )
            warned.append(gpu)
    return judged(
        "pcie_aer",
        fails,
        failed,
        warns,
        warned,
        INSPECT,
        "no fatal or non-fatal AER error on %d GPU(s) and the bridges above them "
        "(%d report AER counters)" % (len(gpus), reported),
    )


def check_peermem(pci, loaded, required):
    nics = pci.get("nics_on_gpu_paths") or []
    if loaded:
        return check("peermem", PASS, [], "nvidia_peermem is loaded")
    if required:
        return check(
            "peermem",
            FAIL,
            [],
            "nvidia_peermem is not loaded (require_peermem=true): "
            "`modprobe nvidia_peermem` and add it to /etc/modules-load.d",
            CONFIGURE,
        )
    if nics:
        return check(
            "peermem",
            WARN,
            [],
            "RDMA NIC(s) %s share PCIe switches with GPUs but nvidia_peermem is not "
            "loaded: GPUDirect RDMA is off (modprobe nvidia_peermem)" % ", ".join(nics),
            CONFIGURE,
        )
    return check("peermem", PASS, [], "no RDMA NIC on a GPU path; nvidia_peermem not needed")


def check_gpu_count(gpus, pci, expected=None):
    seen = [g["bus_id"] for g in gpus]
    problems, missing = [], []
    if not pci.get("error"):
        in_tree = [bdf for bdf, info in sorted(pci.get("gpus", {}).items()) if info["driver"] in (None, "nvidia")]
        missing = [bdf for bdf in in_tree if bdf not in seen]
        if missing:
            problems.append(
                "GPU(s) %s are in the PCI tree but the driver does not report them (fallen off the "
                "bus, or failed to initialise: see the kernel log)" % ", ".join(missing)
            )
    if expected is not None and expected != len(seen):
        problems.append("%d GPU(s) visible to the driver, expected %d" % (len(seen), expected))
    if problems:
        return check("gpu_count", FAIL, missing, "; ".join(problems), REBOOT if missing else INSPECT)
    return check(
        "gpu_count", PASS, [], "%d GPU(s) visible%s" % (len(seen), ", as expected" if expected is not None else "")
    )


def check_gpus_kept(gpus, known, expected=None):
    """The watcher's count check: a GPU that an earlier report of this boot listed and this one
    lacks fails (a GPU lost off the bus can drop out of ``nvidia-smi -q`` without an Xid line),
    as does a count other than ``expected``. Same name and actions as :func:`check_gpu_count`."""
    seen = {g["bus_id"] for g in gpus}
    missing = sorted(set(known) - seen)
    problems = []
    if missing:
        problems.append(
            "GPU(s) %s reported earlier this boot are gone from nvidia-smi's report (%d of %d left; fallen off "
            "the bus, or lost: see the kernel log)" % (", ".join(missing), len(seen), len(set(known) | seen))
        )
    if expected is not None and expected != len(seen):
        problems.append("%d GPU(s) visible to the driver, expected %d" % (len(seen), expected))
    if problems:
        return check("gpu_count", FAIL, missing, "; ".join(problems), REBOOT if missing else INSPECT)
    return check("gpu_count", PASS, [], "%d GPU(s) visible, none lost since the first report" % len(seen))


def check_persistence(gpus):
    off = [g["bus_id"] for g in gpus if g.get("persistence_mode") is False]
    if off:
        return check(
            "persistence_mode",
            FAIL,
            off,
            "persistence mode off on %s: enable nvidia-persistenced" % ", ".join(off),
            CONFIGURE,
        )
    return check("persistence_mode", PASS, [], "persistence mode on (or not reported) on every GPU")


def _fields(entries, key, limit=6):
    names = ["%s (%s)" % (e["field"], e[key]) for e in entries[:limit]]
    if len(entries) > limit:
        names.append("and %d more" % (len(entries) - limit))
    return ", ".join(names)


def check_readable(gpus):
    """FAIL when a GPU's health facts could not be read (``unreadable``: ``[Unknown Error]``, an
    NVML error other than NotSupported): an unread value is no pass. WARN, with the reason, for
    the judged facts the GPU model does not support (``unsupported``)."""
    unreadable = [(g["bus_id"], g.get("unreadable") or []) for g in gpus]
    unreadable = [(bus_id, entries) for bus_id, entries in unreadable if entries]
    if unreadable:
        return check(
            "readable",
            FAIL,
            [bus_id for bus_id, _e in unreadable],
            "health facts that cannot be read: %s; the driver cannot read them, so the GPU is not known "
            "to be healthy: reset the GPU (nvidia-smi -r) or reboot, and drain the node if they stay unreadable"
            % "; ".join("GPU %s: %s" % (bus_id, _fields(entries, "error")) for bus_id, entries in unreadable),
            RESET_GPU,
        )
    unsupported = []
    for gpu in gpus:
        entries = list(gpu.get("unsupported") or [])
        if gpu.get("ecc") is not None:
            # Some ECC counters read: the others are a driver's layout, not a missing check.
            entries = [e for e in entries if not e["field"].lower().startswith("ecc")]
        if entries:
            unsupported.append((gpu["bus_id"], entries))
    if unsupported:
        return check(
            "readable",
            WARN,
            [bus_id for bus_id, _e in unsupported],
            "not supported on this GPU model, so not judged: %s"
            % "; ".join("GPU %s: %s" % (bus_id, _fields(entries, "reason")) for bus_id, entries in unsupported),
            NONE,
        )
    return check("readable", PASS, [], "every health fact of %d GPU(s) read" % len(gpus))


def run_checks(record, xids, sxids, pci, options):
    """Every check, in a fixed order. ``options``: ``thresholds`` (dict, DEFAULT_THRESHOLDS keys),
    ``busy``, ``fabric_manager`` (auto|required|not_required), ``fabric_manager_state``,
    ``require_peermem``, ``peermem_loaded``, ``expect_gpu_count``, ``nvlink_expected_speed_gbps``,
    ``sxid_fatal_codes``, ``clock_reasons_fail``, ``clock_reasons_warn``, ``kernel_log_error``."""
    thresholds = dict(_thresholds.DEFAULT_THRESHOLDS)
    thresholds.update({k: v for k, v in (options.get("thresholds") or {}).items() if v is not None})
    gpus = record["gpus"]
    bus_ids = [g["bus_id"] for g in gpus]
    return [
        check_xid(xids, bus_ids, options.get("kernel_log_error")),
        check_sxid(sxids, options.get("sxid_fatal_codes") or ()),
        check_row_remap(gpus),
        check_ecc(gpus, thresholds["ecc_volatile_uncorrectable_max"]),
        check_retired_pages(gpus, thresholds["retired_pages_max"]),
        check_fabric(gpus, pci, options.get("fabric_manager", "auto"), options.get("fabric_manager_state")),
        check_nvlink(gpus, thresholds, options.get("nvlink_expected_speed_gbps")),
        check_clocks(
            gpus,
            options.get("clock_reasons_fail") or _thresholds.CLOCK_REASONS_FAIL,
            options.get("clock_reasons_warn")
            if options.get("clock_reasons_warn") is not None
            else _thresholds.CLOCK_REASONS_WARN,
        ),
        check_pcie(gpus, pci, bool(options.get("busy")), thresholds),
        check_aer(gpus, pci, thresholds["aer_correctable_max"]),
        check_peermem(pci, options.get("peermem_loaded"), bool(options.get("require_peermem"))),
        check_gpu_count(gpus, pci, options.get("expect_gpu_count")),
        check_persistence(gpus),
        check_readable(gpus),
    ]
