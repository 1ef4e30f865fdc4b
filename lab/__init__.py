# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab: a simulated GPU fleet that gpufleet.node's playbooks run against."""
