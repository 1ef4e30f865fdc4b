# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""GPU topology facts: NVML or nvidia-smi, checked against the PCI tree, judged by expectations.

Plain Python (no Ansible imports), runs on target Python 3.8+.

Two collectors produce the same backend-neutral record (``collect_nvml`` from NVIDIA's
``nvidia-ml-py`` module object, ``collect_nvidia_smi`` from a ``run(argv)`` callable), and
``build_facts`` turns that record into ``ansible_facts.gpu_topology``: the PCI tree (sysfs, read
as a ``_topology.PciTopology``) supplies the bridges between each GPU pair and which of them redirect
peer traffic (ACS), by the rules of ``pcie._path``, and
``evaluate`` compares the result with what the caller expects.

NVML facts used (nvidia-ml-py 13.615.71, checked against its source):

* ``nvmlDeviceGetTopologyCommonAncestor`` -> a path class (``_path.NVML_TOPOLOGY_LEVELS``).
* ``nvmlDeviceGetP2PStatus(h1, h2, index)``; index READ 0, WRITE 1, NVLINK 2.  The module's
  ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)`` in that release (trailing comma), so the
  integers are used, never the constants.  Status OK 0, CHIPSET_NOT_SUPPORTED 1 (CNS),
  GPU_NOT_SUPPORTED 2 (GNS), IOH_TOPOLOGY_NOT_SUPPORTED 3 (TNS), DISABLED_BY_REGKEY 4 (DR),
  NOT_SUPPORTED 5 (NS), UNKNOWN 6 (U): nvidia-smi's letters for the same values.
* NVLink: ``nvmlDeviceGetNvLinkState(h, link)`` over ``range(NVML_NVLINK_MAX_LINKS)`` (links a
  GPU does not have answer NotSupported/InvalidArgument); the far end from
  ``nvmlDeviceGetNvLinkRemoteDeviceType`` (GPU 0, SWITCH 2) and
  ``nvmlDeviceGetNvLinkRemotePciInfo``.  Behind NVSwitches every GPU reaches every other GPU
  over all its switch links, which is what nvidia-smi prints as NV18 on an HGX H100.
* ``nvmlDeviceGetPciInfo(h).busId`` is ``00000000:07:00.0`` (bytes in older releases).
"""

from __future__ import annotations

from ansible_collections.gpufleet.node.plugins.module_utils.gpu import _nvml, _nvsmi
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _config_space, _path, _sysfs, _topology

NVML_P2P_INDEX = {"read": 0, "write": 1, "nvlink": 2}
NVML_P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_AFFINITY_SCOPE_NODE = 0
#: CPU-set words asked of nvmlDeviceGetCpuAffinity (64 CPUs each): 4096 CPUs.
CPU_SET_WORDS = 64
NUMA_SET_WORDS = 4
P2P_MODES = tuple(name for name, _letter in _nvsmi.P2P_MODES)


class GpuTopologyError(Exception):
    """No facts can be given; ``cause`` is a short key, the message says what to do."""

    def __init__(self, cause, message):
        super().__init__(message)
        self.cause = cause


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no driver, no library): the caller may fall back."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


def label(index):
    return "GPU%d" % index


def empty_record(driver_version=None):
    return {"driver_version": driver_version, "gpus": [], "links": {}, "p2p": {mode: {} for mode in P2P_MODES}}


# -- NVML ------------------------------------------------------------------------------------


def _nvml_code(exc):
    return getattr(exc, "value", None)


def _bits(words):
    """A ctypes array (or list) of 64-bit masks -> sorted set bit numbers."""
    result = []
    for number, word in enumerate(words):
        word = int(word)
        bit = 0
        while word:
            if word & 1:
                result.append(number * 64 + bit)
            word >>= 1
            bit += 1
    return result


def _nvlink_ends(nvml, handle, bus_ids):
    """Active NVLinks of one GPU: ``(count, {peer_bus_id: links}, switch_links)``."""
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    active = 0
    to_gpu = {}
    to_switch = 0
    for link in range(max_links):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            continue
        if state != enabled:
            continue
        active += 1
        remote_type = _nvml.optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        remote = _nvml.optional(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remote_bus = _nvsmi.normalize_bus_id(_nvml.text(remote.busId)) if remote is not None else None
        if remote_type == NVML_NVLINK_DEVICE_TYPE_GPU or (remote_type is None and remote_bus in bus_ids):
            to_gpu[remote_bus] = to_gpu.get(remote_bus, 0) + 1
        else:
            # NVSwitch (or a far end NVML cannot name: an NVSwitch invisible in a VM).
            to_switch += 1
    return active, to_gpu, to_switch


def collect_nvml(nvml):
    """Read the topology through NVML (``nvml`` is the imported ``pynvml`` module)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable("nvmlInit() failed: %s" % exc, _nvml_code(exc)) from exc
    try:
        return _collect_nvml(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _collect_nvml(nvml):
    driver = _nvml.text(nvml.nvmlSystemGetDriverVersion())
    count = nvml.nvmlDeviceGetCount()
    handles = []
    for index in range(count):
        try:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError as exc:
            raise GpuTopologyError(
                "gpu_lost",
                "NVML cannot get a handle for GPU %d (%s): the GPU has most likely fallen off the "
                'bus (look for "Xid 79" / "fallen off the bus" in dmesg); the node needs a GPU reset '
                "or a reboot" % (index, exc),
            ) from exc
    gpus = []
    for index, handle in enumerate(handles):
        pci = nvml.nvmlDeviceGetPciInfo(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        cpus = _nvml.optional(nvml, "nvmlDeviceGetCpuAffinity", handle, CPU_SET_WORDS)
        nodes = _nvml.optional(nvml, "nvmlDeviceGetMemoryAffinity", handle, NUMA_SET_WORDS, NVML_AFFINITY_SCOPE_NODE)
        node_list = _bits(nodes) if nodes is not None else []
        gpu_numa = _nvml.optional(nvml, "nvmlDeviceGetNumaNodeId", handle)
        gpus.append(
            {
                "index": index,
                "uuid": _nvml.text(nvml.nvmlDeviceGetUUID(handle)),
                "name": _nvml.text(nvml.nvmlDeviceGetName(handle)),
                "pci_bus_id": _nvsmi.normalize_bus_id(_nvml.text(pci.busId)),
                "memory_total_mib": int(memory.total) // (1024 * 1024),
                "pcie": {
                    "gen_current": _nvml.optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
                    "gen_max": _nvml.optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
                    "width_current": _nvml.optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
                    "width_max": _nvml.optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
                },
                "numa_node": node_list[0] if len(node_list) == 1 else None,
                "cpu_affinity": _nvsmi.format_cpu_list(_bits(cpus)) if cpus is not None and _bits(cpus) else None,
                "gpu_numa_id": gpu_numa if isinstance(gpu_numa, int) and gpu_numa >= 0 else None,
                "nvlinks": 0,
            }
        )
    bus_ids = {gpu["pci_bus_id"] for gpu in gpus}
    ends = []
    for gpu, handle in zip(gpus, handles):
        active, to_gpu, to_switch = _nvlink_ends(nvml, handle, bus_ids)
        gpu["nvlinks"] = active
        ends.append((to_gpu, to_switch))

    links = {}
    p2p = {mode: {} for mode in P2P_MODES}
    for i, _gpu_i in enumerate(gpus):
        row = links[label(i)] = {}
        for mode in P2P_MODES:
            p2p[mode][label(i)] = {}
        for j, gpu_j in enumerate(gpus):
            if i == j:
                row[label(j)] = "X"
                for mode in P2P_MODES:
                    p2p[mode][label(i)][label(j)] = "X"
                continue
            direct = ends[i][0].get(gpu_j["pci_bus_id"], 0)
            switched = min(ends[i][1], ends[j][1])
            nv = direct + switched
            if nv:
                row[label(j)] = "NV%d" % nv
            else:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                row[label(j)] = _path.NVML_TOPOLOGY_LEVELS.get(level, "SYS")
            for mode in P2P_MODES:
                try:
                    status = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], NVML_P2P_INDEX[mode])
                except nvml.NVMLError:
                    status = 6
                p2p[mode][label(i)][label(j)] = NVML_P2P_STATUS.get(status, "U")
    return {"driver_version": driver, "gpus": gpus, "links": links, "p2p": p2p}


# -- nvidia-smi ------------------------------------------------------------------------------
class _NoDevices(Exception):
    """nvidia-smi: "No devices were found"."""


def _read(run, argv, parse, tolerate_rc=False):
    """Run one nvidia-smi command and parse its stdout; failure texts raise with their cause."""
    rc, out, err = run(argv)
    out, err = out or "", err or ""
    _nvsmi.check_failure(out + "\n" + err)
    if _nvsmi.no_devices(out + "\n" + err):
        raise _NoDevices()
    if rc != 0:
        if tolerate_rc:
            return None
        raise GpuTopologyError(
            "nvidia_smi_failed", "`%s` exited %d: %s" % (" ".join(argv), rc, (err or out).strip()[-500:])
        )
    try:
        return parse(out)
    except _nvsmi.NvidiaSmiParseError as exc:
        raise GpuTopologyError(
            "nvidia_smi_output", "cannot read the output of `%s`: %s" % (" ".join(argv), exc)
        ) from exc


def collect_nvidia_smi(run, binary):
    """Read the topology with nvidia-smi; ``run(argv)`` returns ``(rc, stdout, stderr)``."""
    try:
        return _collect_nvidia_smi(run, binary)
    except _nvsmi.NvidiaSmiError as exc:
        raise GpuTopologyError(exc.cause, str(exc)) from exc
    except _NoDevices:
        return empty_record()


def _collect_nvidia_smi(run, binary):
    rows = _read(run, _nvsmi.query_argv(binary), lambda out: _nvsmi.parse_query_csv(out, _nvsmi.QUERY_FIELDS))
    if not rows:
        return empty_record()
    topo = _read(run, [binary, "topo", "-m"], _nvsmi.parse_topo_matrix)
    labels = {g["label"] for g in topo["gpus"]}
    p2p = {}
    for mode, letter in _nvsmi.P2P_MODES:
        argv = [binary, "topo", "-p2p", letter]
        p2p[mode] = _read(run, argv, _nvsmi.parse_p2p_matrix)
        if set(p2p[mode]) != labels:
            raise GpuTopologyError(
                "nvidia_smi_output",
                "`%s` shows %s, `topo -m` %s" % (" ".join(argv), " ".join(sorted(p2p[mode])), " ".join(sorted(labels))),
            )
    # Active links per GPU; best effort (GPUs without NVLink may make it complain).
    nvlinks = _read(run, [binary, "nvlink", "-s"], _nvsmi.parse_nvlink_status, tolerate_rc=True) or {}

    topo_gpus = {g["index"]: g for g in topo["gpus"]}
    gpus = []
    for row in rows:
        index = int(row["index"])
        t = topo_gpus.get(index)
        if t is None:
            raise GpuTopologyError(
                "nvidia_smi_output", "nvidia-smi lists GPU %d but `topo -m` has no GPU%d row" % (index, index)
            )
        gpus.append(
            {
                "index": index,
                "uuid": row["uuid"],
                "name": row["name"],
                "pci_bus_id": _nvsmi.normalize_bus_id(row["pci.bus_id"]),
                "memory_total_mib": _nvsmi.parse_int_or_none(row["memory.total"]),
                "pcie": {
                    "gen_current": _nvsmi.parse_int_or_none(row["pcie.link.gen.current"]),
                    "gen_max": _nvsmi.parse_int_or_none(row["pcie.link.gen.max"]),
                    "width_current": _nvsmi.parse_int_or_none(row["pcie.link.width.current"]),
                    "width_max": _nvsmi.parse_int_or_none(row["pcie.link.width.max"]),
                },
                "numa_node": _nvsmi.numa_node_of(t["numa_affinity"]),
                "cpu_affinity": t["cpu_affinity"],
                "gpu_numa_id": t["gpu_numa_id"],
                "nvlinks": nvlinks.get(index, 0),
            }
        )
    if len(topo["gpus"]) != len(gpus):
        raise GpuTopologyError(
            "nvidia_smi_output", "`topo -m` shows %d GPUs, --query-gpu %d" % (len(topo["gpus"]), len(gpus))
        )
    driver = rows[0]["driver_version"]
    links = {g["label"]: dict(g["links"]) for g in topo["gpus"]}
    return {"driver_version": driver, "gpus": gpus, "links": links, "p2p": p2p}


# -- the PCI tree ----------------------------------------------------------------------------
def pci_view(sysfs_path, gpus):
    """Cross-check GPU bus ids with the sysfs tree; returns ``(view, topology or None)``."""
    view = {
        "sysfs_path": sysfs_path,
        "checked": False,
        "config_readable": False,
        "missing": [],
        "other_gpus": [],
        "error": None,
    }
    try:
        try:
            topo = _topology.PciTopology.scan(sysfs_path)
            view["config_readable"] = True
        except _config_space.PciConfigTruncated:
            topo = _topology.PciTopology.scan(sysfs_path, with_config=False)
    except (_config_space.PciError, OSError) as exc:
        view["error"] = str(exc)
        return view, None
    view["checked"] = True
    known = {gpu["pci_bus_id"] for gpu in gpus}
    view["missing"] = [bdf for bdf in (gpu["pci_bus_id"] for gpu in gpus) if bdf not in topo.devices]
    view["other_gpus"] = [
        {"pci_bus_id": bdf, "driver": topo.devices[bdf].driver} for bdf in topo.gpus if bdf not in known
    ]
    return view, topo


# -- facts -----------------------------------------------------------------------------------
def build_facts(record, backend, sysfs_path=_sysfs.DEFAULT_SYSFS_PATH, expect=None):
    gpus = record["gpus"]
    labels = [label(g["index"]) for g in gpus]
    view, topo = pci_view(sysfs_path, gpus)
    in_tree = {g["pci_bus_id"]: topo is not None and g["pci_bus_id"] in topo.devices for g in gpus}
    bridges = {}
    redirecting = {}
    for gi in gpus:
        li = label(gi["index"])
        bridges[li] = {}
        redirecting[li] = {}
        for gj in gpus:
            lj = label(gj["index"])
            if li == lj:
                continue
            if not (in_tree[gi["pci_bus_id"]] and in_tree[gj["pci_bus_id"]]):
                bridges[li][lj] = None
                redirecting[li][lj] = None
                continue
            crossed = topo.bridges_between(gi["pci_bus_id"], gj["pci_bus_id"])
            bridges[li][lj] = crossed
            redirecting[li][lj] = topo.redirecting(crossed) if view["config_readable"] else None
    view["redirecting"] = redirecting
    for gpu in gpus:
        chain = topo.chain(gpu["pci_bus_id"]) if in_tree[gpu["pci_bus_id"]] else None
        gpu["upstream_port"] = chain[-1] if chain else None
    facts = {
        "backend": backend,
        "driver_version": record["driver_version"],
        "gpu_count": len(gpus),
        "no_gpus": not gpus,
        "gpus": gpus,
        "links": record["links"],
        "p2p": record["p2p"],
        "bridges": bridges,
        "pci_tree": view,
        "summary": summarize(record, labels),
    }
    facts["violations"] = evaluate(facts, expect or {})
    return facts


def _pairs(labels):
    for n, a in enumerate(labels):
        for b in labels[n + 1 :]:
            yield a, b


def summarize(record, labels):
    links = record["links"]
    p2p = record["p2p"]
    pair_links = [links[a][b] for a, b in _pairs(labels)]
    not_ok = []
    for a, b in _pairs(labels):
        statuses = {p2p[mode][a][b] for mode in ("read", "write")} | {p2p[mode][b][a] for mode in ("read", "write")}
        if statuses != {"OK"}:
            not_ok.append([a, b])
    nvlink_pairs = [link for link in pair_links if link.startswith("NV")]
    ordered = sorted(pair_links, key=_path.link_rank)
    return {
        "gpu_count": len(labels),
        "pairs": len(pair_links),
        "p2p_all_pairs": not not_ok,
        "p2p_pairs_not_ok": not_ok,
        "worst_link": ordered[-1] if ordered else None,
        "best_link": ordered[0] if ordered else None,
        "nvlink": bool(nvlink_pairs),
        "nvlink_all_pairs": bool(pair_links) and len(nvlink_pairs) == len(pair_links),
        "numa_nodes": sorted({g["numa_node"] for g in record["gpus"] if g["numa_node"] is not None}),
        "pcie_downtrained": [
            label(g["index"])
            for g in record["gpus"]
            if g["pcie"]["width_current"] is not None
            and g["pcie"]["width_max"] is not None
            and g["pcie"]["width_current"] < g["pcie"]["width_max"]
        ],
    }


def _gpu_name(gpu):
    return "%s (%s, %s)" % (label(gpu["index"]), gpu["pci_bus_id"], gpu["name"])


def _violation(check, gpus, bridges, message):
    return {"check": check, "gpus": gpus, "bridges": bridges, "message": message}


def evaluate(facts, expect):
    """Violations of ``expect`` (gpu_count, min_pcie_gen, min_pcie_width, p2p_all_pairs,
    nvlink_required): each ``{'check', 'gpus', 'bridges', 'message'}``."""
    violations = []
    gpus = facts["gpus"]
    by_label = {label(g["index"]): g for g in gpus}
    labels = [label(g["index"]) for g in gpus]
    view = facts["pci_tree"]

    wanted = expect.get("gpu_count")
    if wanted is not None and wanted != len(gpus):
        others = ["%s (driver %s)" % (o["pci_bus_id"], o["driver"] or "none") for o in view.get("other_gpus", [])]
        message = "%d GPU(s) visible to the NVIDIA driver, expected %d" % (len(gpus), wanted)
        if others:
            message += "; NVIDIA GPUs in the PCI tree the driver does not manage: %s" % ", ".join(others)
        violations.append(_violation("gpu_count", [], [], message))

    # (check, the link field judged, its minimum, message); the current generation drops while a
    # GPU idles, so the generation judged is the negotiated maximum.
    link_rules = [
        (
            "pcie_width",
            "width_current",
            expect.get("min_pcie_width"),
            "%(gpu)s PCIe link trained to x%(value)s%(where)s, expected at least x%(minimum)d (the GPU can do "
            "x%(width_max)s): reseat the card, check the slot, riser and BIOS lane settings",
        ),
        (
            "pcie_gen",
            "gen_max",
            expect.get("min_pcie_gen"),
            "%(gpu)s PCIe link can reach Gen%(value)s at most%(where)s, expected Gen%(minimum)d: check the slot "
            "and the BIOS PCIe speed setting",
        ),
    ]
    for gpu in gpus:
        port = gpu.get("upstream_port")
        for check, field, minimum, text in link_rules:
            if minimum is None:
                continue
            value = gpu["pcie"][field]
            if value is None or value < minimum:
                message = text % {
                    "gpu": _gpu_name(gpu),
                    "value": value,
                    "where": " below port %s" % port if port else "",
                    "minimum": minimum,
                    "width_max": gpu["pcie"]["width_max"],
                }
                violations.append(_violation(check, [label(gpu["index"])], [port] if port else [], message))

    if expect.get("p2p_all_pairs"):
        for a, b in facts["summary"]["p2p_pairs_not_ok"]:
            statuses = []
            for mode in ("read", "write"):
                status = facts["p2p"][mode][a][b]
                statuses.append("%s %s (%s)" % (mode, status, _nvsmi.P2P_STATUSES.get(status, status)))
            crossed = facts["bridges"].get(a, {}).get(b) or []
            redirect = (view.get("redirecting") or {}).get(a, {}).get(b)
            message = "P2P between %s and %s is not OK: %s; link %s" % (
                _gpu_name(by_label[a]),
                _gpu_name(by_label[b]),
                ", ".join(statuses),
                facts["links"][a][b],
            )
            if crossed:
                message += "; peer traffic crosses bridge(s) %s" % ", ".join(crossed)
            if redirect:
                message += (
                    "; ACS redirects peer traffic at %s (clear ReqRedir/CmpltRedir/EgressCtrl "
                    "there: gpufleet.node.pcie_acs)" % ", ".join(redirect)
                )
            elif redirect is not None and crossed:
                message += "; no bridge on that path redirects (ACS), so the platform or the driver refuses peer access"
            violations.append(_violation("p2p", [a, b], redirect or crossed, message))

    if expect.get("nvlink_required"):
        for gpu in gpus:
            if not gpu["nvlinks"]:
                violations.append(
                    _violation("nvlink", [label(gpu["index"])], [], "%s has no active NVLink" % _gpu_name(gpu))
                )
        for a, b in _pairs(labels):
            link = facts["links"][a][b]
            if not link.startswith("NV"):
                violations.append(
                    _violation("nvlink", [a, b], [], "no NVLink between %s and %s (they talk over %s)" % (a, b, link))
                )
    return violations


def sysfs_nvidia_gpus(sysfs_path, driver=None):
    """NVIDIA GPU functions in the PCI tree (vendor/class files only: any user can read them),
    only those bound to ``driver`` when given; None when the tree cannot be read."""
    try:
        topo = _topology.PciTopology.scan(sysfs_path, with_config=False)
    except (_config_space.PciError, OSError):
        return None
    return [bdf for bdf in topo.gpus if driver is None or topo.devices[bdf].driver == driver]


def check_driver_sees_gpus(record, backend, sysfs_path):
    """Raise when the driver reports no GPU while the PCI tree has GPUs bound to ``nvidia``.

    A GPU bound to another driver (vfio-pci for a VM) is rightly invisible; one bound to
    ``nvidia`` that the driver does not report means the driver is broken, not that the node
    has no GPUs.
    """
    if record["gpus"]:
        return
    bound = sysfs_nvidia_gpus(sysfs_path, driver="nvidia")
    if bound:
        raise GpuTopologyError(
            "driver_no_devices",
            "%s reports no GPU, yet the PCI tree at %s holds NVIDIA GPU(s) %s bound to the nvidia "
            "driver: the driver cannot use them (check `dmesg | grep -i -e NVRM -e Xid`, that the "
            "driver matches the running kernel, and `nvidia-smi` by hand); reload the driver or "
            "reboot the node" % ("NVML" if backend == "nvml" else "nvidia-smi", sysfs_path, ", ".join(bound)),
        )
