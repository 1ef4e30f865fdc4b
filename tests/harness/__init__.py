# SPDX-License-Identifier: GPL-3.0-or-later
"""What the test modules share, one module per job (tests/conftest.py puts the repository on
sys.path):

  playbook    ansible-playbook from a test: the one runner (``run_playbook``, the vault password
              passed per run), its PLAY RECAP, the environment of a run
  lab         the lab of a test run: its prerequisites, the fleet's profiles, the one lab class
              (``Lab``: ``lab`` verbs, playbook runs, the pool as the lab's own reader
              lab/haproxy.py reads it, testinfra) and ``own_lab``
  http        HTTP servers for tests (``FakeHTTP``, ``MetricsServer``)
  prometheus  the collection's dashboard and a live Prometheus' API
  modules     a module as Ansible runs it (``run_module``), a node-side agent as its role
              installs it (``install_agent``)
  parsers     lspci's ACS lines and config-space dumps, env files
  inventory   boot validation's node-local inventory
  ssh         a command on a lab node over SSH
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
