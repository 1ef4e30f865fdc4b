# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The limits an RDMA port's error counters are judged by, with their sources.

Plain Python (no Ansible imports), runs on target Python 3.8+.

Sources:

* NVIDIA NVSentinel's NIC health monitor (github.com/NVIDIA/NVSentinel,
  docs/configuration/nic-health-monitor.md, "Default Counter Configuration"): ``link_downed``,
  ``excessive_buffer_overrun_errors``, ``local_link_integrity_errors`` and ``rnr_nak_retry_err``
  are fatal on any increase; ``symbol_error`` above 120 per hour is fatal (the IBTA bit-error-rate
  limit of 10E-12); ``symbol_error`` above 10/s, ``link_error_recovery`` above 5/min,
  ``port_rcv_errors`` above 10/s, ``port_xmit_discards`` above 100/s, ``local_ack_timeout_err``
  above 1/s and ``roce_slow_restart`` above 10/s are degradation (non-fatal).
* Azure HPC node health checks (github.com/Azure/azurehpc-health-checks,
  customTests/azure_ib_link_flapping.nhc): a link that went down again fails the node
  (``check_ib_link_flapping``, 6 hours by default).
* infiniband-diags ``ibqueryerrors`` (rdma-core infiniband-diags/etc/error_thresholds): counts
  since the counters were cleared - ``SymbolErrorCounter``, ``LinkErrorRecoveryCounter``,
  ``LinkDownedCounter``, ``PortRcvErrors``, ``LocalLinkIntegrityErrors``,
  ``ExcessiveBufferOverrunErrors`` 10, the others 100; a count, not a rate, so not used as a limit
  here, where counters are compared between two reads.
* The counters' widths (drivers/infiniband/core/sysfs.c ``PORT_PMA_ATTR``): the IB PortCounters
  stop at their maximum instead of wrapping, so a counter that reads its maximum can no longer show
  an increase.
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.node.plugins.module_utils.health import _verdict

#: counter -> (directory, limit per minute, status past it, source). A limit of 0 means any
#: increase. Rates are taken over at least one minute (see :func:`rate_per_minute`).
COUNTER_LIMITS = {
    "excessive_buffer_overrun_errors": ("counters", 0.0, _verdict.FAIL, "NVSentinel: fatal on any increase"),
    "local_link_integrity_errors": ("counters", 0.0, _verdict.FAIL, "NVSentinel: fatal on any increase"),
    "symbol_error": ("counters", 2.0, _verdict.FAIL, "NVSentinel symbol_error_fatal: 120/hour (IBTA BER 10E-12)"),
    "link_error_recovery": ("counters", 5.0, _verdict.WARN, "NVSentinel: 5/min"),
    "port_rcv_errors": ("counters", 600.0, _verdict.WARN, "NVSentinel: 10/s"),
    "port_xmit_discards": ("counters", 6000.0, _verdict.WARN, "NVSentinel: 100/s"),
    "rnr_nak_retry_err": ("hw_counters", 0.0, _verdict.FAIL, "NVSentinel: fatal on any increase"),
    "local_ack_timeout_err": ("hw_counters", 60.0, _verdict.WARN, "NVSentinel: 1/s"),
    "roce_slow_restart": ("hw_counters", 600.0, _verdict.WARN, "NVSentinel: 10/s"),
}
#: The flap counter: any increase fails (NVSentinel, Azure's check_ib_link_flapping).
LINK_DOWNED = "link_downed"
#: Counters every port's ``counters/`` must hold to be judged (the kernel creates all of them).
REQUIRED_COUNTERS = (LINK_DOWNED,) + tuple(n for n, (d, _l, _s, _src) in COUNTER_LIMITS.items() if d == "counters")

#: Bits of each PortCounters attribute (sysfs.c PORT_PMA_ATTR); at 2**bits - 1 it has saturated.
COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}


def limits(overrides=None):
    """``{counter: limit per minute}``: the defaults with ``overrides`` applied; ValueError for
    a counter that is not judged or a limit that is not a number of 0 or more."""
    result = {name: spec[1] for name, spec in COUNTER_LIMITS.items()}
    for name, value in (overrides or {}).items():
        if name not in COUNTER_LIMITS:
            raise ValueError(
                "counter_limits: %r is not a judged counter (%s)" % (name, ", ".join(sorted(COUNTER_LIMITS)))
            )
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError("counter_limits.%s: %r is not a number" % (name, value)) from None
        if math.isnan(value) or value < 0 or math.isinf(value):
            raise ValueError("counter_limits.%s: %r is not a rate of 0 or more per minute" % (name, value))
        result[name] = value
    return result


def rate_per_minute(increase, seconds):
    """The increase per minute over ``seconds``, taken over at least one minute: a short sample
    cannot tell a burst from a rate, so two errors in two seconds count as two per minute."""
    return increase * 60.0 / max(seconds, 60.0)


def saturated(name, value):
    """Whether ``value`` is the maximum of the counter ``name`` (it can no longer rise)."""
    bits = COUNTER_BITS.get(name)
    return bits is not None and value == 2**bits - 1
