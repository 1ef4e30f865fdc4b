# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU health state of a lab machine: the faults `python -m lab fault` injects.

The state lives beside the machine, in `<root>/health.json`, and every stand-in reads it on
every call, so a fault takes effect at once, as on a live machine.  It is the lab's one fault
channel: no stand-in takes a fault from its profile or its environment.  What the state drives:

* `<root>/kmsg.log`: this boot's kernel log (plain `dmesg` lines, `[    5.123456] ...`), the
  file the lab points `gpu_health_info`'s `kernel_log_path` at; `xid`/`sxid` append the lines
  the NVIDIA driver prints (`NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', ...`);
* per GPU: ECC counters, remapped rows, clocks event reasons, NVLink links down, the PCIe link
  width it trained to (the GPU's and its upstream port's Link Status in config space, and the
  sysfs `current_link_width`), which `nvidia-smi -q`, `nvidia-smi nvlink -s`, the NVML stub
  and all_reduce_perf answer from;
* per PCI function: the kernel's AER counters (sysfs `aer_dev_correctable`, `aer_dev_fatal`,
  `aer_dev_nonfatal`, in the kernel's own format);
* the node: whether nvidia-fabricmanager runs (NVSwitch profiles; the GPUs' fabric state
  follows it), and whether nvidia_peermem is loaded (`<root>/proc/modules`,
  `<root>/sys/module/nvidia_peermem`);
* the driver as nvidia-smi and NVML meet it (`driver`: not loaded, a library/driver version
  mismatch, no devices; a GPU `lost`: fallen off the bus, no handle for it);
* how all_reduce_perf misbehaves (`allreduce`: wrong results, a hang, a run killed mid-table, an
  NCCL failure at start, or every figure slow);
* per GPU, slow copy engines (`copy_engine_slow`): every copy nvbandwidth measures to, from or
  between it falls behind, while nothing nvidia-smi or NVML shows changes;
* per GPU, what only DCGM's active tests find (`dcgm`: `memory`, `pcie`): `dcgmi diag` level 2
  and up fails its GPU Memory or PCIe test, while nothing nvidia-smi or NVML shows changes;
* a wedged vLLM engine (`engine_wedge`: when it wedged): the vLLM stand-in started before that
  time keeps answering `/health` and `/metrics` while its completions never return and its
  counters freeze; a stand-in started after it (a restart of the server unit) serves again.

A reboot (`reboot()`, called by `Node.reset_firmware`) clears what a reboot clears: the old
boot's kernel log goes, a pending row remap is applied (the remapped count rises), volatile
ECC counts reset, the fabric manager runs again if it is enabled, nvidia_peermem is loaded again
where it is configured.  Hardware stays as it is: NVLink links down, HW slowdown, a link trained
down, slow copy engines, DCGM's memory and PCIe faults, the AER counts of a flaky link,
aggregate ECC counts and remapped rows (InfoROM); the driver faults, a lost GPU and
all_reduce_perf's misbehaviour stay too, until `clear`.

Like node.py, this module is independent of the collection's parsers and checks: the lab is the
independent oracle the module is tested against.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from pathlib import Path

from .regs import LINK_SPEED_TEXT, PCIE_CAP

HEALTH_FILE = "health.json"
KMSG_FILE = "kmsg.log"

KINDS = (
    "xid",
    "sxid",
    "remap-pending",
    "ecc-uncorrectable",
    "fabric-manager-stop",
    "nvlink-down",
    "hw-slowdown",
    "link-degrade",
    "aer",
    "peermem-unload",
    "driver-not-loaded",
    "library-mismatch",
    "no-devices",
    "gpu-lost",
    "allreduce-wrong",
    "allreduce-hang",
    "allreduce-truncate",
    "allreduce-crash",
    "allreduce-slow",
    "engine-wedge",
    "copy-engine-slow",
    "dcgm-memory",
    "dcgm-pcie",
    "clear",
)
#: Faults of the driver as nvidia-smi and NVML meet it (the state's `driver`).
DRIVER_FAULTS = ("driver-not-loaded", "library-mismatch", "no-devices")
#: all_reduce_perf's misbehaviour (the state's `allreduce`: the kind without the prefix).
ALLREDUCE_PREFIX = "allreduce-"

# Linux drivers/pci/pcie/aer.c (v6.8): the names `aer_dev_*` print, in bit order (None: no name,
# printed as `<array>_bit[N] <count>` only when non-zero).
AER_COR_NAMES = [
    "RxErr",
    None,
    None,
    None,
    None,
    None,
    "BadTLP",
    "BadDLLP",
    "Rollover",
    None,
    None,
    None,
    "Timeout",
    "NonFatalErr",
    "CorrIntErr",
    "HeaderOF",
]
AER_UNCOR_NAMES = [
    "Undefined",
    None,
    None,
    None,
    "DLP",
    "SDES",
    None,
    None,
    None,
    None,
    None,
    None,
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
    None,
    None,
    None,
    None,
    None,
]
AER_FILES = {
    "correctable": ("aer_dev_correctable", AER_COR_NAMES, "dev_cor_errs", "ERR_COR"),
    "fatal": ("aer_dev_fatal", AER_UNCOR_NAMES, "dev_fatal_errs", "ERR_FATAL"),
    "nonfatal": ("aer_dev_nonfatal", AER_UNCOR_NAMES, "dev_nonfatal_errs", "ERR_NONFATAL"),
}

# /proc/modules lines (name size refcount users state address) of a host with the NVIDIA driver;
# nvidia_peermem first where it is loaded, as `modprobe nvidia_peermem` leaves it.
MODULES_BASE = [
    "nvidia_uvm 4956160 0 - Live 0x0000000000000000",
    "nvidia_drm 122880 0 - Live 0x0000000000000000",
    "nvidia_modeset 1355776 1 nvidia_drm, Live 0x0000000000000000",
    "nvidia 54501376 {users} {using} Live 0x0000000000000000",
    "ib_uverbs 204800 {ib_users} {ib_using} Live 0x0000000000000000",
    "mlx5_ib 466944 0 - Live 0x0000000000000000",
    "mlx5_core 2428928 1 mlx5_ib, Live 0x0000000000000000",
]
PEERMEM_LINE = "nvidia_peermem 16384 0 - Live 0x0000000000000000"

# Xid lines as the driver prints them (NVIDIA Xid catalog; public kernel logs, see
# tests/data/kernel-log). Application-caused Xids carry the process; the others `<unknown>`.
APP_PROCESS = (2184731, "python3")
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Illegal Instruction Parameter",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ "
    "0x7f3c_4a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
    "partition 6, subpartition 0.",
    63: "Row Remapper: New row (0x00000000000a3b40) Marked for Remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000000000a3b40).",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
    120: "GSP task timeout @ pc:0x4bd36ec, task: 1",
}
APP_XIDS = (13, 31, 43, 45, 68, 69, 94, 109, 119)
#: SXid codes the Fabric Manager user guide lists as non-fatal (the rest print "Fatal" here).
SXID_NONFATAL = (
    11012,
    11021,
    11022,
    11023,
    12021,
    12023,
    15008,
    15011,
    19049,
    19055,
    19057,
    19059,
    19062,
    19065,
    19068,
    19071,
    24001,
    24002,
    24003,
    22013,
)


def _now():
    return time.time()


# -- the state file -------------------------------------------------------------------------------
def default_gpu():
    return {
        "ecc": {
            "volatile": {
                "sram_correctable": 0,
                "sram_uncorrectable": 0,
                "dram_correctable": 0,
                "dram_uncorrectable": 0,
            },
            "aggregate": {
                "sram_correctable": 0,
                "sram_uncorrectable": 0,
                "dram_correctable": 0,
                "dram_uncorrectable": 0,
            },
        },
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "hw_slowdown": False,
        "nvlinks_down": [],
        "width_degraded": None,
        "lost": False,
        "copy_engine_slow": False,
        "dcgm": [],
    }


def default_state(data):
    """What a healthy machine of this profile looks like right after power-on."""
    gpus = [d for d in data["devices"] if d["kind"] == "gpu"]
    nvswitch = bool(data.get("nvswitch"))
    peermem = peermem_configured(data)
    return {
        "boot_time": _now(),
        "gpus": {str(g["index"]): default_gpu() for g in gpus},
        "aer": {},
        "fabric_manager": {"enabled": nvswitch, "active": nvswitch} if nvswitch else None,
        "peermem": {"configured": peermem, "loaded": peermem},
        "driver": None,
        "allreduce": None,
        "engine_wedge": None,
        "faults": [],
    }


def peermem_configured(data):
    """nvidia_peermem is set to load where GPUDirect RDMA NICs (ConnectX) sit in the machine."""
    return any(d["kind"] == "nic" and d.get("driver") == "mlx5_core" for d in data["devices"])


def path(root):
    return Path(root) / HEALTH_FILE


def load(root, data):
    try:
        return json.loads(path(root).read_text())
    except FileNotFoundError:
        return default_state(data)


def save(root, state):
    target = path(root)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, target)


# -- the kernel log -------------------------------------------------------------------------------
#: Seconds from power-on to the end of the boot log below: later lines are stamped after it.
BOOT_LOG_END = 8.0


def _stamp(state):
    since_boot = BOOT_LOG_END + max(0.0, _now() - state["boot_time"])
    return "[%5d.%06d] " % divmod(int(since_boot * 1e6), 1_000_000)


def boot_log(data, driver_version):
    """The NVIDIA part of a boot's kernel log (what `dmesg | grep -i nvidia` shows after boot)."""
    lines = [
        "[    4.812345] nvidia: loading out-of-tree module taints kernel.",
        "[    4.903112] nvidia-nvlink: Nvlink Core is being initialized, major device number 511",
        "[    5.117804] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
        "(dvs-builder@U22-I3-B10-02-5)  Thu Mar 13 23:36:39 UTC 2025" % driver_version,
    ]
    for n, bdf in enumerate((data.get("nvswitch") or {}).get("bdfs", [])):
        lines.append("[    5.3%05d] nvidia-nvswitch%d: probe (PCI:%s)" % (n * 1711, n, bdf))
    lines.append(
        "[    5.642018] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX "
        "platforms  %s  Release Build  (dvs-builder@U22-I3-B10-02-5)" % driver_version
    )
    if peermem_configured(data):
        lines.append(
            "[    6.204517] nvidia_peermem: module using GPL-only symbols uses symbols "
            "peer_memory_client_register from module ib_core."
        )
    return "\n".join(lines) + "\n"


def kmsg_path(root):
    return Path(root) / KMSG_FILE


def append_kmsg(root, state, lines):
    with open(kmsg_path(root), "a") as f:
        for line in lines:
            f.write(_stamp(state) + line + "\n")


def xid_bdf(bdf):
    """The driver's Xid bus id: `0000:3b:00.0` -> `PCI:0000:3b:00` (no function)."""
    return "PCI:" + bdf.rsplit(".", 1)[0]


def xid_line(bdf, code):
    text = XID_TEXT.get(code, "Xid %d reported by the lab" % code)
    if code in APP_XIDS:
        pid, name = APP_PROCESS
        who = "pid=%d, name=%s" % (pid, name)
    else:
        who = "pid='<unknown>', name=<unknown>"
    return "NVRM: Xid (%s): %d, %s, %s" % (xid_bdf(bdf), code, who, text)


def sxid_lines(switch_no, bdf, code, link=30):
    severity = "Non-fatal" if code in SXID_NONFATAL else "Fatal"
    prefix = "nvidia-nvswitch%d: SXid (PCI:%s): %d, " % (switch_no, bdf, code)
    return [
        prefix + "%s, Link %d LTSSM Fault Up" % (severity, link),
        prefix + "Severity %d Engine instance %d Sub-engine instance 00" % (0 if severity == "Non-fatal" else 1, link),
        prefix + "Data {0x%08x, 0x%08x, 0x00000000, 0x%08x, 0x80005302, 0x00000000, 0x00000000, "
        "0x00000000, 0x00000000}" % (link, link, link),
    ]


# -- sysfs and procfs views -----------------------------------------------------------------------
def aer_text(kind, counts):
    """One `aer_dev_*` file as Linux prints it (`RxErr 0` ... `TOTAL_ERR_COR 0`)."""
    _name, names, array, total_name = AER_FILES[kind]
    out = []
    for bit, name in enumerate(names):
        value = counts.get(name or "bit%d" % bit, 0)
        if name:
            out.append("%s %d" % (name, value))
        elif value:
            out.append("%s_bit[%d] %d" % (array, bit, value))
    out.append("TOTAL_%s %d" % (total_name, sum(counts.values())))
    return "\n".join(out) + "\n"


def device_dir(root, bdf):
    return Path(root) / "sys" / "bus" / "pci" / "devices" / bdf


def write_aer(root, data, state):
    for dev in data["devices"]:
        ddir = device_dir(root, dev["bdf"])
        if not ddir.exists():
            continue
        counts = state["aer"].get(dev["bdf"], {})
        for kind, (fname, _n, _a, _t) in AER_FILES.items():
            (ddir / fname).write_text(aer_text(kind, counts.get(kind, {})))
        if dev["role"] == "root_port":
            for short in ("cor", "fatal", "nonfatal"):
                (ddir / ("aer_rootport_total_err_%s" % short)).write_text("0\n")


def write_modules(root, state):
    peermem = state["peermem"]["loaded"]
    users = ["nvidia_uvm", "nvidia_modeset"] + (["nvidia_peermem"] if peermem else [])
    lines = ([PEERMEM_LINE] if peermem else []) + [
        line.format(
            users=len(users),
            using=",".join(users) + ",",
            ib_users=1 + peermem,
            ib_using=("nvidia_peermem," if peermem else "") + "mlx5_ib,",
        )
        for line in MODULES_BASE
    ]
    if not state["peermem"]["configured"]:
        lines = [line for line in lines if not line.startswith(("ib_uverbs", "mlx5_"))]
    proc = Path(root) / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "modules").write_text("\n".join(lines) + "\n")
    modules = Path(root) / "sys" / "module"
    for name in ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"):
        (modules / name).mkdir(parents=True, exist_ok=True)
        (modules / name / "initstate").write_text("live\n")
    peer_dir = modules / "nvidia_peermem"
    if peermem:
        peer_dir.mkdir(parents=True, exist_ok=True)
        (peer_dir / "initstate").write_text("live\n")
        (peer_dir / "refcnt").write_text("0\n")
    elif peer_dir.exists():
        shutil.rmtree(peer_dir)


def _set_link(root, dev, gen, width):
    """Write a function's trained link into its Link Status register and sysfs files."""
    cfg = device_dir(root, dev["bdf"]) / "config"
    with open(cfg, "r+b") as f:
        f.seek(PCIE_CAP + 0x12)
        status = struct.unpack("<H", f.read(2))[0]
        status = (status & ~0x03FF) | gen | (width << 4)
        f.seek(PCIE_CAP + 0x12)
        f.write(struct.pack("<H", status))
    ddir = device_dir(root, dev["bdf"])
    (ddir / "current_link_width").write_text("%d\n" % width)
    (ddir / "current_link_speed").write_text(LINK_SPEED_TEXT[gen] + "\n")


def apply_links(root, data, state):
    """Train each GPU (and the port above it) to the width its state says."""
    by_bdf = {d["bdf"]: d for d in data["devices"]}
    for dev in data["devices"]:
        if dev["kind"] != "gpu":
            continue
        width = state["gpus"][str(dev["index"])]["width_degraded"] or dev["width_current"]
        for rec in (dev, by_bdf.get(dev["parent"])):
            if rec is not None:
                _set_link(root, rec, dev["gen_current"], width)


def write_views(root, data, state):
    """Every file the state shows through (AER, modules, trained links)."""
    write_aer(root, data, state)
    write_modules(root, state)
    apply_links(root, data, state)


def init(root, data, driver_version):
    """A machine's first power-on: a healthy state, this boot's kernel log."""
    state = default_state(data)
    kmsg_path(root).write_text(boot_log(data, driver_version))
    save(root, state)
    write_views(root, data, state)
    return state


# -- faults ---------------------------------------------------------------------------------------
class FaultError(ValueError):
    """A fault that cannot be injected on this machine (the message says why)."""


def _gpu_rec(data, index):
    gpus = sorted((d for d in data["devices"] if d["kind"] == "gpu"), key=lambda d: d["index"])
    if not 0 <= index < len(gpus):
        raise FaultError("GPU %d does not exist: %s has GPUs 0-%d" % (index, data["profile"], len(gpus) - 1))
    return gpus[index]


def inject(root, data, kind, gpu=0, code=None):
    """Apply one fault to the machine at `root`; returns a one-line description."""
    state = load(root, data)
    if kind == "clear":
        return clear(root, data, state)
    if kind not in KINDS:
        raise FaultError("unknown fault %r; known: %s" % (kind, ", ".join(KINDS)))
    rec = _gpu_rec(data, gpu)
    g = state["gpus"][str(gpu)]
    if kind == "xid":
        if code is None:
            raise FaultError("xid needs a code, e.g. `fault NODE xid 79`")
        append_kmsg(root, state, [xid_line(rec["bdf"], code)])
        what = "Xid %d on GPU %d (%s) in this boot's kernel log" % (code, gpu, rec["bdf"])
    elif kind == "sxid":
        bdfs = (data.get("nvswitch") or {}).get("bdfs", [])
        if not bdfs:
            raise FaultError("sxid needs NVSwitches: profile %s has none" % data["profile"])
        if code is None:
            raise FaultError("sxid needs a code, e.g. `fault NODE sxid 20034`")
        switch_no = gpu % len(bdfs)
        append_kmsg(root, state, sxid_lines(switch_no, bdfs[switch_no], code))
        what = "SXid %d on nvidia-nvswitch%d (%s)" % (code, switch_no, bdfs[switch_no])
    elif kind == "remap-pending":
        g["remapped_rows"]["pending"] = True
        what = "row remap pending on GPU %d" % gpu
    elif kind == "ecc-uncorrectable":
        g["ecc"]["volatile"]["dram_uncorrectable"] += 1
        g["ecc"]["aggregate"]["dram_uncorrectable"] += 1
        what = "volatile uncorrectable DRAM ECC error on GPU %d" % gpu
    elif kind == "fabric-manager-stop":
        if not state["fabric_manager"]:
            raise FaultError("fabric-manager-stop needs NVSwitches: profile %s has none" % data["profile"])
        state["fabric_manager"]["active"] = False
        what = "nvidia-fabricmanager stopped; GPU fabric state In Progress"
    elif kind == "nvlink-down":
        if not rec["nvlinks"]:
            raise FaultError("GPU %d of %s has no NVLink" % (gpu, data["profile"]))
        link = next((n for n in range(rec["nvlinks"]) if n not in g["nvlinks_down"]), None)
        if link is None:
            raise FaultError("every NVLink of GPU %d is already down" % gpu)
        g["nvlinks_down"] = sorted(g["nvlinks_down"] + [link])
        what = "NVLink %d of GPU %d inactive" % (link, gpu)
    elif kind == "hw-slowdown":
        g["hw_slowdown"] = True
        what = "HW Slowdown active on GPU %d" % gpu
    elif kind == "link-degrade":
        width = g["width_degraded"] or rec["width_current"]
        if width <= 1:
            raise FaultError("GPU %d is already at x1" % gpu)
        g["width_degraded"] = width // 2
        what = "PCIe link of GPU %d trained down to x%d" % (gpu, width // 2)
    elif kind == "aer":
        port = rec["parent"]
        counts = state["aer"].setdefault(port, {}).setdefault("nonfatal", {})
        counts["CmpltTO"] = counts.get("CmpltTO", 0) + 1
        what = "AER non-fatal error (CmpltTO) on %s, the port above GPU %d" % (port, gpu)
    elif kind == "peermem-unload":
        if not state["peermem"]["loaded"]:
            raise FaultError("nvidia_peermem is not loaded on this machine")
        state["peermem"]["loaded"] = False
        what = "nvidia_peermem unloaded"
    elif kind in DRIVER_FAULTS:
        state["driver"] = kind
        what = "the NVIDIA driver: %s" % kind
    elif kind == "engine-wedge":
        # the time of the wedge: a vLLM stand-in started before it is wedged, one (re)started
        # after it is not (a restart of the server ends a wedge, as it does a hung engine core)
        state["engine_wedge"] = _now()
        what = "the vLLM engine is wedged: /health and /metrics answer, completions never return"
    elif kind == "gpu-lost":
        g["lost"] = True
        what = "GPU %d (%s) fell off the bus: no device handle for it" % (gpu, rec["bdf"])
    elif kind == "copy-engine-slow":
        g["copy_engine_slow"] = True
        what = "the copy engines of GPU %d are slow: its host and peer copies (nvbandwidth) fall behind" % gpu
    elif kind in ("dcgm-memory", "dcgm-pcie"):
        # faults only DCGM's active tests find: nothing nvidia-smi or NVML shows changes
        found = kind[len("dcgm-") :]
        if found not in g.setdefault("dcgm", []):
            g["dcgm"].append(found)
        what = "GPU %d fails DCGM's %s test (dcgmi diag -r 2 and up)" % (
            gpu,
            "GPU Memory" if found == "memory" else "PCIe",
        )
    else:  # allreduce-*
        state["allreduce"] = kind[len(ALLREDUCE_PREFIX) :]
        what = "all_reduce_perf: %s" % state["allreduce"]
    state["faults"].append({"kind": kind, "gpu": gpu, "code": code, "at": _now()})
    save(root, state)
    write_views(root, data, state)
    return what


def clear(root, data, state=None):
    """Every injected fault gone: the machine healthy again (the kernel log keeps its lines, as a
    real one would; a new boot starts a new log)."""
    old = state or load(root, data)
    state = default_state(data)
    state["boot_time"] = old["boot_time"]
    # What was never a fault stays: counts the machine had before are not part of `clear`.
    save(root, state)
    write_views(root, data, state)
    kmsg = kmsg_path(root)
    if kmsg.exists():
        text = kmsg.read_text()
        kept = [line for line in text.splitlines() if "Xid (" not in line]
        kmsg.write_text("\n".join(kept) + ("\n" if kept else ""))
    return "faults cleared"


def keeps_out(root, data):
    """Why this machine, as the model holds it now, must not take traffic: [] when healthy.

    The lab's own answer, from its state and its kernel log, to check the collection's
    gpu_health verdict against (the report's EXPECTED column); it shares no code with it."""
    state = load(root, data)
    why = []
    for index, g in sorted(state["gpus"].items(), key=lambda item: int(item[0])):
        rows = g["remapped_rows"]
        if rows["pending"] or rows["failure"]:
            why.append("GPU %s: row remap %s" % (index, "pending" if rows["pending"] else "failure"))
        if g["ecc"]["volatile"]["dram_uncorrectable"] or g["ecc"]["volatile"]["sram_uncorrectable"]:
            why.append("GPU %s: uncorrectable ECC" % index)
        if g["hw_slowdown"]:
            why.append("GPU %s: HW slowdown" % index)
        if g["nvlinks_down"]:
            why.append("GPU %s: NVLink %s down" % (index, ",".join(map(str, g["nvlinks_down"]))))
        if g["width_degraded"]:
            why.append("GPU %s: link trained down" % index)
        if g.get("lost"):
            why.append("GPU %s: lost" % index)
    if state.get("driver"):
        why.append("driver: %s" % state["driver"])
    if state.get("allreduce") not in (None, "slow"):  # slow: for the peers' baseline to judge
        why.append("all_reduce_perf: %s" % state["allreduce"])
    fm = state["fabric_manager"]
    if fm and not fm["active"]:
        why.append("fabric manager stopped")
    for port, counts in sorted(state["aer"].items()):
        if any(counts.get(kind) for kind in ("fatal", "nonfatal")):
            why.append("AER errors on %s" % port)
    kmsg = kmsg_path(root)
    for line in kmsg.read_text().splitlines() if kmsg.exists() else ():
        if "SXid (" in line:
            if ", Fatal," in line:
                why.append("fatal SXid %s" % line.split("): ", 1)[1].split(",", 1)[0])
        elif "Xid (" in line:
            code = int(line.split("): ", 1)[1].split(",", 1)[0])
            if code not in APP_XIDS:
                why.append("Xid %d" % code)
    return why


def reboot(root, data, driver_version):
    """What a power cycle does to the health state (see the module docstring)."""
    state = load(root, data)
    state["boot_time"] = _now()
    for g in state["gpus"].values():
        rows = g["remapped_rows"]
        if rows["pending"]:
            rows["pending"] = False
            rows["uncorrectable"] += 1
        g["ecc"]["volatile"] = dict.fromkeys(g["ecc"]["volatile"], 0)
    fm = state["fabric_manager"]
    if fm:
        fm["active"] = fm["enabled"]
    pm = state["peermem"]
    pm["loaded"] = pm["configured"]
    kmsg_path(root).write_text(boot_log(data, driver_version))
    save(root, state)
    write_views(root, data, state)
    return state
