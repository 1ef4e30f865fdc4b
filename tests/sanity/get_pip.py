# SPDX-License-Identifier: GPL-3.0-or-later
"""Offline stand-in for pip's get-pip.py bootstrap, which ansible-test downloads from a host these
machines cannot reach. ansible-test runs it as ``python get_pip.py [pip options] pip==X ...`` in an
empty venv; this installs pip with the interpreter's own ensurepip, then the requested packages
from the package index, which is what get-pip.py does with its bundled copy.
"""

import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet"] + args)
