# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The kernel log's GPU events: NVRM ``Xid`` and nvswitch ``SXid`` lines of this boot, and what each
code means (the XID table).

Plain Python (no Ansible imports), runs on target Python 3.8+. Sources (each cited where it is
used):

* NVIDIA, "XID Errors" (docs.nvidia.com/deploy/xid-errors/) - what each code means and the
  recovery it calls for; "Fabric Manager User Guide" (DU-09883-001) for SXids.
* GPUd (github.com/leptonai/gpud) - its XID component maps codes to repair actions (restart the
  application, reset the GPU, reboot, inspect the hardware) and reads NVLink XIDs 144-150 as fatal
  or not from the driver's own "Fatal"/"Nonfatal" word (gpud PR 1174).
* Azure HPC node health checks (github.com/Azure/azurehpc-health-checks) - fail on XIDs 48, 56,
  57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.health._verdict import (
    FAIL,
    INSPECT,
    NONE,
    REBOOT,
    RESET_GPU,
    RESTART_APP,
    WARN,
)

# -- the XID table -------------------------------------------------------------------------------
#: code -> (status, action, meaning). Meaning and recovery: NVIDIA "XID Errors" catalog; FAIL codes
#: are those Azure's HPC health checks fail on plus 94/95 (contained/uncontained ECC: reset the
#: GPU), 140 (unrecovered ECC); WARN codes are application faults that do not indict the node.
XID_CATALOG = {
    13: (WARN, RESTART_APP, "graphics engine exception (usually the application)"),
    31: (WARN, RESTART_APP, "GPU memory page fault (usually the application)"),
    43: (WARN, RESTART_APP, "GPU stopped processing (the application)"),
    45: (WARN, RESTART_APP, "preemptive cleanup, due to previous errors"),
    48: (FAIL, RESET_GPU, "double bit ECC error"),
    56: (FAIL, INSPECT, "display engine error"),
    57: (FAIL, INSPECT, "error programming video memory interface"),
    58: (FAIL, INSPECT, "unstable video memory interface detected"),
    62: (FAIL, RESET_GPU, "internal micro-controller halt"),
    63: (FAIL, RESET_GPU, "ECC page retirement or row remapping recording event"),
    64: (FAIL, INSPECT, "ECC page retirement or row remapper recording failure"),
    65: (FAIL, RESET_GPU, "video processor exception"),
    68: (FAIL, RESET_GPU, "NVDEC0 exception"),
    69: (FAIL, RESET_GPU, "graphics engine class error"),
    73: (FAIL, RESET_GPU, "NVENC2 error"),
    74: (FAIL, RESET_GPU, "NVLink error"),
    79: (FAIL, REBOOT, "GPU has fallen off the bus"),
    80: (FAIL, INSPECT, "corrupted data sent to GPU"),
    81: (FAIL, INSPECT, "VGA subsystem error"),
    92: (FAIL, INSPECT, "high single-bit ECC error rate"),
    94: (FAIL, RESET_GPU, "contained ECC error"),
    95: (FAIL, RESET_GPU, "uncontained ECC error"),
    109: (WARN, RESTART_APP, "context switch timeout"),
    119: (FAIL, REBOOT, "GSP RPC timeout"),
    120: (FAIL, REBOOT, "GSP error"),
    140: (FAIL, RESET_GPU, "unrecovered ECC error"),
}
#: NVLink XIDs (Blackwell and later) whose severity the driver prints in the line itself
#: ("Fatal" / "Nonfatal"); read as GPUd does (gpud PR 1174).
XID_NVLINK_SEVERITY_IN_LINE = range(144, 151)
_FATAL_WORD_RE = re.compile(r"\bfatal\b", re.I)
_NONFATAL_WORD_RE = re.compile(r"\bnon-?fatal\b", re.I)

# -- kernel log ----------------------------------------------------------------------------------
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
# Old drivers: "NVRM: Xid (0000:01:00): 16, Head 00000000 Count 00000000" (no "PCI:").
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bdf>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\)"
    r":\s*(?P<code>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
# "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"
_SXID_RE = re.compile(
    r"SXid \((?:PCI:)?(?P<bdf>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\)"
    r":\s*(?P<code>\d+)(?:,\s*(?P<rest>.*?))?\s*$"
)
# Any NVRM Xid / nvswitch SXid line: one the patterns above do not read is reported, never skipped.
_ANY_XID_RE = re.compile(r"NVRM: Xid\b")
_ANY_SXID_RE = re.compile(r"\bSXid\b")
_PAREN_RE = re.compile(r"\((?:PCI:)?([^)]*)\)")
_PID_RE = re.compile(r"^pid='?(?P<pid><unknown>|-?\d+)'?\s*,?\s*")
# Drivers that print the loss of a GPU on several lines without an Xid (gpud PR 1209):
# "NVRM: The NVIDIA GPU 0000:b3:00.0" ... "NVRM: fallen off the bus and is not responding".
_LOST_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]\s*$")
_FALLEN_RE = re.compile(r"fallen off the bus")
# Where a new boot starts in a captured log: journalctl's separator, or the kernel's own banner,
# printk'd first at boot (init/main.c linux_banner): "Linux version 6.8.0-49-generic
# (buildd@lcy02-amd64-046) (x86_64-linux-gnu-gcc-13 ...) #49-Ubuntu SMP ...", at the start of the
# message, after the prefix a log format puts before it: dmesg's "[    0.000000]" (the banner is
# stamped 0; a line a root process writes to /dev/kmsg later is not), dmesg --ctime's
# "[Fri Aug 30 11:43:09 2024]", dmesg --decode's "kern  :notice: <time> ", journalctl's or
# syslog's "<time> <host> kernel: " (or "kernel: "). "Linux version 6" elsewhere in a line - a
# process's own message, an Xid's text - is no boot.
_JOURNAL_BOOT_RE = re.compile(r"^-- (?:Boot [0-9a-f]+|Reboot) --")
_BANNER_RE = re.compile(
    r"^(?:"
    r"\[\s*(?P<mono>\d+\.\d+)\]\s*"  # dmesg
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s*"  # dmesg --ctime
    r"|kern\s*:\s*[a-z]+\s*:\s*\S+\s+"  # dmesg --decode --time-format iso
    r"|(?:[^\s\[\]]+(?: +[^\s\[\]]+){0,3} +[^\s\[\]]+ +)?kernel: (?:\[\s*(?P<mono2>\d+\.\d+)\]\s*)?"  # journalctl, syslog
    r")?Linux version \d\S* \("
)
_JOURNAL_META_RE = re.compile(r"^-- (?:Logs begin|Journal begins|No entries)")


def this_boot(lines):
    """The lines of the last boot of a captured log (after the last journalctl ``-- Boot ... --``
    separator or the kernel's ``Linux version`` banner); all of them when there is none."""
    start = 0
    for number, line in enumerate(lines):
        if is_boot_start(line):
            start = number
    return lines[start:]


def is_boot_start(line):
    """Whether ``line`` starts a boot: journalctl's boot separator, or the kernel's own banner (the
    message starts with ``Linux version <release> (``, stamped 0 where the log has monotonic
    stamps)."""
    if _JOURNAL_BOOT_RE.match(line):
        return True
    match = _BANNER_RE.match(line)
    if not match:
        return False
    stamp = match.group("mono") or match.group("mono2")
    return stamp is None or float(stamp) == 0.0


def parse_kernel_log(text):
    """NVRM Xid and nvswitch SXid events of this boot in a kernel log (plain ``dmesg``, ``dmesg
    -T``, ``journalctl -k``, syslog lines: the prefix does not matter).

    Returns ``(xid_events, sxid_events)``, each event ``{'bdf', 'code', 'pid', 'message'}`` with
    ``bdf`` as the driver printed it (no ``PCI:``, lower case), ``pid`` an int or None. An Xid or
    SXid line this parser cannot read is an event with ``code`` None, ``bdf`` what the line has
    in parentheses (or ``unknown``) and ``message`` the whole line: ``xid_verdict`` fails it.
    """
    xids, sxids = [], []
    lines = this_boot((text or "").splitlines())
    lost = None
    for number, line in enumerate(lines):
        if _JOURNAL_META_RE.match(line):
            continue
        match = _XID_RE.search(line)
        if match:
            rest = match.group("rest") or ""
            pid = None
            pid_match = _PID_RE.match(rest)
            if pid_match:
                pid = None if pid_match.group("pid") == "<unknown>" else int(pid_match.group("pid"))
                rest = rest[pid_match.end() :]
            xids.append(
                {
                    "bdf": match.group("bdf").lower(),
                    "code": int(match.group("code")),
                    "pid": pid,
                    "message": rest.strip(),
                }
            )
            continue
        match = _SXID_RE.search(line)
        if match:
            sxids.append(
                {
                    "bdf": match.group("bdf").lower(),
                    "code": int(match.group("code")),
                    "pid": None,
                    "message": (match.group("rest") or "").strip(),
                }
            )
            continue
        if _ANY_XID_RE.search(line) or _ANY_SXID_RE.search(line):
            paren = _PAREN_RE.search(line)
            (xids if _ANY_XID_RE.search(line) else sxids).append(
                {
                    "bdf": paren.group(1).strip().lower() if paren and paren.group(1).strip() else "unknown",
                    "code": None,
                    "pid": None,
                    "message": line.strip(),
                }
            )
            continue
        match = _LOST_GPU_RE.search(line)
        if match:
            lost = (match.group("bdf").lower(), number)
            continue
        if lost and number - lost[1] <= 3 and _FALLEN_RE.search(line):
            if not any(x["code"] == 79 and x["bdf"] == lost[0] for x in xids):
                xids.append(
                    {
                        "bdf": lost[0],
                        "code": 79,
                        "pid": None,
                        "message": "GPU has fallen off the bus (reported without an Xid line)",
                    }
                )
            lost = None
    return xids, sxids


def xid_verdict(event):
    """``(status, action, meaning)`` of one Xid event."""
    code = event["code"]
    if code is None:
        return (
            FAIL,
            INSPECT,
            "an Xid line this collection cannot parse, so its severity is unknown: %r; read it against "
            "NVIDIA's XID catalog" % event.get("message"),
        )
    if code in XID_NVLINK_SEVERITY_IN_LINE:
        message = event.get("message") or ""
        if _FATAL_WORD_RE.search(message) and not _NONFATAL_WORD_RE.search(message):
            return FAIL, RESET_GPU, "fatal NVLink error"
        return WARN, NONE, "non-fatal NVLink error"
    if code in XID_CATALOG:
        return XID_CATALOG[code]
    return WARN, NONE, "XID %d is not in this collection's table: look it up in NVIDIA's XID catalog" % code


def sxid_verdict(event, fatal_codes=()):
    """SXid lines carry their own severity ("Fatal"/"Non-fatal", Fabric Manager User Guide
    DU-09883-001); ``fatal_codes`` fail whatever the line says."""
    message = event.get("message") or ""
    if event["code"] is None:
        return FAIL, INSPECT, "an SXid line this collection cannot parse: %r" % message
    if event["code"] in fatal_codes or (_FATAL_WORD_RE.search(message) and not _NONFATAL_WORD_RE.search(message)):
        return FAIL, REBOOT, "fatal NVSwitch error"
    return WARN, NONE, "NVSwitch error"
