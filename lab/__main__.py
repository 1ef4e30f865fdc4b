# SPDX-License-Identifier: GPL-3.0-or-later
"""`python -m lab` (from the repository root): see lab/cli.py."""

import sys

from .cli import main

sys.exit(main())
