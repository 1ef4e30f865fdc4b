# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Module attributes shared by the collection's modules."""

from __future__ import annotations


class ModuleDocFragment:
    # A module that changes nothing on the host (it states its own check_mode support).
    DOCUMENTATION = r"""
attributes:
  diff_mode:
    support: none
    description: Nothing on the host is changed, so there is no diff.
"""

    # A module that only reads or computes.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: Only reads or computes; runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing on the host is changed, so there is no diff.
"""

    # A module that sets ansible_facts.
    FACTS = r"""
attributes:
  facts:
    support: full
    description: Sets facts under C(ansible_facts).
"""
