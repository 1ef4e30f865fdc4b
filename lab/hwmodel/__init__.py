# SPDX-License-Identifier: GPL-3.0-or-later
"""Hardware model: declarative node profiles -> sysfs trees with real config space.

import lab.hwmodel as hw
node = hw.build("l40s-4x-switch", "/tmp/n1")   # lays the machine out
node = hw.Node.load("/tmp/n1")                  # or $GPUFLEET_LAB_ROOT
node.link_type(0, 1), node.redirected(0, 1), node.p2p_status(0, 1, "read")
"""

from . import health, units
from .node import ROOT_ENV, Node
from .profiles import PROFILES
from .tree import build, config_space, describe

__all__ = ["PROFILES", "ROOT_ENV", "Node", "build", "config_space", "describe", "health", "units"]
