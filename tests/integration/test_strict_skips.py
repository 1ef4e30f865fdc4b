# SPDX-License-Identifier: GPL-3.0-or-later
"""The test command cannot pass vacuously: under CI or GPUFLEET_TESTS_STRICT=1 (scripts/test.sh
sets it), a test that skips for a missing prerequisite (the lab's preflight, a package) fails,
saying why; only a test marked optional_input (input outside the repository) may skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CASES = """
import pytest

def test_lab_cannot_boot():
    pytest.skip("lab prerequisites: unshare: cannot create a user namespace")

@pytest.mark.skipif(True, reason="promtool is missing (Debian package prometheus)")
def test_tool_missing():
    pass

@pytest.mark.optional_input
@pytest.mark.skipif(True, reason="no ../shared/corpus/lspci")
def test_corpus_outside_the_repository():
    pass

def test_runs():
    pass
"""


def _pytest(tmp_path, **env):
    (tmp_path / "test_cases.py").write_text(CASES)
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUFLEET_TESTS_STRICT")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-c", str(REPO / "pytest.ini"),
         "--rootdir", str(tmp_path), "-q", str(tmp_path / "test_cases.py")],
        cwd=REPO, env=dict(base, **env), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_missing_prerequisite_fails_under_the_test_command_and_ci(tmp_path):
    for env in ({"GPUFLEET_TESTS_STRICT": "1"}, {"CI": "true"}):
        run = _pytest(tmp_path, **env)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out
        assert "1 failed, 1 passed, 1 skipped, 1 error" in out, out  # a skip at set-up fails as an error
        assert "unshare: cannot create a user namespace" in out and "promtool is missing" in out, out
        assert "skipped under the test command" in out, out


def test_outside_the_test_command_a_missing_prerequisite_skips(tmp_path):
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 3 skipped" in run.stdout, run.stdout
