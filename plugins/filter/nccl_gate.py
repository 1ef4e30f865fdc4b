# -*- coding: utf-8 -*-
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NCCL gate's records for a task result that came back without them.

``gpufleet.node.nccl_allreduce`` returns the full result and the readiness marker it built
(``verdict``, ``marker``), on failure too. Only a task that failed before the module could build
them (its arguments refused, the module crashed) lacks them; role nccl_gate then builds them here,
with the same builder (``gate_records`` in ``plugins/module_utils/nccl/_readiness.py``):

    {{ ansible_failed_result | gpufleet.node.nccl_gate_records(inventory_hostname, record) }}
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.node.plugins.module_utils.nccl import _readiness

#: What the records carry that only the caller knows (the module's ``record`` option).
RECORD_KEYS = ("boot_id", "result_path", "serving_backend", "serving_backend_reason")


def nccl_gate_records(result, host, record):
    """``result`` with ``verdict`` and ``marker``: those it carries, else built from it."""
    if not isinstance(result, Mapping):
        raise AnsibleFilterError("nccl_gate_records: the task result must be a dict, got %s" % type(result).__name__)
    if isinstance(result.get("verdict"), Mapping) and isinstance(result.get("marker"), Mapping):
        return dict(result)
    if not isinstance(record, Mapping) or set(record) - set(RECORD_KEYS):
        raise AnsibleFilterError(
            "nccl_gate_records: record must be a dict of %s, got %r" % (", ".join(RECORD_KEYS), record)
        )
    verdict, marker = _readiness.gate_records(dict(result), host, **dict(record))
    return dict(result, verdict=verdict, marker=marker)


class FilterModule:
    def filters(self):
        return {"nccl_gate_records": nccl_gate_records}
