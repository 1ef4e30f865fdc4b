# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The environment GPU services read: the NCCL variables the measured topology calls for, and the
PyTorch allocator setting.

Plain Python, no Ansible. The filter ``gpufleet.node.gpu_runtime_env`` (plugins/filter/ncclenv.py)
exposes it to the role ``gpu_runtime_env``, which writes one env file that systemd
(``EnvironmentFile=``) and docker (``--env-file``) both read.

* ``NCCL_P2P_LEVEL``: ``NVL`` when every GPU pair is on NVLink; otherwise the widest path class
  some pair needs among those under one PCIe host bridge (``_path.HOST_BRIDGE_CLASSES``:
  PIX < PXB < PHB). Pairs across NODE/SYS never raise it (set it yourself if you measured that
  P2P across the CPU interconnect helps).
* ``NCCL_IB_DISABLE=1`` when the node has no RDMA NIC (``_path.is_rdma_nic``) and more than
  one GPU, so NCCL does not probe for InfiniBand/RoCE.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.node.plugins.module_utils.common import _linevalue
from ansible_collections.gpufleet.node.plugins.module_utils.pcie import _path

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvError(ValueError):
    """An environment that must be refused before anything is written."""


def _hex(value):
    """``'0x020700'``, ``'0207'``, ``0x15b3`` -> int; '' or None -> None."""
    if value in (None, ""):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    text = text[2:] if text.startswith("0x") else text
    try:
        return int(text, 16)
    except ValueError:
        return None


def nic_is_rdma(nic):
    """Whether one entry of a NIC list (``pcie_acs_info``'s ``nics``, or written by hand) is an
    RDMA NIC, by ``_path.is_rdma_nic``.

    ``{'rdma': bool}`` says it outright. A 24-bit class (``0x020700``, with the programming
    interface) is read by its top 16 bits. An entry with neither class nor vendor is one:
    ``pcie_acs_info`` lists only RDMA NICs.
    """
    if not isinstance(nic, dict):
        return True
    if "rdma" in nic:
        return bool(nic["rdma"])
    cls_text = nic.get("class", nic.get("class_id"))
    vendor = _hex(nic.get("vendor", nic.get("vendor_id")))
    cls = _hex(cls_text)
    if cls is None and vendor is None:
        return True
    if cls is not None and len(str(cls_text).lower().replace("0x", "")) > 4:
        cls >>= 8
    return _path.is_rdma_nic(vendor, cls, nic.get("driver"))


def p2p_level(links):
    """NCCL_P2P_LEVEL for a GPU links matrix ``{"GPU0": {"GPU1": "PIX"}}``; None when NCCL should decide."""
    pairs = []
    for a, row in (links or {}).items():
        for b, kind in (row or {}).items():
            if a == b or str(kind).upper() in ("X", ""):
                continue
            pairs.append(str(kind).upper())
    if not pairs:
        return None
    if all(_path.nvlink_count(k) is not None for k in pairs):
        return "NVL"
    pcie = [k for k in pairs if k in _path.HOST_BRIDGE_CLASSES]
    if not pcie:
        return None
    return max(pcie, key=_path.link_rank)


def _flag(value):
    """auto/true/false (as given to the role) -> True, False or None (auto)."""
    if value in (True, False):
        return value
    if str(value).lower() in ("true", "yes", "1"):
        return True
    if str(value).lower() in ("false", "no", "0"):
        return False
    return None


def runtime_env(
    topology=None, nics=None, rdma="auto", nccl_debug=None, user_env=None, alloc_conf="expandable_segments:True"
):
    """The env for GPU services. Returns ``{'env': {...}, 'why': {...}, 'warnings': [...]}``.

    User values (``user_env``) always win; a user value of None removes a derived variable.
    Raises EnvError for a name or value an env file read by systemd and docker cannot carry.
    """
    env, why, warnings = {}, {}, []
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
        why["PYTORCH_CUDA_ALLOC_CONF"] = (
            "expandable segments against fragmentation; vLLM turns them off "
            "while its memory pool is active and drops other options"
        )
    gpus = (topology or {}).get("gpus") or []
    level = p2p_level((topology or {}).get("links"))
    if level:
        env["NCCL_P2P_LEVEL"] = level
        why["NCCL_P2P_LEVEL"] = "widest GPU-to-GPU link under one host bridge in the measured topology"
    has_rdma = _flag(rdma)
    if has_rdma is None and nics is not None:
        has_rdma = any(nic_is_rdma(n) for n in nics)
    if has_rdma is False and (len(gpus) != 1):
        env["NCCL_IB_DISABLE"] = "1"
        why["NCCL_IB_DISABLE"] = "the node has no RDMA NIC"
    if nccl_debug:
        env["NCCL_DEBUG"] = str(nccl_debug).upper()
        why["NCCL_DEBUG"] = "asked for (debugging)"
    for key, value in (user_env or {}).items():
        if not ENV_NAME.match(str(key)):
            raise EnvError("invalid environment variable name %r" % key)
        if value is None:
            env.pop(key, None)
            why.pop(key, None)
            continue
        value = str(value).lower() if isinstance(value, bool) else str(value)
        env[key] = value
        why[key] = "set by the user"
    for key, value in env.items():
        try:  # the one check of every env-file value (the templates' gpufleet.node.env_value filter)
            _linevalue.env_value(value, key)
        except _linevalue.LineValueError as exc:
            raise EnvError(str(exc)) from exc
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    extra = [o for o in alloc.split(",") if o and not o.startswith("expandable_segments")]
    if extra:
        warnings.append(
            "PYTORCH_CUDA_ALLOC_CONF options %s do not survive vLLM's memory pool (it keeps only "
            "expandable_segments)" % ",".join(extra)
        )
    return {"env": env, "why": why, "warnings": warnings}
