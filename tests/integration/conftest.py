# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def balancer(tmp_path):
    """A real HAProxy on loopback (tests/integration/test_haproxy_pool_member.py's Balancer): its
    admin socket, config file and backend vllm_pool under tmp_path; stopped afterwards."""
    from tests.integration.test_haproxy_pool_member import Balancer

    lb = Balancer(tmp_path)
    lb.start()
    yield lb
    lb.stop()
