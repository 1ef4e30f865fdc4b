# SPDX-License-Identifier: GPL-3.0-or-later
"""Stand-ins for the node's tools (nvidia-smi, ...), each driven by the hardware model."""
